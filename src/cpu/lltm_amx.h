/* Matrix products on AMX, the tile unit of Intel's Xeons since Sapphire
 * Rapids, for the CPU passes of the 16-bit types (lltm_cpu_impl.h): the
 * factors are the passes' bfloat16 or float16 tensors, the sums float.
 *
 * A tile product multiplies bfloat16 factors and sums in float. The product
 * of two bfloat16s is exact in float, so a product of bfloat16 tensors is
 * float's product of them, but for the order of the sums. A float16 holds
 * 11 significant bits: two bfloat16s hold it exactly (its top 8 bits, and
 * the rest), and each product of two takes the four products of their
 * pieces, each exact, so that again only the order of the sums differs.
 * The tiles count bfloat16's subnormals (below 2^-126) as zero, and sums
 * that fall there too: no float16 lies there, and bfloat16 values there are
 * no LLTM's.
 *
 * Where the CPU has no AMX but AVX512-BF16 (AMD's Zen 4, say), the same
 * packed factors go through its dot products (vdpbf16ps), which multiply
 * and sum as a tile product does, 16 columns a vector.
 *
 * The AMX and AVX512-BF16 code is compiled for its own target only
 * (attributes, not the build's flags), and runs only where
 * lltm_amx_usable (lltm_ffi.h) says the CPU has one of them (and Linux let
 * this process use AMX): the module stays portable. */
#ifndef LLTM_AMX_H
#define LLTM_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "lltm_op.h"

/* A factor packed into the tiles' layout: `count` rows of the left factor
 * or columns of the right one, over `depth`. `finite` is 0 where a float16
 * factor holds inf or NaN, whose pieces' products (inf times a zero piece)
 * would not be the value's: such a product is no tile product's. Start
 * from {0}; packing again reuses the memory; lltm_amx_free frees it. */
typedef struct {
  int64_t count, depth;
  int dtype; /* LLTM_BFLOAT16 or LLTM_FLOAT16 */
  int finite;
  int64_t packed_depth; /* depth times the pieces a value takes, squared, in whole tiles */
  uint16_t* tiles;
  size_t capacity; /* bfloat16s */
} lltm_amx_factor;

/* The right factor b (depth x columns) of dtype's bits, element (k, j) at
 * b[k * row_stride + j * column_stride], one of the strides 1, into
 * *packed. LLTM_SUCCESS, LLTM_ERROR_NO_MEMORY, or LLTM_ERROR_ARGUMENTS where
 * neither stride is 1. */
int lltm_amx_pack_right(int dtype, int64_t depth, int64_t columns, const uint16_t* b,
                        int64_t row_stride, int64_t column_stride, lltm_amx_factor* packed);

/* What lltm_amx_multiply returns where a factor is not finite: nothing is
 * done, and the product is the caller's to take another way. */
#define LLTM_AMX_DECLINED 1

/* What lltm_amx_multiply calls, where given, for each run of the sums it
 * computes (rows first_row to first_row + rows by columns first_column to
 * first_column + columns), on the thread that computed them, after them:
 * `sums` holds the run's (row stride sums_stride), its first at (first_row,
 * first_column). They lie in the product's sums, or, where then takes
 * them, in memory of the thread's own, for then only. */
typedef void (*lltm_amx_then)(void* context, const float* sums, int64_t sums_stride,
                              int64_t first_row, int64_t rows, int64_t first_column,
                              int64_t columns);

/* sums (rows x right's columns, row stride sums_stride) = a times right,
 * a (rows x right's depth, of right's dtype) with element (i, k) at
 * a[i * row_stride + k * depth_stride], one of the strides 1, packed into
 * *left on the way; then `then` (may be NULL) for each run of them, which
 * may leave the sums themselves unwritten: where
 * lltm_amx_then_takes_every_run(right), `then` takes every run from the
 * threads' own memory, and sums may be NULL. LLTM_SUCCESS,
 * LLTM_ERROR_NO_MEMORY, LLTM_ERROR_ARGUMENTS (neither stride 1) or
 * LLTM_AMX_DECLINED. Only where lltm_amx_usable. */
int lltm_amx_multiply(int64_t rows, const uint16_t* a, int64_t row_stride, int64_t depth_stride,
                      const lltm_amx_factor* right, lltm_amx_factor* left, float* sums,
                      int64_t sums_stride, lltm_amx_then then, void* context);
int lltm_amx_then_takes_every_run(const lltm_amx_factor* right);

/* The rows and columns of a block of sums. */
#define LLTM_AMX_BLOCK 32
/* The rows of a tile: a block of this many rows or fewer takes one tile's
 * products, not two. */
#define LLTM_AMX_TILE_ROWS 16

/* lltm_amx_multiply in two halves, for a caller that shares a product's
 * blocks among its own threads: a packed into *left by the team of the
 * product's `work` (LLTM_SUCCESS, LLTM_ERROR_NO_MEMORY, LLTM_ERROR_ARGUMENTS
 * or LLTM_AMX_DECLINED); then any block of the sums, on the calling
 * thread: rows first_row to first_row + rows by columns first_column to
 * first_column + columns, each first a multiple of LLTM_AMX_BLOCK, at
 * sums[i * stride + j] for the whole product's (i, j). lltm_amx_work is
 * the work of a product of `rows` rows by `columns` columns of right's
 * depth, in elements of pointwise math (lltm_team_size). */
int lltm_amx_pack_left(int64_t rows, const uint16_t* a, int64_t row_stride,
                       int64_t depth_stride, const lltm_amx_factor* right, int64_t work,
                       lltm_amx_factor* left);
/* Room in *left for `rows` rows of a left factor of right's, so that
 * lltm_amx_pack_left of as many rows or fewer with work 0 (on the calling
 * thread) asks for no memory: LLTM_SUCCESS or LLTM_ERROR_NO_MEMORY. */
int lltm_amx_reserve_left(int64_t rows, const lltm_amx_factor* right, lltm_amx_factor* left);
void lltm_amx_block_sums(const lltm_amx_factor* left, const lltm_amx_factor* right,
                         int64_t first_row, int64_t rows, int64_t first_column, int64_t columns,
                         float* sums, int64_t stride);
int64_t lltm_amx_work(int64_t rows, int64_t columns, const lltm_amx_factor* right);

/* What multiplies a product of `rows` rows of dtype's: "amx" (AMX's
 * tiles) or "avx512-bf16" (AVX512-BF16's dot products). Only where
 * lltm_amx_usable. */
const char* lltm_amx_tiles_name(int dtype, int64_t rows);

void lltm_amx_free(lltm_amx_factor* packed);

#endif /* LLTM_AMX_H */
