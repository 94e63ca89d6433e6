/* The CPU passes (src/lltm_cpu.c, src/round_cpu.c): the same math, layout and
 * argument order as the CUDA launchers of lltm_kernel.h, without the stream.
 * Each returns LLTM_SUCCESS, or LLTM_ERROR_NO_MEMORY where a sequence pass
 * cannot allocate its scratch memory. */
#ifndef LLTM_CPU_H
#define LLTM_CPU_H

#include <stdint.h>

int lltm_cpu_forward(int dtype, int64_t batch_size, int64_t state_size, const void* gates,
                     const void* old_cell, void* new_h, void* new_cell);
int lltm_cpu_backward(int dtype, int64_t batch_size, int64_t state_size,
                      const int64_t grad_strides[4], const void* grad_h, const void* grad_cell,
                      const void* new_cell, const void* gates, void* d_old_cell, void* d_gates);
int lltm_cpu_sequence_forward(int dtype, int64_t steps, int64_t batch_size,
                              int64_t input_features, int64_t state_size, const void* inputs,
                              const void* weights, const void* bias, const void* h0,
                              const void* c0, void* outputs, void* cells, void* gates);
int lltm_cpu_sequence_backward(int dtype, int64_t steps, int64_t batch_size,
                               int64_t input_features, int64_t state_size,
                               const int64_t grad_strides[6], const void* inputs,
                               const void* weights, const void* h0, const void* outputs,
                               const void* cells, const void* gates, const void* grad_outputs,
                               const void* grad_cells, void* d_gates, void* d_inputs,
                               void* d_weights, void* d_bias, void* d_h0, void* d_c0);
int lltm_cpu_round_forward(int dtype, int64_t count, const void* input, void* output);

#endif /* LLTM_CPU_H */
