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
 *               row: float32 training T=64 B=16 S=128 11.1 against 16.3,
 *               T=1024 B=16 S=128 2.1 against 9.4 (cluster_kernel.cu);
 *               bfloat16 autocast, T=1024 B=16, the forward alone: S=512
 *               2.4 against 4.2, S=768 3.7 against 4.2
 *               (cluster_mma_kernel.cu).
 *   persistent  dense steps, at least 2 of them, batch x state at most
 *               LLTM_PERSISTENT_ELEMENTS, a block's weights and the batch's
 *               state in shared memory, every block resident (the 16-bit
 *               types: compute capability 8.0 and newer):
 *               persistent_kernel.cu's kernels, one cooperative launch a
 *               pass. H200 sweep (BENCHMARKS.md): faster than the cuBLAS
 *               loop at 177 of the 190 points where both take the call,
 *               the median 0.79 of its time. The plan passes float32
 *               training of more than 16 rows at states from 512 on to
 *               the cuBLAS loop (LLTM_PERSISTENT_TRAINING_ROWS).
 *   cublas      cuBLAS loaded and taking the dtype (not LLTM_CUBLAS=0);
 *               the plan passes small packed float32 and float64 steps on
 *               to the row below (LLTM_PACKED_STEPS_STATE, and
 *               LLTM_PACKED_STEPS_ROWS_STATE for a batch of up to 16):
 *               cublas_loop_kernel.cu, a cuBLAS product and a pointwise
 *               kernel a step each way. H200 sweep, 64x16x1536x1536
 *               float32 training: 91.2 us a step, against 194.5 on the
 *               step kernels; bfloat16 autocast 31.8 against 196.3.
 *   steps       every pass: step_by_step_kernel.cu, one fused kernel (the
 *               tiled product and the cell) a step each way. Last: it takes
 *               what the others do not, and small packed float32 steps.
 *  sequence, CPU:
 *   cpu         every pass: src/cpu's recurrence (its products portable or
 *               on AMX, LLTM_AMX). The CPU's one path: nothing to measure.
 *  the sequence's state (lltm_sequence_state), CUDA device: where a state's
 *               rows are not whole 16 bytes and the padded state's forward
 *               (or where a backward follows, its backward) takes the
 *               persistent row on LLTM_PAD_STEPS steps or more, or its
 *               forward the cublas row on as many or with large products
 *               (LLTM_PAD_STATE), the call runs at the padded state (zero
 *               units, the inputs' features padded alike; each pass pads
 *               and cuts back in C, include/lltm_padding.h): cuBLAS then
 *               takes its 16-byte aligned kernels for every product,
 *               those around the persistent kernels' recurrence too
 *               (which stage rows off 16 bytes through a ring of padded
 *               copies either way). H200
 *               sweep (BENCHMARKS.md, LLTM_PAD=0 its state as given),
 *               T=1024 B=16, bfloat16 autocast, us a step padded and as
 *               given: S=650 training 9.2 and 9.6 (768: 9.4); S=1500, on
 *               the cublas row, inference 8.3 and 17.9 (1536: 8.0),
 *               training 20.3 and 39.5 (1536: 19.6). A call whose
 *               tensors moved since the call before (after other
 *               models' calls) launches its kernels as they come rather
 *               than replaying its graph (lltm_cublas.h): training at
 *               1500 then took 36.8 (1536: 19.5). The steps row is not
 *               padded (not measured so), nor a forward alone on the
 *               cluster row (measured: LLTM_PAD_STEPS's note below).
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

#ifdef LLTM_WITH_CUDA

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
 * (BENCHMARKS.md), with the rule: B=20 two layers S=650 72.0 (persistent
 * 91.5); one layer S=650 33.8 (43.2), S=512 30.4 (30.5), S=300 on the
 * persistent row 20.2 (cublas 24.3). */
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
 * 37.3 at S=200, 15.9 at S=256). H200 sweep (BENCHMARKS.md), packed T=64
 * S=200, steps against cublas: B=16 training 34.8/37.1, inference
 * 13.1/23.4; B=64 34.7/26.8 and 13.4/12.6. */
#define LLTM_PACKED_STEPS_STATE 128
#define LLTM_PACKED_STEPS_ROWS 16
#define LLTM_PACKED_STEPS_ROWS_STATE 255

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
                     lltm_plan_persistent(dtype, 0, steps, batch_size, state_size,
                                          options->clusters)
                         .blocks
                 ? PASSED_ON
                 : 0;
    case LLTM_PATH_PERSISTENT:
      if (packed) return LLTM_ERROR_PATH_PACKED;
      plan->persistent = lltm_plan_persistent(dtype, pass == LLTM_PASS_BACKWARD, steps,
                                              batch_size, state_size, options->clusters);
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

/* The fewest steps for which the plan pads the state. On short sequences
 * padding wins some calls and loses others: H200, T=64 F=S, us a step
 * padded (LLTM_PAD=1) and as given (LLTM_PAD=0), probed once, 7 runs:
 * bfloat16 autocast training, B=16 S=650 19.9 and 21.4 (768: 18.7), B=64
 * S=1000 25.1 and 27.8; float32 training, B=64 S=650 56.5 and 48.9, B=16
 * S=650 34.3 and 31.6; bfloat16 inference, B=16 S=650 8.7 and 8.3. */
#define LLTM_PAD_STEPS 256

/* Under LLTM_PAD_STEPS steps the padding still pays on the cuBLAS loop
 * where each step's product is large: a 16-bit state of at least
 * LLTM_PAD_STATE (on rows off 16 bytes cuBLAS takes sm_80 kernels of
 * 2-element alignment, 13 us a product at S=1500 B=64 against 5 padded),
 * of any batch. H200, T=64 F=S under bfloat16 autocast, us a step padded
 * and as given (python3 benchmark.py --sweep -c --states 1500 --steps 64
 * --batches 1,4,8,16,64; LLTM_PAD=0 the state as given), training and
 * inference: B=1 30.2 and 34.0, 15.6 and 16.9 (1536: 27.3, 14.4); B=4
 * 34.4 and 44.0, 16.2 and 22.0 (1536: 33.1, 15.2); B=8 31.7 and 45.8,
 * 13.5 and 20.5 (1536: 28.7, 12.1); B=16 34.8 and 50.8, 17.0 and 25.5
 * (1536: 33.9, 15.6); B=64 41.3 and 63.8, 18.6 and 31.5 (1536: 37.8,
 * 16.2). In the same run with the padding from 16 rows only, B=4 and 8
 * as given took 1.42 to 1.75 times 1536's time. */
#define LLTM_PAD_STATE 1024

/* A call whose backward will run pads where that backward takes the
 * persistent row on LLTM_PAD_STEPS steps or more, whatever row takes its
 * forward (the cluster row's tensor-core forward, which takes any state
 * as well): H200, T=1024 under bfloat16 autocast, training, us a step as
 * given and padded, B=64: S=300 12.25 and 10.04, 500 14.40 and 12.16, 650
 * 18.55 and 14.54, 700 19.15 and 15.02; B=16: 6.25 and 6.14, 7.03 and
 * 7.20, 9.60 and 9.10, 9.77 and 9.67. A forward alone on the cluster row
 * stays as given: padded, at B=16, S=300 took 2.05 against 1.90, 500
 * 2.69 against 2.48. */

int64_t lltm_sequence_state(int dtype, int device, int backward, int64_t steps,
                            int64_t batch_size, int64_t state_size, int packed,
                            const lltm_sequence_options* options) {
  if (!options) options = &default_options;
  const int64_t row = dtype == LLTM_FLOAT64 ? 2 : dtype == LLTM_FLOAT32 ? 4 : 8;
  const int64_t padded = (state_size + row - 1) / row * row;
  if (options->pad == 0 || padded == state_size) return state_size;
  if (options->pad == 1) return padded;
  if (device == LLTM_CPU) return state_size;
  const int long_steps = steps >= LLTM_PAD_STEPS;
  const int large_products = (dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16) &&
                             state_size >= LLTM_PAD_STATE;
  if (!long_steps && !large_products) return state_size;
  const int path = lltm_sequence_path(dtype, device,
                                      backward ? LLTM_PASS_FORWARD_SAVED : LLTM_PASS_FORWARD,
                                      steps, batch_size, padded, packed, options);
  if (path == LLTM_PATH_CUBLAS || (long_steps && path == LLTM_PATH_PERSISTENT)) return padded;
  return long_steps && backward &&
                 lltm_sequence_path(dtype, device, LLTM_PASS_BACKWARD, steps, batch_size, padded,
                                    packed, options) == LLTM_PATH_PERSISTENT
             ? padded
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
