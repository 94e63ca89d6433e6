/* The driver of `make asan` and `make valgrind`: runs every C check the
 * test_*.c files register (tests/c/lltm_check.h), then fails for any CPU pass in
 * the registry that no check called. With LLTM_BLAS_LIBRARY in the
 * environment (`make asan` sets it where lltm_ffi/_blas.py finds one), the
 * CPU passes load that BLAS, and the checks run its products too.
 *
 *   ./run_checks [seed]     exit status 0: every check passed and every pass was called
 */
#include <stdio.h>
#include <stdlib.h>

#include "lltm_check.h"

#define MAX_CHECKS 64
static struct {
  const char* name;
  lltm_check_function function;
} checks[MAX_CHECKS];
static int check_count;
static int too_many_checks;

void lltm_register_check(const char* name, lltm_check_function function) {
  if (check_count == MAX_CHECKS) {
    too_many_checks = 1;
    return;
  }
  checks[check_count].name = name;
  checks[check_count++].function = function;
}

static char called[256];

int lltm_check_pass(const char* pass, int dtype, const int64_t* sizes, const double* scalars,
                    void* const* tensors) {
  const int id = lltm_pass_id(pass);
  if (id < 0) {
    fprintf(stderr, "no pass %s is registered\n", pass);
    return id;
  }
  if (id < (int)sizeof called) called[id] = 1;
  return lltm_run(id, dtype, LLTM_CPU, 0, sizes, scalars, (const intptr_t*)tensors);
}

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 20240531u;
  long failures = 0;
  const char* blas = getenv("LLTM_BLAS_LIBRARY");
  if (blas && *blas) {
    lltm_blas_library(blas);
    const char* config = lltm_blas_config();
    printf("BLAS: %s\n", *config ? config : "none could be loaded from LLTM_BLAS_LIBRARY");
    if (!*config) ++failures;
  } else {
    printf("BLAS: none (LLTM_BLAS_LIBRARY is not set): the own products only\n");
  }
  if (too_many_checks || lltm_pass_conflict()) {
    fprintf(stderr, "registry: %s\n", too_many_checks ? "more checks than MAX_CHECKS"
                                                      : lltm_pass_conflict());
    ++failures;
  }
  for (int i = 0; i < check_count; ++i) {
    const long found = checks[i].function(seed);
    printf("%-28s %s\n", checks[i].name, found ? "FAILED" : "ok");
    failures += found;
  }
  for (int id = 0; id < lltm_pass_count(); ++id) {
    if ((lltm_pass_devices(id) & LLTM_ON_CPU) && !(id < (int)sizeof called && called[id])) {
      fprintf(stderr, "no C check calls the CPU pass %s\n", lltm_pass_name(id));
      ++failures;
    }
  }
  printf("run_checks (seed %llu): %d checks of %d registered passes, %ld failures\n",
         (unsigned long long)seed, check_count, lltm_pass_count(), failures);
  return failures ? 1 : 0;
}
