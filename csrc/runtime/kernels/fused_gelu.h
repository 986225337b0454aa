// BiasGelu's CUDA entry points: the signatures under which torch_ort._C_cuda registers them
// (kernels/cuda/fused_gelu_cuda.cc, REGISTER_FUSED_CUDA) and fused_gelu.cc looks them up
// (cuda_table.h). ATen types only: both extensions share them through libtorch.
#pragma once

#include <ATen/core/Tensor.h>

namespace torch_ort::kernels {

// y = gelu(x + bias): x, y contiguous of one float dtype (fp32, fp16 or bf16, computed in fp32);
// bias undefined or contiguous 1-D of x.size(-1), same dtype; y preallocated like x.
using BiasGeluCudaFn = void (*)(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& y, bool tanh);
// dx = dy · gelu'(x + bias), same contract; dx preallocated like x.
using BiasGeluGradCudaFn = void (*)(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& bias,
                                    const at::Tensor& dx, bool tanh);

}  // namespace torch_ort::kernels
