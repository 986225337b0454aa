// The CUDA half of our fused kernels. Their CUDA implementations live in torch_ort._C_cuda (built
// only where nvcc is, setup.py); importing that module registers each one here by name. A fused
// kernel meeting CUDA tensors looks its implementation up and, when there is none (no toolkit at
// build time), runs its unfused ATen reference instead — slower, never wrong.
//
// The two extensions are loaded with RTLD_LOCAL and see none of each other's symbols, so entries
// are plain function pointers whose signatures (declared beside each fused kernel, e.g.
// kernels/fused_gelu.h) use only ATen types, which both share through libtorch.
#pragma once

#include <string>
#include <vector>

namespace torch_ort {

// Called by torch_ort._C_cuda at import (through the capsule of _C._cuda_kernel_table()).
void register_cuda_kernel(const char* name, void* fn);
// nullptr when torch_ort._C_cuda did not register `name` (not built, or not imported yet).
void* find_cuda_kernel(const std::string& name);
std::vector<std::string> cuda_kernel_names();

template <typename Fn>
Fn cuda_kernel(const std::string& name) {
  return reinterpret_cast<Fn>(find_cuda_kernel(name));
}

}  // namespace torch_ort
