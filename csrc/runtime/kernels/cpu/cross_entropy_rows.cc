// LinearCrossEntropy's row loop (cross_entropy_rows_body.h) compiled twice: for AVX-512 (16
// lanes) and for AVX2 with FMA (8 lanes), each inside its own target pragma, and the widest that
// runs here is called (simd.h's use_avx512 / use_avx2).
#include "csrc/runtime/kernels/cpu/cross_entropy_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <ATen/Parallel.h>

#include "csrc/runtime/kernels/cpu/simd.h"

namespace torch_ort::kernels::cpu {
namespace {

using namespace optim::simd;

struct Avx512Lanes {
  using V = __m512;
  static constexpr int64_t kWidth = 16;
  template <typename T> TORCH_ORT_AVX512 static V load(const T* p) { return load16(p); }
  template <typename T> TORCH_ORT_AVX512 static void store(T* p, V x) { store16(p, x); }
  TORCH_ORT_AVX512 static V set1(float x) { return _mm512_set1_ps(x); }
  TORCH_ORT_AVX512 static V zero() { return _mm512_setzero_ps(); }
  TORCH_ORT_AVX512 static V max(V a, V b) { return _mm512_max_ps(a, b); }
  TORCH_ORT_AVX512 static V add(V a, V b) { return _mm512_add_ps(a, b); }
  TORCH_ORT_AVX512 static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  TORCH_ORT_AVX512 static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  TORCH_ORT_AVX512 static V exp(V x) { return exp16(x); }
  TORCH_ORT_AVX512 static float reduce_max(V x) { return _mm512_reduce_max_ps(x); }
  TORCH_ORT_AVX512 static float reduce_add(V x) { return _mm512_reduce_add_ps(x); }
};

struct Avx2Lanes {
  using V = __m256;
  static constexpr int64_t kWidth = 8;
  template <typename T> TORCH_ORT_AVX2 static V load(const T* p) { return load8(p); }
  template <typename T> TORCH_ORT_AVX2 static void store(T* p, V x) { store8(p, x); }
  TORCH_ORT_AVX2 static V set1(float x) { return _mm256_set1_ps(x); }
  TORCH_ORT_AVX2 static V zero() { return _mm256_setzero_ps(); }
  TORCH_ORT_AVX2 static V max(V a, V b) { return _mm256_max_ps(a, b); }
  TORCH_ORT_AVX2 static V add(V a, V b) { return _mm256_add_ps(a, b); }
  TORCH_ORT_AVX2 static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  TORCH_ORT_AVX2 static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  TORCH_ORT_AVX2 static V exp(V x) { return exp8(x); }
  // Lane by lane in a fixed order, as _mm512_reduce_*_ps: halves, then pairs, then the last two.
  TORCH_ORT_AVX2 static float reduce_max(V x) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  }
  TORCH_ORT_AVX2 static float reduce_add(V x) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
  }
};

}  // namespace

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
namespace avx512 {
namespace {
using Lanes = Avx512Lanes;
#include "csrc/runtime/kernels/cpu/cross_entropy_rows_body.h"
}  // namespace
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
namespace {
using Lanes = Avx2Lanes;
#include "csrc/runtime/kernels/cpu/cross_entropy_rows_body.h"
}  // namespace
}  // namespace avx2
#pragma GCC pop_options

bool cross_entropy_rows(at::Tensor& logits, const CrossEntropyRows& args, double* row_loss) {
  if (logits.dim() != 2 || !logits.is_contiguous() || !logits.device().is_cpu()) return false;
  if (use_avx512()) return avx512::run(logits, args, row_loss);
  if (use_avx2()) return avx2::run(logits, args, row_loss);
  return false;
}

}  // namespace torch_ort::kernels::cpu
