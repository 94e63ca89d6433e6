/* Conversions between float and the 16-bit floats whose bits the C
 * families _float16 and _bfloat16 take (lltm_float16, lltm_bfloat16 of
 * lltm_op.h): a CPU pass loads each element into float, computes there and
 * stores each result back, rounded to nearest even. Loading is exact.
 * Storing keeps inf and NaN (NaN made quiet, its sign and the top of its
 * payload kept) and rounds what lies past the largest finite value to inf;
 * float16 goes down to its subnormals.
 *
 * All four are branch-free integer and float arithmetic, so that gcc
 * vectorises a pass's loops around them. C's _Float16 converts float16 in
 * one F16C instruction, but gcc 12 vectorises no loop that converts it, and
 * the LLTM's float16 passes ran several times slower with it. Where C has
 * _Float16, the _native pair converts with it, and the C checks
 * (test_round_cpu.c) find both pairs equal on every float16 and on float's
 * values around each rounding boundary. */
#ifndef LLTM_HALF_H
#define LLTM_HALF_H

#include <stdint.h>
#include <string.h>

#include "lltm_op.h"

static inline float lltm_float_of_bits(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

static inline uint32_t lltm_bits_of_float(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}

/* bfloat16 is float's top half. */
static inline float lltm_bfloat16_to_float(lltm_bfloat16 value) {
  return lltm_float_of_bits((uint32_t)value << 16);
}

static inline lltm_bfloat16 lltm_float_to_bfloat16(float value) {
  const uint32_t bits = lltm_bits_of_float(value);
  /* Adding 0x7fff and the kept half's lowest bit carries into the kept half
   * past the midpoint, and at it when that half is odd; a carry out of the
   * largest finite value gives inf. */
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return (lltm_bfloat16)((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* The float16 conversions compute every case, then keep one by masks:
 * gcc turns a ?: between float results into a branch, and vectorises a loop
 * with one only for AVX-512 (with its masked instructions). */
static inline uint32_t lltm_select_bits(uint32_t condition, uint32_t if_true, uint32_t if_false) {
  const uint32_t mask = 0u - condition;
  return (if_true & mask) | (if_false & ~mask);
}

static inline float lltm_float16_to_float(lltm_float16 value) {
  /* Exponent and mantissa moved to float's places, then rebiased: by
   * 127 - 15 for a normal number; to all ones for inf and NaN. */
  const uint32_t magnitude = (uint32_t)(value & 0x7fffu) << 13;
  const uint32_t exponent = value & 0x7c00u;
  const uint32_t normal = magnitude + (112u << 23);
  const uint32_t special = 0x7f800000u | magnitude | ((value & 0x3ffu) ? 0x400000u : 0u);
  /* A subnormal's mantissa m as 2^-14 (1 + m / 1024) - 2^-14, exactly m 2^-24. */
  const uint32_t subnormal =
      lltm_bits_of_float(lltm_float_of_bits(magnitude + (113u << 23)) - 6.103515625e-05f);
  const uint32_t bits = lltm_select_bits(
      exponent == 0, subnormal, lltm_select_bits(exponent == 0x7c00u, special, normal));
  return lltm_float_of_bits(bits | (uint32_t)(value & 0x8000u) << 16);
}

static inline lltm_float16 lltm_float_to_float16(float value) {
  const uint32_t bits = lltm_bits_of_float(value);
  const uint32_t magnitude = bits & 0x7fffffffu;
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t special =
      magnitude > 0x7f800000u ? 0x7e00u | ((magnitude >> 13) & 0x3ffu) : 0x7c00u;
  /* Below 2^-14 the result is subnormal: adding 0.5 lines its ten bits up
   * with the bottom of float's mantissa, rounded to nearest even by the
   * addition itself. */
  const uint32_t subnormal =
      lltm_bits_of_float(lltm_float_of_bits(magnitude) + 0.5f) - lltm_bits_of_float(0.5f);
  /* Rebiased by 15 - 127 with float16's rounding bias, as for bfloat16; a
   * carry past 65504 gives the exponent of inf. */
  const uint32_t normal =
      (magnitude - (112u << 23) + 0xfffu + ((magnitude >> 13) & 1u)) >> 13;
  const uint32_t result =
      lltm_select_bits(magnitude >= (143u << 23), special,
                       lltm_select_bits(magnitude < (113u << 23), subnormal, normal));
  return (lltm_float16)(result | sign);
}

#if defined(__FLT16_MANT_DIG__) && !defined(__cplusplus)
#define LLTM_HAS_NATIVE_FLOAT16 1

static inline float lltm_float16_to_float_native(lltm_float16 value) {
  _Float16 half;
  memcpy(&half, &value, sizeof half);
  return (float)half;
}

static inline lltm_float16 lltm_float_to_float16_native(float value) {
  const _Float16 half = (_Float16)value;
  lltm_float16 bits;
  memcpy(&bits, &half, sizeof bits);
  return bits;
}
#endif

#endif /* LLTM_HALF_H */
