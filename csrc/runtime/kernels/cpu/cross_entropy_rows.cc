// Three passes over each row, the row in L2 meanwhile (V = 128k fp32 is 512 KiB): the maximum
// (and the row's sum, for label smoothing), then e = exp(l − max) into a per-thread float scratch
// with its sum S, then the gradient e/S·scale − ε/V·scale (− (1 − ε)·scale at the label) stored
// over the row. loss = lse − (1 − ε)·l_y − ε/V·Σl with lse = max + log S: PyTorch's
// cross_entropy with label smoothing, written through the log-sum-exp.
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

TORCH_ORT_AVX512 inline float reduce_max(__m512 v) { return _mm512_reduce_max_ps(v); }
TORCH_ORT_AVX512 inline float reduce_add(__m512 v) { return _mm512_reduce_add_ps(v); }

template <typename T>
float as_float(T v) { return static_cast<float>(v); }

// One row of V logits of type T; e: V floats of scratch. Returns the row's loss.
template <typename T>
TORCH_ORT_AVX512 double row(T* l, int64_t v, int64_t label, const CrossEntropyRows& a, float* e) {
  const int64_t body = v - v % 16;
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < body; j += 16) {
    const __m512 x = load16(l + j);
    vmax = _mm512_max_ps(vmax, x);
    vsum = _mm512_add_ps(vsum, x);
  }
  float m = reduce_max(vmax);
  double total = reduce_add(vsum);
  for (int64_t j = body; j < v; ++j) {
    m = std::max(m, as_float(l[j]));
    total += as_float(l[j]);
  }
  // An all -inf row (or a NaN) gives NaN as eager's log-softmax does; a finite max keeps exp finite.
  const __m512 mm = _mm512_set1_ps(m);
  __m512 vs = _mm512_setzero_ps();
  for (int64_t j = 0; j < body; j += 16) {
    const __m512 x = exp16(_mm512_sub_ps(load16(l + j), mm));
    _mm512_storeu_ps(e + j, x);
    vs = _mm512_add_ps(vs, x);
  }
  double s = reduce_add(vs);
  for (int64_t j = body; j < v; ++j) {
    e[j] = std::exp(as_float(l[j]) - m);
    s += e[j];
  }
  const double lse = m + std::log(s);
  const double eps = a.smoothing;
  const double loss = lse - (1.0 - eps) * as_float(l[label]) - (eps > 0 ? eps / v * total : 0.0);
  if (a.grad_scale != 0.0f) {
    const float scale = a.grad_scale;
    const float inv = static_cast<float>(scale / s);
    const float shift = static_cast<float>(scale * eps / v);
    const __m512 vinv = _mm512_set1_ps(inv), vshift = _mm512_set1_ps(shift);
    for (int64_t j = 0; j < body; j += 16)
      store16(l + j, _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(e + j), vinv), vshift));
    for (int64_t j = body; j < v; ++j) l[j] = static_cast<T>(e[j] * inv - shift);
    // The label's entry from its float value: one rounding, as eager's softmax − onehot.
    l[label] = static_cast<T>(e[label] * inv - shift - static_cast<float>(scale * (1.0 - eps)));
  }
  return loss;
}

template <typename T>
void rows(T* data, int64_t n, int64_t v, const CrossEntropyRows& a, double* row_loss) {
  const bool grad = a.grad_scale != 0.0f;
  at::parallel_for(0, n, 1, [&](int64_t b, int64_t end) {
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(v));
    for (int64_t i = b; i < end; ++i) {
      T* l = data + i * v;
      const int64_t y = a.labels[i];
      if (a.has_ignore_index && y == a.ignore_index) {
        row_loss[i] = 0.0;
        if (grad) std::fill(l, l + v, T(0));
        continue;
      }
      if (y < 0 || y >= v) {
        row_loss[i] = std::numeric_limits<double>::quiet_NaN();
        if (grad) std::fill(l, l + v, T(0));
        continue;
      }
      row_loss[i] = row(l, v, y, a, scratch.data());
    }
  });
}

}  // namespace

bool cross_entropy_rows(at::Tensor& logits, const CrossEntropyRows& args, double* row_loss) {
  if (!use_avx512() || logits.dim() != 2 || !logits.is_contiguous() || !logits.device().is_cpu()) return false;
  const int64_t n = logits.size(0), v = logits.size(1);
  switch (logits.scalar_type()) {
    case at::kFloat: rows(logits.data_ptr<float>(), n, v, args, row_loss); break;
    case at::kBFloat16: rows(logits.data_ptr<c10::BFloat16>(), n, v, args, row_loss); break;
    case at::kHalf: rows(logits.data_ptr<c10::Half>(), n, v, args, row_loss); break;
    default: return false;
  }
  return true;
}

}  // namespace torch_ort::kernels::cpu
