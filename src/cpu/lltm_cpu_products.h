/* Part of the CPU passes (lltm_cpu_impl.h), included from it once for
 * every element type, with its parameters defined: the matrix
 * products, the own tiles', the BLAS's and AMX's, and where each runs. */

/* The matrix products. Each tile of a result, LLTM_TILE_ROWS rows by
 * LLTM_TILE_COLUMNS columns, is summed in registers over the depth: each
 * step of the depth loads one row of b's tile and one value of a per row.
 * Of the tiles from 4 to 12 rows by 16 to 64 columns tried on an AVX-512
 * machine, 8 x 32 ran fastest in float32, with AVX-512 and with AVX2. */
#ifndef LLTM_TILE_ROWS
#define LLTM_TILE_ROWS 8
#define LLTM_TILE_COLUMNS 32
/* A page of memory, as far as where a factor's rows lie apart goes. */
#define LLTM_PAGE_BYTES 4096

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
 * Every product of a batch of more than 2 rows, where the BLAS's kernels
 * are narrower than the CPU's vectors (lltm_blas_narrow: AVX2's on a CPU
 * with AVX-512, as OPENBLAS_CORETYPE=Haswell asks): the own tiles run
 * their AVX-512 clone, on the recurrence's weights in panels. On the
 * 2-core AMD EPYC (Zen 5) so, against the BLAS, nn.LSTM beside them: one
 * thread, inference at B=16, S=256 71 us against 143; B=64, S=1024 4563
 * against 7402 (nn.LSTM 5963), training 14758 against 21039 (17245); 2
 * threads, B=64, S=1024 inference 2304 against 3669 (3335), B=32, S=1024
 * training 3958 against 5858 (5885).
 * And every product of a batch of more than 2 rows of a state up to
 * LLTM_OWN_TILES_STATE on LLTM_OWN_PRODUCTS_TEAM threads or more, on a CPU
 * with AVX-512: there each thread's part of the inputs' products is small
 * for a BLAS call. On 16 threads of the H200 machine's Xeon (OpenBLAS's
 * SkylakeX kernels), the own tiles for every product against the BLAS for
 * all but the recurrence, inference at B=64 S=128 53.8 us against 61.6
 * (nn.LSTM 53.3), S=256 91.6 against 99.6 (105.1); training at B=16 S=256
 * 118.2 against 129.1, B=64 S=128 132.1 against 147.5. On 4 threads the
 * two tied at a state of 256 (B=64 inference 279.6 and 279.6).
 * And so from LLTM_OWN_PRODUCTS_SMALL_TEAM threads on at a state up to
 * LLTM_OWN_PRODUCTS_SMALL_STATE: on the Xeon, at a state of 128, batches
 * 16 and 64, two turns, the own tiles' time over the BLAS's for the
 * inputs was 0.86 to 0.91 on 4 threads in inference (B=64: 87.4 us
 * against 95.9, nn.LSTM 98.7), 0.91 to 1.00 training; on 2 threads 0.92
 * to 0.98 in inference, no more than the order of the turns gave (the
 * BLAS's went first, and the same products taken first took 1.03 to 1.07
 * of their time taken second), so there, as on one thread, the BLAS keeps
 * the inputs' products. */
#define LLTM_OWN_PRODUCTS_TEAM 8
#define LLTM_OWN_TILES_STATE 256
#define LLTM_OWN_PRODUCTS_SMALL_TEAM 4
#define LLTM_OWN_PRODUCTS_SMALL_STATE 128
static inline int lltm_own_products_pay(int64_t batch_size, int64_t state_size) {
  if (batch_size <= 2) return 0;
  if (lltm_blas_narrow()) return 1;
  const int team = lltm_pass_team();
  return lltm_cpu_avx512() &&
         ((state_size <= LLTM_OWN_TILES_STATE && team >= LLTM_OWN_PRODUCTS_TEAM) ||
          (state_size <= LLTM_OWN_PRODUCTS_SMALL_STATE && team >= LLTM_OWN_PRODUCTS_SMALL_TEAM));
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
 * - 8 rows or more of a state up to LLTM_OWN_TILES_WIDE_STATE, on a CPU
 *   with AVX-512 (on one thread, up to LLTM_OWN_TILES_ONE_THREAD_BATCH
 *   rows): a step's BLAS call packs the weights again, the tiles read them
 *   in the panels the pass packed once. On the Xeon, T=16, us a step, the
 *   own tiles' recurrence against the BLAS's (the inputs' products on the
 *   BLAS both ways): B=16 inference at S=512, 768 and 1024, one thread 814,
 *   1800 and 2358 against 974, 1924 and 2766; 4 threads 285, 610 and 1044
 *   against 369, 735 and 1349; training 1317, 3241 and 7120 against 1637,
 *   3842 and 8285 on one thread. B=64 inference on 4 threads 855, 1863
 *   and 3093 against 955, 1961 and 3351, on 16 threads 453, 670 and 982
 *   against 451, 1100 and 1119; but on one thread 2450, 5739 and 8613
 *   against 2432, 5208 and 7641.
 * Larger states, and one row at more than LLTM_OWN_TILES_ROW_STATE or on
 * fewer threads, take the BLAS's (its gemv reads the weights as they lie,
 * where the tiles' panels cost a pass more than its steps save: one thread,
 * B=1, inference at S=512 took 337 us a step against 231), or at 1 and 2
 * rows, where a thread's share of the weights fits its L2, dot_rows_
 * (own_gemv_pays_ in lltm_cpu_forward.h). */
#define LLTM_OWN_TILES_BATCH 8
#define LLTM_OWN_TILES_TEAM 4
#define LLTM_OWN_TILES_ROW_STATE 512
#define LLTM_OWN_TILES_WIDE_STATE 1024
#define LLTM_OWN_TILES_ONE_THREAD_BATCH 16
static inline int lltm_own_tiles_pay(int64_t batch_size, int64_t state_size) {
  const int team = lltm_pass_team();
  if (batch_size == 1) {
    return state_size <= LLTM_OWN_TILES_ROW_STATE && team >= LLTM_OWN_TILES_TEAM;
  }
  if (state_size <= LLTM_OWN_TILES_STATE) {
    return batch_size < LLTM_OWN_TILES_BATCH || team >= LLTM_OWN_TILES_TEAM ||
           lltm_cpu_avx512();
  }
  return state_size <= LLTM_OWN_TILES_WIDE_STATE && batch_size >= LLTM_OWN_TILES_BATCH &&
         lltm_cpu_avx512() && (team > 1 || batch_size <= LLTM_OWN_TILES_ONE_THREAD_BATCH);
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

/* y (m) = a (m x n, row stride lda) times x (n): each of a's rows' dot
 * product with x, four rows at a time, so that four sums are in flight. */
LLTM_VECTOR_CLONES
static void LLTM_NAME(dot_rows_)(int64_t m, int64_t n, const SCALAR* a, int64_t lda,
                                 const SCALAR* x, SCALAR* y) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const SCALAR *a0 = a + i * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
    SCALAR s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int64_t k = 0; k < n; ++k) {
      s0 += a0[k] * x[k];
      s1 += a1[k] * x[k];
      s2 += a2[k] * x[k];
      s3 += a3[k] * x[k];
    }
    y[i] = s0, y[i + 1] = s1, y[i + 2] = s2, y[i + 3] = s3;
  }
  for (; i < m; ++i) {
    SCALAR sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t k = 0; k < n; ++k) sum += a[i * lda + k] * x[k];
    y[i] = sum;
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

/* Where a product's tiles read their factor b (depth x columns, row
 * stride b_stride): the columns from first_panel on from panels of a
 * tile's width, each panel's depth rows one after another (zeros past the
 * last column), the others from b itself. A short last tile takes a panel,
 * so that it runs the same code as the others; and where rows of b lie far
 * apart, every tile does: a tile reading 32 columns of each row otherwise
 * takes another page at every row (2-core AMD EPYC, Zen 5, one thread, a
 * step's product of 64 rows by 3072 columns over a depth of 1024, a
 * state of 1024's: 3051 us so, 1744 in panels; 16 rows 548 and 395; at
 * a depth of 512 within 2% of each other). tile_columns_ finds a tile's. */
struct LLTM_NAME(tile_factor_) {
  const SCALAR* b;
  int64_t b_stride, depth, first_panel;
  SCALAR* panels; /* tile_factor_of_'s are the caller's to free() */
};

/* *factor, for b's `columns` columns: from the first on in panels
 * where `all`, else those past the last whole tile's width. LLTM_SUCCESS,
 * or LLTM_ERROR_NO_MEMORY. */
static int LLTM_NAME(tile_factor_of_)(int64_t depth, const SCALAR* b, int64_t b_stride,
                                      int64_t columns, int all,
                                      struct LLTM_NAME(tile_factor_) * factor) {
  const int64_t first_panel = all ? 0 : columns - columns % LLTM_TILE_COLUMNS;
  const int64_t panels = (columns - first_panel + LLTM_TILE_COLUMNS - 1) / LLTM_TILE_COLUMNS;
  factor->b = b;
  factor->b_stride = b_stride;
  factor->depth = depth;
  factor->first_panel = first_panel;
  factor->panels = NULL;
  if (panels == 0) return LLTM_SUCCESS;
  factor->panels =
      (SCALAR*)calloc((size_t)(panels * depth * LLTM_TILE_COLUMNS + 1), sizeof(SCALAR));
  if (!factor->panels) return LLTM_ERROR_NO_MEMORY;
  LLTM_FOR_EACH(panel, panels, depth * (columns - first_panel) / 16, {
    const int64_t first = first_panel + panel * LLTM_TILE_COLUMNS;
    const int64_t count = columns - first < LLTM_TILE_COLUMNS ? columns - first
                                                               : LLTM_TILE_COLUMNS;
    SCALAR* into = factor->panels + panel * depth * LLTM_TILE_COLUMNS;
    for (int64_t k = 0; k < depth; ++k) {
      memcpy(into + k * LLTM_TILE_COLUMNS, b + k * b_stride + first,
             sizeof(SCALAR) * (size_t)count);
    }
  });
  return LLTM_SUCCESS;
}

/* The tile of the factor's columns from first_column (a multiple of a
 * tile's width) on, from depth `done` on, and its row stride. */
static inline const SCALAR* LLTM_NAME(tile_columns_)(const struct LLTM_NAME(tile_factor_) * factor,
                                                     int64_t first_column, int64_t done,
                                                     int64_t* stride) {
  if (first_column < factor->first_panel) {
    *stride = factor->b_stride;
    return factor->b + done * factor->b_stride + first_column;
  }
  *stride = LLTM_TILE_COLUMNS;
  return factor->panels +
         ((first_column - factor->first_panel) / LLTM_TILE_COLUMNS * factor->depth + done) *
             LLTM_TILE_COLUMNS;
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
  struct LLTM_NAME(tile_factor_) factor;
  if (LLTM_NAME(tile_factor_of_)(depth, b, b_row_stride, columns, 0, &factor) != LLTM_SUCCESS) {
    return LLTM_ERROR_NO_MEMORY;
  }
  int64_t done = 0;
  do { /* once at least, so that depth 0 writes base */
    const int64_t block = depth - done < LLTM_DEPTH_BLOCK ? depth - done : LLTM_DEPTH_BLOCK;
    LLTM_FOR_EACH(index, lltm_tile_count(rows, columns), rows * columns * block / 16, {
      const struct lltm_tile tile = lltm_tile_at(index, rows, columns);
      const SCALAR* a_rows[LLTM_TILE_ROWS];
      LLTM_NAME(tile_rows_)(a + done * a_depth_stride, a_row_stride, tile, a_rows);
      int64_t b_stride;
      const SCALAR* b_tile = LLTM_NAME(tile_columns_)(&factor, tile.first_column, done, &b_stride);
      LLTM_NAME(product_tile_)(block, a_rows, a_depth_stride, b_tile, b_stride, tile.rows,
                               tile.columns, base ? base + tile.first_column : NULL,
                               accumulate || done,
                               out + tile.first_row * out_stride + tile.first_column, out_stride);
    });
    done += block;
  } while (done < depth);
  free(factor.panels);
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

/* A forward pass's weights (3 * state rows of `columns`, the hidden ones
 * first) as the own tiles read them: each gate's hidden weights transposed,
 * in panels, as hidden[gate] (a tile_factor_ wholly in panels), then where
 * `inputs` the input weights transposed (input_features x 3 * state), at
 * *input_part. In one block of memory of its own, returned for the caller
 * to free (NULL where none can be had): two blocks of these sizes freed at
 * the end of every pass had glibc hand their pages back and fault them in
 * again on the next (2-core AMD EPYC, one thread, a state of 256, a batch
 * of 16, one step: 955 us a call against 268). The transpose goes 16 rows
 * at a time, so that each column's writes fill whole cache lines while the
 * rows stay in cache. */
static SCALAR* LLTM_NAME(forward_tile_factors_)(int64_t state_size, int64_t columns,
                                                const STORAGE* weights, int inputs,
                                                struct LLTM_NAME(tile_factor_) hidden[3],
                                                SCALAR** input_part) {
  const int64_t gates_size = 3 * state_size, features = columns - state_size;
  const int64_t panels = (state_size + LLTM_TILE_COLUMNS - 1) / LLTM_TILE_COLUMNS;
  const int64_t panel_size = state_size * LLTM_TILE_COLUMNS;
  const int64_t input_size = inputs ? features * gates_size : 0;
  SCALAR* block =
      (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(3 * panels * panel_size + input_size + 1));
  if (!block) return NULL;
  LLTM_FOR_EACH(index, 3 * panels, gates_size * state_size / 16, {
    const int64_t gate_end = (index / panels + 1) * state_size;
    const int64_t first = gate_end - state_size + index % panels * LLTM_TILE_COLUMNS;
    const int count = (int)(gate_end - first < LLTM_TILE_COLUMNS ? gate_end - first
                                                                 : LLTM_TILE_COLUMNS);
    SCALAR* into = block + index * panel_size;
    for (int j = 0; j < LLTM_TILE_COLUMNS; ++j) {
      const STORAGE* row = weights + (first + j) * columns;
      for (int64_t k = 0; k < state_size; ++k) {
        into[k * LLTM_TILE_COLUMNS + j] = j < count ? LOAD(row[k]) : 0;
      }
    }
  });
  SCALAR* transposed = block + 3 * panels * panel_size;
  LLTM_FOR_EACH(rows, (input_size ? gates_size + 15 : 0) / 16, input_size, {
    const int64_t r0 = rows * 16, r1 = r0 + 16 < gates_size ? r0 + 16 : gates_size;
    for (int64_t k = 0; k < features; ++k) {
      for (int64_t r = r0; r < r1; ++r) {
        transposed[k * gates_size + r] = LOAD(weights[r * columns + state_size + k]);
      }
    }
  });
  *input_part = inputs ? transposed : NULL;
  for (int gate = 0; gate < 3; ++gate) {
    const struct LLTM_NAME(tile_factor_) gate_factor = {NULL, 0, state_size, 0,
                                                        block + gate * panels * panel_size};
    hidden[gate] = gate_factor;
  }
  return block;
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
 * base's or out's and rounded into out, by the thread that computed them. */
struct LLTM_NAME(sums_out_) {
  const STORAGE* base;
  int accumulate;
  STORAGE* out;
  int64_t out_stride;
};

static void LLTM_NAME(add_run_)(void* context, const SCALAR* sums, int64_t sums_stride,
                                int64_t first_row, int64_t rows, int64_t first_column,
                                int64_t columns) {
  const struct LLTM_NAME(sums_out_)* to = (const struct LLTM_NAME(sums_out_)*)context;
  for (int64_t i = 0; i < rows; ++i) {
    STORAGE* out = to->out + (first_row + i) * to->out_stride + first_column;
    LLTM_NAME(add_sums_row_)(columns,
                             to->accumulate ? out : to->base ? to->base + first_column : NULL,
                             sums + i * sums_stride, out);
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
  const size_t sums_bytes = sizeof(SCALAR) * (size_t)(block * columns);
  lltm_amx_factor left = {0}, right = {0};
  int status = packed_b ? LLTM_SUCCESS
                        : lltm_amx_pack_right(AMX_DTYPE, depth, columns, b, b_row_stride,
                                              b_column_stride, &right);
  const lltm_amx_factor* b_tiles = packed_b ? packed_b : &right;
  /* Room for the sums only where add_run_ does not take them all from the
   * threads' own memory, or AMX declines the product. */
  SCALAR* sums = NULL;
  if (status == LLTM_SUCCESS && !lltm_amx_then_takes_every_run(b_tiles)) {
    sums = (SCALAR*)malloc(sums_bytes);
    if (!sums) status = LLTM_ERROR_NO_MEMORY;
  }
  for (int64_t first = 0; status == LLTM_SUCCESS && first < rows; first += block) {
    const int64_t count = rows - first < block ? rows - first : block;
    const STORAGE* a_rows = a + first * a_row_stride;
    struct LLTM_NAME(sums_out_) to = {base, accumulate, out + first * out_stride, out_stride};
    status = lltm_amx_multiply(count, a_rows, a_row_stride, a_depth_stride, b_tiles, &left, sums,
                               columns, LLTM_NAME(add_run_), &to);
    if (status == LLTM_AMX_DECLINED) {
      if (!sums) sums = (SCALAR*)malloc(sums_bytes);
      status = sums ? LLTM_NAME(converted_product_)(count, columns, depth, a_rows, a_row_stride,
                                                    a_depth_stride, b, b_row_stride,
                                                    b_column_stride, sums, columns)
                    : LLTM_ERROR_NO_MEMORY;
      if (status == LLTM_SUCCESS) LLTM_NAME(add_run_)(&to, sums, columns, 0, count, 0, columns);
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
  /* A step's rows packed part by part (start_amx_step_), part_count of them. */
  lltm_amx_factor* part_rows;
  int64_t part_count;
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
  for (int64_t part = 0; part < amx->part_count; ++part) lltm_amx_free(&amx->part_rows[part]);
  free(amx->part_rows);
  free(amx->sums);
}
