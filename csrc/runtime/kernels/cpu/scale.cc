// Multi-tensor scale (with the inf/nan check of its input) and global L2 norm on the CPU: the
// fused unscale, overflow check and gradient-norm of mixed-precision training (FP16_Optimizer).
#include <atomic>
#include <cmath>

#include "csrc/runtime/kernels/cpu/chunks.h"
#include "csrc/runtime/kernels/cpu/simd.h"
#include "csrc/runtime/kernels/multi_tensor.h"

namespace torch_ort::optim {
namespace {

// Returns whether an element of src is inf or nan.
template <typename S, typename D>
bool scale_portable(const S* src, D* dst, int64_t n, float scale) {
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const float x = float(src[i]);
    bad |= !std::isfinite(x);
    dst[i] = D(x * scale);
  }
  return bad;
}

template <typename S, typename D>
TORCH_ORT_AVX512 int64_t scale_avx512(const S* src, D* dst, int64_t n, float scale, bool& bad) {
  const __m512 k = _mm512_set1_ps(scale);
  __mmask16 any = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = simd::load16(src + i);
    any |= simd::nonfinite(x);
    simd::store16(dst + i, _mm512_mul_ps(x, k));
  }
  bad |= any != 0;
  return i;
}

template <typename T>
double sumsq_portable(const T* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(float(x[i])) * float(x[i]);
  return s;
}

template <typename T>
TORCH_ORT_AVX512 int64_t sumsq_avx512(const T* x, int64_t n, double& s) {
  simd::SquareSum acc = simd::square_sum_zero();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) simd::add_squares(acc, simd::load16(x + i));
  s += simd::total(acc);
  return i;
}

}  // namespace

bool scale_cpu(const std::vector<at::Tensor>& src, const std::vector<at::Tensor>& dst, double scale) {
  check_lists("multi_tensor_scale", {&src, &dst}, {"src", "dst"}, 2, c10::DeviceType::CPU);
  const bool wide = simd::use_avx512();
  std::atomic<bool> found{false};
  for_chunks(chunks_of(src), [&](const Chunk& c, int64_t) {
    with_float_type(src[c.tensor], [&](auto* s) {
      with_float_type(dst[c.tensor], [&](auto* d) {
        s += c.begin;
        d += c.begin;
        const int64_t n = c.end - c.begin;
        bool bad = false;
        const int64_t done = wide ? scale_avx512(s, d, n, float(scale), bad) : 0;
        bad |= scale_portable(s + done, d + done, n - done, float(scale));
        if (bad) found.store(true, std::memory_order_relaxed);
      });
    });
  });
  return found.load();
}

double l2norm_cpu(const std::vector<at::Tensor>& tensors) {
  check_lists("multi_tensor_l2norm", {&tensors}, {"tensors"}, 1, c10::DeviceType::CPU);
  const bool wide = simd::use_avx512();
  const std::vector<Chunk> chunks = chunks_of(tensors);
  std::vector<double> partial(chunks.size());
  for_chunks(chunks, [&](const Chunk& c, int64_t k) {
    with_float_type(tensors[c.tensor], [&](auto* x) {
      x += c.begin;
      const int64_t n = c.end - c.begin;
      double s = 0;
      const int64_t done = wide ? sumsq_avx512(x, n, s) : 0;
      partial[size_t(k)] = s + sumsq_portable(x + done, n - done);
    });
  });
  double total = 0;
  for (double p : partial) total += p;  // chunk order: the same sum every run
  return std::sqrt(total);
}

}  // namespace torch_ort::optim
