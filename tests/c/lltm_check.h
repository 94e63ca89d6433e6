/* The C checks that `make asan` and `make valgrind` run under the
 * sanitizers: each test_*.c (the LLTM's in tests/c/, each ported op's in
 * src/ops/<op>/) registers its checks with LLTM_CHECK, and
 * tests/c/run_checks.c runs them all, then fails for any CPU pass in the
 * registry (include/lltm_op.h) that no check called. */
#ifndef LLTM_CHECK_H
#define LLTM_CHECK_H

#include <stdint.h>

#include "lltm_op.h"

/* A check: the number of failures it found with the random inputs `seed`
 * draws; it says what they were on stderr. */
typedef long (*lltm_check_function)(uint64_t seed);

void lltm_register_check(const char* name, lltm_check_function function);

/* LLTM_CHECK(name) { ... } defines and registers the check `name`, whose
 * body sees `seed`. */
#define LLTM_CHECK(name)                                                      \
  static long name(uint64_t seed);                                            \
  __attribute__((constructor)) static void lltm_register_check_##name(void) { \
    lltm_register_check(#name, name);                                         \
  }                                                                           \
  static long name(uint64_t seed)

/* Runs the CPU version of the registered pass `pass` through lltm_run, as
 * Python does, and records that a check called it. */
int lltm_check_pass(const char* pass, int dtype, const int64_t* sizes, const double* scalars,
                    void* const* tensors);

#endif /* LLTM_CHECK_H */
