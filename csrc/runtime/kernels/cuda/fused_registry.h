// Inside torch_ort._C_cuda: the CUDA implementations of our fused kernels, collected by static
// registration (REGISTER_FUSED_CUDA("BiasGelu", bias_gelu_cuda)) and handed to torch_ort._C's table
// (kernels/cuda_table.h) when the module is imported.
#pragma once

#include <utility>
#include <vector>

namespace torch_ort::cuda {

inline std::vector<std::pair<const char*, void*>>& fused_kernels() {
  static std::vector<std::pair<const char*, void*>> list;
  return list;
}

inline bool add_fused_kernel(const char* name, void* fn) {
  fused_kernels().emplace_back(name, fn);
  return true;
}

}  // namespace torch_ort::cuda

#ifndef TORCH_ORT_CONCAT
#define TORCH_ORT_CONCAT_INNER(a, b) a##b
#define TORCH_ORT_CONCAT(a, b) TORCH_ORT_CONCAT_INNER(a, b)
#endif
#define REGISTER_FUSED_CUDA(name, fn)                              \
  static const bool TORCH_ORT_CONCAT(kFusedCudaReg_, __COUNTER__) = \
      ::torch_ort::cuda::add_fused_kernel(name, reinterpret_cast<void*>(&(fn)))
