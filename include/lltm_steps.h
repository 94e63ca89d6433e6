/* The steps of one direction of a sequence layer, in the order its
 * recurrence visits them: for the CPU passes (lltm_cpu_impl.h) and the CUDA
 * launchers (src/cuda/recurrence/) alike, on the host.
 *
 * Every tensor of a pass holds its steps' rows one step after another. Step
 * t has batch_sizes[t] rows, or batch_size rows each where batch_sizes is
 * NULL. That is a PackedSequence's layout: its sequences sorted longest
 * first, so that those still running at step t are the first batch_sizes[t]
 * rows, and the sizes never grow. The forward direction visits t = 0, 1,
 * ...; the reverse one t = steps - 1 down to 0, so that each sequence starts
 * at its own last element, and no row is copied to reverse it.
 *
 * Row r of a step continues row r of the step visited before it where that
 * step has one; the others (every row of the first step visited; in the
 * reverse direction, those of the sequences that start there) start from
 * row r of h0 and c0. The rows that the step visited next lacks end there:
 * theirs are their sequences' final states. */
#ifndef LLTM_STEPS_H
#define LLTM_STEPS_H

#include <stdint.h>
#include <string.h>

typedef struct {
  const int64_t* batch_sizes; /* NULL: batch_size rows every step */
  int64_t steps, batch_size;
  int64_t rows; /* every step's rows, summed */
  int reverse;
} lltm_walk;

typedef struct {
  int64_t order;  /* its place in the walk, 0 first */
  int64_t t;      /* which step */
  int64_t offset; /* its first row */
  int64_t rows;
  /* Its rows below `carried` continue those of the step visited before it,
   * whose first row is previous_offset; the others start from h0 and c0. */
  int64_t carried, previous_offset;
  /* Its rows below `continued` go on into the step visited next; the others
   * end here. */
  int64_t continued;
} lltm_step;

static inline int64_t lltm_rows_at(const lltm_walk* walk, int64_t t) {
  return walk->batch_sizes ? walk->batch_sizes[t] : walk->batch_size;
}

static inline int64_t lltm_step_index(const lltm_walk* walk, int64_t order) {
  return walk->reverse ? walk->steps - 1 - order : order;
}

static inline int64_t lltm_smaller(int64_t a, int64_t b) { return a < b ? a : b; }

/* Fills *walk: `steps` steps of batch_sizes (NULL: batch_size rows each),
 * `rows` rows in all, visited backwards where `reverse`. 0, having filled
 * nothing, where batch_sizes is no PackedSequence's of batch_size
 * sequences and `rows` rows: the first size batch_size, each from 1 to the
 * one before, all summing to rows. Steps that all have the whole batch are
 * walked as dense ones (batch_sizes NULL). */
static inline int lltm_make_walk(const int64_t* batch_sizes, int64_t steps, int64_t batch_size,
                                 int64_t rows, int reverse, lltm_walk* walk) {
  int64_t sum = 0;
  if (steps < 0 || batch_size < 0) return 0;
  if (batch_sizes) {
    for (int64_t t = 0; t < steps; ++t) {
      const int64_t size = batch_sizes[t];
      if (size < 1 || size > (t ? batch_sizes[t - 1] : batch_size)) return 0;
      sum += size;
    }
    if (steps && batch_sizes[0] != batch_size) return 0;
    if (steps && batch_sizes[steps - 1] == batch_size) batch_sizes = NULL;
  } else {
    sum = steps * batch_size;
  }
  if (sum != rows) return 0;
  walk->batch_sizes = batch_sizes;
  walk->steps = steps;
  walk->batch_size = batch_size;
  walk->rows = rows;
  walk->reverse = reverse != 0;
  return 1;
}

/* The walk of a packed pass (packed_forward, packed_backward), whose
 * sizes start with rows, steps, batch, input_features, state, reverse. */
static inline int lltm_packed_walk(const int64_t* sizes, const int64_t* batch_sizes,
                                   lltm_walk* walk) {
  return lltm_make_walk(batch_sizes, sizes[1], sizes[2], sizes[0], (int)sizes[5], walk);
}

/* The step at `order` in the walk, whose first row is `offset`. */
static inline lltm_step lltm_step_at(const lltm_walk* walk, int64_t order, int64_t offset) {
  lltm_step step;
  step.order = order;
  step.t = lltm_step_index(walk, order);
  step.offset = offset;
  step.rows = lltm_rows_at(walk, step.t);
  const int64_t previous_rows =
      order > 0 ? lltm_rows_at(walk, lltm_step_index(walk, order - 1)) : 0;
  const int64_t next_rows =
      order + 1 < walk->steps ? lltm_rows_at(walk, lltm_step_index(walk, order + 1)) : 0;
  step.carried = lltm_smaller(step.rows, previous_rows);
  step.previous_offset = walk->reverse ? offset + step.rows : offset - previous_rows;
  step.continued = lltm_smaller(step.rows, next_rows);
  return step;
}

/* The first and last steps visited (the walk has a step at least), and the
 * steps visited after and before `step`. */
static inline lltm_step lltm_first_step(const lltm_walk* walk) {
  const int64_t last_rows = lltm_rows_at(walk, walk->steps - 1);
  return lltm_step_at(walk, 0, walk->reverse ? walk->rows - last_rows : 0);
}

static inline lltm_step lltm_last_step(const lltm_walk* walk) {
  const int64_t last_rows = lltm_rows_at(walk, walk->steps - 1);
  return lltm_step_at(walk, walk->steps - 1, walk->reverse ? 0 : walk->rows - last_rows);
}

static inline lltm_step lltm_next_step(const lltm_walk* walk, const lltm_step* step) {
  const int64_t order = step->order + 1;
  return lltm_step_at(walk, order,
                      walk->reverse
                          ? step->offset - lltm_rows_at(walk, lltm_step_index(walk, order))
                          : step->offset + step->rows);
}

static inline lltm_step lltm_previous_step(const lltm_walk* walk, const lltm_step* step) {
  return lltm_step_at(walk, step->order - 1, step->previous_offset);
}

/* Where the rows of a step start in a tensor of every step read through
 * its (step, row) strides: a dense walk's step t at t * step_stride, a
 * packed walk's at its first row. */
static inline int64_t lltm_step_start(const lltm_walk* walk, const lltm_step* step,
                                      int64_t step_stride, int64_t row_stride) {
  return walk->batch_sizes ? step->offset * row_stride : step->t * step_stride;
}

/* The backward pass's products with each step's previous state (the
 * hidden weights' gradient, d_gates^T times that state; h0's, d_gates
 * times the hidden weights) take it in blocks: gate rows gate_row to
 * gate_row + rows - 1, whose previous states are as many consecutive rows
 * from state_row of the outputs (initial 0) or of h0 (initial 1). A dense
 * walk has two blocks, h0's and one for every later step; a packed walk
 * one more for each change of batch size. Each row of h0 lies in one
 * initial block: its sequence starts once. */
typedef struct {
  int64_t gate_row, state_row, rows;
  int initial;
} lltm_state_block;

typedef struct {
  lltm_step step;
  int part; /* the step's next block: 0 its carried rows, 1 its rows from h0; 2 past the walk */
  lltm_state_block pending;
} lltm_block_cursor;

static inline lltm_block_cursor lltm_first_block(const lltm_walk* walk) {
  lltm_block_cursor cursor;
  memset(&cursor, 0, sizeof cursor);
  cursor.part = 2;
  if (walk->steps > 0) {
    cursor.step = lltm_first_step(walk);
    cursor.part = 0;
  }
  return cursor;
}

/* Joins `block` to `into` where the two are consecutive in both their gate
 * rows and their state rows (either way round), or `into` is empty: 1,
 * else 0. */
static inline int lltm_join_blocks(lltm_state_block* into, const lltm_state_block* block) {
  if (into->rows == 0) {
    *into = *block;
    return 1;
  }
  if (block->initial != into->initial) return 0;
  if (block->gate_row == into->gate_row + into->rows &&
      block->state_row == into->state_row + into->rows) {
    into->rows += block->rows;
    return 1;
  }
  if (block->gate_row + block->rows == into->gate_row &&
      block->state_row + block->rows == into->state_row) {
    into->gate_row = block->gate_row;
    into->state_row = block->state_row;
    into->rows += block->rows;
    return 1;
  }
  return 0;
}

/* The walk's next block in *block: 1, or 0 after its last. */
static inline int lltm_next_block(const lltm_walk* walk, lltm_block_cursor* cursor,
                                  lltm_state_block* block) {
  while (cursor->part < 2) {
    const lltm_step step = cursor->step;
    lltm_state_block next;
    if (cursor->part == 0) {
      next.gate_row = step.offset;
      next.state_row = step.previous_offset;
      next.rows = step.carried;
      next.initial = 0;
      cursor->part = 1;
    } else {
      next.gate_row = step.offset + step.carried;
      next.state_row = step.carried;
      next.rows = step.rows - step.carried;
      next.initial = 1;
      cursor->part = step.order + 1 < walk->steps ? 0 : 2;
      if (cursor->part == 0) cursor->step = lltm_next_step(walk, &step);
    }
    if (next.rows == 0 || lltm_join_blocks(&cursor->pending, &next)) continue;
    *block = cursor->pending;
    cursor->pending = next;
    return 1;
  }
  if (cursor->pending.rows == 0) return 0;
  *block = cursor->pending;
  cursor->pending.rows = 0;
  return 1;
}

#endif /* LLTM_STEPS_H */
