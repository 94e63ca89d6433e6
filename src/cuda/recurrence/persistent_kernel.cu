// The persistent path: one cooperative launch runs every step of a pass. Each
// block owns `columns` state columns for every batch row and keeps the rows
// of the hidden weights that meet them in shared memory for the whole
// sequence; the grid synchronises once a step, when every block has written
// its part of the state the next step reads. A step costs no launch, and the
// weights are read from memory once a pass instead of once a step.
//
// float and double compute the products on CUDA cores (persistent_step), the
// 16-bit types on tensor cores (mma_step); the two share the kernels' steps,
// the cell's math and what a step reads and writes.
//
// Dense steps only, either direction; the plan (src/plan.c) takes them
// where plan_persistent lays a launch out.

#include <cooperative_groups.h>

#include "lltm_persistent.cuh"
#include "lltm_plan_queries.cuh"

// Whether a forward kernel keeps its gates and cells for a backward: fixed
// when it is compiled, or told at run time by cells (NULL: it keeps
// neither). The tensor-core kernels come in both fixed kinds: testing
// cells for every element took the bfloat16 kernel from 3.75 to 3.81 ms
// (H200, T=1024 B=16 S=768, autocast training). float and double test it:
// compiled as keeping, float's took 9.36 ms there against 9.33.
enum class Keeps { kNothing, kAll, kAtRunTime };

// Forward, the steps in the walk's order (reverse: last to first): the
// lanes of a group compute the three gates of one (batch row, column)
// element of the block's, one of them the cell. The last step visited
// leaves its state in final_h and final_cell too, where final_h is not
// NULL. cells NULL (the plan's kernel for a forward alone): nothing kept
// for a backward (ForwardRecurrence), the cell carried in final_cell, its
// element read and written by the same lane each step. staging NULL, or a
// ring of two (batch, state rounded up to whole 16 bytes) buffers
// (StagingRing) where the state's rows are not whole 16 bytes. Dense steps
// only (lltm_steps.h); bias NULL: none.
template <typename Dtype, int kColumns, Keeps kKeeps>
__global__ void __launch_bounds__(kPersistentThreads) lltm_sequence_forward_persistent_kernel(
    const int64_t steps, const int64_t batch_size, const int64_t state_size,
    const int64_t weights_row_stride, const int reverse, const Dtype* __restrict__ bias,
    const Dtype* __restrict__ weights, const Dtype* h0, const Dtype* c0, Dtype* outputs,
    Dtype* cells, Dtype* gates, Dtype* final_h, Dtype* final_cell, Dtype* staging) {
  typedef math_t<Dtype> Math;
  constexpr bool kTensorCores = !IsMath<Dtype>::value;
  static_assert(!kTensorCores || kColumns == kMmaColumns, "a tensor-core block owns a tile");
  extern __shared__ __align__(16) unsigned char shared[];
  const int64_t stride = kTensorCores ? mma_padded(state_size) : padded<Dtype>(state_size);
  const int64_t rows = kTensorCores ? (batch_size + kMmaRows - 1) / kMmaRows * kMmaRows
                                    : batch_size;
  Dtype* w = reinterpret_cast<Dtype*>(shared);  // row g * kColumns + c: gate g of column c
  Dtype* h = w + 3 * kColumns * stride;         // the previous step's h, every batch row
  Math* partial = reinterpret_cast<Math*>(h + rows * stride);  // tensor cores: mma_step's
  const int64_t column0 = (int64_t)blockIdx.x * kColumns;
  for (int64_t i = threadIdx.x; i < 3 * kColumns * stride; i += blockDim.x) {
    const int64_t row = i / stride, k = i % stride;
    const int64_t column = column0 + row % kColumns, gate_row = row / kColumns * state_size;
    w[i] = k < state_size && column < state_size
        ? weights[(gate_row + column) * weights_row_stride + k] : to_storage<Dtype>(0);
  }
  MulticastStage multicast = MulticastStage::prepared(h, batch_size, rows, stride, kTensorCores);
  const StagingRing<Dtype> ring(staging, batch_size, state_size);
  ring.zero_padding();
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  const int64_t step = batch_size * state_size;
  const bool keeping = kKeeps == Keeps::kAtRunTime ? cells != NULL : kKeeps == Keeps::kAll;
  // Where each step's cells go: cells, or final_cell for every step.
  Dtype* const cell_steps = keeping ? cells : final_cell;
  const int64_t cell_step = keeping ? step : 0;
  for (int64_t order = 0; order < steps; ++order) {
    const int64_t t = reverse ? steps - 1 - order : order;
    const int64_t previous = reverse ? t + 1 : t - 1;
    const Dtype* old_h = order ? outputs + previous * step : h0;
    const Dtype* old_cell = order ? cell_steps + previous * cell_step : c0;
    Dtype* final_h_now = order + 1 == steps ? final_h : NULL;
    // An element's input part of its gates, the bias and its old cell,
    // which this lane wrote: as stored, so that nothing waits for them
    // before finish.
    auto load = [&](const BlockElement<kColumns>& at, Dtype (&inputs)[7]) {
      const int64_t gate = t * 3 * step + at.row * 3 * state_size + at.column;
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        inputs[g] = gates[gate + g * state_size];
        inputs[3 + g] = bias ? bias[g * state_size + at.column] : to_storage<Dtype>(0);
      }
      inputs[6] = old_cell[at.element];
    };
    auto stage = [&] {
      __syncthreads();
      const bool from_ring = order && staging;
      multicast.stage(from_ring ? ring.slot(order - 1) : old_h, (int)batch_size,
                      from_ring ? ring.ring_length : state_size, h, stride, order > 0);
      __syncthreads();
    };
    Dtype* const kept_h = ring.kept_rows(order);
    auto finish = [&](const BlockElement<kColumns>& at, const Math (&sums)[3],
                      const Dtype (&inputs)[7]) {
      const int64_t gate = t * 3 * step + at.row * 3 * state_size + at.column;
      Math pre[3];
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        pre[g] = keep_gate(&gates[gate + g * state_size],
                           to_math(inputs[g]) + to_math(inputs[3 + g]) + sums[g], keeping);
      }
      Math h_value, cell_value;
      cell_forward_(pre[0], pre[1], pre[2], to_math(inputs[6]), &h_value, &cell_value);
      const Dtype new_h = to_storage<Dtype>(h_value), new_cell = to_storage<Dtype>(cell_value);
      outputs[t * step + at.element] = new_h;
      if (kept_h) kept_h[at.row * ring.ring_length + at.column] = new_h;
      cell_steps[t * cell_step + at.element] = new_cell;
      if (final_h_now) {
        final_h_now[at.element] = new_h;
        final_cell[at.element] = new_cell;
      }
    };
    if constexpr (kTensorCores) {
      auto product = [&](int m, int begin, int end, float (&acc)[3][4]) {
        mma_rows<Dtype, 3>(h + m * kMmaRows * stride, stride, w, stride, begin, end, acc);
      };
      mma_step<Math, 3, 7, Dtype>(column0, batch_size, state_size, state_size, partial, load, stage,
                           product, finish);
    } else {
      auto product = [&](int64_t column, int64_t first_row, int rows, int part, int parts,
                         Math (&sums)[kPersistentRows * 3]) {
        dot_tile<Dtype, kPersistentRows, 3>(h + first_row * stride, stride, rows,
                                            w + (column - column0) * stride, kColumns * stride,
                                            stride, part, parts, sums);
      };
      persistent_step<Math, kColumns, 3, 7, Dtype>(column0, batch_size, state_size, load, stage,
                                            product, finish);
    }
    grid.sync();
  }
  multicast.close();
}

// Backward, the steps in the reverse of the walk's order, then the gradient
// of h0: the gradient reaching a step's h from the step visited after it
// (that step's d_gates times the hidden weights), or the final h's at the
// last step visited, then the cell's backward pass; d_c0 carries the
// gradient reaching each cell, starting from the final cell's. staging as
// in the forward, of d_gates' rows. Dense steps only.
template <typename Dtype, int kColumns>
__global__ void __launch_bounds__(kPersistentThreads) lltm_sequence_backward_persistent_kernel(
    const int64_t steps, const int64_t batch_size, const int64_t state_size,
    const int64_t weights_row_stride, const int reverse, const Dtype* __restrict__ weights,
    const Dtype* __restrict__ grad_outputs, const Dtype* __restrict__ grad_cells,
    const GradStrides strides, const Dtype* __restrict__ grad_final_h,
    const Dtype* __restrict__ grad_final_cell, const Dtype* __restrict__ cells,
    const Dtype* __restrict__ gates, Dtype* d_gates, Dtype* d_h0, Dtype* d_c0, Dtype* staging) {
  typedef math_t<Dtype> Math;
  constexpr bool kTensorCores = !IsMath<Dtype>::value;
  static_assert(!kTensorCores || kColumns == kMmaColumns, "a tensor-core block owns a tile");
  extern __shared__ __align__(16) unsigned char shared[];
  const int64_t gates_size = 3 * state_size;
  const int64_t stride = kTensorCores ? mma_padded(gates_size) : padded<Dtype>(gates_size);
  const int64_t rows = kTensorCores ? (batch_size + kMmaRows - 1) / kMmaRows * kMmaRows
                                    : batch_size;
  Dtype* w = reinterpret_cast<Dtype*>(shared);  // row c: column c of the hidden weights
  Dtype* g = w + kColumns * stride;             // the next step's d_gates, every batch row
  Math* partial = reinterpret_cast<Math*>(g + rows * stride);  // tensor cores: mma_step's
  const int64_t column0 = (int64_t)blockIdx.x * kColumns;
  for (int64_t i = threadIdx.x; i < kColumns * stride; i += blockDim.x) {
    const int64_t c = i / stride, k = i % stride;
    w[i] = k < gates_size && column0 + c < state_size
        ? weights[k * weights_row_stride + column0 + c] : to_storage<Dtype>(0);
  }
  MulticastStage multicast = MulticastStage::prepared(g, batch_size, rows, stride, kTensorCores);
  const StagingRing<Dtype> ring(staging, batch_size, gates_size);
  ring.zero_padding();
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  const int64_t step = batch_size * state_size;
  for (int64_t order = steps - 1; order >= -1; --order) {
    // t: the step at `order` (-1: h0's gradient); next: the one visited after it.
    const int64_t t = order < 0 ? -1 : reverse ? steps - 1 - order : order;
    const int64_t next = order + 1 >= steps ? -1 : reverse ? steps - 2 - order : order + 1;
    const Dtype* d_gates_next = next >= 0 ? d_gates + next * 3 * step : NULL;
    const Dtype* grad_output =
        t >= 0 ? offset_or_null(grad_outputs, t * strides.outputs[0]) : NULL;
    const Dtype* grad_cell = t >= 0 ? offset_or_null(grad_cells, t * strides.cells[0]) : NULL;
    // An element's output and cell gradients (with the final states' at the
    // last step visited), its cell, its gates and the gradient carried to
    // its cell, which this lane wrote.
    auto load = [&](const BlockElement<kColumns>& at, Dtype (&inputs)[8]) {
      if (t < 0) return;
      const int64_t gate = t * 3 * step + at.row * gates_size + at.column;
      inputs[0] = stored_gradient_at(grad_output, strides.outputs, at.row, at.column);
      inputs[1] = stored_gradient_at(grad_cell, strides.cells, at.row, at.column);
      inputs[2] = cells[t * step + at.element];
#pragma unroll
      for (int g = 0; g < 3; ++g) inputs[3 + g] = gates[gate + g * state_size];
      if (d_gates_next) {
        inputs[6] = d_c0[at.element];
      } else {
        inputs[6] = grad_final_cell ? grad_final_cell[at.element] : to_storage<Dtype>(0);
        inputs[7] = grad_final_h ? grad_final_h[at.element] : to_storage<Dtype>(0);
      }
    };
    auto stage = [&] {
      if (!d_gates_next) return;
      __syncthreads();
      multicast.stage(staging ? ring.slot(order + 1) : d_gates_next, (int)batch_size,
                      staging ? ring.ring_length : gates_size, g, stride, true);
      __syncthreads();
    };
    Dtype* const kept_d_gates = ring.kept_rows(order);
    auto finish = [&](const BlockElement<kColumns>& at, const Math (&sums)[1],
                      const Dtype (&inputs)[8]) {
      if (t < 0) {
        d_h0[at.element] = to_storage<Dtype>(sums[0]);
        return;
      }
      const int64_t gate = t * 3 * step + at.row * gates_size + at.column;
      const Math grad_h =
          d_gates_next ? to_math(inputs[0]) : to_math(inputs[0]) + to_math(inputs[7]);
      Math d_old_cell, d_input, d_output, d_candidate;
      cell_backward_(grad_h + sums[0], to_math(inputs[6]) + to_math(inputs[1]), to_math(inputs[2]),
                     to_math(inputs[3]), to_math(inputs[4]), to_math(inputs[5]), &d_old_cell,
                     &d_input, &d_output, &d_candidate);
      d_c0[at.element] = to_storage<Dtype>(d_old_cell);
      const Dtype d[3] = {to_storage<Dtype>(d_input), to_storage<Dtype>(d_output),
                          to_storage<Dtype>(d_candidate)};
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        d_gates[gate + g * state_size] = d[g];
        if (kept_d_gates) {
          kept_d_gates[at.row * ring.ring_length + at.column + g * state_size] = d[g];
        }
      }
    };
    if constexpr (kTensorCores) {
      auto product = [&](int m, int begin, int end, float (&acc)[1][4]) {
        if (d_gates_next) {
          mma_rows<Dtype, 1>(g + m * kMmaRows * stride, stride, w, stride, begin, end, acc);
        }
      };
      mma_step<Math, 1, 8, Dtype>(column0, batch_size, state_size, gates_size, partial, load, stage,
                           product, finish);
    } else {
      auto product = [&](int64_t column, int64_t first_row, int rows, int part, int parts,
                         Math (&sums)[kPersistentRows]) {
        if (d_gates_next) {
          dot_tile<Dtype, kPersistentRows, 1>(g + first_row * stride, stride, rows,
                                              w + (column - column0) * stride, stride, stride,
                                              part, parts, sums);
        }
      };
      persistent_step<Math, kColumns, 1, 8, Dtype>(column0, batch_size, state_size, load, stage,
                                            product, finish);
    }
    grid.sync();
  }
  multicast.close();
}

// The persistent kernel of a pass (an lltm_pass) for `columns`
// columns a block: 1, 2, 4 or 8 for float and double, kMmaColumns for the
// 16-bit types.
template <typename Dtype>
static const void* persistent_kernel(int pass, int columns) {
  const bool backward = pass == LLTM_PASS_BACKWARD;
  if constexpr (IsMath<Dtype>::value) {
    constexpr Keeps kKeeps = Keeps::kAtRunTime;
    switch (columns) {
      case 1:
        return backward ? (const void*)lltm_sequence_backward_persistent_kernel<Dtype, 1>
                        : (const void*)lltm_sequence_forward_persistent_kernel<Dtype, 1, kKeeps>;
      case 2:
        return backward ? (const void*)lltm_sequence_backward_persistent_kernel<Dtype, 2>
                        : (const void*)lltm_sequence_forward_persistent_kernel<Dtype, 2, kKeeps>;
      case 4:
        return backward ? (const void*)lltm_sequence_backward_persistent_kernel<Dtype, 4>
                        : (const void*)lltm_sequence_forward_persistent_kernel<Dtype, 4, kKeeps>;
      default:
        return backward ? (const void*)lltm_sequence_backward_persistent_kernel<Dtype, 8>
                        : (const void*)lltm_sequence_forward_persistent_kernel<Dtype, 8, kKeeps>;
    }
  } else {
    (void)columns;
    constexpr int kColumns = kMmaColumns;
    if (backward) return (const void*)lltm_sequence_backward_persistent_kernel<Dtype, kColumns>;
    return pass == LLTM_PASS_FORWARD_SAVED
               ? (const void*)lltm_sequence_forward_persistent_kernel<Dtype, kColumns, Keeps::kAll>
               : (const void*)
                     lltm_sequence_forward_persistent_kernel<Dtype, kColumns, Keeps::kNothing>;
  }
}

// A block per group of `columns` state columns: for float and double
// enough blocks to spread the work over the device, no more than it holds
// at once; for the 16-bit types kMmaColumns, on compute capability 8.0 and
// newer only (the tensor cores' mma), where the kernels hold code for it,
// in clusters where `clusters` allows them. A query that fails leaves the
// pass to the rows below (no plan); its answer is not kept.
template <typename Dtype>
static bool query_persistent(PersistentPlan* plan, int device, int pass, int64_t batch_size,
                             int64_t state_size, bool clusters) {
  *plan = {NULL, 0, 0, 1};
  const bool backward = pass == LLTM_PASS_BACKWARD;
  const bool tensor_cores = !IsMath<Dtype>::value;
  // The rows of the hidden weights a column needs, and their length.
  const int64_t weight_rows = backward ? 1 : 3;
  const int64_t length = backward ? 3 * state_size : state_size;
  int processors, max_shared, major;
  if (query_failed(cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device)) ||
      query_failed(cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                          device)) ||
      query_failed(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device))) {
    return false;
  }
  int64_t columns, shared_bytes;
  if (tensor_cores) {
    if (major < 8) return true;
    columns = kMmaColumns;
    const int64_t rows = (batch_size + kMmaRows - 1) / kMmaRows * kMmaRows;
    const int64_t warps = kPersistentThreads / 32;
    shared_bytes = (weight_rows * columns + rows) * mma_padded(length) * (int64_t)sizeof(Dtype) +
                   warps * rows * weight_rows * columns * (int64_t)sizeof(float);
  } else {
    const int64_t wanted = (batch_size * state_size + 31) / 32;
    const int64_t target = wanted < processors ? (wanted > 0 ? wanted : 1) : processors;
    columns = 1;
    while (columns < 8 && columns * target < state_size) columns *= 2;
    if ((state_size + columns - 1) / columns > processors) return true;
    shared_bytes = (weight_rows * columns + batch_size) * padded<Dtype>(length) *
                   (int64_t)sizeof(Dtype);
  }
  const void* kernel = persistent_kernel<Dtype>(pass, (int)columns);
  cudaFuncAttributes attributes;
  if (query_failed(cudaFuncGetAttributes(&attributes, kernel))) return false;
  // ptxVersion is the virtual architecture the kernel's code came from: an
  // older one than 8.0 compiled the mma away. The kernel may take all the
  // dynamic shared memory a block can: a kept plan of other sizes launches
  // it too.
  const int64_t most_shared = max_shared - (int64_t)attributes.sharedSizeBytes;
  if (shared_bytes > most_shared || (tensor_cores && attributes.ptxVersion < 80)) return true;
  int resident = 0;
  if (query_failed(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)most_shared)) ||
      query_failed(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &resident, kernel, kPersistentThreads, (size_t)shared_bytes))) {
    return false;
  }
  int64_t blocks = (state_size + columns - 1) / columns;
  if (blocks > (int64_t)resident * processors) return true;
  plan->kernel = kernel;
  plan->blocks = (int)blocks;
  plan->shared_bytes = (size_t)shared_bytes;
  // Clusters for the tensor-core kernels where the device and the kernel's
  // code have them (9.0) and the clustered grid is resident at once; the
  // grid grows to whole clusters, its extra blocks owning no column.
  if (tensor_cores && clusters && major == 9 && attributes.ptxVersion >= 90) {
    blocks = (blocks + kMmaCluster - 1) / kMmaCluster * kMmaCluster;
    cudaLaunchAttribute attribute[1];
    const cudaLaunchConfig_t config = cluster_launch_config(
        (unsigned)blocks, kPersistentThreads, (size_t)shared_bytes, kMmaCluster, 0, attribute);
    int active = 0;
    if (query_failed(cudaOccupancyMaxActiveClusters(&active, kernel, &config))) return false;
    if ((int64_t)active * kMmaCluster >= blocks) {
      plan->blocks = (int)blocks;
      plan->cluster = kMmaCluster;
    }
  }
  return true;
}

// query_persistent's plan, asked once for a device and sizes.
template <typename Dtype>
PersistentPlan plan_persistent(int pass, int64_t steps, int64_t batch_size, int64_t state_size,
                               bool clusters) {
  PersistentPlan plan = {NULL, 0, 0, 1};
  // A single step keeps nothing on chip for a next one; its plan's queries
  // and a cooperative launch would cost the host more than the launches
  // they save.
  int device;
  if (steps < 2 || batch_size * state_size > kPersistentElements ||
      query_failed(cudaGetDevice(&device))) {
    return plan;
  }
  static KeptAnswers<PersistentPlan> kept;
  return kept.get({device, pass, clusters, batch_size, state_size}, [&](PersistentPlan* p) {
    return query_persistent<Dtype>(p, device, pass, batch_size, state_size, clusters);
  });
}

int launch_persistent(const PersistentPlan& plan, void** arguments, cudaStream_t stream) {
  if (plan.cluster == 1) {
    return cudaLaunchCooperativeKernel(plan.kernel, plan.blocks, kPersistentThreads, arguments,
                                       plan.shared_bytes, stream);
  }
  cudaLaunchAttribute attributes[2];
  cudaLaunchConfig_t config = cluster_launch_config(
      (unsigned)plan.blocks, kPersistentThreads, plan.shared_bytes, (unsigned)plan.cluster,
      stream, attributes);
  attributes[1].id = cudaLaunchAttributeCooperative;
  attributes[1].val.cooperative = 1;
  config.numAttrs = 2;
  return cudaLaunchKernelExC(&config, plan.kernel, arguments);
}

extern "C" lltm_persistent_plan lltm_plan_persistent(int dtype, int pass, int64_t steps,
                                                    int64_t batch_size, int64_t state_size,
                                                    int clusters) {
  return LLTM_TYPED_CALL_WITH_HALF(dtype, plan_persistent, pass, steps, batch_size,
                                   state_size, clusters != 0);
}

// What the other files of the recurrence call (lltm_recurrence.cuh), for
// every element type.
#define LLTM_INSTANTIATE(Dtype) \
  template PersistentPlan plan_persistent<Dtype>(int, int64_t, int64_t, int64_t, bool);
LLTM_FOR_EVERY_DTYPE(LLTM_INSTANTIATE)
