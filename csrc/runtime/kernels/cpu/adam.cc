// Multi-tensor Adam on the CPU: one pass over p, g, m, v per chunk (chunks.h), 16 lanes at a time
// on AVX-512 and a scalar loop for the rest. Update rules: torch_ort/optim/fused_adam.py.
#include <cmath>

#include "csrc/runtime/kernels/cpu/chunks.h"
#include "csrc/runtime/kernels/cpu/simd.h"
#include "csrc/runtime/kernels/multi_tensor.h"

namespace torch_ort::optim {
namespace {

struct AdamScalars {
  float b1, one_minus_b1, b2, one_minus_b2, eps, grad_scale;
  AdamTerms t;
};

// One element; the SIMD loop is the same sequence of operations on 16 lanes.
template <int kMode>
inline float adam_one(float p, float g, float& m, float& v, const AdamScalars& s) {
  g *= s.grad_scale;
  if constexpr (kMode == 2) p *= s.t.decay;     // AdamW (torch): decay first
  if constexpr (kMode == 0) g += s.t.l2 * p;    // Adam + L2: decay joins the gradient
  m = s.b1 * m + s.one_minus_b1 * g;
  v = s.b2 * v + s.one_minus_b2 * (g * g);
  float root = std::sqrt(v);
  if constexpr (kMode == 2) root *= s.t.inv_sqrt_bc2;
  p -= s.t.step_size * m / (root + s.eps);
  if constexpr (kMode == 1) p *= s.t.decay;     // AdamW (transformers): decay last
  return p;
}

template <int kMode, typename P, typename G>
void adam_portable(P* p, const G* g, float* m, float* v, int64_t n, const AdamScalars& s) {
  for (int64_t i = 0; i < n; ++i) p[i] = P(adam_one<kMode>(float(p[i]), float(g[i]), m[i], v[i], s));
}

// Returns how many leading elements it did (a multiple of 16).
template <int kMode, typename P, typename G>
TORCH_ORT_AVX512 int64_t adam_avx512(P* p, const G* g, float* m, float* v, int64_t n,
                                     const AdamScalars& s) {
  const __m512 b1 = _mm512_set1_ps(s.b1), omb1 = _mm512_set1_ps(s.one_minus_b1);
  const __m512 b2 = _mm512_set1_ps(s.b2), omb2 = _mm512_set1_ps(s.one_minus_b2);
  const __m512 eps = _mm512_set1_ps(s.eps), gs = _mm512_set1_ps(s.grad_scale);
  const __m512 step = _mm512_set1_ps(s.t.step_size), isb2 = _mm512_set1_ps(s.t.inv_sqrt_bc2);
  const __m512 decay = _mm512_set1_ps(s.t.decay), l2 = _mm512_set1_ps(s.t.l2);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 pv = simd::load16(p + i);
    __m512 gv = _mm512_mul_ps(simd::load16(g + i), gs);
    if constexpr (kMode == 2) pv = _mm512_mul_ps(pv, decay);
    if constexpr (kMode == 0) gv = _mm512_add_ps(gv, _mm512_mul_ps(l2, pv));
    const __m512 mv = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(omb1, gv));
    const __m512 vv = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                    _mm512_mul_ps(omb2, _mm512_mul_ps(gv, gv)));
    __m512 root = _mm512_sqrt_ps(vv);
    if constexpr (kMode == 2) root = _mm512_mul_ps(root, isb2);
    pv = _mm512_sub_ps(pv, _mm512_div_ps(_mm512_mul_ps(step, mv), _mm512_add_ps(root, eps)));
    if constexpr (kMode == 1) pv = _mm512_mul_ps(pv, decay);
    _mm512_storeu_ps(m + i, mv);
    _mm512_storeu_ps(v + i, vv);
    simd::store16(p + i, pv);
  }
  return i;
}

template <int kMode>
void adam_mode(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& ms, const std::vector<at::Tensor>& vs,
               const AdamScalars& s) {
  const bool wide = simd::use_avx512();
  for_chunks(chunks_of(params), [&](const Chunk& c, int64_t) {
    with_param_grad(params[c.tensor], grads[c.tensor], [&](auto* p, auto* g) {
      float* m = ms[c.tensor].data_ptr<float>() + c.begin;
      float* v = vs[c.tensor].data_ptr<float>() + c.begin;
      p += c.begin;
      g += c.begin;
      const int64_t n = c.end - c.begin;
      const int64_t done = wide ? adam_avx512<kMode>(p, g, m, v, n, s) : 0;
      adam_portable<kMode>(p + done, g + done, m + done, v + done, n - done, s);
    });
  });
}

}  // namespace

void adam_cpu(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
              const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
              const AdamHyper& h) {
  check_lists("multi_tensor_adam", {&params, &grads, &exp_avgs, &exp_avg_sqs},
              {"params", "grads", "exp_avgs", "exp_avg_sqs"}, 2, c10::DeviceType::CPU);
  check_grad_dtypes("multi_tensor_adam", params, grads);
  const AdamScalars s{float(h.beta1), float(1.0 - h.beta1), float(h.beta2), float(1.0 - h.beta2),
                      float(h.eps), float(h.grad_scale), adam_terms(h)};
  switch (h.mode) {
    case AdamWMode::kAdamL2: return adam_mode<0>(params, grads, exp_avgs, exp_avg_sqs, s);
    case AdamWMode::kAdamWTransformers: return adam_mode<1>(params, grads, exp_avgs, exp_avg_sqs, s);
    case AdamWMode::kAdamWTorch: return adam_mode<2>(params, grads, exp_avgs, exp_avg_sqs, s);
  }
}

}  // namespace torch_ort::optim
