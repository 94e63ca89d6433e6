/* A sequence pass at a padded state (lltm_padding.h): where its padded
 * tensors lie in its workspace, and the copies in and out of them. */
#include <stdint.h>
#include <string.h>

#include "lltm_padding.h"

/* Each padded tensor starts on whole 512 bytes, as torch's allocations do
 * (the persistent kernels' bulk copies and cuBLAS's aligned kernels need
 * 16). */
static int64_t whole_bytes(int64_t elements, int element_bytes, int64_t bytes) {
  const int64_t chunk = bytes / element_bytes;
  return (elements + chunk - 1) / chunk * chunk;
}

/* NULL stays NULL: the workspace's size is laid out without tensors. */
static void* offset(const void* tensor, int64_t elements, int element_bytes) {
  return tensor ? (char*)tensor + elements * element_bytes : NULL;
}

/* The workspace as it is laid out: `used` elements so far. */
typedef struct {
  char* base; /* NULL: only counting */
  int element_bytes;
  int64_t used;
} workspace;

static void* take(workspace* space, int64_t elements) {
  void* at = space->base ? space->base + space->used * space->element_bytes : NULL;
  space->used += whole_bytes(elements, space->element_bytes, 512);
  return at;
}

static void add(lltm_copy* copies, int* count, lltm_copy copy) { copies[(*count)++] = copy; }

/* A dense (rows, columns) matrix padded to `columns` in `dst` from `src`'s
 * (src_rows, src_columns), rows src_row apart and elements src_column. */
static lltm_copy padded_matrix(void* dst, int64_t rows, int64_t columns, const void* src,
                               int64_t src_rows, int64_t src_columns, int64_t src_row,
                               int64_t src_column) {
  return (lltm_copy){.dst = dst, .src = src, .batches = 1, .rows = rows, .columns = columns,
                     .dst_row = columns, .src_rows = src_rows, .src_columns = src_columns,
                     .src_row = src_row, .src_column = src_column};
}

/* The dense (rows, columns) matrix `dst` cut from `src`, rows src_row apart. */
static lltm_copy cut_matrix(void* dst, int64_t rows, int64_t columns, const void* src,
                            int64_t src_row) {
  return padded_matrix(dst, rows, columns, src, rows, columns, src_row, 1);
}

/* The weights' three gates, each rows x columns of the state and the
 * features ([hidden | input] columns), from `src` laid out with
 * src_state and src_features into `dst` laid out with state and features:
 * two copies, the hidden columns and the input columns, padded or cut. */
static void weight_copies(lltm_copy* copies, int* count, int element_bytes, void* dst,
                          int64_t state, int64_t features, const void* src, int64_t src_state,
                          int64_t src_features, int64_t rows, int64_t hidden, int64_t input) {
  const int64_t dst_row = state + features, src_row = src_state + src_features;
  const lltm_copy gates = {.batches = 3, .rows = rows, .dst_batch = state * dst_row,
                           .dst_row = dst_row, .src_rows = rows < src_state ? rows : src_state,
                           .src_batch = src_state * src_row, .src_row = src_row,
                           .src_column = 1};
  lltm_copy part = gates;
  part.dst = dst, part.src = src, part.columns = hidden;
  part.src_columns = hidden < src_state ? hidden : src_state;
  add(copies, count, part);
  part = gates;
  part.dst = offset(dst, state, element_bytes), part.src = offset(src, src_state, element_bytes);
  part.columns = input, part.src_columns = input < src_features ? input : src_features;
  add(copies, count, part);
}

/* Lays out the padded pass of `sizes` and the tensors `present` (bit i:
 * tensor i given) in a workspace at `base`, returning its elements; where
 * `padded` is not NULL, fills it from the tensors given. */
static int64_t lay_out(int pass, int element_bytes, const int64_t* sizes, uint64_t present,
                       void* const* given, char* base, lltm_padded_pass* padded) {
  const int backward = pass == LLTM_PASS_BACKWARD;
  const int count = backward ? LLTM_BACKWARD_SIZES : LLTM_FORWARD_SIZES;
  const int64_t rows = sizes[0], batch = sizes[2], features = sizes[LLTM_SIZE_FEATURES];
  const int64_t state = sizes[LLTM_SIZE_STATE], padded_state = sizes[LLTM_SIZE_PADDED];
  const int64_t padded_features = whole_bytes(features, element_bytes, 16);
  workspace space = {base, element_bytes, 0};
  lltm_padded_pass unused;
  lltm_padded_pass* out = padded ? padded : &unused;
  void** tensors = out->tensors;
  out->pad_count = out->cut_count = 0;
  if (padded) {
    memcpy(out->sizes, sizes, sizeof(int64_t) * count);
    memcpy(tensors, given, sizeof(void*) * (backward ? LLTM_B_COUNT : LLTM_F_COUNT));
  } else {
    memset(tensors, 0, sizeof(out->tensors));
  }
  out->sizes[LLTM_SIZE_FEATURES] = padded_features;
  out->sizes[LLTM_SIZE_STATE] = padded_state;
  lltm_copy* pads = out->pads;
  lltm_copy* cuts = out->cuts;
  int* pad_count = &out->pad_count;
  int* cut_count = &out->cut_count;
#define GIVEN(index) ((present >> (index)) & 1)
  /* A tensor the pass reads, padded from (rows, columns) to (rows, padded_columns). */
#define READ(index, rows_, columns, padded_columns, row_stride, column_stride)                 \
  do {                                                                                         \
    void* copy = take(&space, (rows_) * (padded_columns));                                     \
    add(pads, pad_count, padded_matrix(copy, rows_, padded_columns, tensors[index], rows_,    \
                                       columns, row_stride, column_stride));                   \
    tensors[index] = copy;                                                                     \
  } while (0)
  /* A tensor the pass writes, cut from (rows, padded_columns) to (rows, columns). */
#define WRITTEN(index, rows_, columns, padded_columns)                                         \
  do {                                                                                         \
    void* copy = take(&space, (rows_) * (padded_columns));                                     \
    add(cuts, cut_count, cut_matrix(tensors[index], rows_, columns, copy, padded_columns));    \
    tensors[index] = copy;                                                                     \
  } while (0)
  const int inputs = backward ? LLTM_B_INPUTS : LLTM_F_INPUTS;
  const int weights = backward ? LLTM_B_WEIGHTS : LLTM_F_WEIGHTS;
  const int h0 = backward ? LLTM_B_H0 : LLTM_F_H0;
  if (padded_features != features) READ(inputs, rows, features, padded_features, features, 1);
  void* padded_weights = take(&space, 3 * padded_state * (padded_state + padded_features));
  weight_copies(pads, pad_count, element_bytes, padded_weights, padded_state, padded_features,
                tensors[weights], state, features, padded_state, padded_state, padded_features);
  tensors[weights] = padded_weights;
  READ(h0, batch, state, padded_state, state, 1);
  if (!backward) {
    if (GIVEN(LLTM_F_BIAS)) READ(LLTM_F_BIAS, 3, state, padded_state, state, 1);
    READ(LLTM_F_C0, batch, state, padded_state, state, 1);
    WRITTEN(LLTM_F_OUTPUTS, rows, state, padded_state);
    /* Cells and gates kept for the backward are given at the padded state. */
    if (!GIVEN(LLTM_F_CELLS)) tensors[LLTM_F_GATES] = take(&space, 3 * rows * padded_state);
    if (GIVEN(LLTM_F_FINAL_H)) WRITTEN(LLTM_F_FINAL_H, batch, state, padded_state);
    if (GIVEN(LLTM_F_FINAL_CELL)) WRITTEN(LLTM_F_FINAL_CELL, batch, state, padded_state);
    tensors[LLTM_F_STAGING] = NULL;
  } else {
    const int64_t* strides = sizes + LLTM_B_STRIDES;
    READ(LLTM_B_OUTPUTS, rows, state, padded_state, state, 1);
    for (int grad = 0; grad < 2; ++grad) {
      if (!GIVEN(LLTM_B_GRAD_OUTPUTS + grad)) continue;
      READ(LLTM_B_GRAD_OUTPUTS + grad, rows, state, padded_state, strides[2 * grad],
           strides[2 * grad + 1]);
      out->sizes[LLTM_B_STRIDES + 2 * grad] = padded_state;
      out->sizes[LLTM_B_STRIDES + 2 * grad + 1] = 1;
    }
    if (GIVEN(LLTM_B_GRAD_FINAL_H)) READ(LLTM_B_GRAD_FINAL_H, batch, state, padded_state, state, 1);
    if (GIVEN(LLTM_B_GRAD_FINAL_CELL)) {
      READ(LLTM_B_GRAD_FINAL_CELL, batch, state, padded_state, state, 1);
    }
    tensors[LLTM_B_D_GATES] = take(&space, 3 * rows * padded_state);
    if (GIVEN(LLTM_B_D_INPUTS) && padded_features != features) {
      WRITTEN(LLTM_B_D_INPUTS, rows, features, padded_features);
    }
    if (GIVEN(LLTM_B_D_WEIGHTS)) {
      void* padded_grad = take(&space, 3 * padded_state * (padded_state + padded_features));
      weight_copies(cuts, cut_count, element_bytes, tensors[LLTM_B_D_WEIGHTS], state, features,
                    padded_grad, padded_state, padded_features, state, state, features);
      tensors[LLTM_B_D_WEIGHTS] = padded_grad;
    }
    if (GIVEN(LLTM_B_D_BIAS)) WRITTEN(LLTM_B_D_BIAS, 3, state, padded_state);
    for (int grad = LLTM_B_D_H0; grad <= LLTM_B_D_C0; ++grad) {
      if (GIVEN(grad)) {
        WRITTEN(grad, batch, state, padded_state);
      } else {
        tensors[grad] = take(&space, batch * padded_state);
      }
    }
    tensors[LLTM_B_STAGING] = NULL;
    tensors[LLTM_B_PREVIOUS] = GIVEN(LLTM_B_BATCH_SIZES) && GIVEN(LLTM_B_D_WEIGHTS)
                                   ? take(&space, rows * padded_state)
                                   : NULL;
  }
#undef WRITTEN
#undef READ
#undef GIVEN
  return space.used;
}

/* Bit i set where tensors[i] is given, of the first `count`. */
static uint64_t present_of(void* const* tensors, int count) {
  uint64_t present = 0;
  for (int index = 0; index < count; ++index) {
    present |= (uint64_t)(tensors[index] != NULL) << index;
  }
  return present;
}

static int element_bytes_of(int dtype) {
  return dtype == LLTM_FLOAT64 ? 8 : dtype == LLTM_FLOAT32 ? 4 : 2;
}

int64_t lltm_sequence_workspace(int pass, int dtype, const int64_t* sizes, uint64_t present) {
  if (sizes[LLTM_SIZE_PADDED] == sizes[LLTM_SIZE_STATE]) return 0;
  return lay_out(pass, element_bytes_of(dtype), sizes, present, NULL, NULL, NULL);
}

int lltm_pad_pass(int pass, int element_bytes, const lltm_args* given, lltm_padded_pass* padded) {
  const int backward = pass == LLTM_PASS_BACKWARD;
  const int64_t state = given->sizes[LLTM_SIZE_STATE];
  const int64_t padded_state = given->sizes[LLTM_SIZE_PADDED];
  padded->pad_count = padded->cut_count = 0;
  padded->args = *given;
  if (padded_state == state) return LLTM_SUCCESS;
  void* space = given->tensors[backward ? LLTM_B_WORKSPACE : LLTM_F_WORKSPACE];
  if (padded_state < state || !space) return LLTM_ERROR_ARGUMENTS;
  const uint64_t present = present_of(given->tensors, backward ? LLTM_B_WORKSPACE
                                                               : LLTM_F_WORKSPACE);
  const uint64_t needed = backward ? 1u << LLTM_B_INPUTS | 1u << LLTM_B_WEIGHTS | 1u << LLTM_B_H0 |
                                         1u << LLTM_B_OUTPUTS | 1u << LLTM_B_CELLS |
                                         1u << LLTM_B_GATES
                                   : 1u << LLTM_F_INPUTS | 1u << LLTM_F_WEIGHTS | 1u << LLTM_F_H0 |
                                         1u << LLTM_F_C0 | 1u << LLTM_F_OUTPUTS;
  const int gates_missing = !backward && (present >> LLTM_F_CELLS & 1) &&
                            !(present >> LLTM_F_GATES & 1);
  if ((present & needed) != needed || gates_missing) return LLTM_ERROR_ARGUMENTS;
  lay_out(pass, element_bytes, given->sizes, present, given->tensors, (char*)space, padded);
  padded->args.sizes = padded->sizes;
  padded->args.tensors = padded->tensors;
  return LLTM_SUCCESS;
}

void lltm_copy_on_cpu(const lltm_copy* copies, int count, int element_bytes) {
  for (const lltm_copy* copy = copies; copy < copies + count; ++copy) {
    const int64_t kept = copy->columns < copy->src_columns ? copy->columns : copy->src_columns;
    for (int64_t batch = 0; batch < copy->batches; ++batch) {
      for (int64_t row = 0; row < copy->rows; ++row) {
        char* dst = offset(copy->dst, batch * copy->dst_batch + row * copy->dst_row,
                           element_bytes);
        const int64_t copied = row < copy->src_rows ? kept : 0;
        if (copied) {
          const char* src = offset(copy->src, batch * copy->src_batch + row * copy->src_row,
                                   element_bytes);
          for (int64_t column = 0; column < copied; ++column) {
            memcpy(dst + column * element_bytes,
                   src + column * copy->src_column * element_bytes, element_bytes);
          }
        }
        memset(dst + copied * element_bytes, 0, (copy->columns - copied) * element_bytes);
      }
    }
  }
}
