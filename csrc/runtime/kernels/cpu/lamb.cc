// Multi-tensor LAMB on the CPU, in two passes over each parameter so that no update tensor is
// stored: pass 1 updates m, v and sums ‖p‖² and ‖u‖² per chunk; the per-tensor trust ratios come
// from those sums; pass 2 recomputes u from the new m, v and p (the same operations, so the same
// u) and applies p -= lr·ratio·u. Update rules: torch_ort/optim/fused_lamb.py.
#include <cmath>

#include "csrc/runtime/kernels/cpu/chunks.h"
#include "csrc/runtime/kernels/cpu/simd.h"
#include "csrc/runtime/kernels/multi_tensor.h"

namespace torch_ort::optim {
namespace {

struct LambScalars {
  float b1, m_weight, b2, one_minus_b2, eps, wd, inv_bc1, inv_bc2, grad_scale;
  bool adam_w;
};

// u from the new m, v and p.
inline float lamb_update(float p, float m, float v, const LambScalars& s) {
  float u = (m * s.inv_bc1) / (std::sqrt(v * s.inv_bc2) + s.eps);
  if (s.adam_w) u += s.wd * p;
  return u;
}

template <typename P, typename G>
void pass1_portable(const P* p, const G* g, float* m, float* v, int64_t n, const LambScalars& s,
                    double& pp, double& uu) {
  for (int64_t i = 0; i < n; ++i) {
    const float pi = float(p[i]);
    float gi = float(g[i]) * s.grad_scale;
    if (!s.adam_w) gi += s.wd * pi;
    m[i] = s.b1 * m[i] + s.m_weight * gi;
    v[i] = s.b2 * v[i] + s.one_minus_b2 * (gi * gi);
    const float u = lamb_update(pi, m[i], v[i], s);
    pp += double(pi) * pi;
    uu += double(u) * u;
  }
}

template <typename P>
void pass2_portable(P* p, const float* m, const float* v, int64_t n, const LambScalars& s, float lr) {
  for (int64_t i = 0; i < n; ++i) {
    const float pi = float(p[i]);
    p[i] = P(pi - lr * lamb_update(pi, m[i], v[i], s));
  }
}

TORCH_ORT_AVX512 inline __m512 lamb_update16(__m512 p, __m512 m, __m512 v, const LambScalars& s) {
  const __m512 root = _mm512_sqrt_ps(_mm512_mul_ps(v, _mm512_set1_ps(s.inv_bc2)));
  __m512 u = _mm512_div_ps(_mm512_mul_ps(m, _mm512_set1_ps(s.inv_bc1)),
                           _mm512_add_ps(root, _mm512_set1_ps(s.eps)));
  if (s.adam_w) u = _mm512_add_ps(u, _mm512_mul_ps(_mm512_set1_ps(s.wd), p));
  return u;
}

template <typename P, typename G>
TORCH_ORT_AVX512 int64_t pass1_avx512(const P* p, const G* g, float* m, float* v, int64_t n,
                                      const LambScalars& s, double& pp, double& uu) {
  const __m512 b1 = _mm512_set1_ps(s.b1), mw = _mm512_set1_ps(s.m_weight);
  const __m512 b2 = _mm512_set1_ps(s.b2), omb2 = _mm512_set1_ps(s.one_minus_b2);
  const __m512 gs = _mm512_set1_ps(s.grad_scale), wd = _mm512_set1_ps(s.wd);
  simd::SquareSum psum = simd::square_sum_zero(), usum = simd::square_sum_zero();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 pv = simd::load16(p + i);
    __m512 gv = _mm512_mul_ps(simd::load16(g + i), gs);
    if (!s.adam_w) gv = _mm512_add_ps(gv, _mm512_mul_ps(wd, pv));
    const __m512 mv = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(mw, gv));
    const __m512 vv = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                    _mm512_mul_ps(omb2, _mm512_mul_ps(gv, gv)));
    _mm512_storeu_ps(m + i, mv);
    _mm512_storeu_ps(v + i, vv);
    const __m512 u = lamb_update16(pv, mv, vv, s);
    simd::add_squares(psum, pv);
    simd::add_squares(usum, u);
  }
  pp += simd::total(psum);
  uu += simd::total(usum);
  return i;
}

template <typename P>
TORCH_ORT_AVX512 int64_t pass2_avx512(P* p, const float* m, const float* v, int64_t n,
                                      const LambScalars& s, float lr) {
  const __m512 lrv = _mm512_set1_ps(lr);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 pv = simd::load16(p + i);
    const __m512 u = lamb_update16(pv, _mm512_loadu_ps(m + i), _mm512_loadu_ps(v + i), s);
    simd::store16(p + i, _mm512_sub_ps(pv, _mm512_mul_ps(lrv, u)));
  }
  return i;
}

// lr·(trust ratio) for one tensor from its ‖p‖² and ‖u‖² (formulas in fused_lamb.py).
float scaled_lr(double pp, double uu, const LambHyper& h) {
  double w = std::sqrt(pp);
  if (h.max_weight_norm > 0) w = std::min(w, h.max_weight_norm);
  const double un = std::sqrt(uu);
  double ratio = 1.0;
  if (lamb_terms(h).ratio_on) ratio = (w > 0 && un > 0) ? w / un : 1.0;
  ratio = std::min(std::max(ratio, h.ratio_min), h.ratio_max);
  return float(h.lr * ratio);
}

}  // namespace

void lamb_cpu(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
              const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
              const LambHyper& h) {
  check_lists("multi_tensor_lamb", {&params, &grads, &exp_avgs, &exp_avg_sqs},
              {"params", "grads", "exp_avgs", "exp_avg_sqs"}, 2, c10::DeviceType::CPU);
  check_grad_dtypes("multi_tensor_lamb", params, grads);
  const LambTerms t = lamb_terms(h);
  const LambScalars s{float(h.beta1), t.m_weight, float(h.beta2), float(1.0 - h.beta2), float(h.eps),
                      float(h.weight_decay), t.inv_bc1, t.inv_bc2, float(h.grad_scale), h.adam_w_mode};
  const bool wide = simd::use_avx512();
  const std::vector<Chunk> chunks = chunks_of(params);

  // Pass 1: per-chunk sums, reduced per tensor in chunk order (the same result every run).
  std::vector<double> chunk_pp(chunks.size()), chunk_uu(chunks.size());
  for_chunks(chunks, [&](const Chunk& c, int64_t k) {
    with_param_grad(params[c.tensor], grads[c.tensor], [&](auto* p, auto* g) {
      float* m = exp_avgs[c.tensor].data_ptr<float>() + c.begin;
      float* v = exp_avg_sqs[c.tensor].data_ptr<float>() + c.begin;
      p += c.begin;
      g += c.begin;
      const int64_t n = c.end - c.begin;
      double pp = 0, uu = 0;
      const int64_t done = wide ? pass1_avx512(p, g, m, v, n, s, pp, uu) : 0;
      pass1_portable(p + done, g + done, m + done, v + done, n - done, s, pp, uu);
      chunk_pp[size_t(k)] = pp;
      chunk_uu[size_t(k)] = uu;
    });
  });
  std::vector<double> pp(params.size()), uu(params.size());
  for (size_t k = 0; k < chunks.size(); ++k) {
    pp[chunks[k].tensor] += chunk_pp[k];
    uu[chunks[k].tensor] += chunk_uu[k];
  }
  std::vector<float> lr(params.size());
  for (size_t i = 0; i < params.size(); ++i) lr[i] = scaled_lr(pp[i], uu[i], h);

  // Pass 2.
  for_chunks(chunks, [&](const Chunk& c, int64_t) {
    with_float_type(params[c.tensor], [&](auto* p) {
      const float* m = exp_avgs[c.tensor].data_ptr<float>() + c.begin;
      const float* v = exp_avg_sqs[c.tensor].data_ptr<float>() + c.begin;
      p += c.begin;
      const int64_t n = c.end - c.begin;
      const int64_t done = wide ? pass2_avx512(p, m, v, n, s, lr[c.tensor]) : 0;
      pass2_portable(p + done, m + done, v + done, n - done, s, lr[c.tensor]);
    });
  });
}

}  // namespace torch_ort::optim
