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

/* The whole-sequence layer's passes, step by step as the step-by-step
 * kernels of sequence_kernel.cu; lltm_ffi.h describes the arguments. d_h0
 * doubles as the gradient reaching each h_t. */
static int LLTM_NAME(sequence_forward_)(int64_t steps, int64_t batch_size, int64_t state_size,
                                        int64_t weights_row_stride, const SCALAR* projected,
                                        const SCALAR* weights, const SCALAR* h0, const SCALAR* c0,
                                        SCALAR* outputs, SCALAR* cells, SCALAR* gates) {
  /* The hidden weights transposed, (state, 3 * state), so that each step's
   * product runs along contiguous rows, as the backward pass's does. */
  const int64_t gates_size = 3 * state_size;
  SCALAR* transposed = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(gates_size * state_size));
  if (!transposed) return LLTM_ERROR_NO_MEMORY;
  for (int64_t r = 0; r < gates_size; ++r) {
    for (int64_t k = 0; k < state_size; ++k) {
      transposed[k * gates_size + r] = weights[r * weights_row_stride + k];
    }
  }
  const int64_t step = batch_size * state_size;
  for (int64_t t = 0; t < steps; ++t) {
    const SCALAR* old_h = t ? outputs + (t - 1) * step : h0;
    const SCALAR* old_cell = t ? cells + (t - 1) * step : c0;
    SCALAR* gates_t = gates + t * 3 * step;
    LLTM_NAME(rows_times_matrix_)(batch_size, gates_size, state_size, old_h, transposed,
                                  gates_size, projected + t * 3 * step, gates_t);
    LLTM_NAME(forward_)(batch_size, state_size, gates_t, old_cell, outputs + t * step,
                        cells + t * step);
  }
  free(transposed);
  return LLTM_SUCCESS;
}

static int LLTM_NAME(sequence_backward_)(int64_t steps, int64_t batch_size, int64_t state_size,
                                         int64_t weights_row_stride, const SCALAR* weights,
                                         const SCALAR* grad_outputs, const SCALAR* grad_cells,
                                         const SCALAR* cells, const SCALAR* gates,
                                         SCALAR* d_gates, SCALAR* d_h0, SCALAR* d_c0) {
  const int64_t step = batch_size * state_size;
  const int64_t dense[4] = {state_size, 1, state_size, 1};
  for (int64_t t = steps - 1; t >= 0; --t) {
    if (t + 1 < steps) {
      LLTM_NAME(rows_times_matrix_)(batch_size, state_size, 3 * state_size,
                                    d_gates + (t + 1) * 3 * step, weights, weights_row_stride,
                                    grad_outputs + t * step, d_h0);
      for (int64_t i = 0; i < step; ++i) d_c0[i] += grad_cells[t * step + i];
    } else {
      memcpy(d_h0, grad_outputs + t * step, (size_t)step * sizeof(SCALAR));
      memcpy(d_c0, grad_cells + t * step, (size_t)step * sizeof(SCALAR));
    }
    LLTM_NAME(backward_)(batch_size, state_size, dense, d_h0, d_c0, cells + t * step,
                         gates + t * 3 * step, d_c0, d_gates + t * 3 * step);
  }
  LLTM_NAME(rows_times_matrix_)(batch_size, state_size, 3 * state_size, d_gates, weights,
                                weights_row_stride, NULL, d_h0);
  return LLTM_SUCCESS;
}

#undef LLTM_NAME
#undef LLTM_CONCAT
#undef LLTM_CONCAT_
