/* The CPU passes, written once for both element types: lltm_cpu.c includes
 * this file twice, with SCALAR (float or double) and SUFFIX defined, after
 * defining exp_SUFFIX, expm1_SUFFIX and tanh_SUFFIX for that type, so each
 * type computes in its own precision. */

#define LLTM_CONCAT_(a, b) a##b
#define LLTM_CONCAT(a, b) LLTM_CONCAT_(a, b)
#define LLTM_NAME(name) LLTM_CONCAT(name, SUFFIX)

static inline SCALAR LLTM_NAME(sigmoid_)(SCALAR z) {
  return (SCALAR)1 / ((SCALAR)1 + LLTM_NAME(exp_)(-z));
}

/* ELU with alpha = 1. */
static inline SCALAR LLTM_NAME(elu_)(SCALAR z) {
  return z > (SCALAR)0 ? z : LLTM_NAME(expm1_)(z);
}

static inline SCALAR LLTM_NAME(d_elu_)(SCALAR z) {
  return z > (SCALAR)0 ? (SCALAR)1 : LLTM_NAME(exp_)(z);
}

LLTM_VECTOR_CLONES
static void LLTM_NAME(forward_row_)(int64_t state_size, const SCALAR* gate_row,
                                    const SCALAR* old_cell, SCALAR* new_h,
                                    SCALAR* new_cell) {
#pragma omp simd
  for (int64_t column = 0; column < state_size; ++column) {
    const SCALAR input_gate = LLTM_NAME(sigmoid_)(gate_row[column]);
    const SCALAR output_gate = LLTM_NAME(sigmoid_)(gate_row[state_size + column]);
    const SCALAR candidate_cell = LLTM_NAME(elu_)(gate_row[2 * state_size + column]);
    const SCALAR cell = old_cell[column] + candidate_cell * input_gate;
    new_cell[column] = cell;
    new_h[column] = LLTM_NAME(tanh_)(cell) * output_gate;
  }
}

static int LLTM_NAME(forward_)(int64_t batch_size, int64_t state_size, const SCALAR* gates,
                              const SCALAR* old_cell, SCALAR* new_h, SCALAR* new_cell) {
  LLTM_FOR_EACH_ROW(row, batch_size, batch_size * state_size, {
    const int64_t offset = row * state_size;
    LLTM_NAME(forward_row_)(state_size, gates + 3 * offset, old_cell + offset,
                            new_h + offset, new_cell + offset);
  });
  return LLTM_SUCCESS;
}

/* One element of the backward pass; grad_h and grad_cell are this element's
 * output gradients. */
static inline void LLTM_NAME(backward_element_)(
    SCALAR grad_h, SCALAR grad_cell, SCALAR new_cell, SCALAR input_pre, SCALAR output_pre,
    SCALAR candidate_pre, SCALAR* d_old_cell, SCALAR* d_input_gate, SCALAR* d_output_gate,
    SCALAR* d_candidate_cell) {
  const SCALAR input_gate = LLTM_NAME(sigmoid_)(input_pre);
  const SCALAR output_gate = LLTM_NAME(sigmoid_)(output_pre);
  const SCALAR candidate_cell = LLTM_NAME(elu_)(candidate_pre);
  const SCALAR tanh_new_cell = LLTM_NAME(tanh_)(new_cell);
  const SCALAR d_new_cell =
      ((SCALAR)1 - tanh_new_cell * tanh_new_cell) * output_gate * grad_h + grad_cell;
  *d_old_cell = d_new_cell;
  *d_input_gate = candidate_cell * d_new_cell * input_gate * ((SCALAR)1 - input_gate);
  *d_output_gate = tanh_new_cell * grad_h * output_gate * ((SCALAR)1 - output_gate);
  *d_candidate_cell = input_gate * d_new_cell * LLTM_NAME(d_elu_)(candidate_pre);
}

/* grad_h and grad_cell step by their column strides; the loop is versioned
 * for the dense case (stride 1), which vectorises without gathers. */
LLTM_VECTOR_CLONES
static void LLTM_NAME(backward_row_)(int64_t state_size, const SCALAR* grad_h,
                                     int64_t grad_h_column_stride, const SCALAR* grad_cell,
                                     int64_t grad_cell_column_stride, const SCALAR* new_cell,
                                     const SCALAR* gate_row, SCALAR* d_old_cell,
                                     SCALAR* d_gate_row) {
  if (grad_h_column_stride == 1 && grad_cell_column_stride == 1) {
#pragma omp simd
    for (int64_t column = 0; column < state_size; ++column) {
      LLTM_NAME(backward_element_)(
          grad_h[column], grad_cell[column], new_cell[column], gate_row[column],
          gate_row[state_size + column], gate_row[2 * state_size + column], &d_old_cell[column],
          &d_gate_row[column], &d_gate_row[state_size + column],
          &d_gate_row[2 * state_size + column]);
    }
  } else {
#pragma omp simd
    for (int64_t column = 0; column < state_size; ++column) {
      LLTM_NAME(backward_element_)(
          grad_h[column * grad_h_column_stride], grad_cell[column * grad_cell_column_stride],
          new_cell[column], gate_row[column], gate_row[state_size + column],
          gate_row[2 * state_size + column], &d_old_cell[column], &d_gate_row[column],
          &d_gate_row[state_size + column], &d_gate_row[2 * state_size + column]);
    }
  }
}

/* grad_strides: grad_h's row and column strides, then grad_cell's, in elements. */
static int LLTM_NAME(backward_)(int64_t batch_size, int64_t state_size,
                               const int64_t* grad_strides, const SCALAR* grad_h,
                               const SCALAR* grad_cell, const SCALAR* new_cell,
                               const SCALAR* gates, SCALAR* d_old_cell, SCALAR* d_gates) {
  LLTM_FOR_EACH_ROW(row, batch_size, batch_size * state_size, {
    const int64_t offset = row * state_size;
    LLTM_NAME(backward_row_)(state_size, grad_h + row * grad_strides[0], grad_strides[1],
                             grad_cell + row * grad_strides[2], grad_strides[3],
                             new_cell + offset, gates + 3 * offset, d_old_cell + offset,
                             d_gates + 3 * offset);
  });
  return LLTM_SUCCESS;
}

/* out[j] = base[j] + sum_r a[r] * weights[r, j], for the `depth` rows of
 * weights and `columns` of its columns, along weights' contiguous rows;
 * base may be NULL (zero). */
LLTM_VECTOR_CLONES
static void LLTM_NAME(row_times_matrix_)(int64_t columns, int64_t depth, const SCALAR* a,
                                         const SCALAR* weights, int64_t weights_row_stride,
                                         const SCALAR* base, SCALAR* out) {
  for (int64_t j = 0; j < columns; ++j) out[j] = base ? base[j] : 0;
  int64_t r = 0;
  /* Four rows at a time: a quarter of the loads and stores of out. */
  for (; r + 4 <= depth; r += 4) {
    const SCALAR a0 = a[r], a1 = a[r + 1], a2 = a[r + 2], a3 = a[r + 3];
    const SCALAR* w0 = weights + r * weights_row_stride;
    const SCALAR* w1 = w0 + weights_row_stride;
    const SCALAR* w2 = w1 + weights_row_stride;
    const SCALAR* w3 = w2 + weights_row_stride;
#pragma omp simd
    for (int64_t j = 0; j < columns; ++j) {
      out[j] += a0 * w0[j] + a1 * w1[j] + a2 * w2[j] + a3 * w3[j];
    }
  }
  for (; r < depth; ++r) {
    const SCALAR factor = a[r];
    const SCALAR* w = weights + r * weights_row_stride;
#pragma omp simd
    for (int64_t j = 0; j < columns; ++j) out[j] += factor * w[j];
  }
}

/* row_times_matrix_ for every batch row. The threading threshold counts
 * sixteen multiply-adds as one element of a pointwise pass. */
static void LLTM_NAME(rows_times_matrix_)(int64_t batch_size, int64_t columns, int64_t depth,
                                          const SCALAR* a, const SCALAR* weights,
                                          int64_t weights_row_stride, const SCALAR* base,
                                          SCALAR* out) {
  LLTM_FOR_EACH_ROW(b, batch_size, batch_size * columns * depth / 16, {
    LLTM_NAME(row_times_matrix_)(columns, depth, a + b * depth, weights, weights_row_stride,
                                 base ? base + b * columns : NULL, out + b * columns);
  });
}

/* The transpose (columns, rows) of a (rows, columns) matrix with row
 * stride `stride`, in memory of its own (NULL where none can be had). */
static SCALAR* LLTM_NAME(transposed_)(int64_t rows, int64_t columns, const SCALAR* matrix,
                                      int64_t stride) {
  SCALAR* result = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(rows * columns + 1));
  if (!result) return NULL;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < columns; ++k) result[k * rows + r] = matrix[r * stride + k];
  }
  return result;
}

/* The whole-sequence layer's passes, step by step as the step-by-step
 * kernels of sequence_kernel.cu; lltm_ffi.h describes the arguments. */
static int LLTM_NAME(sequence_forward_)(int64_t steps, int64_t batch_size, int64_t input_features,
                                        int64_t state_size, const SCALAR* inputs,
                                        const SCALAR* weights, const SCALAR* bias,
                                        const SCALAR* h0, const SCALAR* c0, SCALAR* outputs,
                                        SCALAR* cells, SCALAR* gates) {
  /* The weights transposed, (state + input_features, 3 * state), so that
   * every product runs along contiguous rows, as the backward pass's do:
   * rows below state_size are the hidden weights, the rest the input ones. */
  const int64_t gates_size = 3 * state_size;
  SCALAR* transposed = LLTM_NAME(transposed_)(gates_size, state_size + input_features, weights,
                                              state_size + input_features);
  if (!transposed) return LLTM_ERROR_NO_MEMORY;
  /* Every step's input part of its gates, and the bias, before the loop. */
  const int64_t rows = steps * batch_size;
  LLTM_FOR_EACH_ROW(row, rows, rows * gates_size * input_features / 16, {
    LLTM_NAME(row_times_matrix_)(gates_size, input_features, inputs + row * input_features,
                                 transposed + state_size * gates_size, gates_size, bias,
                                 gates + row * gates_size);
  });
  const int64_t step = batch_size * state_size;
  for (int64_t t = 0; t < steps; ++t) {
    const SCALAR* old_h = t ? outputs + (t - 1) * step : h0;
    const SCALAR* old_cell = t ? cells + (t - 1) * step : c0;
    SCALAR* gates_t = gates + t * 3 * step;
    LLTM_NAME(rows_times_matrix_)(batch_size, gates_size, state_size, old_h, transposed,
                                  gates_size, gates_t, gates_t);
    LLTM_NAME(forward_)(batch_size, state_size, gates_t, old_cell, outputs + t * step,
                        cells + t * step);
  }
  free(transposed);
  return LLTM_SUCCESS;
}

/* dst (dense rows x columns) = src (row and column strides `strides`), or
 * += src where `accumulate`; src NULL counts as zeros. */
static void LLTM_NAME(take_strided_)(int64_t rows, int64_t columns, const SCALAR* src,
                                     const int64_t* strides, int accumulate, SCALAR* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    SCALAR* row = dst + r * columns;
    for (int64_t c = 0; c < columns; ++c) {
      const SCALAR value = src ? src[r * strides[0] + c * strides[1]] : (SCALAR)0;
      row[c] = accumulate ? row[c] + value : value;
    }
  }
}

/* rows (count of them, at most LLTM_WEIGHT_BLOCK, `columns` apart) += the
 * outer products a[k * a_stride + i] * b_k over the `depth` rows b_k of b
 * (length `length`, row stride `stride`): one pass over b for the whole
 * block of rows. */
#ifndef LLTM_WEIGHT_BLOCK
#define LLTM_WEIGHT_BLOCK 8
#endif
LLTM_VECTOR_CLONES
static void LLTM_NAME(accumulate_outer_)(int count, int64_t depth, const SCALAR* a,
                                         int64_t a_stride, const SCALAR* b, int64_t stride,
                                         int64_t length, SCALAR* rows, int64_t columns) {
  for (int64_t k = 0; k < depth; ++k) {
    const SCALAR* b_row = b + k * stride;
    for (int i = 0; i < count; ++i) {
      const SCALAR factor = a[k * a_stride + i];
      SCALAR* row = rows + i * columns;
#pragma omp simd
      for (int64_t j = 0; j < length; ++j) row[j] += factor * b_row[j];
    }
  }
}

/* d_weights (3 * state, state + input_features) from the gate gradients
 * (steps * batch, 3 * state): row r sums d_gates[., r] times each step's
 * [h_{t-1}, x_t], h_{-1} being h0. Blocks of LLTM_WEIGHT_BLOCK rows, each
 * block one pass over the states and inputs. */
static void LLTM_NAME(weight_grads_)(int64_t steps, int64_t batch_size, int64_t input_features,
                                     int64_t state_size, const SCALAR* d_gates,
                                     const SCALAR* inputs, const SCALAR* h0,
                                     const SCALAR* outputs, SCALAR* d_weights) {
  const int64_t rows = steps * batch_size, columns = state_size + input_features;
  const int64_t gates_size = 3 * state_size;
  const int64_t blocks = (gates_size + LLTM_WEIGHT_BLOCK - 1) / LLTM_WEIGHT_BLOCK;
  LLTM_FOR_EACH_ROW(block, blocks, gates_size * rows * columns / 16, {
    const int64_t r0 = block * LLTM_WEIGHT_BLOCK;
    const int count = (int)(gates_size - r0 < LLTM_WEIGHT_BLOCK ? gates_size - r0
                                                                 : LLTM_WEIGHT_BLOCK);
    SCALAR* d_rows = d_weights + r0 * columns;
    memset(d_rows, 0, sizeof(SCALAR) * (size_t)(count * columns));
    LLTM_NAME(accumulate_outer_)(count, batch_size, d_gates + r0, gates_size, h0, state_size,
                                 state_size, d_rows, columns);
    LLTM_NAME(accumulate_outer_)(count, rows - batch_size, d_gates + batch_size * gates_size + r0,
                                 gates_size, outputs, state_size, state_size, d_rows, columns);
    LLTM_NAME(accumulate_outer_)(count, rows, d_gates + r0, gates_size, inputs, input_features,
                                 input_features, d_rows + state_size, columns);
  });
}

/* d_bias: the column sums of the gate gradients (rows, 3 * state). */
LLTM_VECTOR_CLONES
static void LLTM_NAME(column_sums_)(int64_t rows, int64_t columns, const SCALAR* matrix,
                                    SCALAR* sums) {
  for (int64_t j = 0; j < columns; ++j) sums[j] = 0;
  for (int64_t k = 0; k < rows; ++k) {
    const SCALAR* row = matrix + k * columns;
#pragma omp simd
    for (int64_t j = 0; j < columns; ++j) sums[j] += row[j];
  }
}

/* d_h0 doubles as the gradient reaching each h_t, d_c0 as that reaching
 * each c_t; a single step given neither (not wanted) uses scratch space. */
static int LLTM_NAME(sequence_backward_)(
    int64_t steps, int64_t batch_size, int64_t input_features, int64_t state_size,
    const int64_t* grad_strides, const SCALAR* inputs, const SCALAR* weights, const SCALAR* h0,
    const SCALAR* outputs, const SCALAR* cells, const SCALAR* gates, const SCALAR* grad_outputs,
    const SCALAR* grad_cells, SCALAR* d_gates, SCALAR* d_inputs, SCALAR* d_weights,
    SCALAR* d_bias, SCALAR* d_h0, SCALAR* d_c0) {
  const int64_t step = batch_size * state_size, gates_size = 3 * state_size;
  const int64_t columns = state_size + input_features, rows = steps * batch_size;
  const int64_t dense[4] = {state_size, 1, state_size, 1};
  const int wants_d_h0 = d_h0 != NULL;
  SCALAR* scratch = NULL;
  if (!d_h0 || !d_c0) {
    scratch = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(2 * step + 1));
    if (!scratch) return LLTM_ERROR_NO_MEMORY;
    if (!d_h0) d_h0 = scratch;
    if (!d_c0) d_c0 = scratch + step;
  }
  for (int64_t t = steps - 1; t >= 0; --t) {
    const SCALAR* grad_output = grad_outputs ? grad_outputs + t * grad_strides[0] : NULL;
    const SCALAR* grad_cell = grad_cells ? grad_cells + t * grad_strides[3] : NULL;
    const int carried = t + 1 < steps;
    if (carried) {
      LLTM_NAME(rows_times_matrix_)(batch_size, state_size, gates_size,
                                    d_gates + (t + 1) * 3 * step, weights, columns, NULL, d_h0);
    }
    LLTM_NAME(take_strided_)(batch_size, state_size, grad_output, grad_strides + 1, carried,
                             d_h0);
    LLTM_NAME(take_strided_)(batch_size, state_size, grad_cell, grad_strides + 4, carried, d_c0);
    LLTM_NAME(backward_)(batch_size, state_size, dense, d_h0, d_c0, cells + t * step,
                         gates + t * 3 * step, d_c0, d_gates + t * 3 * step);
  }
  if (wants_d_h0) {
    LLTM_NAME(rows_times_matrix_)(batch_size, state_size, gates_size, d_gates, weights, columns,
                                  NULL, d_h0);
  }
  free(scratch);
  if (d_inputs) {
    LLTM_NAME(rows_times_matrix_)(rows, input_features, gates_size, d_gates,
                                  weights + state_size, columns, NULL, d_inputs);
  }
  if (d_weights) {
    LLTM_NAME(weight_grads_)(steps, batch_size, input_features, state_size, d_gates, inputs, h0,
                             outputs, d_weights);
  }
  if (d_bias) LLTM_NAME(column_sums_)(rows, gates_size, d_gates, d_bias);
  return LLTM_SUCCESS;
}

#undef LLTM_NAME
#undef LLTM_CONCAT
#undef LLTM_CONCAT_
