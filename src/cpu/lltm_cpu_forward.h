/* Part of the CPU passes (lltm_cpu_impl.h), included from it once for
 * every element type, with its parameters defined: the steps'
 * shared pieces and the forward pass, recurrence_forward_. */

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
 * each gate's transposed, state x state, in panels) added to the tile's
 * three gates, then the cell's forward math. Where hidden_sums is not NULL
 * it holds the step's products already (row stride 3 * state). */
static void LLTM_NAME(forward_step_tile_)(int64_t state_size, struct lltm_tile tile,
                                          const struct LLTM_NAME(tile_factor_) * hidden,
                                          const SCALAR* hidden_sums,
                                          struct LLTM_NAME(old_state_) old, STORAGE* gates,
                                          STORAGE* new_h, STORAGE* new_cell) {
  const int64_t gates_size = 3 * state_size;
  if (!hidden_sums) {
    const SCALAR* a_rows[LLTM_TILE_ROWS];
    for (int i = 0; i < LLTM_TILE_ROWS; ++i) {
      const int64_t row = tile.first_row + (i < tile.rows ? i : tile.rows - 1);
      a_rows[i] = LLTM_NARROW_STORAGE ? old.h_factors + row * state_size
                                      : LLTM_AS_SCALAR(LLTM_NAME(old_row_)(
                                            old.h, old.h0, old.carried, row, state_size));
    }
    for (int gate = 0; gate < 3; ++gate) {
      const int64_t column = gate * state_size + tile.first_column;
      int64_t b_stride;
      const SCALAR* b = LLTM_NAME(tile_columns_)(&hidden[gate], tile.first_column, 0, &b_stride);
      LLTM_NAME(product_tile_)(state_size, a_rows, 1, b, b_stride, tile.rows, tile.columns, NULL,
                               1, gates + tile.first_row * gates_size + column, gates_size);
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
 * (start_forward_amx_ says why): part after part of the step's rows by a
 * block of LLTM_AMX_BLOCK states, each a thread's, taking its sums of each
 * factor's columns of those states, then its cell (amx_step_part_). The
 * left factor (`a`, the step's rows) is packed by the team before the
 * parts, or, where a bfloat16 part's rows take at most
 * LLTM_AMX_OWN_ROWS_MAX_BYTES packed (own_rows), by each part for itself
 * (parts of the same rows pack them alike). The factors (`count`: the
 * forward's gates, or the backward's one) each hold a column a state;
 * their sums lie state_size apart in amx->sums. A factor AMX declines (a
 * float16 not finite) leaves the sums to SCALAR's own product of converted
 * copies, before the parts.
 * On one thread the step is one part: its sums, then its cell a whole row
 * at a time. Blocks of states took longer there: on the H200 machine's
 * Xeon, bfloat16, a batch of 64, time over nn.LSTM's in two turns,
 * training at a state of 256 0.94 and 0.95 against 0.69 and 0.77,
 * inference at 512 1.07 and 1.17 against 0.95 and 0.99. */
struct LLTM_NAME(amx_step_) {
  struct LLTM_NAME(recurrent_amx_) * amx;
  const lltm_amx_factor* factors;
  const STORAGE* a;
  int count, sums_done, team, own_rows;
  int64_t rows, product_rows, state_size, width, row_parts, row_unit, parts, a_stride;
};

/* Where the factors' packed tiles fit a core's L2 (2 MiB on the H200
 * machine's Xeon), a step of more than one block of 32 rows is split by
 * rows first: each thread of up to one a block takes every state of its
 * rows, as one thread takes the step, so that the split costs the
 * threads' waking and little else, and pays from this much work on
 * (lltm_team_size_from); threads past the blocks of rows wait. From
 * LLTM_PARALLEL_MIN_ELEMENTS on, the team's threads past the blocks of
 * rows split each one's states too, into groups of whole blocks of 32.
 * Elsewhere blocks of 32 states split the step, from
 * LLTM_PARALLEL_MIN_ELEMENTS. On that Xeon, bfloat16, T=16, us a step, in
 * one process, the rules taking turns (the one before: one thread below
 * LLTM_PARALLEL_MIN_ELEMENTS, else blocks of 32 states, as many rows as a
 * team has threads past the blocks): two threads at B=64, inference at
 * S=128 79.4 against 94.5, S=256 133.9 against 187.8 (nn.LSTM 82.1 and
 * 186.1), S=512 417.5 against 448.0; training 206.5 against 243.9, 419.9
 * against 532.2, 1275.3 against 1412.9. Four threads at B=64, inference,
 * S=128 43.1 against 54.9 by rows alone; at S=256 73.9 and 83.7 against
 * 84.6 and 90.3 with two groups of states. Eight threads at B=128,
 * inference at S=256, 119.2 and 116.0 against 152.2 and 146.5. 16 threads
 * at B=64: the same parts as before up to a state of 256; 0.90 to 1.05
 * of the time before at S=512 and at B=128.
 * Groups of states below LLTM_PARALLEL_MIN_ELEMENTS took eight threads at
 * B=64, S=64, from 28.9 to 35.7 in one run (49.4 and 49.3 in another). */
#ifndef LLTM_AMX_ROW_SPLIT_MIN_WORK
#define LLTM_AMX_ROW_SPLIT_MIN_WORK 8192
#endif
#define LLTM_AMX_ROW_SPLIT_MAX_BYTES (2 << 20)

/* A part packs its own rows, on its thread, where they take this much or
 * less packed: a copy of a microsecond or two, against a parallel region
 * of its own for the team's packing before the parts (4.4 us to wake and
 * join 16 threads on the H200 machine's Xeon, 1.1 us two). On that Xeon,
 * bfloat16, T=16, one process, the two taking turns, us a step: 16
 * threads' inference at B=64, S=128 39.0 against 43.5, S=256 63.0 against
 * 68.6, and at B=1, S=256 16.3 against 21.7; 0.86 to 1.02 of the time at
 * states 128 to 1024, batches 1 to 64, on 2, 4 and 16 threads, training
 * too (1.02 at two sizes, one of which this leaves as it was: training
 * on two threads at B=64, S=1024, whose parts' rows take more). */
#define LLTM_AMX_OWN_ROWS_MAX_BYTES (32 << 10)

#ifdef AMX_DTYPE
/* A split by rows first (start_amx_step_) in parts of `unit` rows: their
 * count, *row_parts and *width (the states of a part). */
static int64_t LLTM_NAME(rows_first_)(int64_t rows, int64_t unit, int64_t state_size, int team,
                                      int share_states, int64_t* row_parts, int64_t* width) {
  const int64_t units = (rows + unit - 1) / unit;
  *row_parts = team < units ? team : units;
  const int64_t groups = share_states ? team / *row_parts : 1;
  *width = (state_size + groups - 1) / groups;
  if (groups > 1) *width = (*width + LLTM_AMX_BLOCK - 1) / LLTM_AMX_BLOCK * LLTM_AMX_BLOCK;
  return (state_size + *width - 1) / *width * *row_parts;
}
#endif

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
  const int64_t work = rows * state_size + product_work;
  const int64_t row_blocks = (rows + LLTM_AMX_BLOCK - 1) / LLTM_AMX_BLOCK;
  const int64_t factor_bytes =
      (int64_t)sizeof(uint16_t) * count * factors[0].count * factors[0].packed_depth;
  const int by_rows = row_blocks > 1 && factor_bytes <= LLTM_AMX_ROW_SPLIT_MAX_BYTES;
  const int team = by_rows ? lltm_team_size_from(work, LLTM_AMX_ROW_SPLIT_MIN_WORK)
                           : lltm_team_size(work);
  const int may_own_rows = AMX_DTYPE == LLTM_BFLOAT16 && product_rows > 0;
  int64_t row_parts, width, row_unit = LLTM_AMX_BLOCK;
  if (by_rows) {
    const int share_states = lltm_team_size(work) > 1;
    const int64_t whole_blocks = LLTM_NAME(rows_first_)(rows, LLTM_AMX_BLOCK, state_size, team,
                                                        share_states, &row_parts, &width);
    /* Where blocks of 32 rows leave threads of the team idle, parts that
     * pack their own rows take a tile row (16 rows) each, so that more
     * threads share the step. On the H200 machine's Xeon, bfloat16, T=16,
     * one process, the two taking turns, us a step: 16 threads' inference
     * at B=64, S=128 45.3 against 53.3, S=64 45.8 against 53.9, B=48 S=128
     * 46.3 against 56.6; training 0.92 to 0.96 of the time; 8 threads at
     * S=64 0.82 and 0.88; 4 threads' inference at B=64, S=128 40.2 against
     * 50.9. */
    int64_t tile_row_parts, tile_row_width;
    if (may_own_rows && whole_blocks < team &&
        (int64_t)sizeof(uint16_t) * LLTM_AMX_TILE_ROWS * factors[0].packed_depth <=
            LLTM_AMX_OWN_ROWS_MAX_BYTES &&
        LLTM_NAME(rows_first_)(rows, LLTM_AMX_TILE_ROWS, state_size, team, share_states,
                               &tile_row_parts, &tile_row_width) > whole_blocks &&
        tile_row_parts >= (rows + LLTM_AMX_TILE_ROWS - 1) / LLTM_AMX_TILE_ROWS) {
      row_unit = LLTM_AMX_TILE_ROWS;
      row_parts = tile_row_parts;
      width = tile_row_width;
    }
  } else {
    /* The states' blocks outermost, so that a thread's parts share weights. */
    width = team > 1 ? LLTM_AMX_BLOCK : state_size;
    row_parts = team / ((state_size + width - 1) / width);
    row_parts = row_parts < 1 ? 1 : row_parts > row_blocks ? row_blocks : row_parts;
  }
  const int64_t blocks = (state_size + width - 1) / width, parts = blocks * row_parts;
  const int64_t units = (rows + row_unit - 1) / row_unit;
  const int64_t part_rows = row_parts > 0 ? (units + row_parts - 1) / row_parts * row_unit : 0;
  const int own_rows = may_own_rows &&
                       (int64_t)sizeof(uint16_t) * part_rows * factors[0].packed_depth <=
                           LLTM_AMX_OWN_ROWS_MAX_BYTES;
  if (own_rows && parts > amx->part_count) {
    lltm_amx_factor* grown =
        (lltm_amx_factor*)realloc(amx->part_rows, sizeof(lltm_amx_factor) * (size_t)parts);
    if (!grown) return LLTM_ERROR_NO_MEMORY;
    memset(grown + amx->part_count, 0,
           sizeof(lltm_amx_factor) * (size_t)(parts - amx->part_count));
    amx->part_rows = grown;
    amx->part_count = parts;
  }
  for (int64_t part = 0; own_rows && status == LLTM_SUCCESS && part < parts; ++part) {
    status = lltm_amx_reserve_left(part_rows, &factors[0], &amx->part_rows[part]);
  }
  if (!own_rows && product_rows > 0) {
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
  const struct LLTM_NAME(amx_step_) started = {
      amx,        factors, a,         count,    sums_done, team,    own_rows, rows,
      product_rows, state_size, width, row_parts, row_unit, parts, a_stride};
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
  lltm_part(part % step->row_parts, step->row_parts, step->rows, step->row_unit, &first_row,
            &rows);
  const int64_t state_size = step->state_size, width = step->width;
  const int64_t first = part / step->row_parts * width;
  const int64_t count = state_size - first < width ? state_size - first : width;
  const int64_t product_rows =
      step->product_rows - first_row < rows ? step->product_rows - first_row : rows;
#ifdef AMX_DTYPE
  if (!step->sums_done && product_rows > 0) {
    /* The part's own rows packed on its thread (room reserved: no failure),
     * or the step's, packed before the parts. */
    const lltm_amx_factor* left = &step->amx->packed_step;
    int64_t left_row = first_row;
    if (step->own_rows) {
      lltm_amx_pack_left(product_rows, step->a + first_row * step->a_stride, step->a_stride, 1,
                         &step->factors[0], 0, &step->amx->part_rows[part]);
      left = &step->amx->part_rows[part];
      left_row = 0;
    }
    float* sums = step->amx->sums + (first_row - left_row) * step->amx->columns;
    for (int factor = 0; factor < step->count; ++factor) {
      lltm_amx_block_sums(left, &step->factors[factor], left_row, product_rows, first, count,
                          sums + factor * state_size, step->amx->columns);
    }
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
 * own tiles take the recurrence and the input part of the gates too, the
 * input weights transposed (`transposed`, input_features x 3 * state). */
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
                                        input_factors, features, 1, f->transposed, gates_size, 1,
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

/* Where a thread's share of the hidden weights fits its core's L2 (this
 * many bytes or fewer), a step of up to LLTM_BLAS_GEMV_ROWS rows takes its
 * products by dot_rows_, a share a thread of the team, not by the BLAS's
 * gemv: OpenBLAS's, called on many threads at once, gained little from
 * more of them. On 16 threads of the H200 machine's Xeon, float32, a step's
 * three gates at B=1 alone (a probe, us a step): S=768 12.5 by dot_rows_ on
 * 16 shares against 39.9 by OpenBLAS's gemv on 6 (lltm_blas_parts) and
 * 68.8 on 16; S=512 8.6 against 31.3; S=1024 56.3 against 104.6. In
 * lltm_sequence, T=16, one process, the two taking turns: inference at
 * B=1 S=768 31.8 against 63.2, S=1024 41.8 against 81.3, B=2 0.39 to 0.45
 * of the time at states 512 to 1024, training 0.71 to 0.83; on 4 threads
 * B=2 S=512 0.74. Where the shares do not fit, OpenBLAS's streams the
 * weights the faster: on the 2-core AMD EPYC, S=768 on 2 threads, 84 to 94
 * against 104 to 110 (the probe). */
#define LLTM_OWN_GEMV_MAX_BYTES (1 << 20)
static int LLTM_NAME(own_gemv_pays_)(int64_t rows, int64_t state_size, int team) {
  const int64_t share = ((state_size + team - 1) / team + 15) / 16 * 16;
  return rows <= LLTM_BLAS_GEMV_ROWS &&
         (int64_t)sizeof(SCALAR) * 3 * share * state_size <= LLTM_OWN_GEMV_MAX_BYTES;
}

/* A step's forward recurrent products of the states from `first` on,
 * `count` of them, on the BLAS (or, where own_gemv, by dot_rows_): their
 * three gates' columns of sums (rows x 3 * state) = h (rows x state, row
 * stride state) times those rows of the hidden weights (row stride
 * `columns`), transposed. Where the states are all of them, the three
 * gates' rows are one block: one call. */
static void LLTM_NAME(blas_gate_sums_)(int64_t rows, int64_t state_size, int64_t columns,
                                       int64_t first, int64_t count, const SCALAR* h,
                                       const SCALAR* weights, int own_gemv, SCALAR* sums) {
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
      if (own_gemv) {
        LLTM_NAME(dot_rows_)(width, state_size, gate_weights, columns, h + row * state_size,
                             sums + row * gates_size + column);
      } else {
        LLTM_MATH(blas_gemv_)(0, width, state_size, gate_weights, columns,
                              h + row * state_size, sums + row * gates_size + column);
      }
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
   * by step: on AMX and the BLAS from the weights as they are; by the own
   * tiles from the weights transposed (the hidden ones in panels), so that
   * every product runs along contiguous rows, as the backward pass's do. */
  struct LLTM_NAME(forward_factors_) factors = {products, input_features, state_size, inputs,
                                                weights, bias, NULL, NULL, NULL, NULL};
  SCALAR *hidden_panels = NULL, *h_factors = NULL, *sums = NULL;
  struct LLTM_NAME(tile_factor_) hidden[3]; /* in hidden_panels */
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
    int has_weights = 1;
    if (on_blas) {
      has_weights = LLTM_NAME(operand_)(gates_size * columns, weights, &factors.weight_factors,
                                        &weights_copy);
      sums = (SCALAR*)malloc(sizeof(SCALAR) * (size_t)(walk->batch_size * gates_size + 1));
    } else {
      /* The tiles take the hidden weights transposed, in panels. Where the
       * BLAS takes the input part of the gates from the weights as they
       * are, that is all; else the input weights are transposed too (a
       * narrow STORAGE's converted on the way all the same). */
      const int hidden_only = products.blas && !LLTM_NARROW_STORAGE;
      factors.weight_factors = hidden_only ? LLTM_AS_SCALAR(weights) : NULL;
      SCALAR* input_part = NULL;
      hidden_panels = LLTM_NAME(forward_tile_factors_)(state_size, columns, weights, !hidden_only,
                                                       hidden, &input_part);
      factors.transposed = input_part;
      has_weights = hidden_panels != NULL;
    }
    if (!has_inputs || !has_weights || (on_blas && !sums) || (LLTM_NARROW_STORAGE && !h_factors)) {
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
      LLTM_FOR_EACH_OF_TEAM(part, parts.parts, parts.team, {
        struct lltm_tile tile;
        if (LLTM_NAME(amx_step_part_)(&parts, part, &tile)) {
          LLTM_NAME(forward_step_tile_)(state_size, tile, NULL, amx.sums, old, step_gates,
                                        step_outputs, step_cells);
        }
      });
    } else if (on_blas) {
      /* Each thread's states: their products on the BLAS, then their math. */
      const SCALAR* h = LLTM_NARROW_STORAGE
                            ? h_factors
                            : LLTM_AS_SCALAR(LLTM_NAME(old_h_rows_)(old, step.rows, state_size,
                                                                    old_h_scratch));
      const int team = lltm_team_size(elements * gates_size / 16);
      const int own_gemv = LLTM_NAME(own_gemv_pays_)(step.rows, state_size, team);
      const int parts = own_gemv ? team : lltm_blas_parts(elements * gates_size / 16);
      LLTM_FOR_EACH_OF_TEAM(part, parts, team, {
        int64_t first, count;
        lltm_part(part, parts, state_size, 16, &first, &count);
        if (count > 0) {
          LLTM_NAME(blas_gate_sums_)(step.rows, state_size, columns, first, count, h,
                                     factors.weight_factors, own_gemv, sums);
          const struct lltm_tile tile = {0, first, (int)step.rows, (int)count};
          LLTM_NAME(forward_step_tile_)(state_size, tile, NULL, sums, old, step_gates,
                                        step_outputs, step_cells);
        }
      });
    } else {
      LLTM_FOR_EACH(index, lltm_tile_count(step.rows, state_size), elements * gates_size / 16, {
        LLTM_NAME(forward_step_tile_)(state_size, lltm_tile_at(index, step.rows, state_size),
                                      hidden, NULL, old, step_gates, step_outputs,
                                      step_cells);
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
  free(hidden_panels);
  free(h_factors);
  free(sums);
  free(inputs_copy);
  free(weights_copy);
  return status;
}
