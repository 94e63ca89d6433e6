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
#include "lltm_padding.h"
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

// A padded pass's copies (lltm_padding.h), moved in words of up to 16
// bytes: a block's threads along a row of dst, a word each, zeros past
// src's extent; each thread copies kCopyRows rows at once, so that as many
// of its loads are in flight (one at a time left the copies at a fifth of
// the memory's bandwidth). A batch a grid layer (blockIdx.z). The copy's
// sizes and strides are in words (in_words); a word of several elements
// needs src's columns dense. H200, a bfloat16 inference call at 1500
// padded to 1536, 8 rows (8-byte words): the 9 copies took 34 us (torch
// profiler), where an element a thread they took 49 us of a call of 16
// rows padded to 1504.
static const int kCopyThreads = 256;
static const int kCopyRows = 8;

template <typename Word>
__global__ void lltm_copy_kernel(const lltm_copy copy) {
  Word* dst = static_cast<Word*>(copy.dst) + blockIdx.z * copy.dst_batch;
  const Word* src = static_cast<const Word*>(copy.src) + blockIdx.z * copy.src_batch;
  const int64_t kept_columns = min(copy.columns, copy.src_columns);
  for (int64_t first = (int64_t)blockIdx.y * kCopyRows; first < copy.rows;
       first += (int64_t)gridDim.y * kCopyRows) {
    for (int64_t column = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; column < copy.columns;
         column += (int64_t)blockDim.x * gridDim.x) {
      Word values[kCopyRows];
#pragma unroll
      for (int k = 0; k < kCopyRows; ++k) {
        const int64_t row = first + k;
        values[k] = row < copy.src_rows && column < kept_columns
                        ? src[row * copy.src_row + column * copy.src_column]
                        : Word{};
      }
#pragma unroll
      for (int k = 0; k < kCopyRows; ++k) {
        if (first + k < copy.rows) dst[(first + k) * copy.dst_row + column] = values[k];
      }
    }
  }
}

// `copy` (in elements of element_bytes) in words of Word, or false where
// its pointers, strides or extents are not whole words.
template <typename Word>
static bool in_words(lltm_copy* copy, int element_bytes) {
  const int64_t per_word = (int64_t)sizeof(Word) / element_bytes;
  if (per_word > 1 && copy->src_column != 1) return false;
  if (((uintptr_t)copy->dst | (uintptr_t)copy->src) % sizeof(Word) ||
      (copy->columns | copy->src_columns | copy->dst_row | copy->src_row | copy->dst_batch |
       copy->src_batch) % per_word) {
    return false;
  }
  copy->columns /= per_word, copy->src_columns /= per_word;
  copy->dst_row /= per_word, copy->src_row /= per_word;
  copy->dst_batch /= per_word, copy->src_batch /= per_word;
  return true;
}

template <typename Word>
static void launch_copy(const lltm_copy& copy, cudaStream_t stream) {
  const int64_t column_blocks = (copy.columns + kCopyThreads - 1) / kCopyThreads;
  const int64_t row_blocks = (copy.rows + kCopyRows - 1) / kCopyRows;
  const dim3 grid((unsigned)(column_blocks < 16 ? column_blocks : 16),
                  (unsigned)(row_blocks < 2048 ? row_blocks : 2048), (unsigned)copy.batches);
  lltm_copy_kernel<Word><<<grid, kCopyThreads, 0, stream>>>(copy);
}

// The unsigned integer of an element's bytes: the word of a copy with
// strided columns or rows off whole larger words.
template <int Bytes> struct ElementWord;
template <> struct ElementWord<2> { typedef unsigned short type; };
template <> struct ElementWord<4> { typedef unsigned int type; };
template <> struct ElementWord<8> { typedef unsigned long long type; };

template <typename Dtype>
static int run_copies(const lltm_copy* copies, int count, cudaStream_t stream) {
  const int bytes = (int)sizeof(Dtype);
  for (const lltm_copy* given = copies; given < copies + count; ++given) {
    if (given->batches * given->rows * given->columns == 0) continue;
    lltm_copy copy = *given;
    if (in_words<uint4>(&copy, bytes)) {
      launch_copy<uint4>(copy, stream);
    } else if (bytes < 8 && in_words<uint2>(&copy, bytes)) {
      launch_copy<uint2>(copy, stream);
    } else if (bytes < 4 && in_words<unsigned int>(&copy, bytes)) {
      launch_copy<unsigned int>(copy, stream);
    } else {
      launch_copy<typename ElementWord<sizeof(Dtype)>::type>(copy, stream);
    }
    CUDA_POST_KERNEL_CHECK;
  }
  return LLTM_SUCCESS;
}

// What identifies a pass's launches, for its graph (lltm_cublas.h): the
// pass (3 forward, 4 backward), its dtype and options, its sizes and the
// addresses of the tensors given (a packed sequence's batch sizes by value,
// through the walk; the options' address changes from call to call).
template <typename Dtype>
static lltm_pass_key pass_key(int pass, const lltm_args* given, int size_count,
                              int tensor_count, int batch_sizes_index, const lltm_walk& walk,
                              const lltm_sequence_options* options) {
  lltm_pass_key key = {{pass, lltm_dtype_of<Dtype>(), key_options(options)},
                       walk.batch_sizes,
                       walk.batch_sizes ? walk.steps : 0};
  int value = 3;
  for (int index = 0; index < size_count; ++index) key.values[value++] = given->sizes[index];
  for (int index = 0; index < tensor_count; ++index) {
    if (index != batch_sizes_index) key.values[value++] = address(given->tensors[index]);
  }
  return key;
}

// The pass of `given` as it runs, at its padded state where it has one
// (lltm_padding.h), and its walk: LLTM_SUCCESS or the error's code.
static int padded_walk(int pass, int element_bytes, int batch_sizes, const lltm_args* given,
                       lltm_padded_pass* padded, lltm_walk* walk) {
  const int code = lltm_pad_pass(pass, element_bytes, given, padded);
  if (code != LLTM_SUCCESS) return code;
  return lltm_packed_walk(padded->args.sizes, as<int64_t>(padded->args.tensors[batch_sizes]), walk)
             ? LLTM_SUCCESS
             : LLTM_ERROR_ARGUMENTS;
}

// A pass's launches on `stream`: its padded copies in, steps(), and its
// results copied back.
template <typename Dtype, typename Steps>
static int with_copies(const lltm_padded_pass& padded, cudaStream_t stream, Steps steps) {
  int code = run_copies<Dtype>(padded.pads, padded.pad_count, stream);
  if (code == LLTM_SUCCESS) code = steps();
  return code == LLTM_SUCCESS ? run_copies<Dtype>(padded.cuts, padded.cut_count, stream) : code;
}

// The launchers of the passes, packed_forward and packed_backward: packed
// steps, or where batch_sizes is NULL dense ones, in either direction, with
// the final states and the options (NULL: the defaults), at the padded state
// where their sizes give one (lltm_padding.h numbers their sizes and
// tensors). The forward pass takes cells NULL, for a forward no backward
// follows, where final_h and final_cell are given: it then writes no cells
// and no pre-activations (ForwardRecurrence), gates (rows, 3 * state)
// serving as its workspace, which it always needs; the backward pass needs
// the cells and gates a forward kept. Otherwise LLTM_ERROR_ARGUMENTS.
// staging (NULL: none) as ForwardRecurrence and BackwardRecurrence say;
// previous, the packed backward's (rows, state) workspace, as
// hidden_weight_grads says (NULL for dense steps). A padded pass copies in,
// runs and copies back within its graph.
template <typename Dtype>
static int launch_packed_forward(const lltm_args* given, cudaStream_t stream) {
  lltm_padded_pass padded;
  lltm_walk walk;
  const int ready =
      padded_walk(LLTM_PASS_FORWARD, sizeof(Dtype), LLTM_F_BATCH_SIZES, given, &padded, &walk);
  if (ready != LLTM_SUCCESS) return ready;
  const int64_t* sizes = padded.args.sizes;
  void* const* t = padded.args.tensors;
  const lltm_sequence_options* options = as<lltm_sequence_options>(t[LLTM_F_OPTIONS]);
  const int64_t input_features = sizes[LLTM_SIZE_FEATURES], state_size = sizes[LLTM_SIZE_STATE];
  const lltm_pass_key key = pass_key<Dtype>(3, given, LLTM_FORWARD_SIZES, LLTM_F_OPTIONS,
                                            LLTM_F_BATCH_SIZES, walk, options);
  if (walk.rows * state_size == 0) return LLTM_SUCCESS;
  if (!t[LLTM_F_GATES] ||
      (!t[LLTM_F_CELLS] && (!t[LLTM_F_FINAL_H] || !t[LLTM_F_FINAL_CELL]))) {
    return LLTM_ERROR_ARGUMENTS;
  }
  const ForwardRecurrence<Dtype> recurrence = {
      walk, state_size, state_size + input_features, as<Dtype>(t[LLTM_F_BIAS]),
      as<Dtype>(t[LLTM_F_WEIGHTS]), as<Dtype>(t[LLTM_F_H0]), as<Dtype>(t[LLTM_F_C0]),
      as<Dtype>(t[LLTM_F_OUTPUTS]), as<Dtype>(t[LLTM_F_CELLS]), as<Dtype>(t[LLTM_F_GATES]),
      as<Dtype>(t[LLTM_F_FINAL_H]), as<Dtype>(t[LLTM_F_FINAL_CELL]),
      as<Dtype>(t[LLTM_F_STAGING])};
  return run_pass(key, lltm_dtype_of<Dtype>(), stream, options, [&](bool cublas, cudaStream_t on) {
    return with_copies<Dtype>(padded, on, [&] {
      return sequence_forward_steps<Dtype>(cublas, on, options, input_features,
                                           as<Dtype>(t[LLTM_F_INPUTS]), recurrence);
    });
  });
}

template <typename Dtype>
static int launch_packed_backward(const lltm_args* given, cudaStream_t stream) {
  lltm_padded_pass padded;
  lltm_walk walk;
  const int ready =
      padded_walk(LLTM_PASS_BACKWARD, sizeof(Dtype), LLTM_B_BATCH_SIZES, given, &padded, &walk);
  if (ready != LLTM_SUCCESS) return ready;
  const int64_t* sizes = padded.args.sizes;
  void* const* t = padded.args.tensors;
  const lltm_sequence_options* options = as<lltm_sequence_options>(t[LLTM_B_OPTIONS]);
  const int64_t input_features = sizes[LLTM_SIZE_FEATURES], state_size = sizes[LLTM_SIZE_STATE];
  const int64_t* row_strides = sizes + LLTM_B_STRIDES;  // grad_outputs' (row, column), grad_cells'
  const GradStrides strides = {{sizes[2] * row_strides[0], row_strides[0], row_strides[1]},
                               {sizes[2] * row_strides[2], row_strides[2], row_strides[3]}};
  const lltm_pass_key key = pass_key<Dtype>(4, given, LLTM_BACKWARD_SIZES, LLTM_B_OPTIONS,
                                            LLTM_B_BATCH_SIZES, walk, options);
  // Past one step d_h0 and d_c0 carry the gradients between steps.
  if (walk.steps > 1 && (!t[LLTM_B_D_H0] || !t[LLTM_B_D_C0])) return LLTM_ERROR_ARGUMENTS;
  if (walk.rows * state_size == 0) return LLTM_SUCCESS;
  if (!t[LLTM_B_CELLS] || !t[LLTM_B_GATES]) return LLTM_ERROR_ARGUMENTS;
  // Packed steps' weights gradient gathers their old states there.
  if (walk.batch_sizes && t[LLTM_B_D_WEIGHTS] && !t[LLTM_B_PREVIOUS]) return LLTM_ERROR_ARGUMENTS;
  const BackwardRecurrence<Dtype> recurrence = {
      walk, state_size, state_size + input_features, as<Dtype>(t[LLTM_B_WEIGHTS]),
      as<Dtype>(t[LLTM_B_GRAD_OUTPUTS]), as<Dtype>(t[LLTM_B_GRAD_CELLS]), strides,
      as<Dtype>(t[LLTM_B_GRAD_FINAL_H]), as<Dtype>(t[LLTM_B_GRAD_FINAL_CELL]),
      as<Dtype>(t[LLTM_B_CELLS]), as<Dtype>(t[LLTM_B_GATES]), as<Dtype>(t[LLTM_B_D_GATES]),
      as<Dtype>(t[LLTM_B_D_H0]), as<Dtype>(t[LLTM_B_D_C0]), as<Dtype>(t[LLTM_B_STAGING])};
  return run_pass(key, lltm_dtype_of<Dtype>(), stream, options, [&](bool cublas, cudaStream_t on) {
    return with_copies<Dtype>(padded, on, [&] {
      return sequence_backward_steps<Dtype>(
          cublas, on, options, input_features, as<Dtype>(t[LLTM_B_INPUTS]),
          as<Dtype>(t[LLTM_B_H0]), as<Dtype>(t[LLTM_B_OUTPUTS]), recurrence,
          as<Dtype>(t[LLTM_B_D_INPUTS]), as<Dtype>(t[LLTM_B_D_WEIGHTS]),
          as<Dtype>(t[LLTM_B_D_BIAS]), as<Dtype>(t[LLTM_B_PREVIOUS]));
    });
  });
}
// The passes, every element type.
LLTM_CUDA_PASS_WITH_HALF(packed_forward, launch_packed_forward, args, stream)
LLTM_CUDA_PASS_WITH_HALF(packed_backward, launch_packed_backward, args, stream)
