/* embed's CPU passes for one element type: embed_cpu.c includes this file
 * through lltm_each_dtype.h, once per type, with STORAGE (the tensors'
 * element type), SCALAR (the type computed in), SUFFIX, LOAD and STORE
 * defined. Each pass takes the arguments of its launcher in embed_kernel.cu,
 * in the same order, without the stream, and skips an index outside the
 * rows as the kernels do. */

/* output[n, d] = weight[indices[n], d] (+ bias[d]), across OpenMP threads
 * where the work pays for them. */
static int LLTM_NAME(embed_forward_)(int64_t index_count, int64_t columns, int64_t rows,
                                     const STORAGE* weight, const int64_t* indices,
                                     const STORAGE* bias, STORAGE* output) {
  LLTM_FOR_EACH(n, index_count, index_count * columns, {
    const int64_t row = indices[n];
    const int inside = row >= 0 && row < rows;
    for (int64_t column = 0; column < columns; ++column) {
      SCALAR value = inside ? LOAD(weight[row * columns + column]) : (SCALAR)0;
      if (bias) value += LOAD(bias[column]);
      output[n * columns + column] = STORE(value);
    }
  });
  return LLTM_SUCCESS;
}

/* grad_weight[indices[n], d] += grad_output[n, d] into grad_weight (zeros,
 * in SCALAR), one index after another on one thread: the same sums, in the
 * same order, on every run. */
static int LLTM_NAME(embed_backward_)(int64_t index_count, int64_t columns, int64_t rows,
                                      const STORAGE* grad_output, const int64_t* indices,
                                      SCALAR* grad_weight) {
  for (int64_t n = 0; n < index_count; ++n) {
    const int64_t row = indices[n];
    if (row < 0 || row >= rows) continue;
    for (int64_t column = 0; column < columns; ++column) {
      grad_weight[row * columns + column] += LOAD(grad_output[n * columns + column]);
    }
  }
  return LLTM_SUCCESS;
}
