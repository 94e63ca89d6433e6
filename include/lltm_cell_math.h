/* The LLTM cell's math, written once: one element of its forward and
 * backward passes, for the CPU passes (src/cpu/lltm_cpu_impl.h), every
 * CUDA path (lltm_cell.h includes it for the kernel files) and the
 * double-precision reference of the C check (tests/c/test_lltm_cpu.c).
 *
 *   new_cell    = old_cell + elu(candidate_pre) * sigmoid(input_pre)
 *   new_h       = tanh(new_cell) * sigmoid(output_pre)
 *   d_new_cell  = (1 - tanh(new_cell)^2) * sigmoid(output_pre) * d_h + d_cell
 *   d_input     = elu(candidate_pre) * d_new_cell * sigmoid'(input_pre)
 *   d_output    = tanh(new_cell) * d_h * sigmoid'(output_pre)
 *   d_candidate = sigmoid(input_pre) * d_new_cell * elu'(candidate_pre)
 *
 * with sigmoid'(z) = sigmoid(z) * (1 - sigmoid(z)) and the ELU's alpha 1.
 * d_new_cell is also d_old_cell, the gradient the step before receives.
 *
 * Included once per math type, with SCALAR (float or double) and SUFFIX
 * defined (as include/lltm_op.h says; CUDA C++ defines SUFFIX empty and
 * tells the two types apart by overloading), and LLTM_CELL_MATH(name):
 * the includer's function for `name` (exp, expm1, tanh, reciprocal) of a
 * SCALAR, in SCALAR. Those four are the only activations used, so each
 * includer picks their accuracy: the CUDA kernels' fast float ones
 * (lltm_cell.h, which says what they cost), the CPU passes' vectorisable
 * ones (lltm_cpu_math.h), libm's for the C check. The functions return
 * SCALAR results; a caller storing a narrower type rounds them. */
#ifndef LLTM_CELL_MATH_H
#define LLTM_CELL_MATH_H

#include "lltm_op.h"

/* Always inlined: the CPU's row loops vectorise only with the math inside. */
#ifdef __CUDACC__
#define LLTM_CELL_FUNCTION static __device__ __forceinline__
#elif defined(__GNUC__)
#define LLTM_CELL_FUNCTION static inline __attribute__((always_inline))
#else
#define LLTM_CELL_FUNCTION static inline
#endif

#endif /* LLTM_CELL_MATH_H */

LLTM_CELL_FUNCTION SCALAR LLTM_NAME(sigmoid_)(SCALAR z) {
  return LLTM_CELL_MATH(reciprocal)((SCALAR)1 + LLTM_CELL_MATH(exp)(-z));
}

/* ELU with alpha = 1; expm1 keeps its accuracy near zero. */
LLTM_CELL_FUNCTION SCALAR LLTM_NAME(elu_)(SCALAR z) {
  return z > (SCALAR)0 ? z : LLTM_CELL_MATH(expm1)(z);
}

LLTM_CELL_FUNCTION SCALAR LLTM_NAME(d_elu_)(SCALAR z) {
  return z > (SCALAR)0 ? (SCALAR)1 : LLTM_CELL_MATH(exp)(z);
}

/* One element of the forward pass: new_h and new_cell from the three gate
 * pre-activations and old_cell. */
LLTM_CELL_FUNCTION void LLTM_NAME(cell_forward_)(SCALAR input_pre, SCALAR output_pre,
                                                 SCALAR candidate_pre, SCALAR old_cell,
                                                 SCALAR* new_h, SCALAR* new_cell) {
  const SCALAR cell = old_cell + LLTM_NAME(elu_)(candidate_pre) * LLTM_NAME(sigmoid_)(input_pre);
  *new_cell = cell;
  *new_h = LLTM_CELL_MATH(tanh)(cell) * LLTM_NAME(sigmoid_)(output_pre);
}

/* One element of the backward pass: d_old_cell and the three gates'
 * gradients from the element's output gradients (d_h, d_cell), the
 * new_cell of its forward pass and its gate pre-activations. */
LLTM_CELL_FUNCTION void LLTM_NAME(cell_backward_)(SCALAR d_h, SCALAR d_cell, SCALAR new_cell,
                                                  SCALAR input_pre, SCALAR output_pre,
                                                  SCALAR candidate_pre, SCALAR* d_old_cell,
                                                  SCALAR* d_input, SCALAR* d_output,
                                                  SCALAR* d_candidate) {
  const SCALAR input_gate = LLTM_NAME(sigmoid_)(input_pre);
  const SCALAR output_gate = LLTM_NAME(sigmoid_)(output_pre);
  const SCALAR tanh_new_cell = LLTM_CELL_MATH(tanh)(new_cell);
  const SCALAR d_new_cell =
      ((SCALAR)1 - tanh_new_cell * tanh_new_cell) * output_gate * d_h + d_cell;
  *d_old_cell = d_new_cell;
  *d_input = LLTM_NAME(elu_)(candidate_pre) * d_new_cell * input_gate * ((SCALAR)1 - input_gate);
  *d_output = tanh_new_cell * d_h * output_gate * ((SCALAR)1 - output_gate);
  *d_candidate = input_gate * d_new_cell * LLTM_NAME(d_elu_)(candidate_pre);
}
