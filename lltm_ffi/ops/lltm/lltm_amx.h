/* Matrix products on AMX, the tile unit of Intel's Xeons since Sapphire
 * Rapids, for the CPU passes of the 16-bit types (lltm_cpu_impl.h).
 *
 * A tile product multiplies bfloat16 factors and sums in float. The product
 * of two bfloat16s is exact in float, so where bfloat16 holds every factor
 * exactly the result is float's product of them, but for the order of the
 * sums. A float16 holds 11 significant bits: two bfloat16s hold it exactly
 * (its value rounded to 8 bits, and the rest), and a product of two takes
 * the four products of their pieces. `pieces` says which: 1 bfloat16 a
 * factor, or 2. The tiles count bfloat16's subnormals (below 2^-126) as
 * zero, and sums that fall there too: no float16 lies there, and bfloat16
 * values there are no LLTM's.
 *
 * The AMX code is compiled for its own target only (attributes, not the
 * build's flags), and runs only where lltm_amx_usable says the CPU has it
 * and Linux let this process use it: the module stays portable. */
#ifndef LLTM_AMX_H
#define LLTM_AMX_H

#include <stddef.h>
#include <stdint.h>

/* 1 where this CPU has AMX's bfloat16 tiles and the kernel gave this
 * process their state (asked once, at the first call); else 0. */
int lltm_amx_usable(void);

/* One factor of a product, packed into the tiles' layout: `count` rows of
 * the left factor or columns of the right one, over `depth` (each factor's
 * depth times pieces^2, padded to a tile's 32), padded with zeros to
 * blocks of 32. `finite` is 0 where a factor of float16 pieces is inf or
 * NaN, whose pieces' products (inf times a zero piece) would not be the
 * value's: such a product is no tile product's. Start from {0}; packing
 * again reuses the memory; lltm_amx_free frees it. */
typedef struct {
  int64_t count, depth;
  int finite;
  uint16_t* tiles;
  size_t capacity; /* bfloat16s */
} lltm_amx_factor;

/* The left factor a (rows x depth), element (i, k) at
 * a[i * row_stride + k * depth_stride], into *packed. LLTM_SUCCESS, or
 * LLTM_ERROR_NO_MEMORY (*packed then holds nothing). */
int lltm_amx_pack_left(int64_t rows, int64_t depth, const float* a, int64_t row_stride,
                       int64_t depth_stride, int pieces, lltm_amx_factor* packed);

/* The right factor b (depth x columns), element (k, j) at b[k * row_stride + j]. */
int lltm_amx_pack_right(int64_t depth, int64_t columns, const float* b, int64_t row_stride,
                        int pieces, lltm_amx_factor* packed);

void lltm_amx_free(lltm_amx_factor* packed);

/* sums (left's rows x right's columns, row stride sums_stride) = left times
 * right, or sums += that where `accumulate`. Both factors packed with the
 * same depth and pieces, both finite; only where lltm_amx_usable. */
void lltm_amx_product(const lltm_amx_factor* left, const lltm_amx_factor* right, int accumulate,
                      float* sums, int64_t sums_stride);

/* What lltm_amx_multiply returns where a factor is not finite: nothing is
 * done, and the product is the caller's to compute another way. */
#define LLTM_AMX_DECLINED 1

/* sums (rows x columns, row stride sums_stride) = a b, packing a and b
 * (element (i, k) of a at a[i * a_row_stride + k * a_depth_stride], (k, j)
 * of b at b[k * b_row_stride + j]) a block of the depth at a time.
 * LLTM_SUCCESS, LLTM_ERROR_NO_MEMORY or LLTM_AMX_DECLINED. */
int lltm_amx_multiply(int64_t rows, int64_t columns, int64_t depth, const float* a,
                      int64_t a_row_stride, int64_t a_depth_stride, const float* b,
                      int64_t b_row_stride, int pieces, float* sums, int64_t sums_stride);

#endif /* LLTM_AMX_H */
