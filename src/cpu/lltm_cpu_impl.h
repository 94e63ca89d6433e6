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
 * reaching h or the cell, then the step's own) it is rounded after each. */

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

/* How a pass takes its matrix products: the steps' recurrent ones by the
 * own tiles, on AMX or on the BLAS; the others (every step's input part of
 * its gates; the gradients of the inputs, the weights and h0) on AMX where
 * the recurrence is, else through the BLAS where `blas` says so, else by
 * the own tiles. products_plan_ decides, in one place. */
enum { LLTM_OWN_TILES, LLTM_ON_AMX, LLTM_ON_BLAS };
static const char* const lltm_recurrence_names[] = {"own tiles", "amx", "blas"};
struct lltm_products {
  int recurrence, blas;
};

/* Where the own tiles take a pass's products rather than the BLAS, as
 * measured: lltm_sequence float32, T=16, training and inference,
 * microseconds a step, the plan against each forced.
 * Every product, where the BLAS's kernels are narrower than the CPU's
 * vectors (lltm_blas_narrow: AVX2's on a CPU with AVX-512, as
 * OPENBLAS_CORETYPE=Haswell asks) and a batch of more than 2 rows takes
 * a state up to 768, or 16 rows at most of any state: the own tiles run
 * their AVX-512 clone. On the 2-core AMD EPYC (Zen 4) so, one thread,
 * inference at B=16, S=256 took 71 us against 143, at B=64, S=512 1166
 * against 1840; 2 threads, B=16, S=1024, 915 against 1151; but B=64,
 * S=1024 3944 against 3703. */
#define LLTM_OWN_PRODUCTS_STATE 768
#define LLTM_OWN_PRODUCTS_BATCH 16
static inline int lltm_own_products_pay(int64_t batch_size, int64_t state_size) {
  return batch_size > 2 &&
         (state_size <= LLTM_OWN_PRODUCTS_STATE || batch_size <= LLTM_OWN_PRODUCTS_BATCH) &&
         lltm_blas_narrow();
}

/* Else the recurrence's product alone, one a step:
 * - 2 to 7 rows of a state up to 256, on any CPU: a step's product is a few
 *   microseconds, and the BLAS's call and its packing of the weights cost
 *   more than the product (on an AMD EPYC with AVX2 only, 2 x 128 x 384
 *   took 7.3 us against 12.4 for two gemv and 25.6 for a gemm);
 * - more rows of a state up to 256, on a CPU with AVX-512, where the tile's
 *   8 x 32 sums fit its 32 registers (with AVX2, 64 x 256 x 768 ran at 24.5
 *   GFLOP/s against OpenBLAS's 45.3): on the H200 machine's Xeon
 *   (OpenBLAS's SkylakeX kernels), one thread, inference at B=16, S=256
 *   took 131 us against 203, at B=64, S=128 142 against 155; and with
 *   AVX2 too on LLTM_OWN_TILES_TEAM threads or more, where a thread's slab
 *   of states is too small to pay for its call (on the Xeon, 4 to 16
 *   threads, B=64, S=128: 0.6 to 0.9 of the BLAS's time);
 * - one row on LLTM_OWN_TILES_TEAM threads or more, of a state up to 512,
 *   where the BLAS's gemv is too small to share out (a part is at least
 *   LLTM_BLAS_PART_ELEMENTS) and the tiles are not: on 16 threads of the
 *   Xeon, inference at S=256 took 23 us against 40, at S=512 51 against 77.
 * Larger batches and states take the BLAS's: on the Xeon, one thread,
 * B=64, S=512 took 3804 us against 2458. */
#define LLTM_OWN_TILES_BATCH 8
#define LLTM_OWN_TILES_STATE 256
#define LLTM_OWN_TILES_TEAM 4
#define LLTM_OWN_TILES_ROW_STATE 512
static inline int lltm_own_tiles_pay(int64_t batch_size, int64_t state_size) {
  const int team = lltm_pass_team();
  if (batch_size == 1) {
    return state_size <= LLTM_OWN_TILES_ROW_STATE && team >= LLTM_OWN_TILES_TEAM;
  }
  return state_size <= LLTM_OWN_TILES_STATE &&
         (batch_size < LLTM_OWN_TILES_BATCH || team >= LLTM_OWN_TILES_TEAM || lltm_cpu_avx512());
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

/* out[j] = start[j] + sums[j] (start NULL: zero), for j < count; start may
 * be out. The loops hold no condition, so that a narrow STORAGE's
 * conversions vectorise. */
static LLTM_ALWAYS_INLINE void LLTM_NAME(add_sums_)(int64_t count, const STORAGE* start,
                                                    const SCALAR* sums, STORAGE* out) {
  if (start) {
    for (int64_t j = 0; j < count; ++j) out[j] = STORE(LOAD(start[j]) + sums[j]);
  } else {
    for (int64_t j = 0; j < count; ++j) out[j] = STORE(sums[j]);
  }
}

/* add_sums_ with vector clones of its own, for the rows of a narrow
 * STORAGE's products. */
LLTM_VECTOR_CLONES
static void LLTM_NAME(add_sums_row_)(int64_t count, const STORAGE* start, const SCALAR* sums,
                                     STORAGE* out) {
  LLTM_NAME(add_sums_)(count, start, sums, out);
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
                                     int count, int width, const STORAGE* base, int accumulate,
                                     STORAGE* out, int64_t out_stride) {
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
    LLTM_NAME(add_sums_)(width, accumulate ? out + i * out_stride : base, sums[i],
                         out + i * out_stride);
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

/* Part `index` of `parts` of `count` items, each part but the last a
 * whole multiple of `align` items: its first item and how many (none for
 * parts past the items). */
#ifndef LLTM_PART_DEFINED
#define LLTM_PART_DEFINED
static inline void lltm_part(int64_t index, int64_t parts, int64_t count, int64_t align,
                             int64_t* first, int64_t* size) {
  int64_t each = (count + parts - 1) / parts;
  each = (each + align - 1) / align * align;
  *first = index * each < count ? index * each : count;
  *size = count - *first < each ? count - *first : each;
}
#endif

/* How many parts the BLAS's products are cut into, each on a thread of its
 * own: one a thread of the pass (lltm_team_size) for work of `elements`
 * elements, but none of less than LLTM_BLAS_PART_ELEMENTS (on 16 threads
 * of the H200 machine's Xeon, float32 inference at a batch of 1 took 0.87
 * of the time of a part a thread at a state of 512, 0.66 at 768), and no
 * more than LLTM_BLAS_MOST_PARTS, well below the buffers OpenBLAS keeps
 * for calls at once (twice its MAX_THREADS, 64 in the scipy-openblas32
 * wheels), past which it warns on stderr. Threads past the parts wait. */
#ifndef LLTM_BLAS_MOST_PARTS
#define LLTM_BLAS_MOST_PARTS 32
#define LLTM_BLAS_PART_ELEMENTS 16384
static inline int lltm_blas_parts(int64_t elements) {
  const int team = lltm_team_size(elements);
  const int64_t worth = elements / LLTM_BLAS_PART_ELEMENTS;
  int parts = team < LLTM_BLAS_MOST_PARTS ? team : LLTM_BLAS_MOST_PARTS;
  if (worth < parts) parts = worth > 1 ? (int)worth : 1;
  return parts;
}
#endif

/* Whether the BLAS takes a product of these sizes and strides as
 * blas_product_ hands them over: every one fits its ints, and each
 * factor's leading stride spans a row (cblas refuses less, and says so on
 * stderr). */
static int LLTM_NAME(blas_takes_)(int64_t rows, int64_t columns, int64_t depth,
                                  int64_t a_row_stride, int64_t a_depth_stride,
                                  int64_t b_row_stride, int64_t b_column_stride,
                                  int64_t out_stride) {
  const int64_t lda = a_depth_stride == 1 ? a_row_stride : a_depth_stride;
  const int64_t ldb = b_column_stride == 1 ? b_row_stride : b_column_stride;
  const int64_t a_span = a_depth_stride == 1 ? depth : rows;
  const int64_t b_span = b_column_stride == 1 ? columns : depth;
  return depth > 0 && (a_row_stride == 1 || a_depth_stride == 1) &&
         (b_row_stride == 1 || b_column_stride == 1) && lda >= a_span && ldb >= b_span &&
         out_stride >= columns && rows <= LLTM_BLAS_MAX && columns <= LLTM_BLAS_MAX &&
         depth <= LLTM_BLAS_MAX && lda <= LLTM_BLAS_MAX && ldb <= LLTM_BLAS_MAX &&
         out_stride <= LLTM_BLAS_MAX;
}

/* out = base + a b, or out += a b where `accumulate`, as product_ below
 * says, through the BLAS, for a STORAGE that is SCALAR: the result cut
 * into parts (of rows, or of columns where they are more), one a thread
 * (lltm_blas_parts), each one BLAS call on its own thread. */
static void LLTM_NAME(blas_product_)(int64_t rows, int64_t columns, int64_t depth,
                                     const SCALAR* a, int64_t a_row_stride,
                                     int64_t a_depth_stride, const SCALAR* b,
                                     int64_t b_row_stride, int64_t b_column_stride,
                                     const STORAGE* base, int accumulate, STORAGE* out,
                                     int64_t out_stride) {
  SCALAR* result = (SCALAR*)(void*)out; /* the same type: never called for a narrow one */
  const int transpose_a = a_depth_stride != 1, transpose_b = b_column_stride != 1;
  const int64_t lda = transpose_a ? a_depth_stride : a_row_stride;
  const int64_t ldb = transpose_b ? b_column_stride : b_row_stride;
  const int by_rows = rows >= columns;
  const int64_t elements = rows * columns * depth / 16;
  const int parts = lltm_blas_parts(elements);
  LLTM_FOR_EACH(part, parts, elements, {
    int64_t first, count;
    lltm_part(part, parts, by_rows ? rows : columns, by_rows ? 8 : 16, &first, &count);
    const int64_t first_row = by_rows ? first : 0, first_column = by_rows ? 0 : first;
    const int64_t part_rows = by_rows ? count : rows, part_columns = by_rows ? columns : count;
    SCALAR* part_out = result + first_row * out_stride + first_column;
    for (int64_t i = 0; count > 0 && base && !accumulate && i < part_rows; ++i) {
      memcpy(part_out + i * out_stride, base + first_column, sizeof(SCALAR) * (size_t)part_columns);
    }
    if (count > 0) {
      LLTM_MATH(blas_gemm_)(transpose_a, transpose_b, part_rows, part_columns, depth,
                            a + first_row * (transpose_a ? 1 : lda), lda,
                            b + first_column * (transpose_b ? ldb : 1), ldb,
                            accumulate || base ? (SCALAR)1 : (SCALAR)0, part_out, out_stride);
    }
  });
}

/* out (rows x columns, row stride out_stride) = base + a b, or out += a b
 * where `accumulate` (base, one value a column, may be NULL: zero). a is
 * rows x depth, element (i, k) at a[i * a_row_stride + k * a_depth_stride];
 * b is depth x columns, element (k, j) at b[k * b_row_stride + j *
 * b_column_stride]. Through the BLAS where `blas` asks for it and it takes
 * the product (one of each factor's strides 1); else by the tiles below,
 * which take b_column_stride 1 only. The tiles' depth goes
 * in blocks of LLTM_DEPTH_BLOCK, so that a tile's columns of b stay in
 * cache for every tile of rows (the weight gradients' depth is every step
 * of the batch). The threading threshold counts sixteen multiply-adds as
 * one element of a pointwise pass. */
#ifndef LLTM_DEPTH_BLOCK
#define LLTM_DEPTH_BLOCK 256
#endif
/* The math type's product, which the 16-bit types' call on their converted
 * factors: defined with linkage, in lltm_cpu_float.c for them. */
int LLTM_MATH(lltm_cpu_product_)(int blas, int64_t rows, int64_t columns, int64_t depth,
                                 const SCALAR* a, int64_t a_row_stride, int64_t a_depth_stride,
                                 const SCALAR* b, int64_t b_row_stride, int64_t b_column_stride,
                                 const SCALAR* base, int accumulate, SCALAR* out,
                                 int64_t out_stride);
int LLTM_NAME(lltm_cpu_product_)(int blas, int64_t rows, int64_t columns, int64_t depth,
                                 const SCALAR* a, int64_t a_row_stride, int64_t a_depth_stride,
                                 const SCALAR* b, int64_t b_row_stride, int64_t b_column_stride,
                                 const STORAGE* base, int accumulate, STORAGE* out,
                                 int64_t out_stride) {
  if (rows <= 0 || columns <= 0) return LLTM_SUCCESS;
  if (LLTM_NARROW_STORAGE) {
    /* SCALAR's own product of the factors (SCALAR already), its sums kept
     * in SCALAR over every depth block, then added to base or out and
     * rounded once. */
    SCALAR* sums = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(rows * columns));
    if (!sums) return LLTM_ERROR_NO_MEMORY;
    const int status =
        LLTM_MATH(lltm_cpu_product_)(blas, rows, columns, depth, a, a_row_stride, a_depth_stride, b,
                                     b_row_stride, b_column_stride, NULL, 0, sums, columns);
    LLTM_FOR_EACH(i, rows, rows * columns, {
      LLTM_NAME(add_sums_row_)(columns, accumulate ? out + i * out_stride : base,
                               sums + i * columns, out + i * out_stride);
    });
    free(sums);
    return status;
  }
  if (blas && LLTM_NAME(blas_takes_)(rows, columns, depth, a_row_stride, a_depth_stride,
                                     b_row_stride, b_column_stride, out_stride)) {
    LLTM_NAME(blas_product_)(rows, columns, depth, a, a_row_stride, a_depth_stride, b,
                             b_row_stride, b_column_stride, base, accumulate, out, out_stride);
    return LLTM_SUCCESS;
  }
  if (b_column_stride != 1 && depth > 0) return LLTM_ERROR_ARGUMENTS;
  const int64_t b_stride = b_row_stride;
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

/* The products read their factors as SCALAR. Where STORAGE is SCALAR those
 * are the tensors themselves (LLTM_AS_SCALAR changes no value, only the
 * type its pointer is spelled with); a narrow STORAGE's factors are
 * converted first (widen_), once for every product that reads them, so that
 * the tiles run float's code. */
#ifndef LLTM_AS_SCALAR
#define LLTM_AS_SCALAR(values) ((const SCALAR*)(const void*)(values))
#endif

LLTM_VECTOR_CLONES
static void LLTM_NAME(widen_)(int64_t count, const STORAGE* values, SCALAR* into) {
  for (int64_t i = 0; i < count; ++i) into[i] = LOAD(values[i]);
}

/* *operand: `count` elements from `values` (NULL: none) as SCALAR, the
 * elements themselves or a converted copy, also in *copy for the caller to
 * free; 0 where no memory could be had for one. */
static int LLTM_NAME(operand_)(int64_t count, const STORAGE* values, const SCALAR** operand,
                               SCALAR** copy) {
  *operand = NULL;
  *copy = NULL;
  if (!LLTM_NARROW_STORAGE || !values) {
    *operand = LLTM_AS_SCALAR(values);
    return 1;
  }
  *copy = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(count + 1));
  if (!*copy) return 0;
  LLTM_NAME(widen_)(count, values, *copy);
  *operand = *copy;
  return 1;
}

/* The transpose (columns, rows) of a (rows, columns) matrix with row
 * stride `stride`, in memory of its own (NULL where none can be had). Rows
 * go in blocks of 16, so that each column's writes fill whole cache lines
 * while the block's rows stay in cache. */
static SCALAR* LLTM_NAME(transposed_)(int64_t rows, int64_t columns, const STORAGE* matrix,
                                      int64_t stride) {
  SCALAR* result = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(rows * columns + 1));
  if (!result) return NULL;
  LLTM_FOR_EACH(block, (rows + 15) / 16, rows * columns, {
    const int64_t r0 = block * 16, r1 = r0 + 16 < rows ? r0 + 16 : rows;
    for (int64_t k = 0; k < columns; ++k) {
      for (int64_t r = r0; r < r1; ++r) result[k * rows + r] = LOAD(matrix[r * stride + k]);
    }
  });
  return result;
}

/* The 16-bit types' products on AMX (lltm_amx.h), where the pass takes them
 * (use_amx, from uses_amx_ below). They read the tensors themselves, not
 * SCALAR copies, so that a pass on AMX makes none: a's element (i, k) at
 * a[i * a_row_stride + k * a_depth_stride], b's (k, j) at
 * b[k * b_row_stride + j * b_column_stride], one stride of each 1. A
 * product AMX declines (a float16 factor not finite) takes SCALAR's own
 * product of converted copies instead. */

/* sums (rows x columns, row stride sums_stride) = a b, by SCALAR's own
 * product of copies of a and b converted to SCALAR. */
static int LLTM_NAME(converted_product_)(int64_t rows, int64_t columns, int64_t depth,
                                         const STORAGE* a, int64_t a_row_stride,
                                         int64_t a_depth_stride, const STORAGE* b,
                                         int64_t b_row_stride, int64_t b_column_stride,
                                         SCALAR* sums, int64_t sums_stride) {
  SCALAR* a_copy = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(rows * depth + 1));
  SCALAR* b_copy = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(depth * columns + 1));
  int status = a_copy && b_copy ? LLTM_SUCCESS : LLTM_ERROR_NO_MEMORY;
  if (status == LLTM_SUCCESS) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t k = 0; k < depth; ++k) {
        a_copy[i * depth + k] = LOAD(a[i * a_row_stride + k * a_depth_stride]);
      }
    }
    for (int64_t k = 0; k < depth; ++k) {
      for (int64_t j = 0; j < columns; ++j) {
        b_copy[k * columns + j] = LOAD(b[k * b_row_stride + j * b_column_stride]);
      }
    }
    status = LLTM_MATH(lltm_cpu_product_)(0, rows, columns, depth, a_copy, depth, 1, b_copy,
                                          columns, 1, NULL, 0, sums, sums_stride);
  }
  free(a_copy);
  free(b_copy);
  return status;
}

#ifdef AMX_DTYPE
/* Where a product's sums go (amx_product_): each run of them added to
 * base's or out's and rounded into out, by the thread that wrote them. */
struct LLTM_NAME(sums_out_) {
  const SCALAR* sums; /* row stride `columns` */
  int64_t columns;
  const STORAGE* base;
  int accumulate;
  STORAGE* out;
  int64_t out_stride;
};

static void LLTM_NAME(add_run_)(void* context, int64_t first_row, int64_t rows,
                                int64_t first_column, int64_t columns) {
  const struct LLTM_NAME(sums_out_)* to = (const struct LLTM_NAME(sums_out_)*)context;
  for (int64_t i = first_row; i < first_row + rows; ++i) {
    STORAGE* out = to->out + i * to->out_stride + first_column;
    LLTM_NAME(add_sums_row_)(columns,
                             to->accumulate ? out : to->base ? to->base + first_column : NULL,
                             to->sums + i * to->columns + first_column, out);
  }
}
#endif

/* out (rows x columns, row stride out_stride) = base + a b, or out += a b
 * where `accumulate` (base, one value a column, may be NULL: zero), as
 * product_ does, on AMX: b packed once (or given packed: packed_b, else
 * NULL), a LLTM_AMX_ROWS rows at a time, each run of a block's sums added
 * and rounded by the thread that wrote them, while they are in its cache. */
#ifndef LLTM_AMX_ROWS
#define LLTM_AMX_ROWS 256
#endif
static int LLTM_NAME(amx_product_)(int64_t rows, int64_t columns, int64_t depth,
                                   const STORAGE* a, int64_t a_row_stride,
                                   int64_t a_depth_stride, const STORAGE* b,
                                   int64_t b_row_stride, int64_t b_column_stride,
                                   const lltm_amx_factor* packed_b, const STORAGE* base,
                                   int accumulate, STORAGE* out, int64_t out_stride) {
#ifdef AMX_DTYPE
  if (rows <= 0 || columns <= 0) return LLTM_SUCCESS;
  const int64_t block = rows < LLTM_AMX_ROWS ? rows : LLTM_AMX_ROWS;
  lltm_amx_factor left = {0}, right = {0};
  SCALAR* sums = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(block * columns));
  int status = !sums     ? LLTM_ERROR_NO_MEMORY
               : packed_b ? LLTM_SUCCESS
                          : lltm_amx_pack_right(AMX_DTYPE, depth, columns, b, b_row_stride,
                                                b_column_stride, &right);
  for (int64_t first = 0; status == LLTM_SUCCESS && first < rows; first += block) {
    const int64_t count = rows - first < block ? rows - first : block;
    const STORAGE* a_rows = a + first * a_row_stride;
    struct LLTM_NAME(sums_out_) to = {sums, columns, base, accumulate, out + first * out_stride,
                                      out_stride};
    status = lltm_amx_multiply(count, a_rows, a_row_stride, a_depth_stride,
                               packed_b ? packed_b : &right, &left, sums, columns,
                               LLTM_NAME(add_run_), &to);
    if (status == LLTM_AMX_DECLINED) {
      status = LLTM_NAME(converted_product_)(count, columns, depth, a_rows, a_row_stride,
                                             a_depth_stride, b, b_row_stride, b_column_stride,
                                             sums, columns);
      if (status == LLTM_SUCCESS) LLTM_NAME(add_run_)(&to, 0, count, 0, columns);
    }
  }
  lltm_amx_free(&left);
  lltm_amx_free(&right);
  free(sums);
  return status;
#else
  (void)rows, (void)columns, (void)depth, (void)a, (void)a_row_stride, (void)a_depth_stride;
  (void)b, (void)b_row_stride, (void)b_column_stride, (void)packed_b, (void)base;
  (void)accumulate, (void)out, (void)out_stride;
  return LLTM_ERROR_DTYPE;
#endif
}

/* A pass's recurrent product on AMX: the hidden weights (the right
 * factor, depth x columns, laid out as amx_product_'s b) packed once, each
 * step's left factor (its old h forward, the next step's gate gradients
 * backward) packed as it comes, and its sums, up to `rows` rows of them
 * (row stride `columns`), for the step tiles. */
struct LLTM_NAME(recurrent_amx_) {
  const STORAGE* weights;
  int64_t depth, columns, row_stride, column_stride;
  lltm_amx_factor packed_weights, packed_step;
  SCALAR* sums;
  /* The forward's: a gate's hidden weights each, and the input weights. */
  lltm_amx_factor gate_weights[3], input_weights;
};

/* *amx with its weights' layout and room for its sums, nothing packed. */
static int LLTM_NAME(recurrent_amx_room_)(int64_t rows, int64_t depth, int64_t columns,
                                          const STORAGE* weights, int64_t row_stride,
                                          int64_t column_stride,
                                          struct LLTM_NAME(recurrent_amx_) * amx) {
  memset(amx, 0, sizeof *amx);
  amx->weights = weights;
  amx->depth = depth;
  amx->columns = columns;
  amx->row_stride = row_stride;
  amx->column_stride = column_stride;
  amx->sums = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(rows * columns + 1));
  return amx->sums ? LLTM_SUCCESS : LLTM_ERROR_NO_MEMORY;
}

static int LLTM_NAME(start_recurrent_amx_)(int64_t rows, int64_t depth, int64_t columns,
                                           const STORAGE* weights, int64_t row_stride,
                                           int64_t column_stride,
                                           struct LLTM_NAME(recurrent_amx_) * amx) {
  const int status = LLTM_NAME(recurrent_amx_room_)(rows, depth, columns, weights, row_stride,
                                                    column_stride, amx);
  if (status != LLTM_SUCCESS) return status;
#ifdef AMX_DTYPE
  return lltm_amx_pack_right(AMX_DTYPE, depth, columns, weights, row_stride, column_stride,
                             &amx->packed_weights);
#else
  return LLTM_ERROR_DTYPE;
#endif
}

/* amx->sums = `rows` rows of a (row stride a_stride) times the weights. */
static int LLTM_NAME(recurrent_sums_)(struct LLTM_NAME(recurrent_amx_) * amx, int64_t rows,
                                      const STORAGE* a, int64_t a_stride) {
  if (rows <= 0) return LLTM_SUCCESS;
#ifdef AMX_DTYPE
  const int status = lltm_amx_multiply(rows, a, a_stride, 1, &amx->packed_weights,
                                       &amx->packed_step, amx->sums, amx->columns, NULL, NULL);
  if (status != LLTM_AMX_DECLINED) return status;
#endif
  return LLTM_NAME(converted_product_)(rows, amx->columns, amx->depth, a, a_stride, 1,
                                       amx->weights, amx->row_stride, amx->column_stride,
                                       amx->sums, amx->columns);
}

static void LLTM_NAME(end_recurrent_amx_)(struct LLTM_NAME(recurrent_amx_) * amx) {
  lltm_amx_free(&amx->packed_weights);
  for (int gate = 0; gate < 3; ++gate) lltm_amx_free(&amx->gate_weights[gate]);
  lltm_amx_free(&amx->input_weights);
  lltm_amx_free(&amx->packed_step);
  free(amx->sums);
}

/* The whole-sequence layer's passes, step by step as the step-by-step
 * kernels of step_by_step_kernel.cu, over the steps of one direction as
 * lltm_steps.h walks them; lltm_ffi.h describes the arguments. Each step is
 * cut into tiles of its rows by states, each tile doing the recurrent
 * product for its states' three gates and then the cell's math on them, so
 * that the threads share the step's pointwise work as well as its product. */

/* The state a step starts from: its row r below `carried` is row r of the
 * previous step's (h, cell), any other row r of (h0, c0). A narrow
 * STORAGE's old h is also in h_factors, as SCALAR (row r at r * state). */
struct LLTM_NAME(old_state_) {
  const STORAGE *h, *cell, *h0, *c0;
  int64_t carried;
  const SCALAR* h_factors;
};

static inline const STORAGE* LLTM_NAME(old_row_)(const STORAGE* previous,
                                                 const STORAGE* initial, int64_t carried,
                                                 int64_t row, int64_t state_size) {
  return (row < carried ? previous : initial) + row * state_size;
}

/* A step's forward tile: its old h times the hidden weights (`hidden`,
 * transposed: state x 3 * state; `last_columns`, each gate's columns of the
 * last block of states padded to a tile, where that block is short of one)
 * added to the tile's three gates, then the cell's forward math. Where
 * hidden_sums is not NULL it holds the step's products already (row stride
 * 3 * state). */
static void LLTM_NAME(forward_step_tile_)(int64_t state_size, struct lltm_tile tile,
                                          const SCALAR* hidden, const SCALAR* last_columns,
                                          const SCALAR* hidden_sums,
                                          struct LLTM_NAME(old_state_) old, STORAGE* gates,
                                          STORAGE* new_h, STORAGE* new_cell) {
  const int64_t gates_size = 3 * state_size;
  if (!hidden_sums) {
    const int is_padded = tile.columns < LLTM_TILE_COLUMNS;
    const SCALAR* a_rows[LLTM_TILE_ROWS];
    for (int i = 0; i < LLTM_TILE_ROWS; ++i) {
      const int64_t row = tile.first_row + (i < tile.rows ? i : tile.rows - 1);
      a_rows[i] = LLTM_NARROW_STORAGE ? old.h_factors + row * state_size
                                      : LLTM_AS_SCALAR(LLTM_NAME(old_row_)(
                                            old.h, old.h0, old.carried, row, state_size));
    }
    for (int gate = 0; gate < 3; ++gate) {
      const int64_t column = gate * state_size + tile.first_column;
      LLTM_NAME(product_tile_)(
          state_size, a_rows, 1,
          is_padded ? last_columns + gate * state_size * LLTM_TILE_COLUMNS : hidden + column,
          is_padded ? LLTM_TILE_COLUMNS : gates_size, tile.rows, tile.columns, NULL, 1,
          gates + tile.first_row * gates_size + column, gates_size);
    }
  }
  for (int i = 0; i < tile.rows; ++i) {
    const int64_t row = tile.first_row + i, offset = row * state_size + tile.first_column;
    const int64_t gate_offset = row * gates_size + tile.first_column;
    const STORAGE* old_cell =
        LLTM_NAME(old_row_)(old.cell, old.c0, old.carried, row, state_size) + tile.first_column;
    if (hidden_sums) {
      LLTM_NAME(forward_sums_row_)(tile.columns, state_size, hidden_sums + gate_offset,
                                   gates + gate_offset, old_cell, new_h + offset,
                                   new_cell + offset);
    } else {
      LLTM_NAME(forward_row_)(tile.columns, state_size, gates + gate_offset, old_cell,
                              new_h + offset, new_cell + offset);
    }
  }
}

/* The old h of a step's `rows` rows, one row after another (row stride
 * state): the state's own rows where they all come from one place, else
 * copied into `scratch` (a packed step in reverse, whose rows past
 * `carried` start from h0). */
static const STORAGE* LLTM_NAME(old_h_rows_)(struct LLTM_NAME(old_state_) old, int64_t rows,
                                             int64_t state_size, STORAGE* scratch) {
  if (old.carried >= rows) return old.h;
  if (old.carried == 0) return old.h0;
  const size_t carried = sizeof(STORAGE) * (size_t)(old.carried * state_size);
  memcpy(scratch, old.h, carried);
  memcpy(scratch + old.carried * state_size, old.h0 + old.carried * state_size,
         sizeof(STORAGE) * (size_t)((rows - old.carried) * state_size));
  return scratch;
}

/* A forward pass's recurrent products on AMX, each gate's hidden weights
 * packed once as a factor of their own, so that a block of states starts a
 * block of every gate's columns: a thread takes its states' sums of the
 * three gates, then their cell's math on the sums it has just written.
 * Where one team took the step's product and the next its cell's math,
 * the sums moved between cores each step: on 16 threads of the H200
 * machine's Xeon, bfloat16 inference at B=64, S=128 took 1.57 to 1.62
 * times nn.LSTM's time that way, 1.18 this way (docs/ARCHITECTURE.md). */
static int LLTM_NAME(start_forward_amx_)(int64_t rows, int64_t state_size, const STORAGE* weights,
                                         int64_t columns,
                                         struct LLTM_NAME(recurrent_amx_) * amx) {
  int status = LLTM_NAME(recurrent_amx_room_)(rows, state_size, 3 * state_size, weights, 1,
                                              columns, amx);
#ifdef AMX_DTYPE
  for (int gate = 0; gate < 3 && status == LLTM_SUCCESS; ++gate) {
    status = lltm_amx_pack_right(AMX_DTYPE, state_size, state_size,
                                 weights + gate * state_size * columns, 1, columns,
                                 &amx->gate_weights[gate]);
  }
  if (status != LLTM_SUCCESS || columns == state_size) return status;
  return lltm_amx_pack_right(AMX_DTYPE, columns - state_size, 3 * state_size,
                             weights + state_size, 1, columns, &amx->input_weights);
#else
  return status == LLTM_SUCCESS ? LLTM_ERROR_DTYPE : status;
#endif
}

/* A step's recurrent product on AMX, shared out with its cell's math
 * (start_forward_amx_ says why): the left factor packed, then part after
 * part of the step's rows by a block of LLTM_AMX_BLOCK states, each a
 * thread's, taking its sums of each factor's columns of those states, then
 * its cell (amx_step_part_). The factors (`count`: the forward's gates, or
 * the backward's one) each hold a column a state; their sums lie
 * state_size apart in amx->sums. A factor AMX declines (a float16 not
 * finite) leaves the sums to SCALAR's own product of converted copies,
 * before the parts.
 * On one thread the step is one part: its sums, then its cell a whole row
 * at a time. Blocks of states took longer there: on the H200 machine's
 * Xeon, bfloat16, a batch of 64, time over nn.LSTM's in two turns,
 * training at a state of 256 0.94 and 0.95 against 0.69 and 0.77,
 * inference at 512 1.07 and 1.17 against 0.95 and 0.99. */
struct LLTM_NAME(amx_step_) {
  struct LLTM_NAME(recurrent_amx_) * amx;
  const lltm_amx_factor* factors;
  int count, sums_done;
  int64_t rows, product_rows, state_size, width, row_parts, parts, work;
};

/* A step of `rows` rows whose first product_rows take the product of a
 * (row stride a_stride) and the factors. */
static int LLTM_NAME(start_amx_step_)(struct LLTM_NAME(recurrent_amx_) * amx,
                                      const lltm_amx_factor* factors, int count, int64_t rows,
                                      int64_t product_rows, int64_t state_size, const STORAGE* a,
                                      int64_t a_stride, struct LLTM_NAME(amx_step_) * step) {
#ifdef AMX_DTYPE
  int status = LLTM_SUCCESS, finite = 1;
  for (int factor = 0; factor < count; ++factor) finite &= factors[factor].finite;
  const int64_t product_work =
      product_rows > 0 ? lltm_amx_work(product_rows, count * state_size, &factors[0]) : 0;
  if (product_rows > 0) {
    status = finite ? lltm_amx_pack_left(product_rows, a, a_stride, 1, &factors[0], product_work,
                                         &amx->packed_step)
                    : LLTM_AMX_DECLINED;
  }
  const int sums_done = product_rows == 0 || status == LLTM_AMX_DECLINED;
  if (status == LLTM_AMX_DECLINED) {
    status = LLTM_NAME(converted_product_)(product_rows, amx->columns, amx->depth, a, a_stride, 1,
                                           amx->weights, amx->row_stride, amx->column_stride,
                                           amx->sums, amx->columns);
  }
  const int64_t work = rows * state_size + product_work;
  const int team = lltm_team_size(work);
  const int64_t width = team > 1 ? LLTM_AMX_BLOCK : state_size;
  const int64_t blocks = (state_size + width - 1) / width;
  const int64_t row_blocks = (rows + LLTM_AMX_BLOCK - 1) / LLTM_AMX_BLOCK;
  /* The states' blocks outermost, so that a thread's parts share weights. */
  int64_t row_parts = team / blocks;
  row_parts = row_parts < 1 ? 1 : row_parts > row_blocks ? row_blocks : row_parts;
  const struct LLTM_NAME(amx_step_) started = {
      amx, factors, count, sums_done, rows, product_rows, state_size, width, row_parts,
      blocks * row_parts, work};
  *step = started;
  return status;
#else
  (void)amx, (void)factors, (void)count, (void)rows, (void)product_rows, (void)state_size;
  (void)a, (void)a_stride, (void)step;
  return LLTM_ERROR_DTYPE;
#endif
}

/* Part `part` of the step: its sums taken, its tile in *tile; 0 where it
 * holds no rows. */
static int LLTM_NAME(amx_step_part_)(const struct LLTM_NAME(amx_step_) * step, int64_t part,
                                     struct lltm_tile* tile) {
  int64_t first_row, rows;
  lltm_part(part % step->row_parts, step->row_parts, step->rows, LLTM_AMX_BLOCK, &first_row,
            &rows);
  const int64_t state_size = step->state_size, width = step->width;
  const int64_t first = part / step->row_parts * width;
  const int64_t count = state_size - first < width ? state_size - first : width;
  const int64_t product_rows =
      step->product_rows - first_row < rows ? step->product_rows - first_row : rows;
#ifdef AMX_DTYPE
  for (int factor = 0; !step->sums_done && product_rows > 0 && factor < step->count; ++factor) {
    lltm_amx_block_sums(&step->amx->packed_step, &step->factors[factor], first_row,
                        product_rows, first, count, step->amx->sums + factor * state_size,
                        step->amx->columns);
  }
#else
  (void)product_rows;
#endif
  const struct lltm_tile part_tile = {first_row, first, (int)rows, (int)count};
  *tile = part_tile;
  return rows > 0;
}

/* What a forward pass's products read: the tensors (on AMX), or their
 * SCALAR factors: the weights as they are (weight_factors), or where the
 * own tiles take the recurrence transposed (`transposed`, columns x 3 *
 * state; its hidden rows alone where the weights as they are serve the
 * input part of the gates). */
struct LLTM_NAME(forward_factors_) {
  struct lltm_products products;
  int64_t input_features, state_size;
  const STORAGE *inputs, *weights, *bias;
  const SCALAR *input_factors, *weight_factors, *transposed;
  const lltm_amx_factor* input_weights; /* on AMX, packed */
};

/* `count` rows of the gates from row `first` on (at `into`, row stride
 * 3 * state): those rows' input part, plus the bias. */
static int LLTM_NAME(input_gates_)(const struct LLTM_NAME(forward_factors_) * f, int64_t first,
                                   int64_t count, STORAGE* into) {
  const int64_t features = f->input_features, state_size = f->state_size;
  const int64_t gates_size = 3 * state_size, columns = state_size + features;
  if (f->products.recurrence == LLTM_ON_AMX) {
    return LLTM_NAME(amx_product_)(count, gates_size, features, f->inputs + first * features,
                                   features, 1, f->weights + state_size, 1, columns,
                                   f->input_weights, f->bias, 0, into, gates_size);
  }
  const SCALAR* input_factors = f->input_factors + first * features;
  if (!f->weight_factors) {
    return LLTM_NAME(lltm_cpu_product_)(f->products.blas, count, gates_size, features,
                                        input_factors, features, 1,
                                        f->transposed + state_size * gates_size, gates_size, 1,
                                        f->bias, 0, into, gates_size);
  }
  return LLTM_NAME(lltm_cpu_product_)(f->products.blas, count, gates_size, features, input_factors,
                                      features, 1, f->weight_factors + state_size, 1, columns,
                                      f->bias, 0, into, gates_size);
}

/* A step of up to this many rows takes its recurrent products on the BLAS
 * a row at a time, each a product of the weights and one vector (gemv),
 * which reads the weights once as they lie; a product of more rows packs
 * them into the BLAS's own layout first, which at 1 and 2 rows cost more
 * than the products (on the 2-core AMD EPYC, from a state of 512; the own
 * tiles take smaller ones). */
#ifndef LLTM_BLAS_GEMV_ROWS
#define LLTM_BLAS_GEMV_ROWS 2
#endif

/* A step's forward recurrent products of the states from `first` on,
 * `count` of them, on the BLAS: their three gates' columns of sums (rows x
 * 3 * state) = h (rows x state, row stride state) times those rows of the
 * hidden weights (row stride `columns`), transposed. Where the states are
 * all of them, the three gates' rows are one block: one call. */
static void LLTM_NAME(blas_gate_sums_)(int64_t rows, int64_t state_size, int64_t columns,
                                       int64_t first, int64_t count, const SCALAR* h,
                                       const SCALAR* weights, SCALAR* sums) {
  const int64_t gates_size = 3 * state_size;
  const int whole = count == state_size;
  for (int64_t gate = 0; gate < (whole ? 1 : 3); ++gate) {
    const int64_t column = gate * state_size + first;
    const int64_t width = whole ? gates_size : count;
    const SCALAR* gate_weights = weights + column * columns;
    if (rows > LLTM_BLAS_GEMV_ROWS) {
      LLTM_MATH(blas_gemm_)(0, 1, rows, width, state_size, h, state_size, gate_weights, columns,
                            0, sums + column, gates_size);
      continue;
    }
    for (int64_t row = 0; row < rows; ++row) {
      LLTM_MATH(blas_gemv_)(0, width, state_size, gate_weights, columns, h + row * state_size,
                            sums + row * gates_size + column);
    }
  }
}

/* The input part of the steps' gates is computed this many rows at a time
 * (a step's at least), as the steps come: where a pass keeps no gates, in
 * memory of its own, reused block after block. A pass that keeps them
 * takes the same blocks, so that both give the same bits. */
#ifndef LLTM_INPUT_BLOCK_ROWS
#define LLTM_INPUT_BLOCK_ROWS 256
#endif

/* Every step's outputs, cells and pre-activation gates, and where final_h
 * is not NULL each sequence's final state in final_h and final_cell
 * (batch, state). bias may be NULL (none). cells and gates may both be
 * NULL (a forward whose backward will not run): the pass then keeps the
 * steps' cells and gates in scratch memory only as long as it needs them. */
static int LLTM_NAME(recurrence_forward_)(struct lltm_products products, const lltm_walk* walk,
                                          int64_t input_features, int64_t state_size,
                                          const STORAGE* inputs, const STORAGE* weights,
                                          const STORAGE* bias, const STORAGE* h0,
                                          const STORAGE* c0, STORAGE* outputs, STORAGE* cells,
                                          STORAGE* gates, STORAGE* final_h,
                                          STORAGE* final_cell) {
  if (!cells != !gates) return LLTM_ERROR_ARGUMENTS;
  if (walk->steps == 0) return LLTM_SUCCESS;
  const int64_t gates_size = 3 * state_size, columns = state_size + input_features;
  const int64_t batch_state = walk->batch_size * state_size;
  const int use_amx = products.recurrence == LLTM_ON_AMX;
  const int on_blas = products.recurrence == LLTM_ON_BLAS;
  /* The steps' input part of their gates, and the bias, a block of steps
   * at a time (LLTM_INPUT_BLOCK_ROWS); then the recurrent products, step
   * by step: on AMX and the BLAS from the
   * weights as they are; by the own tiles from the weights transposed
   * (columns, 3 * state), so that every product runs along contiguous
   * rows, as the backward pass's do: rows below state_size are the hidden
   * weights, the rest the input ones. */
  struct LLTM_NAME(forward_factors_) factors = {products, input_features, state_size, inputs,
                                                weights, bias, NULL, NULL, NULL, NULL};
  SCALAR *transposed = NULL, *last_columns = NULL, *h_factors = NULL, *sums = NULL;
  SCALAR *inputs_copy = NULL, *weights_copy = NULL;
  STORAGE *old_h_scratch = NULL, *cell_scratch = NULL, *gate_block = NULL;
  struct LLTM_NAME(recurrent_amx_) amx = {0};
  const int64_t block_rows =
      walk->batch_size > LLTM_INPUT_BLOCK_ROWS ? walk->batch_size : LLTM_INPUT_BLOCK_ROWS;
  int status = LLTM_SUCCESS;
  if (!gates) {
    cell_scratch = (STORAGE*)malloc(sizeof(STORAGE) * (size_t)(2 * batch_state + 1));
    gate_block = (STORAGE*)malloc(sizeof(STORAGE) * (size_t)(block_rows * gates_size + 1));
    if (!cell_scratch || !gate_block) status = LLTM_ERROR_NO_MEMORY;
  }
  if (use_amx || (on_blas && !LLTM_NARROW_STORAGE)) {
    old_h_scratch = (STORAGE*)malloc(sizeof(STORAGE) * (size_t)(batch_state + 1));
    if (!old_h_scratch) status = LLTM_ERROR_NO_MEMORY;
  }
  if (status == LLTM_SUCCESS && use_amx) {
    status = LLTM_NAME(start_forward_amx_)(walk->batch_size, state_size, weights, columns, &amx);
    factors.input_weights = &amx.input_weights;
  } else if (status == LLTM_SUCCESS) {
    const int has_inputs = LLTM_NAME(operand_)(walk->rows * input_features, inputs,
                                               &factors.input_factors, &inputs_copy);
    h_factors = LLTM_NARROW_STORAGE ? (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(batch_state + 1))
                                    : NULL;
    int has_weights = 1, needs_last_columns = 0;
    if (on_blas) {
      has_weights = LLTM_NAME(operand_)(gates_size * columns, weights, &factors.weight_factors,
                                        &weights_copy);
      sums = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(walk->batch_size * gates_size + 1));
    } else {
      const int64_t full_states = state_size - state_size % LLTM_TILE_COLUMNS;
      needs_last_columns = full_states < state_size;
      /* Where the BLAS takes the input part of the gates from the weights
       * as they are, the tiles need only the hidden columns transposed (a
       * narrow STORAGE's input ones are converted on the way all the same). */
      const int hidden_only = products.blas && !LLTM_NARROW_STORAGE;
      factors.weight_factors = hidden_only ? LLTM_AS_SCALAR(weights) : NULL;
      transposed = LLTM_NAME(transposed_)(gates_size, hidden_only ? state_size : columns, weights,
                                          columns);
      last_columns = transposed && needs_last_columns
                         ? LLTM_NAME(padded_columns_)(3, state_size, state_size, transposed,
                                                      gates_size, full_states,
                                                      state_size - full_states)
                         : NULL;
      factors.transposed = transposed;
    }
    if (!has_inputs || !has_weights || (on_blas && !sums) || (!on_blas && !transposed) ||
        (needs_last_columns && !last_columns) || (LLTM_NARROW_STORAGE && !h_factors)) {
      status = LLTM_ERROR_NO_MEMORY;
    }
  }
  int64_t block_first = 0, block_count = 0; /* the rows of the block computed last */
  lltm_step step = lltm_first_step(walk);
  while (status == LLTM_SUCCESS) {
    if (step.offset < block_first || step.offset + step.rows > block_first + block_count) {
      /* The steps from this one on, as many as a block holds; in either
       * direction their rows lie together. */
      lltm_step last = step;
      block_count = step.rows;
      while (last.order + 1 < walk->steps) {
        const lltm_step next = lltm_next_step(walk, &last);
        if (block_count + next.rows > block_rows) break;
        block_count += next.rows;
        last = next;
      }
      block_first = walk->reverse ? last.offset : step.offset;
      status = LLTM_NAME(input_gates_)(
          &factors, block_first, block_count,
          gates ? gates + block_first * gates_size : gate_block);
      if (status != LLTM_SUCCESS) break;
    }
    STORAGE* step_gates =
        gates ? gates + step.offset * gates_size
              : gate_block + (step.offset - block_first) * gates_size;
    STORAGE* step_cells =
        cells ? cells + step.offset * state_size : cell_scratch + (step.order & 1) * batch_state;
    const STORAGE* previous_cells = cells ? cells + step.previous_offset * state_size
                                          : cell_scratch + (~step.order & 1) * batch_state;
    const struct LLTM_NAME(old_state_) old = {outputs + step.previous_offset * state_size,
                                              previous_cells, h0, c0, step.carried, h_factors};
    if (LLTM_NARROW_STORAGE && !use_amx) {
      for (int64_t row = 0; row < step.rows; ++row) {
        LLTM_NAME(widen_)(state_size,
                          LLTM_NAME(old_row_)(old.h, old.h0, old.carried, row, state_size),
                          h_factors + row * state_size);
      }
    }
    const int64_t elements = step.rows * state_size;
    STORAGE* step_outputs = outputs + step.offset * state_size;
    if (use_amx) {
      struct LLTM_NAME(amx_step_) parts;
      status = LLTM_NAME(start_amx_step_)(
          &amx, amx.gate_weights, 3, step.rows, step.rows, state_size,
          LLTM_NAME(old_h_rows_)(old, step.rows, state_size, old_h_scratch), state_size, &parts);
      if (status != LLTM_SUCCESS) break;
      LLTM_FOR_EACH(part, parts.parts, parts.work, {
        struct lltm_tile tile;
        if (LLTM_NAME(amx_step_part_)(&parts, part, &tile)) {
          LLTM_NAME(forward_step_tile_)(state_size, tile, NULL, NULL, amx.sums, old, step_gates,
                                        step_outputs, step_cells);
        }
      });
    } else if (on_blas) {
      /* Each thread's states: their products on the BLAS, then their math. */
      const SCALAR* h = LLTM_NARROW_STORAGE
                            ? h_factors
                            : LLTM_AS_SCALAR(LLTM_NAME(old_h_rows_)(old, step.rows, state_size,
                                                                    old_h_scratch));
      const int parts = lltm_blas_parts(elements * gates_size / 16);
      LLTM_FOR_EACH(part, parts, elements * gates_size / 16, {
        int64_t first, count;
        lltm_part(part, parts, state_size, 16, &first, &count);
        if (count > 0) {
          LLTM_NAME(blas_gate_sums_)(step.rows, state_size, columns, first, count, h,
                                     factors.weight_factors, sums);
          const struct lltm_tile tile = {0, first, (int)step.rows, (int)count};
          LLTM_NAME(forward_step_tile_)(state_size, tile, NULL, NULL, sums, old, step_gates,
                                        step_outputs, step_cells);
        }
      });
    } else {
      LLTM_FOR_EACH(index, lltm_tile_count(step.rows, state_size), elements * gates_size / 16, {
        LLTM_NAME(forward_step_tile_)(state_size, lltm_tile_at(index, step.rows, state_size),
                                      transposed, last_columns, NULL, old, step_gates,
                                      step_outputs, step_cells);
      });
    }
    if (final_h && step.continued < step.rows) {
      const int64_t first = step.continued * state_size;
      const size_t bytes = sizeof(STORAGE) * (size_t)(elements - first);
      memcpy(final_h + first, step_outputs + first, bytes);
      memcpy(final_cell + first, step_cells + first, bytes);
    }
    if (step.order + 1 == walk->steps) break;
    step = lltm_next_step(walk, &step);
  }
  LLTM_NAME(end_recurrent_amx_)(&amx);
  free(old_h_scratch);
  free(cell_scratch);
  free(gate_block);
  free(transposed);
  free(last_columns);
  free(h_factors);
  free(sums);
  free(inputs_copy);
  free(weights_copy);
  return status;
}

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
 * SCALAR) times the hidden weights (`weights`, 3 * state x (state +
 * input_features); `last_columns`, the last block of states' columns padded
 * to a tile, where that block is short of one), and for the others the
 * final h's gradient; d_c, that reaching its cell, is likewise the gradient
 * carried from the next step or the final cell's. Both then take the
 * step's own output and cell gradients, and the cell's backward math writes
 * the tile's gate gradients and, over d_c, the gradient reaching the old
 * cell. Where carried_sums is not NULL it holds the products of the rows
 * below `continued` already (row stride state). Where gate_factors is not
 * NULL the tile's gate gradients are also converted into it, as SCALAR
 * (laid out as d_gates), for the products that read them. */
static void LLTM_NAME(backward_step_tile_)(int64_t state_size, int64_t input_features,
                                           struct lltm_tile tile, const SCALAR* weights,
                                           const SCALAR* last_columns, int64_t continued,
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
      const int is_padded = tile.columns < LLTM_TILE_COLUMNS;
      const SCALAR* a_rows[LLTM_TILE_ROWS];
      LLTM_NAME(tile_rows_)(next_d_gates, gates_size, carried, a_rows);
      LLTM_NAME(product_tile_)(gates_size, a_rows, 1,
                               is_padded ? last_columns : weights + tile.first_column,
                               is_padded ? LLTM_TILE_COLUMNS : state_size + input_features,
                               carried.rows, tile.columns, NULL, 0,
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
  SCALAR *weights_copy = NULL, *gates_copy = NULL, *last_columns = NULL, *sums = NULL;
  if (status == LLTM_SUCCESS && use_amx) {
    if (walk->steps > 1 || wants_d_h0) {
      status = LLTM_NAME(start_recurrent_amx_)(walk->batch_size, gates_size, state_size, weights,
                                               columns, 1, &amx);
    }
  } else if (status == LLTM_SUCCESS) {
    const int64_t full_states = state_size - state_size % LLTM_TILE_COLUMNS;
    const int needs_last_columns = !on_blas && walk->steps > 1 && full_states < state_size;
    const int has_weights = LLTM_NAME(operand_)(gates_size * columns, weights, &weight_factors,
                                                &weights_copy);
    gates_copy =
        LLTM_NARROW_STORAGE
            ? (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(walk->rows * gates_size + 1))
            : NULL;
    last_columns = has_weights && needs_last_columns
                       ? LLTM_NAME(padded_columns_)(1, 0, gates_size, weight_factors, columns,
                                                    full_states, state_size - full_states)
                       : NULL;
    sums = on_blas ? (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(batch_state + 1)) : NULL;
    if (!has_weights || (LLTM_NARROW_STORAGE && !gates_copy) ||
        (needs_last_columns && !last_columns) || (on_blas && !sums)) {
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
          LLTM_NAME(backward_step_tile_)(state_size, input_features, tile, NULL, NULL,
                                         step.continued, NULL, sums, gradients, step_cells,
                                         step_gates, d_h0, d_c0, step_d_gates, step_gate_factors);
        }
      });
    } else if (use_amx) {
      struct LLTM_NAME(amx_step_) parts;
      status = LLTM_NAME(start_amx_step_)(&amx, &amx.packed_weights, 1, step.rows, step.continued,
                                          state_size, d_gates + next_offset * gates_size,
                                          gates_size, &parts);
      if (status != LLTM_SUCCESS) break;
      LLTM_FOR_EACH(part, parts.parts, parts.work, {
        struct lltm_tile tile;
        if (LLTM_NAME(amx_step_part_)(&parts, part, &tile)) {
          LLTM_NAME(backward_step_tile_)(state_size, input_features, tile, NULL, NULL,
                                         step.continued, NULL, amx.sums, gradients, step_cells,
                                         step_gates, d_h0, d_c0, step_d_gates, NULL);
        }
      });
    } else {
      LLTM_FOR_EACH(index, lltm_tile_count(step.rows, state_size), elements, {
        LLTM_NAME(backward_step_tile_)(state_size, input_features,
                                       lltm_tile_at(index, step.rows, state_size), weight_factors,
                                       last_columns, step.continued, next_d_gates, NULL,
                                       gradients, step_cells, step_gates, d_h0, d_c0,
                                       step_d_gates, step_gate_factors);
      });
    }
    if (step.order == 0) break;
    next_offset = step.offset;
    step = lltm_previous_step(walk, &step);
  }
  free(scratch);
  free(last_columns);
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

/* Whether a pass with `options` (NULL: the defaults) takes its products on
 * AMX: a 16-bit type's, where the CPU has it (or AVX512-BF16's dot products
 * in its place: lltm_amx.h), unless options->amx asks for the portable
 * products (0). A float16 product takes four tile products and its packing
 * costs more: on 2 cores of a Sapphire Rapids the portable products beat
 * AMX's but from a state of 320 and 2^24 multiply-adds a step's recurrent
 * product (BENCHMARKS.md), and only there does float16 take AMX by
 * default; it never takes the dot products by default (on the 2-core AMD
 * EPYC, Zen 4, one thread, inference at 16x64x512x512 took 2491 us a step
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
  if (LLTM_NAME(uses_amx_)(options, batch_size, state_size)) {
    products.recurrence = LLTM_ON_AMX;
  } else if (options->blas != 0 && rows <= LLTM_BLAS_MAX && 3 * state_size <= LLTM_BLAS_MAX &&
             state_size + input_features <= LLTM_BLAS_MAX && lltm_blas_loaded() &&
             (options->blas == 1 || !lltm_own_products_pay(batch_size, state_size))) {
    products.blas = 1;
    if (options->blas == 1 || !lltm_own_tiles_pay(batch_size, state_size)) {
      products.recurrence = LLTM_ON_BLAS;
    }
  }
  lltm_note_cpu_recurrence(lltm_recurrence_names[products.recurrence]);
  return products;
}

/* The sequence's passes, packed_forward and packed_backward:
 * packed steps, or where batch_sizes is NULL dense ones, in either
 * direction, with the final states. */
/* sizes: rows, steps, batch, input_features, state, reverse; the options
 * (lltm_ffi.h) after the tensors and the CUDA passes' staging (the CPU
 * passes' tensors[11] and tensors[17], NULL). */
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
 * column strides. */
static int LLTM_NAME(packed_backward_)(
    const int64_t* sizes, const int64_t* batch_sizes, const STORAGE* inputs,
    const STORAGE* weights, const STORAGE* h0, const STORAGE* outputs, const STORAGE* cells,
    const STORAGE* gates, const STORAGE* grad_outputs, const STORAGE* grad_cells,
    const STORAGE* grad_final_h, const STORAGE* grad_final_cell, STORAGE* d_gates,
    STORAGE* d_inputs, STORAGE* d_weights, STORAGE* d_bias, STORAGE* d_h0, STORAGE* d_c0,
    const lltm_sequence_options* options) {
  lltm_walk walk;
  if (!lltm_packed_walk(sizes, batch_sizes, &walk)) return LLTM_ERROR_ARGUMENTS;
  const int64_t* row_strides = sizes + 6;
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

int LLTM_NAME(lltm_packed_forward_)(const lltm_args* args) {
  return LLTM_NAME(packed_forward_)(args->sizes, args->tensors[5], args->tensors[0],
                                    args->tensors[1], args->tensors[2], args->tensors[3],
                                    args->tensors[4], args->tensors[6], args->tensors[7],
                                    args->tensors[8], args->tensors[9], args->tensors[10],
                                    args->tensors[12]);
}

int LLTM_NAME(lltm_packed_backward_)(const lltm_args* args) {
  return LLTM_NAME(packed_backward_)(args->sizes, args->tensors[3], args->tensors[0],
                                     args->tensors[1], args->tensors[2], args->tensors[4],
                                     args->tensors[5], args->tensors[6], args->tensors[7],
                                     args->tensors[8], args->tensors[9], args->tensors[10],
                                     args->tensors[11], args->tensors[12], args->tensors[13],
                                     args->tensors[14], args->tensors[15], args->tensors[16],
                                     args->tensors[18]);
}

#undef SCALAR
#undef STORAGE
#undef SUFFIX
#undef LOAD
#undef STORE
#undef AMX_DTYPE
