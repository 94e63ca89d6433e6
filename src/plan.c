/* The plan: which path runs a call of the LLTM's sequence or cell, decided
 * here and nowhere else. The sequence's passes (sequence_kernel.cu on a
 * GPU) ask lltm_plan_recurrence; Python asks lltm_sequence_path and
 * lltm_cell_path (lltm_ffi/ops/lltm/plan.py), for the cell's choice, for
 * lltm_ffi.recurrence_path and to refuse a forced path that cannot take a
 * call.
 *
 * The table, in order (docs/ARCHITECTURE.md draws it). Each row: its name
 * (LLTM_PATH=<name> forces it), where it applies, its forward and
 * backward, and the measurement that puts it where it is.
 *
 *  sequence, CUDA device (the first row that takes a pass runs it):
 *   cluster     dense steps, compute capability 9.0 and newer, a state of
 *               at most 256 (a float16 or bfloat16 forward: 768), every
 *               cluster resident at once, clusters not turned off
 *               (LLTM_CLUSTER=0): cluster_kernel.cu's forward and backward
 *               kernels, cluster_mma_kernel.cu's tensor-core forward past
 *               256 (past 512 a forward that keeps its gates and cells
 *               goes on to the persistent row where that takes it:
 *               LLTM_SAVED_CLUSTER_STATE), one launch a pass. H200
 *               sweep (BENCHMARKS.md), us a step against the persistent
 *               row: float32 training T=64 B=16 S=128 14.5 against 15.3,
 *               T=1024 B=16 S=128 2.1 against 9.4 (cluster_kernel.cu);
 *               bfloat16 autocast, T=1024 B=16, the forward alone: S=512
 *               2.2 against 3.9, S=768 3.7 against 4.2
 *               (cluster_mma_kernel.cu).
 *   persistent  dense steps, at least 2 of them, batch x state at most
 *               LLTM_PERSISTENT_ELEMENTS, a block's weights and the batch's
 *               state in shared memory, every block resident (the 16-bit
 *               types: compute capability 8.0 and newer):
 *               persistent_kernel.cu's kernels, one cooperative launch a
 *               pass. H200 sweep (BENCHMARKS.md): faster than the cuBLAS
 *               loop at 175 of the 190 points where both take the call,
 *               the median 0.78 of its time. The plan passes float32
 *               training of more than 16 rows at states from 512 on to
 *               the cuBLAS loop (LLTM_PERSISTENT_TRAINING_ROWS).
 *   cublas      cuBLAS loaded and taking the dtype (not LLTM_CUBLAS=0);
 *               the plan passes small packed float32 and float64 steps on
 *               to the row below (LLTM_PACKED_STEPS_STATE, and
 *               LLTM_PACKED_STEPS_ROWS_STATE for a batch of up to 16,
 *               where the plan pads the state to 256 for this row
 *               instead): cublas_loop_kernel.cu, a cuBLAS product and a
 *               pointwise kernel a step each way. H200 sweep,
 *               64x16x1536x1536 float32 training: 88.6 us a step, against
 *               191.1 on the step kernels; bfloat16 autocast 27.0 against
 *               194.5.
 *   steps       every pass: step_by_step_kernel.cu, one fused kernel (the
 *               tiled product and the cell) a step each way. Last: it takes
 *               what the others do not, and small packed float32 steps.
 *  sequence, CPU:
 *   cpu         every pass: src/cpu's recurrence (its products portable or
 *               on AMX, LLTM_AMX). The CPU's one path: nothing to measure.
 *  the sequence's state (lltm_sequence_state), CUDA device: where cuBLAS
 *               or the persistent kernels run a state off their tiles
 *               or rows off 16 bytes slower than the next such state,
 *               the call runs at that state (zero units, the inputs'
 *               features padded to 16 bytes; each pass pads and cuts
 *               back in C, include/lltm_padding.h): the rules and their
 *               measurements are above lltm_sequence_state. H200 sweep
 *               (BENCHMARKS.md, LLTM_PAD=0 its state as given), T=1024
 *               B=16, bfloat16 autocast, us a step padded and as given:
 *               S=650 training 8.6 and 9.1 (768: 9.0); S=1500, on the
 *               cublas row, inference 8.4 and 18.2 (1536: 8.3), training
 *               20.0 and 39.8 (1536: 19.7). A call whose tensors moved
 *               since the call before (after other models' calls)
 *               launches its kernels as they come rather than replaying
 *               its graph (lltm_cublas.h): training at 1500 then took
 *               36.8 (1536: 19.5). The steps row is not padded, nor a
 *               forward alone on the cluster row (measured: the note
 *               above lltm_sequence_state).
 *  cell (lltm), CUDA device:
 *   cell-steps  a gate product of at most LLTM_STEP_MULTIPLY_ADDS (their
 *               32-bit indices hold such a step), of
 *               LLTM_CAPTURED_STEP_MULTIPLY_ADDS while a CUDA graph is
 *               captured: step_kernel.cu's step_forward and step_backward,
 *               one C call a pass; also a sequence of one dense forward
 *               step with a bias, planned. BENCHMARKS.md, "The cell";
 *               captured (a 16-step loop replayed on an H100, us a cell,
 *               these kernels against torch's products): 31.9 against 75.1
 *               at 16x32x128, 55.4 against 39.0 at 64x64x256.
 *   cell-torch  every other call, and every call on the CPU: torch's cat
 *               and linear around the fused pointwise passes
 *               (forward_pass, backward_pass in src/lltm_kernel.cu and
 *               src/cpu). */
#include <stddef.h>
#include <stdint.h>

#include "lltm_op.h"

#ifdef LLTM_WITH_CUDA
#include "cuda/recurrence/lltm_plan.h"
#include "lltm_cublas.h"
#endif

static const char* const path_names[LLTM_PATH_COUNT] = {
    [LLTM_PATH_CLUSTER] = "cluster", [LLTM_PATH_PERSISTENT] = "persistent",
    [LLTM_PATH_CUBLAS] = "cublas",   [LLTM_PATH_STEPS] = "steps",
    [LLTM_PATH_CPU] = "cpu",         [LLTM_PATH_CELL_STEPS] = "cell-steps",
    [LLTM_PATH_CELL_TORCH] = "cell-torch"};

/* The cell's step kernels' limits, in multiply-adds of the gate product. */
#define LLTM_STEP_MULTIPLY_ADDS ((int64_t)1 << 30)
#define LLTM_CAPTURED_STEP_MULTIPLY_ADDS ((int64_t)1 << 20)

const char* lltm_path_name(int path) {
  return path >= 0 && path < LLTM_PATH_COUNT ? path_names[path] : NULL;
}

static const lltm_sequence_options default_options = {LLTM_PATH_PLANNED, 0, 1, 1, -1, -1, -1};

static int sequence_path_on_device(int path) {
  return path >= LLTM_PATH_CLUSTER && path <= LLTM_PATH_STEPS;
}

/* What row_takes answers where a row could take a pass that the plan
 * leaves to a row below it, which serves it better. */
#define PASSED_ON 1

/* Past this state a 16-bit forward that keeps its gates and cells goes on
 * from the cluster row's tensor-core kernel to the persistent row where
 * that takes it. There (5 and 6 groups a block) the kernel reads part of
 * its weights from shared memory each step, and the stores of the gates
 * and cells cost it more than the persistent kernels: H200, bfloat16
 * autocast, B=16, GPU time a step of the training forward, cluster against
 * persistent: T=1024 S=768 4.49 against 3.83, S=650 3.97 against 3.74; at
 * S=512 (every weight in registers) 2.65 against 3.65. Whole training
 * calls, us a step: T=1024 S=768 9.61 against 9.18, S=650 9.60 against
 * 9.28; T=64 S=650 25.2 against 21.5. A forward alone stays on the
 * cluster row (T=1024 S=768 3.89 against 4.30). */
#define LLTM_SAVED_CLUSTER_STATE 512

/* A float32 call whose backward will run, of more than
 * LLTM_PERSISTENT_TRAINING_ROWS rows and a state of at least
 * LLTM_PERSISTENT_TRAINING_STATE, goes from the persistent row to the
 * cuBLAS loop both ways (where cuBLAS is loaded); a forward alone stays.
 * H200, training, the sweep's timing (probe), us a step, persistent
 * against cublas, at 35 steps of two layers and 64 steps of one: B=20
 * S=650 93.4/74.0 and 44.8/35.4 (word_language_model's medium size),
 * S=512 65.9/63.5 and 31.3/30.6; B=24 S=512 69.0/65.7 and 32.5/31.5.
 * Staying: B=16 S=650 71.0/72.1 and 33.3/34.8, S=512 56.5/60.9 and
 * 25.4/29.2; B=20 S=300 53.0/54.1 and 23.4/26.2. The H200 sweep
 * (BENCHMARKS.md), with the rule: B=20 two layers S=650 71.5 (persistent
 * 91.9); one layer S=650 33.2 (44.1), S=512 30.9 (31.8), S=300 on the
 * persistent row 24.0 (cublas 26.6). */
#define LLTM_PERSISTENT_TRAINING_ROWS 16
#define LLTM_PERSISTENT_TRAINING_STATE 512

/* Packed float32 and float64 steps of a state up to this (and batch x
 * state up to LLTM_PERSISTENT_ELEMENTS) go from the cublas row to steps,
 * whose one fused kernel a step measured faster there than a product and
 * a pointwise kernel; past it, and in 16-bit types, the cuBLAS loop did.
 * H200, T=64, lengths from 64 down to 16, isolated calls, us a step,
 * steps against cublas: float32 B=16 training S=32 14.8/16.6, S=64
 * 19.4/16.2, S=128 21.6/70.7, S=256 34.6/23.7, S=1024 119.2/39.2; B=64
 * S=32 16.1/22.0, S=128 26.1/32.5, S=256 39.9/27.6; bfloat16 autocast
 * B=16 S=32 19.2/18.3, S=256 39.2/19.2, S=1024 126.5/26.1; B=64 S=128
 * 27.9/20.9. A batch of at most LLTM_PACKED_STEPS_ROWS sequences goes to
 * steps at states up to LLTM_PACKED_STEPS_ROWS_STATE: there cuBLAS's
 * float32 products of 16 rows take kernels of 20 to 50 us a product
 * (dense, cublas forced, T=64 B=16 training: 90.6 us a step at S=128,
 * 37.3 at S=200, 15.9 at S=256). There the plan pads the state to 256
 * for the cublas row (lltm_sequence_state). H200 sweep (BENCHMARKS.md),
 * packed T=64 S=200, float32, us a step, padded to 256 on the cublas row
 * and as given on the steps row: B=16 training 25.8/33.2, inference
 * 12.4/13.0 (256: 24.9 and 11.9). */
#define LLTM_PACKED_STEPS_STATE 128
#define LLTM_PACKED_STEPS_ROWS 16
#define LLTM_PACKED_STEPS_ROWS_STATE 255

#ifdef LLTM_WITH_CUDA

/* 0 where path `path` (a GPU row of the sequence) takes the pass, with its
 * layout in *plan; else why not, an LLTM_ERROR_PATH code, or PASSED_ON
 * where `planned` (the plan asks: no path forced). */
static int row_takes(int path, int planned, int dtype, int pass, int64_t steps,
                     int64_t batch_size, int64_t state_size, int packed,
                     const lltm_sequence_options* options, int cublas,
                     lltm_recurrence_plan* plan) {
  switch (path) {
    case LLTM_PATH_CLUSTER:
      if (packed) return LLTM_ERROR_PATH_PACKED;
      if (!options->clusters) return LLTM_ERROR_PATH_NO_CLUSTERS;
      plan->cluster = lltm_plan_cluster(dtype, pass == LLTM_PASS_BACKWARD, steps, batch_size,
                                        state_size);
      if (!plan->cluster.kernel) return LLTM_ERROR_PATH_CLUSTER_SIZES;
      return planned && pass == LLTM_PASS_FORWARD_SAVED &&
                     state_size > LLTM_SAVED_CLUSTER_STATE &&
                     lltm_plan_persistent(dtype, pass, steps, batch_size, state_size,
                                          options->clusters)
                         .blocks
                 ? PASSED_ON
                 : 0;
    case LLTM_PATH_PERSISTENT:
      if (packed) return LLTM_ERROR_PATH_PACKED;
      plan->persistent = lltm_plan_persistent(dtype, pass, steps, batch_size, state_size,
                                              options->clusters);
      if (!plan->persistent.blocks) return LLTM_ERROR_PATH_PERSISTENT_SIZES;
      return planned && cublas && dtype == LLTM_FLOAT32 && pass != LLTM_PASS_FORWARD &&
                     batch_size > LLTM_PERSISTENT_TRAINING_ROWS &&
                     state_size >= LLTM_PERSISTENT_TRAINING_STATE
                 ? PASSED_ON
                 : 0;
    case LLTM_PATH_CUBLAS:
      if (!cublas) return LLTM_ERROR_PATH_NO_CUBLAS;
      return planned && packed && (dtype == LLTM_FLOAT32 || dtype == LLTM_FLOAT64) &&
                     (state_size <= LLTM_PACKED_STEPS_STATE ||
                      (batch_size <= LLTM_PACKED_STEPS_ROWS &&
                       state_size <= LLTM_PACKED_STEPS_ROWS_STATE)) &&
                     batch_size * state_size <= LLTM_PERSISTENT_ELEMENTS
                 ? PASSED_ON
                 : 0;
    default:
      return 0;
  }
}

lltm_recurrence_plan lltm_plan_recurrence(int dtype, int pass, int64_t steps,
                                          int64_t batch_size, int64_t state_size, int packed,
                                          const lltm_sequence_options* options, int cublas) {
  if (!options) options = &default_options;
  lltm_recurrence_plan plan = {LLTM_PATH_STEPS, {NULL, 0, 0, 0, 0}, {NULL, 0, 0, 1}};
  const int forced = sequence_path_on_device(options->path) ? options->path : LLTM_PATH_PLANNED;
  if (options->path == LLTM_PATH_CPU) {
    plan.path = LLTM_ERROR_PATH_DEVICE;
    return plan;
  }
  for (int path = LLTM_PATH_CLUSTER; path <= LLTM_PATH_STEPS; ++path) {
    if (forced != LLTM_PATH_PLANNED && forced != path) continue;
    const int refusal = row_takes(path, forced == LLTM_PATH_PLANNED, dtype, pass, steps,
                                  batch_size, state_size, packed, options, cublas, &plan);
    if (refusal == 0 || forced == path) {
      plan.path = refusal == 0 ? path : refusal;
      return plan;
    }
  }
  return plan;
}

#endif /* LLTM_WITH_CUDA */

int lltm_sequence_path(int dtype, int device, int pass, int64_t steps, int64_t batch_size,
                       int64_t state_size, int packed, const lltm_sequence_options* options) {
  if (!options) options = &default_options;
  if (device == LLTM_CPU) {
    return sequence_path_on_device(options->path) ? LLTM_ERROR_PATH_DEVICE : LLTM_PATH_CPU;
  }
#ifdef LLTM_WITH_CUDA
  const int cublas = options->cublas && lltm_cublas_usable(dtype);
  return lltm_plan_recurrence(dtype, pass, steps, batch_size, state_size, packed, options,
                              cublas)
      .path;
#else
  (void)dtype, (void)pass, (void)steps, (void)batch_size, (void)state_size, (void)packed;
  return LLTM_ERROR_NO_CUDA;
#endif
}

/* The fewest steps for which the plan pads the state to whole 16-byte rows
 * in float32 and float64. On short sequences padding wins some calls and
 * loses others: H200, T=64 F=S, us a step padded (LLTM_PAD=1) and as
 * given (LLTM_PAD=0), probed once, 7 runs: float32 training, B=64 S=650
 * 56.5 and 48.9, B=16 S=650 34.3 and 31.6; bfloat16 inference, B=16 S=650
 * (the cluster row) 8.7 and 8.3. */
#define LLTM_PAD_STEPS 256

/* A 16-bit state of at least LLTM_PAD_STATE whose forward takes the
 * cublas row is padded to whole tiles, at any steps and batch: there
 * cuBLAS's products of rows off 16 bytes take sm_80 kernels of 2-element
 * alignment (13 us a product at S=1500 B=64 against 5 at 1504), and
 * whole tiles did as well as whole rows or better. H200, T=64 F=S under
 * bfloat16 autocast, us a step at 1500 padded to 1536, to 1504
 * (LLTM_PAD=1) and as given (LLTM_PAD=0), training and inference
 * (python3 benchmark.py --sweep -c --states 1500 --steps 64 --batches
 * 1,8,64, with an LLTM_PAD=1 column): B=1 29.6, 29.8 and 34.7; 11.4, 11.3
 * and 12.7 (1536: 29.2, 10.5); B=8 31.5, 34.0 and 47.5; 15.2, 15.2 and
 * 22.8 (1536: 30.8, 13.8); B=64 34.6, 35.0 and 62.5; 15.1, 14.7 and 29.8
 * (1536: 32.8, 13.7). T=1024 B=16: 20.4, 20.7 and 39.8; 8.0, 8.3 and 18.1
 * (1536: 19.7, 7.9). */
#define LLTM_PAD_STATE 1024

/* Where the plan pads the state (lltm_sequence_state), CUDA device:
 *  - to whole tiles (LLTM_PAD_TILE, the width of cuBLAS's widest tiles),
 *    where the forward at that state takes the cublas row with products
 *    cuBLAS serves badly off the tiles: a 16-bit state of at least
 *    LLTM_PAD_STATE, and packed float32 steps of at most
 *    LLTM_PACKED_STEPS_ROWS rows past LLTM_PACKED_STEPS_STATE, which as
 *    given go to the steps row (the notes of both);
 *  - else to whole 16-byte rows, where they are not: in a 16-bit type
 *    wherever a pass takes the cublas row (cuBLAS's kernels for rows off
 *    16 bytes are the slow ones above; H200, T=64, bfloat16 autocast, us
 *    a step padded and as given, 30 runs: B=64 training S=300 18.4 and
 *    19.2 (384: 17.9), S=500 20.1 and 23.3 (512: 19.3), S=650 22.9 and
 *    27.1 (768: 22.6), whole tiles no faster; packed S=100, B=16 training
 *    19.8 and 23.0, inference 8.6 and 8.7, B=64 20.9 and 22.5, 10.7 and
 *    11.9), and on LLTM_PAD_STEPS steps or more where the forward
 *    takes the cublas or persistent row, or a
 *    backward that will run the persistent row (whatever row takes its
 *    forward: the cluster row's tensor-core forward takes any state as
 *    well). H200, T=1024 under bfloat16 autocast, training, us a step as
 *    given and padded, B=64: S=300 12.25 and 10.04, 500 14.40 and 12.16,
 *    650 18.55 and 14.54, 700 19.15 and 15.02; B=16: 6.25 and 6.14, 7.03
 *    and 7.20, 9.60 and 9.10, 9.77 and 9.67. A forward alone on the
 *    cluster row stays as given: padded, at B=16, S=300 took 2.05
 *    against 1.90, 500 2.69 against 2.48. */

static int64_t whole(int64_t size, int64_t chunk) { return (size + chunk - 1) / chunk * chunk; }

int64_t lltm_sequence_state(int dtype, int device, int backward, int64_t steps,
                            int64_t batch_size, int64_t state_size, int packed,
                            const lltm_sequence_options* options) {
  if (!options) options = &default_options;
  const int64_t rows = whole(state_size, dtype == LLTM_FLOAT64   ? 2
                                         : dtype == LLTM_FLOAT32 ? 4
                                                                 : 8);
  if (options->pad == 0) return state_size;
  if (options->pad == 1) return rows;
  if (device == LLTM_CPU || state_size % LLTM_PAD_TILE == 0) return state_size;
  const int sixteen_bit = dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16;
  const int forward = backward ? LLTM_PASS_FORWARD_SAVED : LLTM_PASS_FORWARD;
  const int64_t tiles = whole(state_size, LLTM_PAD_TILE);
  const int off_tiles_slow =
      (sixteen_bit && state_size >= LLTM_PAD_STATE) ||
      (packed && dtype == LLTM_FLOAT32 && batch_size <= LLTM_PACKED_STEPS_ROWS &&
       state_size > LLTM_PACKED_STEPS_STATE);
  if (off_tiles_slow && lltm_sequence_path(dtype, device, forward, steps, batch_size, tiles,
                                           packed, options) == LLTM_PATH_CUBLAS) {
    return tiles;
  }
  if (rows == state_size) return state_size;
  const int forward_path =
      lltm_sequence_path(dtype, device, forward, steps, batch_size, rows, packed, options);
  const int backward_path =
      backward ? lltm_sequence_path(dtype, device, LLTM_PASS_BACKWARD, steps, batch_size, rows,
                                    packed, options)
               : -1;
  if (sixteen_bit && (forward_path == LLTM_PATH_CUBLAS || backward_path == LLTM_PATH_CUBLAS)) {
    return rows;
  }
  return steps >= LLTM_PAD_STEPS &&
                 (forward_path == LLTM_PATH_CUBLAS || forward_path == LLTM_PATH_PERSISTENT ||
                  backward_path == LLTM_PATH_PERSISTENT)
             ? rows
             : state_size;
}

/* Whether the cell's step passes are compiled for `dtype` (asked once). */
static int step_passes_take(int dtype) {
  static int dtypes = -1;
  if (dtypes < 0) {
    dtypes = lltm_pass_dtypes(lltm_pass_id("step_forward"), LLTM_ON_CUDA) &
             lltm_pass_dtypes(lltm_pass_id("step_backward"), LLTM_ON_CUDA);
  }
  return dtype >= 0 && (dtypes >> dtype) & 1;
}

int lltm_cell_path(int dtype, int device, int64_t multiply_adds, int capturing, int forced) {
  const int fits = multiply_adds <= LLTM_STEP_MULTIPLY_ADDS;
  const int takes = device != LLTM_CPU && fits && step_passes_take(dtype);
  if (forced == LLTM_PATH_CELL_STEPS) {
    return takes ? LLTM_PATH_CELL_STEPS
           : device == LLTM_CPU ? LLTM_ERROR_PATH_DEVICE
                                : LLTM_ERROR_PATH_STEP_SIZES;
  }
  if (forced == LLTM_PATH_CELL_TORCH || !takes) return LLTM_PATH_CELL_TORCH;
  return !capturing || multiply_adds <= LLTM_CAPTURED_STEP_MULTIPLY_ADDS ? LLTM_PATH_CELL_STEPS
                                                                          : LLTM_PATH_CELL_TORCH;
}

const char* lltm_path_refusal(int code) {
  switch (code) {
    case LLTM_ERROR_PATH_DEVICE:
      return "it runs on another device (cpu and cell-torch on the CPU; cluster, persistent, "
             "cublas, steps and cell-steps on a CUDA device)";
    case LLTM_ERROR_PATH_PACKED:
      return "it takes dense steps only, not packed ones (batch_sizes or a PackedSequence)";
    case LLTM_ERROR_PATH_NO_CLUSTERS:
      return "it needs thread-block clusters, which LLTM_CLUSTER=0 turns off";
    case LLTM_ERROR_PATH_CLUSTER_SIZES:
      return "the cluster kernels need compute capability 9.0 or newer, a module compiled "
             "for it, a state of at most 256 (a float16 or bfloat16 forward pass: 768) and "
             "every cluster resident at once";
    case LLTM_ERROR_PATH_PERSISTENT_SIZES:
      return "the persistent kernels need at least 2 steps, batch x state of at most 16384, "
             "a block's hidden weights and the batch's state in shared memory and every "
             "block resident at once (float16 and bfloat16: compute capability 8.0 or newer)";
    case LLTM_ERROR_PATH_NO_CUBLAS:
      return "cuBLAS cannot be loaded, has no product of this dtype, or LLTM_CUBLAS=0 turns "
             "it off";
    case LLTM_ERROR_PATH_STEP_SIZES:
      return "the cell's step kernels take a gate product of at most 2^30 multiply-adds "
             "(batch * 3 * state * (state + input_features)) in a dtype their passes take";
    default:
      return NULL;
  }
}
