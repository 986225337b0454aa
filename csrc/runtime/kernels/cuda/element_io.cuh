// fp32/fp16/bf16 element loads and stores that compute in fp32, shared by the .cu kernels (no
// torch headers, like them).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace torch_ort::cuda {

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float x) { p[i] = x; }
__device__ __forceinline__ void store(__half* p, int64_t i, float x) { p[i] = __float2half_rn(x); }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float x) { p[i] = __float2bfloat16_rn(x); }

}  // namespace torch_ort::cuda
