/* Part of the CPU passes (lltm_cpu_impl.h), included from it once for
 * every element type, with its parameters defined: the
 * backward pass, recurrence_backward_. */

/* A step's backward recurrent products of the states from `first` on,
 * `count` of them, on the BLAS: their columns of sums (rows x state) = the
 * next step's gate gradients (rows x 3 * state) times those columns of the
 * hidden weights (row stride `columns`). */
static void LLTM_NAME(blas_carried_sums_)(int64_t rows, int64_t state_size, int64_t columns,
                                          int64_t first, int64_t count,
                                          const SCALAR* next_d_gates, const SCALAR* weights,
                                          SCALAR* sums) {
  const int64_t gates_size = 3 * state_size;
  if (rows > LLTM_BLAS_GEMV_ROWS) {
    LLTM_MATH(blas_gemm_)(0, 0, rows, count, gates_size, next_d_gates, gates_size,
                          weights + first, columns, 0, sums + first, state_size);
    return;
  }
  for (int64_t row = 0; row < rows; ++row) {
    LLTM_MATH(blas_gemv_)(1, gates_size, count, weights + first, columns,
                          next_d_gates + row * gates_size, sums + row * state_size + first);
  }
}

/* `columns` elements of a gradient (column stride `stride`; NULL: zeros)
 * into dst, or added to it where `accumulate`; a loop for each case, none
 * holding a condition, so that a narrow STORAGE's conversions vectorise. */
static void LLTM_NAME(take_gradient_)(int64_t columns, const STORAGE* gradient, int64_t stride,
                                      int accumulate, STORAGE* dst) {
  if (!gradient) {
    for (int64_t c = 0; !accumulate && c < columns; ++c) dst[c] = STORE((SCALAR)0);
  } else if (accumulate) {
    for (int64_t c = 0; c < columns; ++c) {
      dst[c] = STORE(LOAD(dst[c]) + LOAD(gradient[c * stride]));
    }
  } else {
    for (int64_t c = 0; c < columns; ++c) dst[c] = gradient[c * stride];
  }
}

/* The gradients a step's backward tile reads: those of its outputs and
 * cells (each step's first element; strides: grad_output's row and column
 * strides, then grad_cell's) and those of the final states (batch, state;
 * NULL: zeros), which the rows that end at the step start from. */
struct LLTM_NAME(step_gradients_) {
  const STORAGE *output, *cell;
  const int64_t* strides;
  const STORAGE *final_h, *final_cell;
};

/* A step's backward tile. d_h, the gradient reaching its h, is, for the
 * rows below `continued`, the next step's gate gradients (next_d_gates, as
 * SCALAR) times the hidden weights (`hidden`, 3 * state x state), and for
 * the others the final h's gradient; d_c, that reaching its cell, is
 * likewise the gradient carried from the next step or the final cell's.
 * Both then take the step's own output and cell gradients, and the cell's
 * backward math writes the tile's gate gradients and, over d_c, the
 * gradient reaching the old cell. Where carried_sums is not NULL it holds
 * the products of the rows below `continued` already (row stride state).
 * Where gate_factors is not NULL the tile's gate gradients are also
 * converted into it, as SCALAR (laid out as d_gates), for the products that
 * read them. */
static void LLTM_NAME(backward_step_tile_)(int64_t state_size, struct lltm_tile tile,
                                           const struct LLTM_NAME(tile_factor_) * hidden,
                                           int64_t continued,
                                           const SCALAR* next_d_gates,
                                           const SCALAR* carried_sums,
                                           struct LLTM_NAME(step_gradients_) gradients,
                                           const STORAGE* cells, const STORAGE* gates,
                                           STORAGE* d_h, STORAGE* d_c, STORAGE* d_gates,
                                           SCALAR* gate_factors) {
  const int64_t gates_size = 3 * state_size;
  const int64_t* strides = gradients.strides;
  if (continued > tile.first_row) {
    struct lltm_tile carried = tile;
    if (continued - tile.first_row < tile.rows) carried.rows = (int)(continued - tile.first_row);
    for (int i = 0; carried_sums && i < carried.rows; ++i) {
      const int64_t offset = (tile.first_row + i) * state_size + tile.first_column;
      LLTM_NAME(add_sums_row_)(tile.columns, NULL, carried_sums + offset, d_h + offset);
    }
    if (!carried_sums) {
      const SCALAR* a_rows[LLTM_TILE_ROWS];
      LLTM_NAME(tile_rows_)(next_d_gates, gates_size, carried, a_rows);
      int64_t b_stride;
      const SCALAR* b = LLTM_NAME(tile_columns_)(hidden, tile.first_column, 0, &b_stride);
      LLTM_NAME(product_tile_)(gates_size, a_rows, 1, b, b_stride, carried.rows, tile.columns,
                               NULL, 0,
                               d_h + tile.first_row * state_size + tile.first_column,
                               state_size);
    }
  }
  for (int i = 0; i < tile.rows; ++i) {
    const int64_t row = tile.first_row + i, column = tile.first_column;
    const int64_t offset = row * state_size + column, gate_offset = row * gates_size + column;
    if (row >= continued) {
      LLTM_NAME(take_gradient_)(tile.columns, gradients.final_h ? gradients.final_h + offset : NULL,
                                1, 0, d_h + offset);
      LLTM_NAME(take_gradient_)(tile.columns,
                                gradients.final_cell ? gradients.final_cell + offset : NULL, 1, 0,
                                d_c + offset);
    }
    LLTM_NAME(take_gradient_)(
        tile.columns,
        gradients.output ? gradients.output + row * strides[0] + column * strides[1] : NULL,
        strides[1], 1, d_h + offset);
    LLTM_NAME(take_gradient_)(
        tile.columns,
        gradients.cell ? gradients.cell + row * strides[2] + column * strides[3] : NULL,
        strides[3], 1, d_c + offset);
    LLTM_NAME(backward_row_)(tile.columns, state_size, d_h + offset, 1, d_c + offset, 1,
                             cells + offset, gates + gate_offset, d_c + offset,
                             d_gates + gate_offset);
    for (int gate = 0; gate_factors && gate < 3; ++gate) {
      const int64_t at = gate_offset + gate * state_size;
      LLTM_NAME(widen_)(tile.columns, d_gates + at, gate_factors + at);
    }
  }
}

/* The hidden columns of d_weights (3 * state x state, row stride
 * `columns`): d_gates^T (as SCALAR) times each step's previous state, block
 * by block (lltm_state_block); a walk with no rows leaves zeros. Row r of a
 * product reads column r of d_gates. A narrow STORAGE first converts every
 * block's states into `previous`, in the order of d_gates' rows, and takes
 * one product of the whole depth: its sums are rounded once, not once a
 * block. */
static int LLTM_NAME(hidden_weight_grads_)(int blas, const lltm_walk* walk, int64_t state_size,
                                           int64_t columns, const SCALAR* d_gates,
                                           const STORAGE* h0, const STORAGE* outputs,
                                           STORAGE* d_weights) {
  const int64_t gates_size = 3 * state_size;
  SCALAR* previous = NULL;
  if (LLTM_NARROW_STORAGE) {
    previous = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(walk->rows * state_size + 1));
    if (!previous) return LLTM_ERROR_NO_MEMORY;
  }
  lltm_block_cursor cursor = lltm_first_block(walk);
  lltm_state_block block;
  int status = LLTM_SUCCESS, first = 1;
  while (status == LLTM_SUCCESS && lltm_next_block(walk, &cursor, &block)) {
    const STORAGE* states = (block.initial ? h0 : outputs) + block.state_row * state_size;
    if (LLTM_NARROW_STORAGE) {
      LLTM_NAME(widen_)(block.rows * state_size, states, previous + block.gate_row * state_size);
      continue;
    }
    status = LLTM_NAME(lltm_cpu_product_)(blas, gates_size, state_size, block.rows,
                                          d_gates + block.gate_row * gates_size, 1, gates_size,
                                          LLTM_AS_SCALAR(states), state_size, 1, NULL, !first,
                                          d_weights, columns);
    first = 0;
  }
  if (status == LLTM_SUCCESS && (first || LLTM_NARROW_STORAGE)) {
    status = LLTM_NAME(lltm_cpu_product_)(blas, gates_size, state_size,
                                          LLTM_NARROW_STORAGE ? walk->rows : 0, d_gates, 1,
                                          gates_size,
                                          LLTM_NARROW_STORAGE ? previous : LLTM_AS_SCALAR(h0),
                                          state_size, 1, NULL, 0, d_weights, columns);
  }
  free(previous);
  return status;
}

/* d_bias: the column sums of the gate gradients (rows, 3 * state), summed
 * in SCALAR, LLTM_SUM_COLUMNS columns at a time. */
#ifndef LLTM_SUM_COLUMNS
#define LLTM_SUM_COLUMNS 1024
#endif
LLTM_VECTOR_CLONES
static void LLTM_NAME(column_sums_)(int64_t rows, int64_t columns, const STORAGE* matrix,
                                    STORAGE* sums) {
  SCALAR totals[LLTM_SUM_COLUMNS];
  for (int64_t first = 0; first < columns; first += LLTM_SUM_COLUMNS) {
    const int64_t width =
        columns - first < LLTM_SUM_COLUMNS ? columns - first : LLTM_SUM_COLUMNS;
    for (int64_t j = 0; j < width; ++j) totals[j] = 0;
    for (int64_t k = 0; k < rows; ++k) {
      const STORAGE* row = matrix + k * columns + first;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) totals[j] += LOAD(row[j]);
    }
    for (int64_t j = 0; j < width; ++j) sums[first + j] = STORE(totals[j]);
  }
}

/* d_weights (3 * state x (state + input_features)) on AMX, in one product:
 * d_gates^T times each row's [previous state, input], laid out as the
 * weights' columns are (the previous states in the order of d_gates' rows,
 * as hidden_weight_grads_ takes them). */
static int LLTM_NAME(amx_weight_grads_)(const lltm_walk* walk, int64_t input_features,
                                        int64_t state_size, const STORAGE* d_gates,
                                        const STORAGE* inputs, const STORAGE* h0,
                                        const STORAGE* outputs, STORAGE* d_weights) {
  const int64_t gates_size = 3 * state_size, columns = state_size + input_features;
  STORAGE* factors = (STORAGE*)malloc(sizeof(STORAGE) * (size_t)(walk->rows * columns + 1));
  if (!factors) return LLTM_ERROR_NO_MEMORY;
  lltm_block_cursor cursor = lltm_first_block(walk);
  lltm_state_block block;
  while (lltm_next_block(walk, &cursor, &block)) {
    const STORAGE* states = (block.initial ? h0 : outputs) + block.state_row * state_size;
    for (int64_t row = 0; row < block.rows; ++row) {
      memcpy(factors + (block.gate_row + row) * columns, states + row * state_size,
             sizeof(STORAGE) * (size_t)state_size);
    }
  }
  LLTM_FOR_EACH(row, walk->rows, walk->rows * input_features, {
    memcpy(factors + row * columns + state_size, inputs + row * input_features,
           sizeof(STORAGE) * (size_t)input_features);
  });
  const int status = LLTM_NAME(amx_product_)(gates_size, columns, walk->rows, d_gates, 1,
                                             gates_size, factors, columns, 1, NULL, NULL, 0,
                                             d_weights, columns);
  free(factors);
  return status;
}

/* The gradients of the forward pass's arguments. grad_strides: the (step,
 * row, column) strides of grad_outputs, then of grad_cells (a packed walk
 * reads only the row and column ones). d_h0 doubles as the gradient
 * reaching each step's h, d_c0 as that reaching each step's cell; a single
 * step given neither (not wanted) uses scratch space. */
static int LLTM_NAME(recurrence_backward_)(
    struct lltm_products products, const lltm_walk* walk, int64_t input_features,
    int64_t state_size, const int64_t* grad_strides, const STORAGE* inputs,
    const STORAGE* weights, const STORAGE* h0, const STORAGE* outputs, const STORAGE* cells,
    const STORAGE* gates, const STORAGE* grad_outputs, const STORAGE* grad_cells,
    const STORAGE* grad_final_h, const STORAGE* grad_final_cell, STORAGE* d_gates,
    STORAGE* d_inputs, STORAGE* d_weights, STORAGE* d_bias, STORAGE* d_h0, STORAGE* d_c0) {
  /* Past one step d_h0 and d_c0 carry the gradients between steps. */
  if (walk->steps > 1 && (!d_h0 || !d_c0)) return LLTM_ERROR_ARGUMENTS;
  if (walk->steps == 0) return LLTM_SUCCESS;
  const int64_t batch_state = walk->batch_size * state_size, gates_size = 3 * state_size;
  const int64_t columns = state_size + input_features;
  const int64_t strides[4] = {grad_strides[1], grad_strides[2], grad_strides[4], grad_strides[5]};
  const int use_amx = products.recurrence == LLTM_ON_AMX;
  const int on_blas = products.recurrence == LLTM_ON_BLAS;
  const int wants_d_h0 = d_h0 != NULL;
  const int needs_scratch = !d_h0 || !d_c0;
  STORAGE* scratch =
      needs_scratch ? (STORAGE*)malloc(sizeof(STORAGE) * (size_t)(2 * batch_state + 1)) : NULL;
  int status = needs_scratch && !scratch ? LLTM_ERROR_NO_MEMORY : LLTM_SUCCESS;
  /* On AMX the products read the tensors themselves. Else they read SCALAR
   * factors: the weights, and the gate gradients, a narrow STORAGE's
   * converted by the step tiles that write them. */
  struct LLTM_NAME(recurrent_amx_) amx = {0};
  const SCALAR* weight_factors = NULL;
  SCALAR *weights_copy = NULL, *gates_copy = NULL, *sums = NULL;
  struct LLTM_NAME(tile_factor_) hidden = {NULL, 0, 0, 0, NULL};
  if (status == LLTM_SUCCESS && use_amx) {
    if (walk->steps > 1 || wants_d_h0) {
      status = LLTM_NAME(start_recurrent_amx_)(walk->batch_size, gates_size, state_size, weights,
                                               columns, 1, &amx);
    }
  } else if (status == LLTM_SUCCESS) {
    const int needs_tiles = !on_blas && walk->steps > 1;
    const int has_weights = LLTM_NAME(operand_)(gates_size * columns, weights, &weight_factors,
                                                &weights_copy);
    gates_copy =
        LLTM_NARROW_STORAGE
            ? (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(walk->rows * gates_size + 1))
            : NULL;
    /* The hidden weights in panels where a row of them spans a page
     * (tile_factor_ says why); short rows read in place cost nothing to lay
     * out, which a backward pass of few steps would notice (16 threads of
     * the H200 machine's Xeon, float32 training at B=16, S=256 took 10% more
     * with its weights in panels). */
    const int long_rows = columns * (int64_t)sizeof(SCALAR) >= LLTM_PAGE_BYTES;
    const int has_tiles =
        !has_weights || !needs_tiles ||
        LLTM_NAME(tile_factor_of_)(gates_size, weight_factors, columns, state_size, long_rows,
                                   &hidden) == LLTM_SUCCESS;
    sums = on_blas ? (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(batch_state + 1)) : NULL;
    if (!has_weights || (LLTM_NARROW_STORAGE && !gates_copy) ||
        !has_tiles || (on_blas && !sums)) {
      status = LLTM_ERROR_NO_MEMORY;
    }
  }
  const SCALAR* gate_factors = LLTM_NARROW_STORAGE ? gates_copy : LLTM_AS_SCALAR(d_gates);
  if (!d_h0) d_h0 = scratch;
  if (!d_c0) d_c0 = scratch + batch_state;
  lltm_step step = lltm_last_step(walk);
  int64_t next_offset = 0; /* the first row of the step visited after `step` */
  while (status == LLTM_SUCCESS) {
    const struct LLTM_NAME(step_gradients_) gradients = {
        grad_outputs ? grad_outputs + lltm_step_start(walk, &step, grad_strides[0],
                                                      grad_strides[1])
                     : NULL,
        grad_cells ? grad_cells + lltm_step_start(walk, &step, grad_strides[3], grad_strides[4])
                   : NULL,
        strides, grad_final_h, grad_final_cell};
    const SCALAR* next_d_gates =
        step.continued && !use_amx ? gate_factors + next_offset * gates_size : NULL;
    const STORAGE* step_cells = cells + step.offset * state_size;
    const STORAGE* step_gates = gates + step.offset * gates_size;
    STORAGE* step_d_gates = d_gates + step.offset * gates_size;
    SCALAR* step_gate_factors = gates_copy ? gates_copy + step.offset * gates_size : NULL;
    const int64_t elements = step.rows * state_size * gates_size / 16;
    if (on_blas) {
      /* Each thread's states: their products on the BLAS, then their math. */
      const int parts = lltm_blas_parts(elements);
      LLTM_FOR_EACH(part, parts, elements, {
        int64_t first, count;
        lltm_part(part, parts, state_size, 16, &first, &count);
        if (count > 0 && step.continued) {
          LLTM_NAME(blas_carried_sums_)(step.continued, state_size, columns, first, count,
                                        next_d_gates, weight_factors, sums);
        }
        if (count > 0) {
          const struct lltm_tile tile = {0, first, (int)step.rows, (int)count};
          LLTM_NAME(backward_step_tile_)(state_size, tile, NULL, step.continued, NULL, sums,
                                         gradients, step_cells, step_gates, d_h0, d_c0,
                                         step_d_gates, step_gate_factors);
        }
      });
    } else if (use_amx) {
      struct LLTM_NAME(amx_step_) parts;
      status = LLTM_NAME(start_amx_step_)(&amx, &amx.packed_weights, 1, step.rows, step.continued,
                                          state_size, d_gates + next_offset * gates_size,
                                          gates_size, &parts);
      if (status != LLTM_SUCCESS) break;
      LLTM_FOR_EACH_OF_TEAM(part, parts.parts, parts.team, {
        struct lltm_tile tile;
        if (LLTM_NAME(amx_step_part_)(&parts, part, &tile)) {
          LLTM_NAME(backward_step_tile_)(state_size, tile, NULL, step.continued, NULL, amx.sums,
                                         gradients, step_cells, step_gates, d_h0, d_c0,
                                         step_d_gates, NULL);
        }
      });
    } else {
      LLTM_FOR_EACH(index, lltm_tile_count(step.rows, state_size), elements, {
        LLTM_NAME(backward_step_tile_)(state_size, lltm_tile_at(index, step.rows, state_size),
                                       &hidden, step.continued, next_d_gates, NULL,
                                       gradients, step_cells, step_gates, d_h0, d_c0,
                                       step_d_gates, step_gate_factors);
      });
    }
    if (step.order == 0) break;
    next_offset = step.offset;
    step = lltm_previous_step(walk, &step);
  }
  free(scratch);
  free(hidden.panels);
  free(sums);
  if (status == LLTM_SUCCESS && wants_d_h0) {
    /* Each row of h0 is the old state of its sequence's first step. */
    lltm_block_cursor cursor = lltm_first_block(walk);
    lltm_state_block block;
    while (status == LLTM_SUCCESS && lltm_next_block(walk, &cursor, &block)) {
      if (!block.initial) continue;
      STORAGE* block_d_h0 = d_h0 + block.state_row * state_size;
      if (!use_amx) {
        status = LLTM_NAME(lltm_cpu_product_)(products.blas, block.rows, state_size, gates_size,
                                              gate_factors + block.gate_row * gates_size,
                                              gates_size, 1, weight_factors, columns, 1, NULL, 0,
                                              block_d_h0, state_size);
        continue;
      }
      status = LLTM_NAME(recurrent_sums_)(&amx, block.rows, d_gates + block.gate_row * gates_size,
                                          gates_size);
      for (int64_t row = 0; status == LLTM_SUCCESS && row < block.rows; ++row) {
        LLTM_NAME(add_sums_row_)(state_size, NULL, amx.sums + row * state_size,
                                 block_d_h0 + row * state_size);
      }
    }
  }
  LLTM_NAME(end_recurrent_amx_)(&amx);
  if (status == LLTM_SUCCESS && d_inputs) {
    status = use_amx ? LLTM_NAME(amx_product_)(walk->rows, input_features, gates_size, d_gates,
                                               gates_size, 1, weights + state_size, columns, 1,
                                               NULL, NULL, 0, d_inputs, input_features)
                     : LLTM_NAME(lltm_cpu_product_)(products.blas, walk->rows, input_features,
                                                    gates_size, gate_factors, gates_size, 1,
                                                    weight_factors + state_size, columns, 1, NULL,
                                                    0, d_inputs, input_features);
  }
  if (status == LLTM_SUCCESS && d_weights && use_amx) {
    status = LLTM_NAME(amx_weight_grads_)(walk, input_features, state_size, d_gates, inputs, h0,
                                          outputs, d_weights);
  } else if (status == LLTM_SUCCESS && d_weights) {
    status = LLTM_NAME(hidden_weight_grads_)(products.blas, walk, state_size, columns,
                                             gate_factors, h0, outputs, d_weights);
    const SCALAR* input_factors;
    SCALAR* inputs_copy = NULL;
    if (status == LLTM_SUCCESS && !LLTM_NAME(operand_)(walk->rows * input_features, inputs,
                                                       &input_factors, &inputs_copy)) {
      status = LLTM_ERROR_NO_MEMORY;
    }
    if (status == LLTM_SUCCESS) {
      status = LLTM_NAME(lltm_cpu_product_)(products.blas, gates_size, input_features, walk->rows,
                                            gate_factors, 1, gates_size, input_factors,
                                            input_features, 1, NULL, 0, d_weights + state_size,
                                            columns);
    }
    free(inputs_copy);
  }
  if (status == LLTM_SUCCESS && d_bias) {
    LLTM_NAME(column_sums_)(walk->rows, gates_size, d_gates, d_bias);
  }
  free(weights_copy);
  free(gates_copy);
  return status;
}
