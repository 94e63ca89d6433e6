// What the files of the sequence's recurrence share. A pass's way down:
//
//   sequence_kernel.cu        the passes: their launchers, the recurrence
//                             by the path the plan (src/plan.c,
//                             lltm_plan.h) gives, the products and sums
//                             around it
//   cluster_kernel.cu         the cluster kernels (lltm_cluster.h)
//   cluster_mma_kernel.cu     the cluster path's tensor-core forward kernel
//   persistent_kernel.cu      the persistent kernels (lltm_persistent.cuh)
//   cublas_loop_kernel.cu     the cuBLAS loop
//   step_by_step_kernel.cu    the step-by-step kernels
//   products_kernel.cu        the matrix products, and the gradient of the
//                             hidden weights
//
// Here: the device code the step-by-step kernels, the cuBLAS loop and the
// persistent kernels share (a step's state and gradients, the cell's math
// on a step's element), the recurrence as every path takes it
// (ForwardRecurrence, BackwardRecurrence), and the functions each file gives
// the others, each instantiated for every element type in the file that
// defines it.
#ifndef LLTM_RECURRENCE_CUH
#define LLTM_RECURRENCE_CUH

#include "caffe_cuda_macro.h"
#include "lltm_cell.h"
#include "lltm_op.h"
#include "lltm_plan.h"
#include "lltm_steps.h"

// The tiles of the step-by-step kernels and of the hidden weights'
// gradient: kTile x kTile threads a block.
static const int kTile = 16;
static const int kTileThreads = kTile * kTile;

// Blocks of a grid of `tile` x `tile` tiles over rows x columns, at most as
// many as a grid may have.
static inline int tile_blocks(int64_t rows, int64_t columns, int64_t tile = kTile) {
  const int64_t tiles = ((rows + tile - 1) / tile) * ((columns + tile - 1) / tile);
  return (int)(tiles < CAFFE_MAXIMUM_NUM_BLOCKS ? tiles : CAFFE_MAXIMUM_NUM_BLOCKS);
}

// The 16-byte vector of an element type, and its elements: what a lane
// reads of shared memory at once; eight elements' bits for the 16-bit types.
template <typename Dtype>
struct Vector {
  static_assert(sizeof(Dtype) == 2, "float, double or a 16-bit type");
  typedef uint4 type;
  static const int kWidth = 8;
};
template <>
struct Vector<float> {
  typedef float4 type;
  static const int kWidth = 4;
};
template <>
struct Vector<double> {
  typedef double2 type;
  static const int kWidth = 2;
};

template <typename Dtype>
__host__ __device__ static const Dtype* offset_or_null(const Dtype* tensor, int64_t offset) {
  return tensor ? tensor + offset : NULL;
}

// The backward pass's output gradients: grad_outputs' and grad_cells' (step,
// row, column) strides, in elements. Autograd often hands over broadcast
// views (stride 0), which the kernels read as they are.
struct GradStrides {
  int64_t outputs[3], cells[3];
};

// A pass's recurrence as every path takes it: the steps (walk), the state's
// size, and the hidden weights, the first state_size columns of `weights`
// (rows weights_row_stride apart). The other tensors are laid out as
// sequence_kernel.cu says, dense but for the output gradients.
//
// Forward: on entry gates (rows, 3 * state) holds every step's input part;
// each step adds the bias (NULL: none) and old_h times the hidden weights,
// keeps the sum in gates, and writes the step's outputs and cells; the
// last step visited leaves its state in final_h and final_cell too, where
// final_h is not NULL. cells NULL (a forward no backward follows; final_h
// and final_cell then given) keeps nothing for a backward: no cells, and
// no pre-activation written back into gates, which serve as the pass's
// workspace (the cuBLAS loop adds the step's product into them there); the
// paths that carry the cell from step to step through memory carry it in
// final_cell, which ends with each sequence's last one. The arithmetic is
// the same either way, and so are the bits of outputs, final_h and
// final_cell. staging: NULL, or the persistent kernels' ring of two (batch,
// state rounded up to whole 16 bytes) buffers (lltm_persistent.cuh's
// StagingRing), which the other paths leave alone.
template <typename Dtype>
struct ForwardRecurrence {
  lltm_walk walk;
  int64_t state_size, weights_row_stride;
  const Dtype *bias, *weights, *h0, *c0;
  Dtype *outputs, *cells, *gates, *final_h, *final_cell, *staging;
};

// Backward: d_gates of every step from the output gradients grad_outputs
// and grad_cells (NULL: zeros; read through strides) and the final state's
// (dense (batch, state), NULL: zeros), beside the cells and gates the
// forward pass kept. d_h0 and d_c0 end with the gradients of h0 and c0
// where the path gives them (the cluster and persistent kernels; the
// others leave d_h0 to initial_state_grads); past one step the paths carry
// the gradients between steps in them. staging as in the forward, of
// (batch, 3 * state) rows.
template <typename Dtype>
struct BackwardRecurrence {
  lltm_walk walk;
  int64_t state_size, weights_row_stride;
  const Dtype *weights, *grad_outputs, *grad_cells;
  GradStrides strides;
  const Dtype *grad_final_h, *grad_final_cell, *cells, *gates;
  Dtype *d_gates, *d_h0, *d_c0, *staging;
};

// Element (row, column) of one step of an output gradient (that step's
// first element at `step`, NULL for zeros), read through its strides: as
// stored, and in the math type.
template <typename Dtype>
__device__ __forceinline__ Dtype stored_gradient_at(const Dtype* step, const int64_t (&strides)[3],
                                                    int64_t row, int64_t column) {
  return step ? step[row * strides[1] + column * strides[2]] : to_storage<Dtype>(0);
}

template <typename Dtype>
__device__ __forceinline__ math_t<Dtype> gradient_at(const Dtype* step,
                                                     const int64_t (&strides)[3], int64_t row,
                                                     int64_t column) {
  return to_math(stored_gradient_at(step, strides, row, column));
}

// One step of a walk (lltm_steps.h) as its forward kernels see it: its row
// r's old state is row r of the previous step's (h, cell) below `carried`,
// of (h0, c0) from there on; its rows from `continued` on end at the step
// and leave their state in (final_h, final_cell) too, where final_h is not
// NULL. Each pointer is the first element of a step's or of the batch's
// dense (rows, state) elements.
template <typename Dtype>
struct StepState {
  const Dtype* h;
  const Dtype* cell;
  const Dtype* h0;
  const Dtype* c0;
  int64_t carried;
  Dtype* final_h;
  Dtype* final_cell;
  int64_t continued;
  __device__ const Dtype* old_h(int64_t row) const { return row < carried ? h : h0; }
  __device__ const Dtype* old_cell(int64_t row) const { return row < carried ? cell : c0; }
};

// Where the step whose first row is `offset` keeps its cells: its rows of
// cells, or where the pass keeps none (cells NULL) final_cell, whose row r
// carries sequence r's cell from step to step (a step's row r is the
// previous step's row r; a sequence that ends leaves its last cell there).
template <typename Dtype>
static Dtype* step_cells(const ForwardRecurrence<Dtype>& r, int64_t offset) {
  return r.cells ? r.cells + offset * r.state_size : r.final_cell;
}

template <typename Dtype>
static StepState<Dtype> step_state(const ForwardRecurrence<Dtype>& r, const lltm_step& step) {
  const StepState<Dtype> state = {r.outputs + step.previous_offset * r.state_size,
                                  step_cells(r, step.previous_offset), r.h0, r.c0,
                                  step.carried, r.final_h, r.final_cell, step.continued};
  return state;
}

// The cell's forward math on element `element` (row `row`) of a step, from
// its three pre-activations; new_h and new_cell are the step's. new_cell
// may be the old cell's memory (final_cell carrying it, step_cells): the
// element's old cell is read, by this thread, before its new one is written.
template <typename Dtype>
__device__ __forceinline__ void step_cell_forward(const math_t<Dtype> (&pre)[3],
                                                  const StepState<Dtype>& state, int64_t row,
                                                  int64_t element, Dtype* new_h,
                                                  Dtype* new_cell) {
  math_t<Dtype> h_value, cell_value;
  cell_forward_(pre[0], pre[1], pre[2], to_math(state.old_cell(row)[element]), &h_value,
                &cell_value);
  const Dtype h = to_storage<Dtype>(h_value), cell = to_storage<Dtype>(cell_value);
  new_h[element] = h;
  new_cell[element] = cell;
  if (state.final_h && row >= state.continued) {
    state.final_h[element] = h;
    state.final_cell[element] = cell;
  }
}

// What a step's backward reads beside what the forward pass saved: its
// output and cell gradients (the step's first element, NULL for zeros, read
// through strides), and the final states' gradients (dense (batch, state),
// NULL for zeros), where its rows from `continued` on, which end at the
// step, start; the rows below start from what the next step carries back.
template <typename Dtype>
struct StepGradients {
  const Dtype* output;
  const Dtype* cell;
  GradStrides strides;
  const Dtype* final_h;
  const Dtype* final_cell;
  int64_t continued;
};

template <typename Dtype>
static StepGradients<Dtype> step_gradients(const BackwardRecurrence<Dtype>& r,
                                           const lltm_step& step) {
  const GradStrides& strides = r.strides;
  const StepGradients<Dtype> gradients = {
      offset_or_null(r.grad_outputs,
                     lltm_step_start(&r.walk, &step, strides.outputs[0], strides.outputs[1])),
      offset_or_null(r.grad_cells,
                     lltm_step_start(&r.walk, &step, strides.cells[0], strides.cells[1])),
      strides, r.grad_final_h, r.grad_final_cell, step.continued};
  return gradients;
}

// The step-wise paths' loops over a walk: launch(step) for each step in
// the walk's order, or backward launch(step, next_offset) for each in the
// reverse order, next_offset the first row of the step visited after it (0
// for the first visited). A code other than LLTM_SUCCESS ends the loop and
// is returned.
template <typename Launch>
static int for_each_step(const lltm_walk& walk, Launch launch) {
  for (lltm_step step = lltm_first_step(&walk);; step = lltm_next_step(&walk, &step)) {
    const int code = launch(step);
    if (code != LLTM_SUCCESS || step.order + 1 == walk.steps) return code;
  }
}

template <typename Launch>
static int for_each_step_backward(const lltm_walk& walk, Launch launch) {
  lltm_step step = lltm_last_step(&walk);
  int64_t next_offset = 0;
  for (;;) {
    const int code = launch(step, next_offset);
    if (code != LLTM_SUCCESS || step.order == 0) return code;
    next_offset = step.offset;
    step = lltm_previous_step(&walk, &step);
  }
}

// The cell's backward math on element `element` (row, column) of a step:
// the gradients reaching its h and cell are carried_h and carried_cell (the
// next step's, read only for the rows it continues) or the final states',
// each plus the step's own. d_cell, where not NULL, takes the gradient
// reaching the old cell.
template <typename Dtype>
__device__ __forceinline__ void step_cell_backward(const StepGradients<Dtype>& gradients,
                                                   int64_t row, int64_t column, int64_t element,
                                                   math_t<Dtype> carried_h,
                                                   const Dtype* carried_cell,
                                                   math_t<Dtype> new_cell, const Dtype* gate,
                                                   int64_t state_size, Dtype* d_cell,
                                                   Dtype* d_gate) {
  typedef math_t<Dtype> Math;
  const bool continues = row < gradients.continued;
  const Math start_h = continues ? carried_h
                       : gradients.final_h ? to_math(gradients.final_h[element])
                                           : Math(0);
  const Math start_cell = continues ? to_math(carried_cell[element])
                          : gradients.final_cell ? to_math(gradients.final_cell[element])
                                                 : Math(0);
  Math d_old_cell, d_input, d_output, d_candidate;
  cell_backward_(gradient_at(gradients.output, gradients.strides.outputs, row, column) + start_h,
                 gradient_at(gradients.cell, gradients.strides.cells, row, column) + start_cell,
                 new_cell, to_math(gate[0]), to_math(gate[state_size]),
                 to_math(gate[2 * state_size]), &d_old_cell, &d_input, &d_output, &d_candidate);
  d_gate[0] = to_storage<Dtype>(d_input);
  d_gate[state_size] = to_storage<Dtype>(d_output);
  d_gate[2 * state_size] = to_storage<Dtype>(d_candidate);
  if (d_cell) d_cell[element] = to_storage<Dtype>(d_old_cell);
}

// A step's pre-activation from its sum in the math type: rounded to the
// element type (for a 16-bit type), kept in the step's gates where `keep`
// (a forward no backward follows keeps none), and handed to the cell as
// rounded, as the backward pass, which recomputes from the gates, sees it.
template <typename Dtype>
__device__ __forceinline__ math_t<Dtype> keep_gate(Dtype* gate, math_t<Dtype> sum, bool keep) {
  const Dtype kept = to_storage<Dtype>(sum);
  if (keep) *gate = kept;
  return to_math(kept);
}

// Past kPersistentElements (batch x state) the persistent kernels take no
// pass (lltm_plan.h).
static const int64_t kPersistentElements = LLTM_PERSISTENT_ELEMENTS;

// How a persistent launch is laid out, or blocks == 0 where it cannot run
// here. Every block reads the whole batch's state each step, so past
// kPersistentElements (batch x state) that traffic outgrows the launches it
// saves; and it needs shared memory for a block's weights and the whole
// batch, and no more blocks than the device holds at once (a cooperative
// launch needs every block resident).
typedef lltm_persistent_plan PersistentPlan;

// Every element type, for the instantiations: macro(Dtype) for each.
#define LLTM_FOR_EVERY_DTYPE(macro) \
  macro(float) macro(double) macro(__half) macro(__nv_bfloat16)

// products_kernel.cu: C (m x n, row stride ldc) = op(A) op(B) (+ C where
// `accumulate`), row-major, by cuBLAS where `cublas` (within
// lltm_cublas_run) or lltm_ffi's own kernel; and the hidden columns of
// d_weights, d_gates^T times each step's old h (packed steps': gathered
// into previous, (rows, state)).
template <typename Dtype>
int product(bool cublas, cudaStream_t stream, int64_t m, int64_t n, int64_t k, const Dtype* a,
            int64_t lda, bool a_transposed, const Dtype* b, int64_t ldb, bool b_transposed,
            bool accumulate, Dtype* c, int64_t ldc);
template <typename Dtype>
int hidden_weight_grads(bool cublas, cudaStream_t stream, const lltm_walk& walk,
                        int64_t state_size, int64_t columns, const Dtype* d_gates,
                        const Dtype* h0, const Dtype* outputs, Dtype* previous,
                        Dtype* d_weights);

// The recurrence's paths, in the order of the plan's table (src/plan.c).
// The cluster and persistent kernels take the same arguments, `arguments`
// (the kernels' own, in their order: sequence_kernel.cu builds them), but
// for the persistent kernels' last, staging, which the cluster kernels,
// one parameter short, do not read:
// cluster_kernel.cu launches the kernel of a cluster plan
// (lltm_plan_cluster, lltm_cluster.h), persistent_kernel.cu plans a
// persistent launch (blocks == 0: none) and launches the kernel it names.
cudaError_t launch_clusters(const lltm_cluster_plan& plan, void** arguments,
                            cudaStream_t stream);
// cluster_mma_kernel.cu: the cluster path's tensor-core forward kernel for
// a 16-bit state past the cluster kernels' (kernel NULL: none), its
// threads and shared memory a block, its clusters' blocks and batch rows.
struct ClusterMmaKernel {
  const void* kernel;
  int threads;
  size_t shared_bytes;
  int cluster_size, rows;
};
template <typename Dtype>
ClusterMmaKernel cluster_mma_forward(int64_t state_size);
template <typename Dtype>
PersistentPlan plan_persistent(int pass, int64_t steps, int64_t batch_size, int64_t state_size,
                               bool clusters);
int launch_persistent(const PersistentPlan& plan, void** arguments, cudaStream_t stream);

// cublas_loop_kernel.cu: each step's recurrent product by cuBLAS, then a
// pointwise kernel for its gate math.
template <typename Dtype>
int sequence_forward_cublas_steps(const ForwardRecurrence<Dtype>& r, cudaStream_t stream);
template <typename Dtype>
int sequence_backward_cublas_steps(const BackwardRecurrence<Dtype>& r, cudaStream_t stream);

// step_by_step_kernel.cu: one fused kernel a step, product and gate math.
template <typename Dtype>
int launch_sequence_forward_by_step(const ForwardRecurrence<Dtype>& r, cudaStream_t stream);
template <typename Dtype>
int launch_sequence_backward_by_step(const BackwardRecurrence<Dtype>& r, cudaStream_t stream);

#endif  // LLTM_RECURRENCE_CUH
