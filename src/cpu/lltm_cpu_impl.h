/* The CPU passes, written once for every element type: lltm_cpu_<type>.c
 * includes this file for its type, with SUFFIX (the family: float, double, float16,
 * bfloat16), STORAGE (what the tensors hold: float, double, lltm_float16,
 * lltm_bfloat16), SCALAR (what the math runs in: float for the 16-bit types)
 * and LOAD(x) and STORE(x) (a STORAGE element to SCALAR and back; nothing
 * for float and double) defined, and for the 16-bit types AMX_DTYPE (their
 * lltm_dtype: their products may run on AMX, lltm_amx.h), after defining
 * exp_SCALAR, expm1_SCALAR, tanh_SCALAR and reciprocal_SCALAR (the
 * activations of the cell's math, lltm_cell_math.h, which the CUDA paths
 * share). It undefines those parameters at its end, ready for the next type.
 *
 * The 16-bit types round where their tensors hold a value: each result, and
 * whatever a pass keeps in a tensor between steps (each step's h, cell and
 * gates, the gate gradients, the gradients carried to the step before, in
 * d_h0 and d_c0), as a loop of the cell over tensors of that type would.
 * All else is SCALAR: the cell's math; the products' factors, converted
 * once for all the products that read them (on AMX, read as the tensors
 * hold them, each product of two exact in float); and the products' sums,
 * each rounded once, whatever its depth. Where a tensor holds a step's
 * value in two parts (the gates' input, then hidden products; the gradient
 * reaching h or the cell, then the step's own) it is rounded after each.
 *
 * Here: the cell's rows, the plan (products_plan_) and the passes' entry
 * points; the matrix products in lltm_cpu_products.h, the forward pass in
 * lltm_cpu_forward.h, the backward pass in lltm_cpu_backward.h. */

#ifndef LLTM_MATH
#define LLTM_MATH(name) LLTM_CONCAT(name, SCALAR)
/* The cell's activations: exp_float, ..., reciprocal_double (lltm_cpu_math.h). */
#define LLTM_CELL_MATH(name) LLTM_MATH(name##_)
/* Whether tensors hold a narrower type than the math (the 16-bit types). */
#define LLTM_NARROW_STORAGE (sizeof(STORAGE) < sizeof(SCALAR))
#endif

/* The cell's element, forward and backward, in SCALAR. */
#include "lltm_cell_math.h"

/* One element of the forward pass (lltm_cell_math.h), its results rounded
 * as the tensors hold them. */
static LLTM_ALWAYS_INLINE void LLTM_NAME(forward_element_)(SCALAR input_pre, SCALAR output_pre,
                                                           SCALAR candidate_pre, SCALAR old_cell,
                                                           STORAGE* new_h, STORAGE* new_cell) {
  SCALAR h, cell;
  LLTM_NAME(cell_forward_)(input_pre, output_pre, candidate_pre, old_cell, &h, &cell);
  *new_cell = STORE(cell);
  *new_h = STORE(h);
}

/* `columns` elements of one batch row; a gate's pre-activations are
 * gate_stride after the one before (the state size). */
LLTM_VECTOR_CLONES
static void LLTM_NAME(forward_row_)(int64_t columns, int64_t gate_stride, const STORAGE* gate_row,
                                    const STORAGE* old_cell, STORAGE* new_h,
                                    STORAGE* new_cell) {
#pragma omp simd
  for (int64_t column = 0; column < columns; ++column) {
    LLTM_NAME(forward_element_)(LOAD(gate_row[column]), LOAD(gate_row[gate_stride + column]),
                                LOAD(gate_row[2 * gate_stride + column]), LOAD(old_cell[column]),
                                &new_h[column], &new_cell[column]);
  }
}

/* forward_row_ after adding `sums` (laid out as gate_row) to the row's
 * pre-activations, each rounded as the gates hold it. */
LLTM_VECTOR_CLONES
static void LLTM_NAME(forward_sums_row_)(int64_t columns, int64_t gate_stride,
                                         const SCALAR* sums, STORAGE* gate_row,
                                         const STORAGE* old_cell, STORAGE* new_h,
                                         STORAGE* new_cell) {
  STORAGE* output_row = gate_row + gate_stride;
  STORAGE* candidate_row = gate_row + 2 * gate_stride;
  const SCALAR* output_sums = sums + gate_stride;
  const SCALAR* candidate_sums = sums + 2 * gate_stride;
#pragma omp simd
  for (int64_t column = 0; column < columns; ++column) {
    gate_row[column] = STORE(LOAD(gate_row[column]) + sums[column]);
    output_row[column] = STORE(LOAD(output_row[column]) + output_sums[column]);
    candidate_row[column] = STORE(LOAD(candidate_row[column]) + candidate_sums[column]);
    LLTM_NAME(forward_element_)(LOAD(gate_row[column]), LOAD(output_row[column]),
                                LOAD(candidate_row[column]), LOAD(old_cell[column]),
                                &new_h[column], &new_cell[column]);
  }
}

static int LLTM_NAME(forward_)(int64_t batch_size, int64_t state_size, const STORAGE* gates,
                              const STORAGE* old_cell, STORAGE* new_h, STORAGE* new_cell) {
  LLTM_FOR_EACH(row, batch_size, batch_size * state_size, {
    const int64_t offset = row * state_size;
    LLTM_NAME(forward_row_)(state_size, state_size, gates + 3 * offset, old_cell + offset,
                            new_h + offset, new_cell + offset);
  });
  return LLTM_SUCCESS;
}

/* One element of the backward pass (lltm_cell_math.h), its results
 * rounded as the tensors hold them; grad_h and grad_cell are this
 * element's output gradients. */
static LLTM_ALWAYS_INLINE void LLTM_NAME(backward_element_)(
    SCALAR grad_h, SCALAR grad_cell, SCALAR new_cell, SCALAR input_pre, SCALAR output_pre,
    SCALAR candidate_pre, STORAGE* d_old_cell, STORAGE* d_input_gate, STORAGE* d_output_gate,
    STORAGE* d_candidate_cell) {
  SCALAR d_cell, d_input, d_output, d_candidate;
  LLTM_NAME(cell_backward_)(grad_h, grad_cell, new_cell, input_pre, output_pre, candidate_pre,
                            &d_cell, &d_input, &d_output, &d_candidate);
  *d_old_cell = STORE(d_cell);
  *d_input_gate = STORE(d_input);
  *d_output_gate = STORE(d_output);
  *d_candidate_cell = STORE(d_candidate);
}

/* As forward_row_, backwards. grad_h and grad_cell step by their column
 * strides; the loop is versioned for the dense case (stride 1), which
 * vectorises without gathers. */
LLTM_VECTOR_CLONES
static void LLTM_NAME(backward_row_)(int64_t columns, int64_t gate_stride, const STORAGE* grad_h,
                                     int64_t grad_h_column_stride, const STORAGE* grad_cell,
                                     int64_t grad_cell_column_stride, const STORAGE* new_cell,
                                     const STORAGE* gate_row, STORAGE* d_old_cell,
                                     STORAGE* d_gate_row) {
  if (grad_h_column_stride == 1 && grad_cell_column_stride == 1) {
#pragma omp simd
    for (int64_t column = 0; column < columns; ++column) {
      LLTM_NAME(backward_element_)(
          LOAD(grad_h[column]), LOAD(grad_cell[column]), LOAD(new_cell[column]),
          LOAD(gate_row[column]), LOAD(gate_row[gate_stride + column]),
          LOAD(gate_row[2 * gate_stride + column]), &d_old_cell[column], &d_gate_row[column],
          &d_gate_row[gate_stride + column], &d_gate_row[2 * gate_stride + column]);
    }
  } else {
#pragma omp simd
    for (int64_t column = 0; column < columns; ++column) {
      LLTM_NAME(backward_element_)(
          LOAD(grad_h[column * grad_h_column_stride]),
          LOAD(grad_cell[column * grad_cell_column_stride]), LOAD(new_cell[column]),
          LOAD(gate_row[column]), LOAD(gate_row[gate_stride + column]),
          LOAD(gate_row[2 * gate_stride + column]), &d_old_cell[column], &d_gate_row[column],
          &d_gate_row[gate_stride + column], &d_gate_row[2 * gate_stride + column]);
    }
  }
}

/* grad_strides: grad_h's row and column strides, then grad_cell's, in elements. */
static int LLTM_NAME(backward_)(int64_t batch_size, int64_t state_size,
                               const int64_t* grad_strides, const STORAGE* grad_h,
                               const STORAGE* grad_cell, const STORAGE* new_cell,
                               const STORAGE* gates, STORAGE* d_old_cell, STORAGE* d_gates) {
  LLTM_FOR_EACH(row, batch_size, batch_size * state_size, {
    const int64_t offset = row * state_size;
    LLTM_NAME(backward_row_)(state_size, state_size, grad_h + row * grad_strides[0],
                             grad_strides[1], grad_cell + row * grad_strides[2],
                             grad_strides[3], new_cell + offset, gates + 3 * offset,
                             d_old_cell + offset, d_gates + 3 * offset);
  });
  return LLTM_SUCCESS;
}

#include "lltm_padding.h"
#include "lltm_cpu_products.h"
#include "lltm_cpu_forward.h"
#include "lltm_cpu_backward.h"

/* Whether a pass with `options` (NULL: the defaults) takes its products on
 * AMX: a 16-bit type's, where the CPU has it (or AVX512-BF16's dot products
 * in its place: lltm_amx.h), unless options->amx asks for the portable
 * products (0). A float16 product takes four tile products and its packing
 * costs more: on 2 cores of a Sapphire Rapids the portable products beat
 * AMX's but from a state of 320 and 2^24 multiply-adds a step's recurrent
 * product (BENCHMARKS.md), and only there does float16 take AMX by
 * default; it never takes the dot products by default (on the 2-core AMD
 * EPYC, Zen 5, one thread, inference at 16x64x512x512 took 2491 us a step
 * so against the portable products' 1292). */
#define LLTM_AMX_FLOAT16_STATE 320
#define LLTM_AMX_FLOAT16_MULTIPLY_ADDS ((int64_t)1 << 24)
static int LLTM_NAME(uses_amx_)(const lltm_sequence_options* options, int64_t batch_size,
                                int64_t state_size) {
#ifdef AMX_DTYPE
  const int amx = options ? options->amx : -1;
  if (amx == 0 || !lltm_amx_usable()) return 0;
  return AMX_DTYPE == LLTM_BFLOAT16 || amx == 1 ||
         (lltm_amx_tiles() && state_size >= LLTM_AMX_FLOAT16_STATE &&
          batch_size * 3 * state_size * state_size >= LLTM_AMX_FLOAT16_MULTIPLY_ADDS);
#else
  (void)options, (void)batch_size, (void)state_size;
  return 0;
#endif
}

/* How a pass with `options` (lltm_ffi.h; plan.py's sequence_options) takes
 * its products (struct lltm_products): the one place that decides. A
 * 16-bit type's all go on AMX where uses_amx_ says so. Else, where the
 * BLAS is loaded (lltm_blas.h) and its ints hold the sizes, every product
 * but where lltm_own_products_pay says the own tiles are the faster goes
 * through it, the recurrence's too but where lltm_own_tiles_pay says so.
 * options->blas 0 (LLTM_BLAS=0) keeps the own tiles for every product, 1
 * (LLTM_BLAS=1) takes the BLAS for the recurrence at every size. */
static struct lltm_products LLTM_NAME(products_plan_)(const lltm_sequence_options* options,
                                                      int64_t rows,
                                                      int64_t batch_size, int64_t input_features,
                                                      int64_t state_size) {
  struct lltm_products products = {LLTM_OWN_TILES, 0};
  const int blas = options ? options->blas : -1;
  if (LLTM_NAME(uses_amx_)(options, batch_size, state_size)) {
    products.recurrence = LLTM_ON_AMX;
  } else if (blas != 0 && rows <= LLTM_BLAS_MAX && 3 * state_size <= LLTM_BLAS_MAX &&
             state_size + input_features <= LLTM_BLAS_MAX && lltm_blas_loaded() &&
             (blas == 1 || !lltm_own_products_pay(batch_size, state_size))) {
    products.blas = 1;
    if (blas == 1 || !lltm_own_tiles_pay(batch_size, state_size)) {
      products.recurrence = LLTM_ON_BLAS;
    }
  }
  const char* recurrence = lltm_recurrence_names[products.recurrence];
#ifdef AMX_DTYPE
  if (products.recurrence == LLTM_ON_AMX) recurrence = lltm_amx_tiles_name(AMX_DTYPE, batch_size);
#endif
  lltm_note_cpu_recurrence(recurrence);
  return products;
}

/* The sequence's passes, packed_forward and packed_backward:
 * packed steps, or where batch_sizes is NULL dense ones, in either
 * direction, with the final states. */
/* sizes: rows, steps, batch, input_features, state, reverse; the options
 * (lltm_ffi.h) after the tensors and the CUDA passes' workspaces, which
 * the CPU passes do not read (lltm_padding.h numbers them). */
static int LLTM_NAME(packed_forward_)(const int64_t* sizes, const int64_t* batch_sizes,
                                      const STORAGE* inputs, const STORAGE* weights,
                                      const STORAGE* bias, const STORAGE* h0, const STORAGE* c0,
                                      STORAGE* outputs, STORAGE* cells, STORAGE* gates,
                                      STORAGE* final_h, STORAGE* final_cell,
                                      const lltm_sequence_options* options) {
  lltm_walk walk;
  if (!lltm_packed_walk(sizes, batch_sizes, &walk)) return LLTM_ERROR_ARGUMENTS;
  return LLTM_NAME(recurrence_forward_)(
      LLTM_NAME(products_plan_)(options, walk.rows, sizes[2], sizes[3], sizes[4]), &walk,
      sizes[3], sizes[4], inputs, weights, bias, h0, c0, outputs, cells, gates, final_h,
      final_cell);
}

/* sizes as packed_forward's, then grad_outputs' and grad_cells' row and
 * column strides (lltm_padding.h). */
static int LLTM_NAME(packed_backward_)(
    const int64_t* sizes, const int64_t* batch_sizes, const STORAGE* inputs,
    const STORAGE* weights, const STORAGE* h0, const STORAGE* outputs, const STORAGE* cells,
    const STORAGE* gates, const STORAGE* grad_outputs, const STORAGE* grad_cells,
    const STORAGE* grad_final_h, const STORAGE* grad_final_cell, STORAGE* d_gates,
    STORAGE* d_inputs, STORAGE* d_weights, STORAGE* d_bias, STORAGE* d_h0, STORAGE* d_c0,
    const lltm_sequence_options* options) {
  lltm_walk walk;
  if (!lltm_packed_walk(sizes, batch_sizes, &walk)) return LLTM_ERROR_ARGUMENTS;
  const int64_t* row_strides = sizes + LLTM_B_STRIDES;
  const int64_t grad_strides[6] = {sizes[2] * row_strides[0], row_strides[0], row_strides[1],
                                   sizes[2] * row_strides[2], row_strides[2], row_strides[3]};
  return LLTM_NAME(recurrence_backward_)(
      LLTM_NAME(products_plan_)(options, walk.rows, sizes[2], sizes[3], sizes[4]), &walk,
      sizes[3], sizes[4], grad_strides, inputs, weights, h0, outputs, cells, gates, grad_outputs,
      grad_cells, grad_final_h, grad_final_cell, d_gates, d_inputs, d_weights, d_bias, d_h0,
      d_c0);
}

/* The passes' entry points, which lltm_cpu.c registers: each pass's
 * arguments in the order of their declarations in cell.py and sequence.py
 * (the sequence's options' address last). */
int LLTM_NAME(lltm_forward_pass_)(const lltm_args* args) {
  return LLTM_NAME(forward_)(args->sizes[0], args->sizes[1], args->tensors[0], args->tensors[1],
                             args->tensors[2], args->tensors[3]);
}

int LLTM_NAME(lltm_backward_pass_)(const lltm_args* args) {
  return LLTM_NAME(backward_)(args->sizes[0], args->sizes[1], args->sizes + 2, args->tensors[0],
                              args->tensors[1], args->tensors[2], args->tensors[3],
                              args->tensors[4], args->tensors[5]);
}

/* The sequence's passes at the padded state where their sizes give one
 * (lltm_padding.h). */
static int LLTM_NAME(run_packed_forward_)(const lltm_args* args) {
  /* A padded forward that keeps no cells has gates in its workspace, which
   * only a GPU needs then. */
  void* gates = args->tensors[LLTM_F_CELLS] ? args->tensors[LLTM_F_GATES] : NULL;
  return LLTM_NAME(packed_forward_)(
      args->sizes, args->tensors[LLTM_F_BATCH_SIZES], args->tensors[LLTM_F_INPUTS],
      args->tensors[LLTM_F_WEIGHTS], args->tensors[LLTM_F_BIAS], args->tensors[LLTM_F_H0],
      args->tensors[LLTM_F_C0], args->tensors[LLTM_F_OUTPUTS], args->tensors[LLTM_F_CELLS],
      gates, args->tensors[LLTM_F_FINAL_H],
      args->tensors[LLTM_F_FINAL_CELL], args->tensors[LLTM_F_OPTIONS]);
}

static int LLTM_NAME(run_packed_backward_)(const lltm_args* args) {
  void* const* t = args->tensors;
  return LLTM_NAME(packed_backward_)(
      args->sizes, t[LLTM_B_BATCH_SIZES], t[LLTM_B_INPUTS], t[LLTM_B_WEIGHTS], t[LLTM_B_H0],
      t[LLTM_B_OUTPUTS], t[LLTM_B_CELLS], t[LLTM_B_GATES], t[LLTM_B_GRAD_OUTPUTS],
      t[LLTM_B_GRAD_CELLS], t[LLTM_B_GRAD_FINAL_H], t[LLTM_B_GRAD_FINAL_CELL], t[LLTM_B_D_GATES],
      t[LLTM_B_D_INPUTS], t[LLTM_B_D_WEIGHTS], t[LLTM_B_D_BIAS], t[LLTM_B_D_H0], t[LLTM_B_D_C0],
      t[LLTM_B_OPTIONS]);
}

static int LLTM_NAME(padded_)(int pass, const lltm_args* args,
                              int (*run)(const lltm_args* args)) {
  lltm_padded_pass padded;
  int code = lltm_pad_pass(pass, (int)sizeof(STORAGE), args, &padded);
  if (code != LLTM_SUCCESS) return code;
  lltm_copy_on_cpu(padded.pads, padded.pad_count, (int)sizeof(STORAGE));
  code = run(&padded.args);
  if (code == LLTM_SUCCESS) lltm_copy_on_cpu(padded.cuts, padded.cut_count, (int)sizeof(STORAGE));
  return code;
}

int LLTM_NAME(lltm_packed_forward_)(const lltm_args* args) {
  return LLTM_NAME(padded_)(LLTM_PASS_FORWARD, args, LLTM_NAME(run_packed_forward_));
}

int LLTM_NAME(lltm_packed_backward_)(const lltm_args* args) {
  return LLTM_NAME(padded_)(LLTM_PASS_BACKWARD, args, LLTM_NAME(run_packed_backward_));
}
