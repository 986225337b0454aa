// BiasGelu's CPU loop (gelu.h), AVX-512 only: a scalar loop over libm's erfc/exp measured 4-100×
// slower than ATen's vectorised GELU (benchmarks/fused_kernels.py), so without AVX-512 the kernel
// runs the ATen reference instead. The loop uses our own vectorised exp (Cody-Waite reduction, degree-7
// Taylor, scalef) and erf: erf(z) = z·P(z²) on |z| ≤ 1 and erfc(|z|) = exp(-z²)·Q(1/(1+|z|/2))
// beyond, both least-squares fits made for this file (relative error ≤ 1e-7 on erf, 4e-8 on
// erfc·exp(z²)); 1 + erf is taken from erfc for negative z, so gelu(x) keeps its relative accuracy
// where ATen's 1 + erf cancels. The tanh form is written through e = exp(−2|u|) ≤ 1:
// (1 + tanh u)/2 = 1/(1+e) or e/(1+e), 1 − tanh²u = 4e/(1+e)², avoiding the cancellation of
// 1 − tanh² (where ATen's fp32 backward loses up to ~1e-6). benchmarks/fused_kernels.py measures the error against at::gelu.
#include "csrc/runtime/kernels/cpu/gelu.h"

#include <algorithm>
#include <cmath>

#include <ATen/Parallel.h>

#include "csrc/runtime/kernels/cpu/simd.h"

namespace torch_ort::kernels::cpu {
namespace {

using optim::simd::exp16;

constexpr float kSqrtHalf = 0.70710678118654752f;        // 1/√2
constexpr float kInvSqrt2Pi = 0.39894228040143268f;      // 1/√(2π)
constexpr float kTanhBeta = 0.79788456080286536f;        // √(2/π)
constexpr float kTanhKappa = 0.044715f;

// ---- AVX-512
TORCH_ORT_AVX512 inline __m512 splat(float v) { return _mm512_set1_ps(v); }

// (1 + tanh u)/2 and 1 − tanh²u from e = exp(−2|u|) ≤ 1.
TORCH_ORT_AVX512 inline void tanh_terms16(__m512 u, __m512* s, __m512* sech2) {
  const __m512 e = exp16(_mm512_mul_ps(splat(-2.0f), _mm512_abs_ps(u)));
  const __m512 inv = _mm512_div_ps(splat(1.0f), _mm512_add_ps(splat(1.0f), e));
  const __mmask16 pos = _mm512_cmp_ps_mask(u, _mm512_setzero_ps(), _CMP_GE_OQ);
  *s = _mm512_mask_blend_ps(pos, _mm512_mul_ps(e, inv), inv);
  if (sech2) *sech2 = _mm512_mul_ps(_mm512_mul_ps(splat(4.0f), e), _mm512_mul_ps(inv, inv));
}

// erfc(|z|) = exp(−z²)·Q(t) for |z| > 1, t = 1 / (1 + |z|/2): the fitted polynomial Q.
TORCH_ORT_AVX512 inline __m512 erfc_q16(__m512 t) {
  __m512 q = splat(0.08167590200901031f);
  q = _mm512_fmadd_ps(q, t, splat(-0.1875874549150467f));
  q = _mm512_fmadd_ps(q, t, splat(0.028577517718076706f));
  q = _mm512_fmadd_ps(q, t, splat(0.10264842212200165f));
  q = _mm512_fmadd_ps(q, t, splat(0.15929098427295685f));
  q = _mm512_fmadd_ps(q, t, splat(0.25260862708091736f));
  q = _mm512_fmadd_ps(q, t, splat(0.28105294704437256f));
  q = _mm512_fmadd_ps(q, t, splat(0.28219345211982727f));
  q = _mm512_fmadd_ps(q, t, splat(-3.8635480450466275e-06f));
  return q;
}

// Φ(x) = ½(1 + erf(x/√2)), accurate in relative terms for x < 0 too (from erfc).
TORCH_ORT_AVX512 inline __m512 cdf16(__m512 x) {
  const __m512 z = _mm512_mul_ps(x, splat(kSqrtHalf));
  const __m512 az = _mm512_abs_ps(z);
  // |z| ≤ 1: erf(z) = z·P(z²)
  const __m512 s = _mm512_mul_ps(z, z);
  __m512 p = splat(-0.0005667877267114818f);
  p = _mm512_fmadd_ps(p, s, splat(0.004927394445985556f));
  p = _mm512_fmadd_ps(p, s, splat(-0.02672087587416172f));
  p = _mm512_fmadd_ps(p, s, splat(0.11280578374862671f));
  p = _mm512_fmadd_ps(p, s, splat(-0.37612390518188477f));
  p = _mm512_fmadd_ps(p, s, splat(1.1283791065216064f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(z, p), splat(0.5f), splat(0.5f));
  // |z| > 1: erfc(|z|) = exp(−z²)·Q(t), t = 1 / (1 + |z|/2)
  const __m512 t = _mm512_div_ps(splat(1.0f), _mm512_fmadd_ps(az, splat(0.5f), splat(1.0f)));
  const __m512 q = erfc_q16(t);
  const __m512 half_erfc = _mm512_mul_ps(_mm512_mul_ps(q, exp16(_mm512_sub_ps(_mm512_setzero_ps(), s))), splat(0.5f));
  const __mmask16 neg = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 large = _mm512_mask_blend_ps(neg, _mm512_sub_ps(splat(1.0f), half_erfc), half_erfc);
  const __mmask16 is_small = _mm512_cmp_ps_mask(az, splat(1.0f), _CMP_LE_OQ);
  return _mm512_mask_blend_ps(is_small, large, small);
}

// erf(z): z·P(z²) on |z| ≤ 1, sign(z)·(1 − erfc|z|) beyond (the fits of cdf16).
TORCH_ORT_AVX512 inline __m512 erf16(__m512 z) {
  const __m512 az = _mm512_abs_ps(z), s = _mm512_mul_ps(z, z);
  __m512 p = splat(-0.0005667877267114818f);
  p = _mm512_fmadd_ps(p, s, splat(0.004927394445985556f));
  p = _mm512_fmadd_ps(p, s, splat(-0.02672087587416172f));
  p = _mm512_fmadd_ps(p, s, splat(0.11280578374862671f));
  p = _mm512_fmadd_ps(p, s, splat(-0.37612390518188477f));
  p = _mm512_fmadd_ps(p, s, splat(1.1283791065216064f));
  const __m512 t = _mm512_div_ps(splat(1.0f), _mm512_fmadd_ps(az, splat(0.5f), splat(1.0f)));
  const __m512 q = erfc_q16(t);
  const __m512 one_minus_erfc = _mm512_fnmadd_ps(q, exp16(_mm512_sub_ps(_mm512_setzero_ps(), s)), splat(1.0f));
  const __m512 large = _mm512_or_ps(one_minus_erfc, _mm512_and_ps(z, splat(-0.0f)));  // sign of z
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(az, splat(1.0f), _CMP_LE_OQ), large, _mm512_mul_ps(z, p));
}

// tanh(u): odd Taylor series to u⁹ for |u| < 0.1 (where 1 − e would cancel), else
// sign(u)·(1 − e)/(1 + e) with e = exp(−2|u|).
TORCH_ORT_AVX512 inline __m512 tanh16(__m512 u) {
  const __m512 au = _mm512_abs_ps(u);
  const __m512 e = exp16(_mm512_mul_ps(splat(-2.0f), au));
  const __m512 big = _mm512_div_ps(_mm512_sub_ps(splat(1.0f), e), _mm512_add_ps(splat(1.0f), e));
  const __m512 s = _mm512_mul_ps(u, u);
  __m512 p = splat(62.0f / 2835);
  p = _mm512_fmadd_ps(p, s, splat(-17.0f / 315));
  p = _mm512_fmadd_ps(p, s, splat(2.0f / 15));
  p = _mm512_fmadd_ps(p, s, splat(-1.0f / 3));
  p = _mm512_fmadd_ps(p, s, splat(1.0f));
  const __m512 small = _mm512_mul_ps(u, p);
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(au, splat(0.1f), _CMP_LT_OQ),
                              _mm512_or_ps(big, _mm512_and_ps(u, splat(-0.0f))), small);
}

template <UnaryFn fn>
TORCH_ORT_AVX512 inline __m512 apply16(__m512 v) {
  if constexpr (fn == UnaryFn::kExp) return exp16(v);
  else if constexpr (fn == UnaryFn::kTanh) return tanh16(v);
  else if constexpr (fn == UnaryFn::kErf) return erf16(v);
  else if constexpr (fn == UnaryFn::kSigmoid)
    return _mm512_div_ps(splat(1.0f), _mm512_add_ps(splat(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), v))));
  else return exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(v, v)));  // exp(−a²)
}

template <UnaryFn fn>
TORCH_ORT_AVX512 void map16(const float* a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, apply16<fn>(_mm512_maskz_loadu_ps(m, a + i)));
  }
}

TORCH_ORT_AVX512 void unary_avx512(UnaryFn fn, const float* a, float* y, int64_t n) {
  switch (fn) {
    case UnaryFn::kExp: return map16<UnaryFn::kExp>(a, y, n);
    case UnaryFn::kTanh: return map16<UnaryFn::kTanh>(a, y, n);
    case UnaryFn::kErf: return map16<UnaryFn::kErf>(a, y, n);
    case UnaryFn::kSigmoid: return map16<UnaryFn::kSigmoid>(a, y, n);
    case UnaryFn::kExpNegSquare: return map16<UnaryFn::kExpNegSquare>(a, y, n);
  }
}

// Loads `len` ≤ 16 lanes of x (+ b); masked lanes read nothing.
TORCH_ORT_AVX512 inline __m512 load_xb(const float* x, const float* b, __mmask16 m) {
  const __m512 v = _mm512_maskz_loadu_ps(m, x);
  return b ? _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, b)) : v;
}

TORCH_ORT_AVX512 inline __m512 gelu16(__m512 x, bool tanh) {
  if (tanh) {
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    __m512 s;
    tanh_terms16(_mm512_mul_ps(splat(kTanhBeta), _mm512_fmadd_ps(splat(kTanhKappa), x3, x)), &s, nullptr);
    return _mm512_mul_ps(x, s);
  }
  return _mm512_mul_ps(x, cdf16(x));
}

TORCH_ORT_AVX512 inline __m512 gelu_grad16(__m512 dy, __m512 x, bool tanh) {
  const __m512 x_sq = _mm512_mul_ps(x, x);
  if (tanh) {
    __m512 s, sech2;
    tanh_terms16(_mm512_mul_ps(splat(kTanhBeta), _mm512_fmadd_ps(splat(kTanhKappa), _mm512_mul_ps(x_sq, x), x)),
                 &s, &sech2);
    const __m512 poly = _mm512_mul_ps(splat(kTanhBeta), _mm512_fmadd_ps(splat(3.0f * kTanhKappa), x_sq, splat(1.0f)));
    const __m512 right_d = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(splat(0.5f), x), sech2), poly);
    return _mm512_mul_ps(dy, _mm512_add_ps(s, right_d));
  }
  const __m512 pdf = _mm512_mul_ps(splat(kInvSqrt2Pi), exp16(_mm512_mul_ps(splat(-0.5f), x_sq)));
  return _mm512_mul_ps(dy, _mm512_fmadd_ps(x, pdf, cdf16(x)));
}

TORCH_ORT_AVX512 void forward_avx512(const float* x, const float* b, float* y, int64_t len, bool tanh) {
  for (int64_t i = 0; i < len; i += 16) {
    const __mmask16 m = len - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (len - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, gelu16(load_xb(x + i, b ? b + i : nullptr, m), tanh));
  }
}

TORCH_ORT_AVX512 void backward_avx512(const float* dy, const float* x, const float* b, float* dx, int64_t len,
                                      bool tanh) {
  for (int64_t i = 0; i < len; i += 16) {
    const __mmask16 m = len - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (len - i)) - 1);
    const __m512 g = gelu_grad16(_mm512_maskz_loadu_ps(m, dy + i), load_xb(x + i, b ? b + i : nullptr, m), tanh);
    _mm512_mask_storeu_ps(dx + i, m, g);
  }
}

// Runs f(offset, len, bias row or nullptr) over the n elements in parallel: row by row with a
// bias (so the bias lines up with each row), in 4096-element spans without one.
template <typename F>
void for_spans(int64_t n, int64_t c, bool has_bias, const F& f) {
  const int64_t span = has_bias ? c : std::min<int64_t>(n, 4096);
  if (span <= 0) return;
  const int64_t units = (n + span - 1) / span;
  const int64_t grain = std::max<int64_t>(1, 32768 / span);  // ~128 KiB per task
  at::parallel_for(0, units, grain, [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) f(u * span, std::min(span, n - u * span));
  });
}

}  // namespace

bool bias_gelu_forward(const float* x, const float* bias, float* y, int64_t n, int64_t c, bool tanh) {
  if (!optim::simd::use_avx512()) return false;
  for_spans(n, c, bias != nullptr,
            [&](int64_t off, int64_t len) { forward_avx512(x + off, bias, y + off, len, tanh); });
  return true;
}

bool bias_gelu_backward(const float* dy, const float* x, const float* bias, float* dx, int64_t n, int64_t c,
                        bool tanh) {
  if (!optim::simd::use_avx512()) return false;
  for_spans(n, c, bias != nullptr,
            [&](int64_t off, int64_t len) { backward_avx512(dy + off, x + off, bias, dx + off, len, tanh); });
  return true;
}

bool unary_loop(UnaryFn fn, const float* a, float* y, int64_t n) {
  if (!optim::simd::use_avx512()) return false;
  unary_avx512(fn, a, y, n);
  return true;
}

}  // namespace torch_ort::kernels::cpu
