/* The CPU passes, written once for both element types: lltm_cpu.c includes
 * this file twice, with SCALAR (float or double) and SUFFIX defined, after
 * defining exp_SUFFIX, expm1_SUFFIX and tanh_SUFFIX for that type, so each
 * type computes in its own precision. */

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

/* `columns` elements of one batch row; a gate's pre-activations are
 * gate_stride after the one before (the state size). */
LLTM_VECTOR_CLONES
static void LLTM_NAME(forward_row_)(int64_t columns, int64_t gate_stride, const SCALAR* gate_row,
                                    const SCALAR* old_cell, SCALAR* new_h,
                                    SCALAR* new_cell) {
#pragma omp simd
  for (int64_t column = 0; column < columns; ++column) {
    const SCALAR input_gate = LLTM_NAME(sigmoid_)(gate_row[column]);
    const SCALAR output_gate = LLTM_NAME(sigmoid_)(gate_row[gate_stride + column]);
    const SCALAR candidate_cell = LLTM_NAME(elu_)(gate_row[2 * gate_stride + column]);
    const SCALAR cell = old_cell[column] + candidate_cell * input_gate;
    new_cell[column] = cell;
    new_h[column] = LLTM_NAME(tanh_)(cell) * output_gate;
  }
}

static int LLTM_NAME(forward_)(int64_t batch_size, int64_t state_size, const SCALAR* gates,
                              const SCALAR* old_cell, SCALAR* new_h, SCALAR* new_cell) {
  LLTM_FOR_EACH(row, batch_size, batch_size * state_size, {
    const int64_t offset = row * state_size;
    LLTM_NAME(forward_row_)(state_size, state_size, gates + 3 * offset, old_cell + offset,
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

/* As forward_row_, backwards. grad_h and grad_cell step by their column
 * strides; the loop is versioned for the dense case (stride 1), which
 * vectorises without gathers. */
LLTM_VECTOR_CLONES
static void LLTM_NAME(backward_row_)(int64_t columns, int64_t gate_stride, const SCALAR* grad_h,
                                     int64_t grad_h_column_stride, const SCALAR* grad_cell,
                                     int64_t grad_cell_column_stride, const SCALAR* new_cell,
                                     const SCALAR* gate_row, SCALAR* d_old_cell,
                                     SCALAR* d_gate_row) {
  if (grad_h_column_stride == 1 && grad_cell_column_stride == 1) {
#pragma omp simd
    for (int64_t column = 0; column < columns; ++column) {
      LLTM_NAME(backward_element_)(
          grad_h[column], grad_cell[column], new_cell[column], gate_row[column],
          gate_row[gate_stride + column], gate_row[2 * gate_stride + column], &d_old_cell[column],
          &d_gate_row[column], &d_gate_row[gate_stride + column],
          &d_gate_row[2 * gate_stride + column]);
    }
  } else {
#pragma omp simd
    for (int64_t column = 0; column < columns; ++column) {
      LLTM_NAME(backward_element_)(
          grad_h[column * grad_h_column_stride], grad_cell[column * grad_cell_column_stride],
          new_cell[column], gate_row[column], gate_row[gate_stride + column],
          gate_row[2 * gate_stride + column], &d_old_cell[column], &d_gate_row[column],
          &d_gate_row[gate_stride + column], &d_gate_row[2 * gate_stride + column]);
    }
  }
}

/* grad_strides: grad_h's row and column strides, then grad_cell's, in elements. */
static int LLTM_NAME(backward_)(int64_t batch_size, int64_t state_size,
                               const int64_t* grad_strides, const SCALAR* grad_h,
                               const SCALAR* grad_cell, const SCALAR* new_cell,
                               const SCALAR* gates, SCALAR* d_old_cell, SCALAR* d_gates) {
  LLTM_FOR_EACH(row, batch_size, batch_size * state_size, {
    const int64_t offset = row * state_size;
    LLTM_NAME(backward_row_)(state_size, state_size, grad_h + row * grad_strides[0],
                             grad_strides[1], grad_cell + row * grad_strides[2],
                             grad_strides[3], new_cell + offset, gates + 3 * offset,
                             d_old_cell + offset, d_gates + 3 * offset);
  });
  return LLTM_SUCCESS;
}

/* The matrix products. Each tile of a result, LLTM_TILE_ROWS rows by
 * LLTM_TILE_COLUMNS columns, is summed in registers over the depth: each
 * step of the depth loads one row of b's tile and one value of a per row.
 * Of the tiles from 4 to 12 rows by 16 to 64 columns tried on an AVX-512
 * machine, 8 x 32 ran fastest in float32, with AVX-512 and with AVX2. */
#ifndef LLTM_TILE_ROWS
#define LLTM_TILE_ROWS 8
#define LLTM_TILE_COLUMNS 32

/* Where a tile lies in a rows x columns result cut into tiles, counted down
 * each column of tiles first (so that consecutive tiles read the same
 * columns of b); `rows` and `columns` of it lie inside the result. */
struct lltm_tile {
  int64_t first_row, first_column;
  int rows, columns;
};

static inline struct lltm_tile lltm_tile_at(int64_t index, int64_t rows, int64_t columns) {
  const int64_t row_tiles = (rows + LLTM_TILE_ROWS - 1) / LLTM_TILE_ROWS;
  struct lltm_tile tile;
  tile.first_row = index % row_tiles * LLTM_TILE_ROWS;
  tile.first_column = index / row_tiles * LLTM_TILE_COLUMNS;
  tile.rows = (int)(rows - tile.first_row < LLTM_TILE_ROWS ? rows - tile.first_row
                                                            : LLTM_TILE_ROWS);
  tile.columns = (int)(columns - tile.first_column < LLTM_TILE_COLUMNS
                           ? columns - tile.first_column
                           : LLTM_TILE_COLUMNS);
  return tile;
}

static inline int64_t lltm_tile_count(int64_t rows, int64_t columns) {
  return (rows + LLTM_TILE_ROWS - 1) / LLTM_TILE_ROWS *
         ((columns + LLTM_TILE_COLUMNS - 1) / LLTM_TILE_COLUMNS);
}
#endif

/* sums[i][j] = the sum over k < depth of a_rows[i][k * a_depth_stride] *
 * b[k * b_stride + j], for i < rows and j < LLTM_TILE_COLUMNS. Inlined
 * with `rows` a constant, so that the sums live in registers. */
static LLTM_ALWAYS_INLINE void LLTM_NAME(tile_sums_)(int rows, int64_t depth,
                                                     const SCALAR* const* a_rows,
                                                     int64_t a_depth_stride, const SCALAR* b,
                                                     int64_t b_stride,
                                                     SCALAR (*sums)[LLTM_TILE_COLUMNS]) {
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < LLTM_TILE_COLUMNS; ++j) sums[i][j] = 0;
  }
  for (int64_t k = 0; k < depth; ++k) {
    const SCALAR* b_row = b + k * b_stride;
    for (int i = 0; i < rows; ++i) {
      const SCALAR factor = a_rows[i][k * a_depth_stride];
      for (int j = 0; j < LLTM_TILE_COLUMNS; ++j) sums[i][j] += factor * b_row[j];
    }
  }
}

/* tile_sums_ of one row, in four sums over every fourth step of the depth
 * added at the end: four chains of additions overlap where one would wait
 * for each addition before the next. */
static LLTM_ALWAYS_INLINE void LLTM_NAME(row_sums_)(int64_t depth, const SCALAR* a,
                                                    int64_t a_depth_stride, const SCALAR* b,
                                                    int64_t b_stride, SCALAR* sums) {
  SCALAR parts[4][LLTM_TILE_COLUMNS];
  for (int q = 0; q < 4; ++q) {
    for (int j = 0; j < LLTM_TILE_COLUMNS; ++j) parts[q][j] = 0;
  }
  int64_t k = 0;
  for (; k + 4 <= depth; k += 4) {
    for (int q = 0; q < 4; ++q) {
      const SCALAR factor = a[(k + q) * a_depth_stride];
      const SCALAR* b_row = b + (k + q) * b_stride;
      for (int j = 0; j < LLTM_TILE_COLUMNS; ++j) parts[q][j] += factor * b_row[j];
    }
  }
  for (; k < depth; ++k) {
    const SCALAR factor = a[k * a_depth_stride];
    for (int j = 0; j < LLTM_TILE_COLUMNS; ++j) parts[0][j] += factor * b[k * b_stride + j];
  }
  for (int j = 0; j < LLTM_TILE_COLUMNS; ++j) {
    sums[j] = (parts[0][j] + parts[1][j]) + (parts[2][j] + parts[3][j]);
  }
}

/* One tile: out[i][j] = start + sum over k < depth of
 * a_rows[i][k * a_depth_stride] * b[k * b_stride + j], for i < count and
 * j < width, where start is out[i][j] when `accumulate`, else base[j] (zero
 * where base is NULL). a_rows holds LLTM_TILE_ROWS rows and b
 * LLTM_TILE_COLUMNS columns, all readable; a tile of few rows (batch 1, a
 * batch's last rows) sums 1, 2 or 4 of them. What is summed past count and
 * width is dropped. */
LLTM_VECTOR_CLONES
static void LLTM_NAME(product_tile_)(int64_t depth, const SCALAR* const* a_rows,
                                     int64_t a_depth_stride, const SCALAR* b, int64_t b_stride,
                                     int count, int width, const SCALAR* base, int accumulate,
                                     SCALAR* out, int64_t out_stride) {
  SCALAR sums[LLTM_TILE_ROWS][LLTM_TILE_COLUMNS];
  if (count > 4) {
    LLTM_NAME(tile_sums_)(LLTM_TILE_ROWS, depth, a_rows, a_depth_stride, b, b_stride, sums);
  } else if (count > 2) {
    LLTM_NAME(tile_sums_)(4, depth, a_rows, a_depth_stride, b, b_stride, sums);
  } else if (count == 2) {
    LLTM_NAME(tile_sums_)(2, depth, a_rows, a_depth_stride, b, b_stride, sums);
  } else {
    LLTM_NAME(row_sums_)(depth, a_rows[0], a_depth_stride, b, b_stride, sums[0]);
  }
  for (int i = 0; i < count; ++i) {
    SCALAR* row = out + i * out_stride;
    for (int j = 0; j < width; ++j) {
      row[j] = (accumulate ? row[j] : base ? base[j] : (SCALAR)0) + sums[i][j];
    }
  }
}

/* The rows of a (row stride a_row_stride) that a tile reads: its own, then
 * its last again up to LLTM_TILE_ROWS. */
static void LLTM_NAME(tile_rows_)(const SCALAR* a, int64_t a_row_stride, struct lltm_tile tile,
                                  const SCALAR** a_rows) {
  for (int i = 0; i < LLTM_TILE_ROWS; ++i) {
    a_rows[i] = a + (tile.first_row + (i < tile.rows ? i : tile.rows - 1)) * a_row_stride;
  }
}

/* The `count` columns of b (depth rows, row stride b_stride) from `first`
 * on, fewer than a tile's, zero-padded to a tile's width in memory of their
 * own (NULL where none can be had): so that every tile runs the same code.
 * `panels` such copies one after another, copy p from b + p * panel_offset
 * (the forward pass's three gates). */
static SCALAR* LLTM_NAME(padded_columns_)(int panels, int64_t panel_offset, int64_t depth,
                                          const SCALAR* b, int64_t b_stride, int64_t first,
                                          int64_t count) {
  SCALAR* padded =
      (SCALAR*)calloc((size_t)(panels * depth * LLTM_TILE_COLUMNS + 1), sizeof(SCALAR));
  if (!padded) return NULL;
  for (int p = 0; p < panels; ++p) {
    for (int64_t k = 0; k < depth; ++k) {
      memcpy(padded + (p * depth + k) * LLTM_TILE_COLUMNS,
             b + p * panel_offset + k * b_stride + first, sizeof(SCALAR) * (size_t)count);
    }
  }
  return padded;
}

/* out (rows x columns, row stride out_stride) = base + a b, or out += a b
 * where `accumulate` (base, one value a column, may be NULL: zero). a is
 * rows x depth, element (i, k) at a[i * a_row_stride + k * a_depth_stride];
 * b is depth x columns, row-major with row stride b_stride. The depth goes
 * in blocks of LLTM_DEPTH_BLOCK, so that a tile's columns of b stay in
 * cache for every tile of rows (the weight gradients' depth is every step
 * of the batch). The threading threshold counts sixteen multiply-adds as
 * one element of a pointwise pass. */
#ifndef LLTM_DEPTH_BLOCK
#define LLTM_DEPTH_BLOCK 256
#endif
static int LLTM_NAME(product_)(int64_t rows, int64_t columns, int64_t depth, const SCALAR* a,
                               int64_t a_row_stride, int64_t a_depth_stride, const SCALAR* b,
                               int64_t b_stride, const SCALAR* base, int accumulate,
                               SCALAR* out, int64_t out_stride) {
  if (rows <= 0 || columns <= 0) return LLTM_SUCCESS;
  const int64_t full_columns = columns - columns % LLTM_TILE_COLUMNS;
  SCALAR* padded = NULL;
  if (full_columns < columns) {
    padded = LLTM_NAME(padded_columns_)(1, 0, depth, b, b_stride, full_columns,
                                        columns - full_columns);
    if (!padded) return LLTM_ERROR_NO_MEMORY;
  }
  int64_t done = 0;
  do { /* once at least, so that depth 0 writes base */
    const int64_t block = depth - done < LLTM_DEPTH_BLOCK ? depth - done : LLTM_DEPTH_BLOCK;
    LLTM_FOR_EACH(index, lltm_tile_count(rows, columns), rows * columns * block / 16, {
      const struct lltm_tile tile = lltm_tile_at(index, rows, columns);
      const SCALAR* a_rows[LLTM_TILE_ROWS];
      LLTM_NAME(tile_rows_)(a + done * a_depth_stride, a_row_stride, tile, a_rows);
      const int is_padded = tile.first_column == full_columns;
      LLTM_NAME(product_tile_)(
          block, a_rows, a_depth_stride,
          is_padded ? padded + done * LLTM_TILE_COLUMNS : b + done * b_stride + tile.first_column,
          is_padded ? LLTM_TILE_COLUMNS : b_stride, tile.rows, tile.columns,
          base ? base + tile.first_column : NULL, accumulate || done,
          out + tile.first_row * out_stride + tile.first_column, out_stride);
    });
    done += block;
  } while (done < depth);
  free(padded);
  return LLTM_SUCCESS;
}

/* The transpose (columns, rows) of a (rows, columns) matrix with row
 * stride `stride`, in memory of its own (NULL where none can be had). Rows
 * go in blocks of 16, so that each column's writes fill whole cache lines
 * while the block's rows stay in cache. */
static SCALAR* LLTM_NAME(transposed_)(int64_t rows, int64_t columns, const SCALAR* matrix,
                                      int64_t stride) {
  SCALAR* result = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(rows * columns + 1));
  if (!result) return NULL;
  for (int64_t r0 = 0; r0 < rows; r0 += 16) {
    const int64_t r1 = r0 + 16 < rows ? r0 + 16 : rows;
    for (int64_t k = 0; k < columns; ++k) {
      for (int64_t r = r0; r < r1; ++r) result[k * rows + r] = matrix[r * stride + k];
    }
  }
  return result;
}

/* The whole-sequence layer's passes, step by step as the step-by-step
 * kernels of sequence_kernel.cu, over the steps of one direction as
 * lltm_steps.h walks them; lltm_ffi.h describes the arguments. Each step is
 * cut into tiles of its rows by states, each tile doing the recurrent
 * product for its states' three gates and then the cell's math on them, so
 * that the threads share the step's pointwise work as well as its product. */

/* The state a step starts from: its row r below `carried` is row r of the
 * previous step's (h, cell), any other row r of (h0, c0). */
struct LLTM_NAME(old_state_) {
  const SCALAR *h, *cell, *h0, *c0;
  int64_t carried;
};

static inline const SCALAR* LLTM_NAME(old_row_)(const SCALAR* previous, const SCALAR* initial,
                                                int64_t carried, int64_t row,
                                                int64_t state_size) {
  return (row < carried ? previous : initial) + row * state_size;
}

/* A step's forward tile: its old h times the hidden weights (`hidden`,
 * transposed: state x 3 * state; `last_columns`, each gate's columns of the
 * last block of states padded to a tile, where that block is short of one)
 * added to the tile's three gates, then the cell's forward math. */
static void LLTM_NAME(forward_step_tile_)(int64_t state_size, struct lltm_tile tile,
                                          const SCALAR* hidden, const SCALAR* last_columns,
                                          struct LLTM_NAME(old_state_) old, SCALAR* gates,
                                          SCALAR* new_h, SCALAR* new_cell) {
  const int64_t gates_size = 3 * state_size;
  const int is_padded = tile.columns < LLTM_TILE_COLUMNS;
  const SCALAR* a_rows[LLTM_TILE_ROWS];
  for (int i = 0; i < LLTM_TILE_ROWS; ++i) {
    a_rows[i] = LLTM_NAME(old_row_)(old.h, old.h0, old.carried,
                                    tile.first_row + (i < tile.rows ? i : tile.rows - 1),
                                    state_size);
  }
  for (int gate = 0; gate < 3; ++gate) {
    const int64_t column = gate * state_size + tile.first_column;
    LLTM_NAME(product_tile_)(
        state_size, a_rows, 1,
        is_padded ? last_columns + gate * state_size * LLTM_TILE_COLUMNS : hidden + column,
        is_padded ? LLTM_TILE_COLUMNS : gates_size, tile.rows, tile.columns, NULL, 1,
        gates + tile.first_row * gates_size + column, gates_size);
  }
  for (int i = 0; i < tile.rows; ++i) {
    const int64_t row = tile.first_row + i, offset = row * state_size + tile.first_column;
    LLTM_NAME(forward_row_)(
        tile.columns, state_size, gates + row * gates_size + tile.first_column,
        LLTM_NAME(old_row_)(old.cell, old.c0, old.carried, row, state_size) + tile.first_column,
        new_h + offset, new_cell + offset);
  }
}

/* Every step's outputs, cells and pre-activation gates, and where final_h
 * is not NULL each sequence's final state in final_h and final_cell
 * (batch, state). bias may be NULL (none). */
static int LLTM_NAME(recurrence_forward_)(const lltm_walk* walk, int64_t input_features,
                                          int64_t state_size, const SCALAR* inputs,
                                          const SCALAR* weights, const SCALAR* bias,
                                          const SCALAR* h0, const SCALAR* c0, SCALAR* outputs,
                                          SCALAR* cells, SCALAR* gates, SCALAR* final_h,
                                          SCALAR* final_cell) {
  if (walk->steps == 0) return LLTM_SUCCESS;
  /* The weights transposed, (state + input_features, 3 * state), so that
   * every product runs along contiguous rows, as the backward pass's do:
   * rows below state_size are the hidden weights, the rest the input ones. */
  const int64_t gates_size = 3 * state_size;
  const int64_t full_states = state_size - state_size % LLTM_TILE_COLUMNS;
  SCALAR* transposed = LLTM_NAME(transposed_)(gates_size, state_size + input_features, weights,
                                              state_size + input_features);
  const int needs_last_columns = full_states < state_size;
  SCALAR* last_columns = transposed && needs_last_columns
                             ? LLTM_NAME(padded_columns_)(3, state_size, state_size, transposed,
                                                          gates_size, full_states,
                                                          state_size - full_states)
                             : NULL;
  if (!transposed || (needs_last_columns && !last_columns)) {
    free(transposed);
    free(last_columns);
    return LLTM_ERROR_NO_MEMORY;
  }
  /* Every step's input part of its gates, and the bias, before the loop. */
  int status = LLTM_NAME(product_)(walk->rows, gates_size, input_features, inputs,
                                   input_features, 1, transposed + state_size * gates_size,
                                   gates_size, bias, 0, gates, gates_size);
  lltm_step step = lltm_first_step(walk);
  while (status == LLTM_SUCCESS) {
    const struct LLTM_NAME(old_state_) old = {outputs + step.previous_offset * state_size,
                                              cells + step.previous_offset * state_size, h0, c0,
                                              step.carried};
    const int64_t elements = step.rows * state_size;
    SCALAR* step_outputs = outputs + step.offset * state_size;
    SCALAR* step_cells = cells + step.offset * state_size;
    LLTM_FOR_EACH(index, lltm_tile_count(step.rows, state_size), elements * gates_size / 16, {
      LLTM_NAME(forward_step_tile_)(state_size, lltm_tile_at(index, step.rows, state_size),
                                    transposed, last_columns, old,
                                    gates + step.offset * gates_size, step_outputs, step_cells);
    });
    if (final_h && step.continued < step.rows) {
      const int64_t first = step.continued * state_size;
      const size_t bytes = sizeof(SCALAR) * (size_t)(elements - first);
      memcpy(final_h + first, step_outputs + first, bytes);
      memcpy(final_cell + first, step_cells + first, bytes);
    }
    if (step.order + 1 == walk->steps) break;
    step = lltm_next_step(walk, &step);
  }
  free(transposed);
  free(last_columns);
  return status;
}

/* `columns` elements of a gradient (column stride `stride`; NULL: zeros)
 * into dst, or added to it where `accumulate`. */
static void LLTM_NAME(take_gradient_)(int64_t columns, const SCALAR* gradient, int64_t stride,
                                      int accumulate, SCALAR* dst) {
  for (int64_t c = 0; c < columns; ++c) {
    const SCALAR value = gradient ? gradient[c * stride] : (SCALAR)0;
    dst[c] = accumulate ? dst[c] + value : value;
  }
}

/* The gradients a step's backward tile reads: those of its outputs and
 * cells (each step's first element; strides: grad_output's row and column
 * strides, then grad_cell's) and those of the final states (batch, state;
 * NULL: zeros), which the rows that end at the step start from. */
struct LLTM_NAME(step_gradients_) {
  const SCALAR *output, *cell;
  const int64_t* strides;
  const SCALAR *final_h, *final_cell;
};

/* A step's backward tile. d_h, the gradient reaching its h, is, for the
 * rows below `continued`, the next step's gate gradients (next_d_gates)
 * times the hidden weights (`weights`, 3 * state x (state +
 * input_features); `last_columns`, the last block of states' columns padded
 * to a tile, where that block is short of one), and for the others the
 * final h's gradient; d_c, that reaching its cell, is likewise the gradient
 * carried from the next step or the final cell's. Both then take the
 * step's own output and cell gradients, and the cell's backward math writes
 * the tile's gate gradients and, over d_c, the gradient reaching the old
 * cell. */
static void LLTM_NAME(backward_step_tile_)(int64_t state_size, int64_t input_features,
                                           struct lltm_tile tile, const SCALAR* weights,
                                           const SCALAR* last_columns, int64_t continued,
                                           const SCALAR* next_d_gates,
                                           struct LLTM_NAME(step_gradients_) gradients,
                                           const SCALAR* cells, const SCALAR* gates, SCALAR* d_h,
                                           SCALAR* d_c, SCALAR* d_gates) {
  const int64_t gates_size = 3 * state_size;
  const int64_t* strides = gradients.strides;
  if (continued > tile.first_row) {
    struct lltm_tile carried = tile;
    if (continued - tile.first_row < tile.rows) carried.rows = (int)(continued - tile.first_row);
    const int is_padded = tile.columns < LLTM_TILE_COLUMNS;
    const SCALAR* a_rows[LLTM_TILE_ROWS];
    LLTM_NAME(tile_rows_)(next_d_gates, gates_size, carried, a_rows);
    LLTM_NAME(product_tile_)(gates_size, a_rows, 1,
                             is_padded ? last_columns : weights + tile.first_column,
                             is_padded ? LLTM_TILE_COLUMNS : state_size + input_features,
                             carried.rows, tile.columns, NULL, 0,
                             d_h + tile.first_row * state_size + tile.first_column, state_size);
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
  }
}

/* The hidden columns of d_weights (3 * state x state, row stride
 * `columns`): d_gates^T times each step's previous state, block by block
 * (lltm_state_block); a walk with no rows leaves zeros. Row r of a product
 * reads column r of d_gates. */
static int LLTM_NAME(hidden_weight_grads_)(const lltm_walk* walk, int64_t state_size,
                                           int64_t columns, const SCALAR* d_gates,
                                           const SCALAR* h0, const SCALAR* outputs,
                                           SCALAR* d_weights) {
  const int64_t gates_size = 3 * state_size;
  lltm_block_cursor cursor = lltm_first_block(walk);
  lltm_state_block block;
  int status = LLTM_SUCCESS, first = 1;
  while (status == LLTM_SUCCESS && lltm_next_block(walk, &cursor, &block)) {
    status = LLTM_NAME(product_)(gates_size, state_size, block.rows,
                                 d_gates + block.gate_row * gates_size, 1, gates_size,
                                 (block.initial ? h0 : outputs) + block.state_row * state_size,
                                 state_size, NULL, !first, d_weights, columns);
    first = 0;
  }
  if (status == LLTM_SUCCESS && first) {
    status = LLTM_NAME(product_)(gates_size, state_size, 0, d_gates, 1, gates_size, h0,
                                 state_size, NULL, 0, d_weights, columns);
  }
  return status;
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

/* The gradients of the forward pass's arguments. grad_strides: the (step,
 * row, column) strides of grad_outputs, then of grad_cells (a packed walk
 * reads only the row and column ones). d_h0 doubles as the gradient
 * reaching each step's h, d_c0 as that reaching each step's cell; a single
 * step given neither (not wanted) uses scratch space. */
static int LLTM_NAME(recurrence_backward_)(
    const lltm_walk* walk, int64_t input_features, int64_t state_size,
    const int64_t* grad_strides, const SCALAR* inputs, const SCALAR* weights, const SCALAR* h0,
    const SCALAR* outputs, const SCALAR* cells, const SCALAR* gates, const SCALAR* grad_outputs,
    const SCALAR* grad_cells, const SCALAR* grad_final_h, const SCALAR* grad_final_cell,
    SCALAR* d_gates, SCALAR* d_inputs, SCALAR* d_weights, SCALAR* d_bias, SCALAR* d_h0,
    SCALAR* d_c0) {
  /* Past one step d_h0 and d_c0 carry the gradients between steps. */
  if (walk->steps > 1 && (!d_h0 || !d_c0)) return LLTM_ERROR_ARGUMENTS;
  if (walk->steps == 0) return LLTM_SUCCESS;
  const int64_t batch_state = walk->batch_size * state_size, gates_size = 3 * state_size;
  const int64_t columns = state_size + input_features;
  const int64_t full_states = state_size - state_size % LLTM_TILE_COLUMNS;
  const int64_t strides[4] = {grad_strides[1], grad_strides[2], grad_strides[4], grad_strides[5]};
  const int wants_d_h0 = d_h0 != NULL;
  const int needs_scratch = !d_h0 || !d_c0;
  const int needs_last_columns = walk->steps > 1 && full_states < state_size;
  SCALAR* scratch =
      needs_scratch ? (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(2 * batch_state + 1)) : NULL;
  SCALAR* last_columns = needs_last_columns
                             ? LLTM_NAME(padded_columns_)(1, 0, gates_size, weights, columns,
                                                          full_states, state_size - full_states)
                             : NULL;
  if ((needs_scratch && !scratch) || (needs_last_columns && !last_columns)) {
    free(scratch);
    free(last_columns);
    return LLTM_ERROR_NO_MEMORY;
  }
  if (!d_h0) d_h0 = scratch;
  if (!d_c0) d_c0 = scratch + batch_state;
  lltm_step step = lltm_last_step(walk);
  int64_t next_offset = 0; /* the first row of the step visited after `step` */
  for (;;) {
    const struct LLTM_NAME(step_gradients_) gradients = {
        grad_outputs ? grad_outputs + lltm_step_start(walk, &step, grad_strides[0],
                                                      grad_strides[1])
                     : NULL,
        grad_cells ? grad_cells + lltm_step_start(walk, &step, grad_strides[3], grad_strides[4])
                   : NULL,
        strides, grad_final_h, grad_final_cell};
    const SCALAR* next_d_gates = step.continued ? d_gates + next_offset * gates_size : NULL;
    LLTM_FOR_EACH(index, lltm_tile_count(step.rows, state_size),
                  step.rows * state_size * gates_size / 16, {
      LLTM_NAME(backward_step_tile_)(state_size, input_features,
                                     lltm_tile_at(index, step.rows, state_size), weights,
                                     last_columns, step.continued, next_d_gates, gradients,
                                     cells + step.offset * state_size,
                                     gates + step.offset * gates_size, d_h0, d_c0,
                                     d_gates + step.offset * gates_size);
    });
    if (step.order == 0) break;
    next_offset = step.offset;
    step = lltm_previous_step(walk, &step);
  }
  free(scratch);
  free(last_columns);
  int status = LLTM_SUCCESS;
  if (wants_d_h0) {
    /* Each row of h0 is the old state of its sequence's first step. */
    lltm_block_cursor cursor = lltm_first_block(walk);
    lltm_state_block block;
    while (status == LLTM_SUCCESS && lltm_next_block(walk, &cursor, &block)) {
      if (!block.initial) continue;
      status = LLTM_NAME(product_)(block.rows, state_size, gates_size,
                                   d_gates + block.gate_row * gates_size, gates_size, 1, weights,
                                   columns, NULL, 0, d_h0 + block.state_row * state_size,
                                   state_size);
    }
  }
  if (status == LLTM_SUCCESS && d_inputs) {
    status = LLTM_NAME(product_)(walk->rows, input_features, gates_size, d_gates, gates_size, 1,
                                 weights + state_size, columns, NULL, 0, d_inputs,
                                 input_features);
  }
  if (status == LLTM_SUCCESS && d_weights) {
    status = LLTM_NAME(hidden_weight_grads_)(walk, state_size, columns, d_gates, h0, outputs,
                                             d_weights);
    if (status == LLTM_SUCCESS) {
      status = LLTM_NAME(product_)(gates_size, input_features, walk->rows, d_gates, 1,
                                   gates_size, inputs, input_features, NULL, 0,
                                   d_weights + state_size, columns);
    }
  }
  if (status == LLTM_SUCCESS && d_bias) {
    LLTM_NAME(column_sums_)(walk->rows, gates_size, d_gates, d_bias);
  }
  return status;
}

/* The registered passes (lltm_cpu.c): sequence_forward and
 * sequence_backward over dense steps in the forward direction, each step's
 * cell gradients given, no final state; packed_forward and packed_backward
 * over dense or packed steps in either direction, with the final states. */
static int LLTM_NAME(sequence_forward_)(int64_t steps, int64_t batch_size,
                                        int64_t input_features, int64_t state_size,
                                        const SCALAR* inputs, const SCALAR* weights,
                                        const SCALAR* bias, const SCALAR* h0, const SCALAR* c0,
                                        SCALAR* outputs, SCALAR* cells, SCALAR* gates) {
  lltm_walk walk;
  if (!lltm_make_walk(NULL, steps, batch_size, steps * batch_size, 0, &walk)) {
    return LLTM_ERROR_ARGUMENTS;
  }
  return LLTM_NAME(recurrence_forward_)(&walk, input_features, state_size, inputs, weights, bias,
                                        h0, c0, outputs, cells, gates, NULL, NULL);
}

static int LLTM_NAME(sequence_backward_)(
    int64_t steps, int64_t batch_size, int64_t input_features, int64_t state_size,
    const int64_t* grad_strides, const SCALAR* inputs, const SCALAR* weights, const SCALAR* h0,
    const SCALAR* outputs, const SCALAR* cells, const SCALAR* gates, const SCALAR* grad_outputs,
    const SCALAR* grad_cells, SCALAR* d_gates, SCALAR* d_inputs, SCALAR* d_weights,
    SCALAR* d_bias, SCALAR* d_h0, SCALAR* d_c0) {
  lltm_walk walk;
  if (!lltm_make_walk(NULL, steps, batch_size, steps * batch_size, 0, &walk)) {
    return LLTM_ERROR_ARGUMENTS;
  }
  return LLTM_NAME(recurrence_backward_)(&walk, input_features, state_size, grad_strides, inputs,
                                         weights, h0, outputs, cells, gates, grad_outputs,
                                         grad_cells, NULL, NULL, d_gates, d_inputs, d_weights,
                                         d_bias, d_h0, d_c0);
}

/* sizes: rows, steps, batch, input_features, state, reverse (then tf32 and
 * own kernels, read by CUDA only). */
static int LLTM_NAME(packed_forward_)(const int64_t* sizes, const int64_t* batch_sizes,
                                      const SCALAR* inputs, const SCALAR* weights,
                                      const SCALAR* bias, const SCALAR* h0, const SCALAR* c0,
                                      SCALAR* outputs, SCALAR* cells, SCALAR* gates,
                                      SCALAR* final_h, SCALAR* final_cell) {
  lltm_walk walk;
  if (!lltm_packed_walk(sizes, batch_sizes, &walk)) return LLTM_ERROR_ARGUMENTS;
  return LLTM_NAME(recurrence_forward_)(&walk, sizes[3], sizes[4], inputs, weights, bias, h0, c0,
                                        outputs, cells, gates, final_h, final_cell);
}

/* sizes as packed_forward's, then grad_outputs' and grad_cells' row and
 * column strides. */
static int LLTM_NAME(packed_backward_)(
    const int64_t* sizes, const int64_t* batch_sizes, const SCALAR* inputs,
    const SCALAR* weights, const SCALAR* h0, const SCALAR* outputs, const SCALAR* cells,
    const SCALAR* gates, const SCALAR* grad_outputs, const SCALAR* grad_cells,
    const SCALAR* grad_final_h, const SCALAR* grad_final_cell, SCALAR* d_gates,
    SCALAR* d_inputs, SCALAR* d_weights, SCALAR* d_bias, SCALAR* d_h0, SCALAR* d_c0) {
  lltm_walk walk;
  if (!lltm_packed_walk(sizes, batch_sizes, &walk)) return LLTM_ERROR_ARGUMENTS;
  const int64_t* row_strides = sizes + 8;
  const int64_t grad_strides[6] = {sizes[2] * row_strides[0], row_strides[0], row_strides[1],
                                   sizes[2] * row_strides[2], row_strides[2], row_strides[3]};
  return LLTM_NAME(recurrence_backward_)(&walk, sizes[3], sizes[4], grad_strides, inputs, weights,
                                         h0, outputs, cells, gates, grad_outputs, grad_cells,
                                         grad_final_h, grad_final_cell, d_gates, d_inputs,
                                         d_weights, d_bias, d_h0, d_c0);
}
