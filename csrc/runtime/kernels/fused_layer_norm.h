// Signatures of the CUDA implementations of SkipLayerNorm and its gradient (in torch_ort._C_cuda,
// kernels/cuda/fused_layer_norm_cuda.cc), looked up by name through cuda_table.h. Only ATen types:
// both extensions share them through libtorch. The caller allocates every output; optional inputs
// and outputs that are not wanted are undefined tensors.
#pragma once

#include <ATen/core/Tensor.h>

namespace torch_ort {

// fp32, contiguous (rows, C) x/skip/y/sum, (C) gamma/beta/bias, (rows) mean/invstd (float).
// sum = (x + bias) + skip;  y = (sum − μ)·r·gamma + beta.
using SkipLayerNormCudaFn = void (*)(const at::Tensor& x, const at::Tensor& skip, const at::Tensor& gamma,
                                     const at::Tensor& beta, const at::Tensor& bias, double eps,
                                     at::Tensor& y, at::Tensor& mean, at::Tensor& invstd, at::Tensor& sum);
inline constexpr const char* kSkipLayerNormCuda = "SkipLayerNorm";

// dx = r·(g − mean(g) − x̂·mean(g·x̂)) + dsum (g = dy·gamma); dgamma = Σ dy·x̂, dbeta = Σ dy,
// dbias = Σ dx over rows (each written when defined).
using SkipLayerNormGradCudaFn = void (*)(const at::Tensor& dy, const at::Tensor& dsum, const at::Tensor& sum,
                                         const at::Tensor& gamma, const at::Tensor& mean,
                                         const at::Tensor& invstd, at::Tensor& dx, at::Tensor& dgamma,
                                         at::Tensor& dbeta, at::Tensor& dbias);
inline constexpr const char* kSkipLayerNormGradCuda = "SkipLayerNormGrad";

}  // namespace torch_ort
