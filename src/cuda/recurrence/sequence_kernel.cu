// The whole-sequence layer's passes, Caffe style behind extern "C" launchers
// whose loop over the time steps runs in C, on the caller's stream. Layout:
// every step's tensors are dense (rows, state) or, for the gates, (rows, 3 *
// state), the steps one after another; a step's rows are the whole batch, or a
// packed sequence's batch size at that step, and the steps are visited forwards
// or backwards (lltm_steps.h walks them).
//
// A pass is its recurrence and, around it, the products that are not on the
// recurrent path: before the forward loop every step's input part of its gates,
// after the backward loop the gradients of the inputs and the weights (by
// cuBLAS, or lltm_ffi's own kernel where cuBLAS cannot be loaded:
// products_kernel.cu) and of the bias. Four paths for the recurrence, each in a
// file of its own, in the order of the plan's table (src/plan.c, which alone
// chooses, lltm_plan_recurrence): the cluster kernels (cluster_kernel.cu), one
// ordinary launch a pass; the persistent kernels (persistent_kernel.cu), one
// cooperative launch a pass; each step's recurrent product by cuBLAS and a
// pointwise kernel for its gate math (cublas_loop_kernel.cu); and a
// step-by-step kernel that does both (step_by_step_kernel.cu).
// lltm_recurrence.cuh holds what they share.
//
// Every element type: tensors hold it, the arithmetic runs in its math type
// (lltm_math.cuh: float for __half and __nv_bfloat16), converting at each load
// and store. The state a step hands the next (h, the cell, and going back their
// gradients) passes through the tensors that hold it, in the element type, on
// every path alike.
//
// A call comes in at the bottom of this file (the LLTM_CUDA_PASS lines) and
// goes up: the launchers, run_pass (the CUDA graphs of cublas.c), the forward
// or backward pass, which asks the plan for its recurrence's path.

#include "lltm_cublas.h"
#include "lltm_kernels.h"
#include "lltm_recurrence.cuh"

// The plan of a pass's recurrence (src/plan.c), `pass` an lltm_pass;
// `cublas` whether its products run through cuBLAS.
template <typename Dtype>
static lltm_recurrence_plan plan_of(int pass, const lltm_walk& walk, int64_t state_size,
                                    const lltm_sequence_options* options, bool cublas) {
  return lltm_plan_recurrence(lltm_dtype_of<Dtype>(), pass, walk.steps, walk.batch_size,
                              state_size, walk.batch_sizes != NULL, options, cublas);
}

static int64_t address(const void* pointer) { return (int64_t)(uintptr_t)pointer; }

// The options a pass's graph depends on, for its key: TF32 changes the
// products, the clusters and a forced path the recurrence's kernels (without
// cuBLAS no graph is recorded).
static int64_t key_options(const lltm_sequence_options* options) {
  return options ? options->tf32 | !options->clusters << 1 | (options->path + 1) << 2 : 0;
}

// Runs steps(cublas, stream), a pass's launches, through lltm_cublas_run
// (cublas true) where the options allow and cuBLAS can be loaded, else
// directly (cublas false).
template <typename Steps>
static int call_steps(void* steps, cudaStream_t stream) {
  return (*static_cast<Steps*>(steps))(true, stream);
}

template <typename Steps>
static int run_pass(const lltm_pass_key& key, int dtype, cudaStream_t stream,
                    const lltm_sequence_options* options, Steps steps) {
  if (!options || options->cublas) {
    const int code = lltm_cublas_run(&key, dtype, stream, options && options->tf32,
                                     call_steps<Steps>, &steps);
    if (code != LLTM_ERROR_NO_CUBLAS) return code;
  }
  return steps(false, stream);
}

// The forward pass: every step's input part of its gates (the inputs times
// the weights' input columns), then the recurrence by the path the plan
// gives.
template <typename Dtype>
static int sequence_forward_steps(bool cublas, cudaStream_t stream,
                                  const lltm_sequence_options* options, int64_t input_features,
                                  const Dtype* inputs, ForwardRecurrence<Dtype> r) {
  const int64_t gates_size = 3 * r.state_size;
  const lltm_recurrence_plan plan =
      plan_of<Dtype>(r.cells ? LLTM_PASS_FORWARD_SAVED : LLTM_PASS_FORWARD, r.walk, r.state_size,
                     options, cublas);
  if (plan.path < 0) return plan.path;
  const int code = product<Dtype>(cublas, stream, r.walk.rows, gates_size, input_features, inputs,
                                  input_features, false, r.weights + r.state_size,
                                  r.weights_row_stride, true, false, r.gates, gates_size);
  if (code != LLTM_SUCCESS) return code;
  if (plan.path == LLTM_PATH_CLUSTER || plan.path == LLTM_PATH_PERSISTENT) {
    // The whole-pass kernels' arguments (either path's), in their order.
    void* arguments[] = {&r.walk.steps, &r.walk.batch_size, &r.state_size, &r.weights_row_stride,
                         &r.walk.reverse, &r.bias, &r.weights, &r.h0, &r.c0, &r.outputs,
                         &r.cells, &r.gates, &r.final_h, &r.final_cell, &r.staging};
    return plan.path == LLTM_PATH_CLUSTER ? launch_clusters(plan.cluster, arguments, stream)
                                          : launch_persistent(plan.persistent, arguments, stream);
  }
  if (cublas && plan.path == LLTM_PATH_CUBLAS) return sequence_forward_cublas_steps(r, stream);
  return launch_sequence_forward_by_step(r, stream);
}
// The gradient of h0: each row's sequence starts there, so it is that row
// of its first step's d_gates times the hidden weights, one product a block
// of rows that start at one step (lltm_state_block).
template <typename Dtype>
static int initial_state_grads(bool cublas, cudaStream_t stream, const lltm_walk& walk,
                               int64_t state_size, int64_t weights_row_stride,
                               const Dtype* weights, const Dtype* d_gates, Dtype* d_h0) {
  const int64_t gates_size = 3 * state_size;
  lltm_block_cursor cursor = lltm_first_block(&walk);
  lltm_state_block block;
  int code = LLTM_SUCCESS;
  while (code == LLTM_SUCCESS && lltm_next_block(&walk, &cursor, &block)) {
    if (!block.initial) continue;
    code = product<Dtype>(cublas, stream, block.rows, state_size, gates_size,
                          d_gates + block.gate_row * gates_size, gates_size, false, weights,
                          weights_row_stride, false, false, d_h0 + block.state_row * state_size,
                          state_size);
  }
  return code;
}
// sums[c] = the sum of column c of a dense (rows, columns) matrix: a block
// of kSumThreads per 32 columns, each thread summing every 32nd row of its
// column, then the block the 32 partial sums: the same order every run,
// all in the math type.
static const int kSumThreads = 1024;

template <typename Dtype>
__global__ void __launch_bounds__(kSumThreads) lltm_column_sums_kernel(
    const int64_t rows, const int64_t columns, const Dtype* __restrict__ matrix,
    Dtype* __restrict__ sums) {
  typedef math_t<Dtype> Math;
  __shared__ Math partial[kSumThreads / 32][33];
  const int lane = threadIdx.x % 32, group = threadIdx.x / 32;
  for (int64_t column0 = (int64_t)blockIdx.x * 32; column0 < columns;
       column0 += (int64_t)gridDim.x * 32) {
    const int64_t column = column0 + lane;
    Math sum = 0;
    if (column < columns) {
#pragma unroll 4
      for (int64_t row = group; row < rows; row += kSumThreads / 32) {
        sum += to_math(matrix[row * columns + column]);
      }
    }
    partial[group][lane] = sum;
    __syncthreads();
    if (group == 0 && column < columns) {
      Math total = 0;
      for (int g = 0; g < kSumThreads / 32; ++g) total += partial[g][lane];
      sums[column] = to_storage<Dtype>(total);
    }
    __syncthreads();
  }
}
// The backward pass: the recurrence as in the forward pass, then the
// gradients of h0 (where the cluster or persistent kernel has not given
// it), the inputs (d_gates times the input weights), the weights (d_gates^T
// times each step's [old h, x]) and the bias (d_gates summed over every
// row), each where wanted.
template <typename Dtype>
static int sequence_backward_steps(bool cublas, cudaStream_t stream,
                                   const lltm_sequence_options* options, int64_t input_features,
                                   const Dtype* inputs, const Dtype* h0, const Dtype* outputs,
                                   BackwardRecurrence<Dtype> r, Dtype* d_inputs,
                                   Dtype* d_weights, Dtype* d_bias, Dtype* previous) {
  const lltm_walk& walk = r.walk;
  const int64_t state_size = r.state_size, columns = r.weights_row_stride;
  const int64_t gates_size = 3 * state_size;
  const Dtype* weights = r.weights;
  Dtype* d_gates = r.d_gates;
  const lltm_recurrence_plan plan =
      plan_of<Dtype>(LLTM_PASS_BACKWARD, walk, state_size, options, cublas);
  if (plan.path < 0) return plan.path;
  int code;
  if (plan.path == LLTM_PATH_CLUSTER || plan.path == LLTM_PATH_PERSISTENT) {
    // As in the forward pass.
    void* arguments[] = {&r.walk.steps, &r.walk.batch_size, &r.state_size, &r.weights_row_stride,
                         &r.walk.reverse, &r.weights, &r.grad_outputs, &r.grad_cells, &r.strides,
                         &r.grad_final_h, &r.grad_final_cell, &r.cells, &r.gates, &r.d_gates,
                         &r.d_h0, &r.d_c0, &r.staging};
    code = plan.path == LLTM_PATH_CLUSTER ? launch_clusters(plan.cluster, arguments, stream)
                                          : launch_persistent(plan.persistent, arguments, stream);
  } else {
    code = cublas && plan.path == LLTM_PATH_CUBLAS ? sequence_backward_cublas_steps(r, stream)
                                                   : launch_sequence_backward_by_step(r, stream);
    if (code == LLTM_SUCCESS && r.d_h0) {
      code = initial_state_grads<Dtype>(cublas, stream, walk, state_size, columns, weights,
                                        d_gates, r.d_h0);
    }
  }
  if (code == LLTM_SUCCESS && d_inputs) {
    code = product<Dtype>(cublas, stream, walk.rows, input_features, gates_size, d_gates,
                          gates_size, false, weights + state_size, columns, false, false,
                          d_inputs, input_features);
  }
  if (code == LLTM_SUCCESS && d_weights) {
    code = hidden_weight_grads<Dtype>(cublas, stream, walk, state_size, columns, d_gates, h0,
                                      outputs, previous, d_weights);
    if (code == LLTM_SUCCESS) {
      code = product<Dtype>(cublas, stream, gates_size, input_features, walk.rows, d_gates,
                            gates_size, true, inputs, input_features, false, false,
                            d_weights + state_size, columns);
    }
  }
  if (code == LLTM_SUCCESS && d_bias) {
    const int64_t blocks = (gates_size + 31) / 32;
    lltm_column_sums_kernel<Dtype>
        <<<blocks < CAFFE_MAXIMUM_NUM_BLOCKS ? (int)blocks : CAFFE_MAXIMUM_NUM_BLOCKS,
           kSumThreads, 0, stream>>>(walk.rows, gates_size, d_gates, d_bias);
    CUDA_POST_KERNEL_CHECK;
  }
  return code;
}

// The launchers of the passes, packed_forward and packed_backward: packed
// steps, or where batch_sizes is NULL dense ones, in either direction
// (sizes: rows, steps, batch, input_features, state, reverse; backward, then
// grad_outputs' and grad_cells' row and column strides), with the final
// states and the options (NULL: the defaults); their key holds the batch
// sizes too. The forward pass takes cells NULL, for a forward no backward
// follows, where final_h and final_cell are given: it then writes no cells
// and no pre-activations (ForwardRecurrence), gates (rows, 3 * state)
// serving as its workspace, which it always needs; the backward pass needs
// the cells and gates a forward kept. Otherwise LLTM_ERROR_ARGUMENTS.
// staging (NULL: none) as ForwardRecurrence and BackwardRecurrence say;
// previous, the packed backward's (rows, state) workspace, as
// hidden_weight_grads says (NULL for dense steps).
template <typename Dtype>
static int launch_packed_forward(const int64_t* sizes, const void* batch_sizes,
                                 const void* inputs, const void* weights, const void* bias,
                                 const void* h0, const void* c0, void* outputs, void* cells,
                                 void* gates, void* final_h, void* final_cell, void* staging,
                                 const void* options_address, cudaStream_t stream) {
  lltm_walk walk;
  if (!lltm_packed_walk(sizes, as<int64_t>(batch_sizes), &walk)) return LLTM_ERROR_ARGUMENTS;
  const lltm_sequence_options* options = as<lltm_sequence_options>(options_address);
  const int64_t input_features = sizes[3], state_size = sizes[4];
  const lltm_pass_key key = {{3, lltm_dtype_of<Dtype>(), walk.rows, walk.steps, walk.batch_size,
                              input_features, state_size, key_options(options), walk.reverse,
                              address(inputs), address(weights), address(bias), address(h0),
                              address(c0), address(outputs), address(cells), address(gates),
                              address(final_h), address(final_cell), address(staging)},
                             walk.batch_sizes,
                             walk.batch_sizes ? walk.steps : 0};
  if (walk.rows * state_size == 0) return LLTM_SUCCESS;
  if (!gates || (!cells && (!final_h || !final_cell))) return LLTM_ERROR_ARGUMENTS;
  const ForwardRecurrence<Dtype> recurrence = {
      walk, state_size, state_size + input_features, as<Dtype>(bias), as<Dtype>(weights),
      as<Dtype>(h0), as<Dtype>(c0), as<Dtype>(outputs), as<Dtype>(cells), as<Dtype>(gates),
      as<Dtype>(final_h), as<Dtype>(final_cell), as<Dtype>(staging)};
  return run_pass(key, lltm_dtype_of<Dtype>(), stream, options, [&](bool cublas, cudaStream_t on) {
    return sequence_forward_steps<Dtype>(cublas, on, options, input_features, as<Dtype>(inputs),
                                         recurrence);
  });
}

template <typename Dtype>
static int launch_packed_backward(const int64_t* sizes, const void* batch_sizes,
                                  const void* inputs, const void* weights, const void* h0,
                                  const void* outputs, const void* cells, const void* gates,
                                  const void* grad_outputs, const void* grad_cells,
                                  const void* grad_final_h, const void* grad_final_cell,
                                  void* d_gates, void* d_inputs, void* d_weights, void* d_bias,
                                  void* d_h0, void* d_c0, void* staging, void* previous,
                                  const void* options_address, cudaStream_t stream) {
  lltm_walk walk;
  if (!lltm_packed_walk(sizes, as<int64_t>(batch_sizes), &walk)) return LLTM_ERROR_ARGUMENTS;
  const lltm_sequence_options* options = as<lltm_sequence_options>(options_address);
  const int64_t input_features = sizes[3], state_size = sizes[4];
  const int64_t* row_strides = sizes + 6;  // grad_outputs' (row, column), grad_cells'
  const GradStrides strides = {{sizes[2] * row_strides[0], row_strides[0], row_strides[1]},
                               {sizes[2] * row_strides[2], row_strides[2], row_strides[3]}};
  const lltm_pass_key key = {{4, lltm_dtype_of<Dtype>(), walk.rows, walk.steps, walk.batch_size,
                              input_features, state_size, key_options(options), walk.reverse,
                              address(inputs), address(weights), address(h0), address(outputs),
                              address(cells), address(gates), address(grad_outputs),
                              address(grad_cells), address(grad_final_h),
                              address(grad_final_cell), address(d_gates), address(d_inputs),
                              address(d_weights), address(d_bias), address(d_h0), address(d_c0),
                              row_strides[0], row_strides[1], row_strides[2], row_strides[3],
                              address(staging), address(previous)},
                             walk.batch_sizes,
                             walk.batch_sizes ? walk.steps : 0};
  // Past one step d_h0 and d_c0 carry the gradients between steps.
  if (walk.steps > 1 && (!d_h0 || !d_c0)) return LLTM_ERROR_ARGUMENTS;
  if (walk.rows * state_size == 0) return LLTM_SUCCESS;
  if (!cells || !gates) return LLTM_ERROR_ARGUMENTS;
  // Packed steps' weights gradient gathers their old states there.
  if (walk.batch_sizes && d_weights && !previous) return LLTM_ERROR_ARGUMENTS;
  const BackwardRecurrence<Dtype> recurrence = {
      walk, state_size, state_size + input_features, as<Dtype>(weights), as<Dtype>(grad_outputs),
      as<Dtype>(grad_cells), strides, as<Dtype>(grad_final_h), as<Dtype>(grad_final_cell),
      as<Dtype>(cells), as<Dtype>(gates), as<Dtype>(d_gates), as<Dtype>(d_h0), as<Dtype>(d_c0),
      as<Dtype>(staging)};
  return run_pass(key, lltm_dtype_of<Dtype>(), stream, options, [&](bool cublas, cudaStream_t on) {
    return sequence_backward_steps<Dtype>(cublas, on, options, input_features, as<Dtype>(inputs),
                                          as<Dtype>(h0), as<Dtype>(outputs), recurrence,
                                          as<Dtype>(d_inputs), as<Dtype>(d_weights),
                                          as<Dtype>(d_bias), as<Dtype>(previous));
  });
}
// The passes, in the argument order of their declarations in sequence.py,
// the options' address last; every element type.
LLTM_CUDA_PASS_WITH_HALF(packed_forward, launch_packed_forward, args->sizes, args->tensors[5],
                         args->tensors[0], args->tensors[1], args->tensors[2], args->tensors[3],
                         args->tensors[4], args->tensors[6], args->tensors[7], args->tensors[8],
                         args->tensors[9], args->tensors[10], args->tensors[11],
                         args->tensors[12], stream)
LLTM_CUDA_PASS_WITH_HALF(packed_backward, launch_packed_backward, args->sizes, args->tensors[3],
                         args->tensors[0], args->tensors[1], args->tensors[2], args->tensors[4],
                         args->tensors[5], args->tensors[6], args->tensors[7], args->tensors[8],
                         args->tensors[9], args->tensors[10], args->tensors[11],
                         args->tensors[12], args->tensors[13], args->tensors[14],
                         args->tensors[15], args->tensors[16], args->tensors[17],
                         args->tensors[18], args->tensors[19], stream)
