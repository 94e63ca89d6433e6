/* A sequence pass run at a padded state (lltm_sequence_state) over the
 * tensors of the state given: on rows of whole 16 bytes, or whole tiles,
 * cuBLAS takes its aligned kernels for every product. The pass copies what it reads into
 * padded tensors in its workspace (zeros in the units and features
 * added), runs there, and copies what it writes back into the tensors
 * given, cut to their size. The units added have zero weights, bias and
 * initial state: they stay zero and change nothing of the others, so the
 * results are bit for bit those of the pass at the padded state over
 * tensors padded by hand.
 *
 * The cells and gates a forward keeps for its backward are the exception:
 * both passes take them at the padded state, (rows, padded state) and
 * (rows, 3 x padded state), so that the backward reads them as the
 * forward wrote them.
 *
 * Both devices' packed_forward and packed_backward do this where their
 * padded state (LLTM_SIZE_PADDED) differs from their state: the copies
 * are described here once (lltm_padded_pass), and each device runs them
 * its own way (lltm_copy_on_cpu; on a GPU a kernel inside the pass's
 * graph). */
#ifndef LLTM_PADDING_H
#define LLTM_PADDING_H

#include <stdint.h>

#include "lltm_op.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tensors of packed_forward (lltm_ffi/ops/lltm/sequence.py), in order:
 * the options' address follows the workspace. */
enum lltm_forward_tensor {
  LLTM_F_INPUTS, LLTM_F_WEIGHTS, LLTM_F_BIAS, LLTM_F_H0, LLTM_F_C0, LLTM_F_BATCH_SIZES,
  LLTM_F_OUTPUTS, LLTM_F_CELLS, LLTM_F_GATES, LLTM_F_FINAL_H, LLTM_F_FINAL_CELL,
  LLTM_F_STAGING, LLTM_F_WORKSPACE, LLTM_F_OPTIONS, LLTM_F_COUNT
};
/* packed_backward's. */
enum lltm_backward_tensor {
  LLTM_B_INPUTS, LLTM_B_WEIGHTS, LLTM_B_H0, LLTM_B_BATCH_SIZES, LLTM_B_OUTPUTS, LLTM_B_CELLS,
  LLTM_B_GATES, LLTM_B_GRAD_OUTPUTS, LLTM_B_GRAD_CELLS, LLTM_B_GRAD_FINAL_H,
  LLTM_B_GRAD_FINAL_CELL, LLTM_B_D_GATES, LLTM_B_D_INPUTS, LLTM_B_D_WEIGHTS, LLTM_B_D_BIAS,
  LLTM_B_D_H0, LLTM_B_D_C0, LLTM_B_STAGING, LLTM_B_PREVIOUS, LLTM_B_WORKSPACE, LLTM_B_OPTIONS,
  LLTM_B_COUNT
};
/* The sizes: rows, steps, batch, input_features, state, reverse, the
 * padded state, then (backward) grad_outputs' and grad_cells' row and
 * column strides. */
enum { LLTM_SIZE_FEATURES = 3, LLTM_SIZE_STATE = 4, LLTM_SIZE_PADDED = 6, LLTM_B_STRIDES = 7 };
#define LLTM_FORWARD_SIZES 7
#define LLTM_BACKWARD_SIZES 11

/* dst[b][r][c] = r < src_rows && c < src_columns ? src[b][r][c] : 0 over
 * dst's batches x rows x columns, elements of the pass's dtype; strides in
 * elements, dst's columns dense. Cutting back is a copy whose source is
 * at least as large as dst. */
typedef struct {
  void* dst;
  const void* src;
  int64_t batches, rows, columns, dst_batch, dst_row;
  int64_t src_rows, src_columns, src_batch, src_row, src_column;
} lltm_copy;

#define LLTM_MOST_COPIES 12

/* A pass's padded run: its arguments at the padded state (the tensors it
 * reads and writes moved into the workspace), the copies that fill them
 * before it runs, and those that write its results back after. */
typedef struct {
  int64_t sizes[LLTM_BACKWARD_SIZES];
  void* tensors[LLTM_B_COUNT];
  lltm_args args;
  lltm_copy pads[LLTM_MOST_COPIES], cuts[LLTM_MOST_COPIES];
  int pad_count, cut_count;
} lltm_padded_pass;

/* Fills `padded` for the pass (LLTM_PASS_BACKWARD, or a forward) of
 * `given`, elements of element_bytes: where its padded state equals its
 * state, args is `given`'s and there are no copies. LLTM_SUCCESS, or
 * LLTM_ERROR_ARGUMENTS for a padded state below the state, or without a
 * workspace. */
int lltm_pad_pass(int pass, int element_bytes, const lltm_args* given, lltm_padded_pass* padded);

/* Runs `count` copies on the CPU. */
void lltm_copy_on_cpu(const lltm_copy* copies, int count, int element_bytes);

#ifdef __cplusplus
}
#endif

#endif /* LLTM_PADDING_H */
