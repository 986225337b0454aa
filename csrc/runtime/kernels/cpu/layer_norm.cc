// fp32 CPU loops of SkipLayerNorm (forward, backward) and BiasDropout: see layer_norm.h. Each row
// is read once from memory; the second and third sweeps over a row hit the cache.
#include "csrc/runtime/kernels/cpu/layer_norm.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "csrc/runtime/kernels/cpu/simd.h"

namespace torch_ort::kernels::cpu {
namespace {

using optim::simd::use_avx512;

// A fixed split of the rows into chunks of at least ~16K elements: column sums are then added in
// the same order whatever the thread schedule.
int64_t num_chunks(int64_t rows, int64_t cols) {
  const int64_t min_rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), (rows + min_rows - 1) / min_rows));
}

template <typename F>
void for_row_chunks(int64_t rows, int64_t k, const F& f) {  // f(chunk, first row, end row)
  at::parallel_for(0, k, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) f(c, c * rows / k, (c + 1) * rows / k);
  });
}

// --- AVX-512, 16 columns at a time; the last (C mod 16) columns through masked loads/stores
// (masked lanes load 0). A portable scalar version of these loops lost to ATen (0.4-0.8x, see
// benchmarks/results/fused_norm.md), so without AVX-512 the kernels run their ATen reference.

TORCH_ORT_AVX512 inline __m512 ld(const float* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }

TORCH_ORT_AVX512 void forward_rows_avx512(const SkipLnForward& a, int64_t r0, int64_t r1) {
  const int64_t C = a.cols;
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t r = r0; r < r1; ++r) {
    const float *x = a.x + r * C, *sk = a.skip + r * C;
    float* s = a.sum + r * C;
    __m512 acc = zero;
    for (int64_t j = 0; j < C; j += 16) {
      const __mmask16 k = C - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (C - j)) - 1);
      __m512 v = ld(x + j, k);
      if (a.bias) v = _mm512_add_ps(v, ld(a.bias + j, k));
      v = _mm512_add_ps(v, ld(sk + j, k));
      _mm512_mask_storeu_ps(s + j, k, v);
      acc = _mm512_add_ps(acc, v);
    }
    const float m = _mm512_reduce_add_ps(acc) / static_cast<float>(C);
    const __m512 mv = _mm512_set1_ps(m);
    __m512 acc2 = zero;
    for (int64_t j = 0; j < C; j += 16) {
      const __mmask16 k = C - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (C - j)) - 1);
      const __m512 d = _mm512_maskz_sub_ps(k, ld(s + j, k), mv);
      acc2 = _mm512_add_ps(acc2, _mm512_mul_ps(d, d));
    }
    const float rs = 1.f / std::sqrt(_mm512_reduce_add_ps(acc2) / static_cast<float>(C) + a.eps);
    const __m512 rv = _mm512_set1_ps(rs);
    float* y = a.y + r * C;
    for (int64_t j = 0; j < C; j += 16) {
      const __mmask16 k = C - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (C - j)) - 1);
      __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(ld(s + j, k), mv), rv), ld(a.gamma + j, k));
      if (a.beta) v = _mm512_add_ps(v, ld(a.beta + j, k));
      _mm512_mask_storeu_ps(y + j, k, v);
    }
    a.mean[r] = m;
    a.invstd[r] = rs;
  }
}

TORCH_ORT_AVX512 void backward_rows_avx512(const SkipLnBackward& a, int64_t r0, int64_t r1, float* pg,
                                           float* pb, float* pd) {
  const int64_t C = a.cols;
  const float inv_c = 1.f / static_cast<float>(C);
  for (int64_t r = r0; r < r1; ++r) {
    const float *s = a.sum + r * C, *dy = a.dy + r * C;
    const __m512 mv = _mm512_set1_ps(a.mean[r]), rv = _mm512_set1_ps(a.invstd[r]);
    __m512 a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps();
    for (int64_t j = 0; j < C; j += 16) {
      const __mmask16 k = C - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (C - j)) - 1);
      const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(ld(s + j, k), mv), rv);
      const __m512 d = ld(dy + j, k), g = _mm512_mul_ps(d, ld(a.gamma + j, k));  // 0 in masked lanes
      a1 = _mm512_add_ps(a1, g);
      a2 = _mm512_add_ps(a2, _mm512_mul_ps(g, xh));
      _mm512_mask_storeu_ps(pg + j, k, _mm512_add_ps(ld(pg + j, k), _mm512_mul_ps(d, xh)));
      _mm512_mask_storeu_ps(pb + j, k, _mm512_add_ps(ld(pb + j, k), d));
    }
    const __m512 c1 = _mm512_set1_ps(_mm512_reduce_add_ps(a1) * inv_c);
    const __m512 c2 = _mm512_set1_ps(_mm512_reduce_add_ps(a2) * inv_c);
    float* dx = a.dx + r * C;
    for (int64_t j = 0; j < C; j += 16) {
      const __mmask16 k = C - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (C - j)) - 1);
      const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(ld(s + j, k), mv), rv);
      const __m512 g = _mm512_mul_ps(ld(dy + j, k), ld(a.gamma + j, k));
      __m512 v = _mm512_mul_ps(rv, _mm512_sub_ps(_mm512_sub_ps(g, c1), _mm512_mul_ps(xh, c2)));
      if (a.dsum) v = _mm512_add_ps(v, ld(a.dsum + r * C + j, k));
      _mm512_mask_storeu_ps(dx + j, k, v);
      _mm512_mask_storeu_ps(pd + j, k, _mm512_add_ps(ld(pd + j, k), v));
    }
  }
}

TORCH_ORT_AVX512 void dropout_rows_avx512(const float* x, const float* bias, const float* res,
                                          const bool* mask, float scale, int64_t C, int64_t r0, int64_t r1,
                                          float* y) {
  const __m512 sv = _mm512_set1_ps(scale);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t o = r * C;
    for (int64_t j = 0; j < C; j += 16) {
      const int64_t n = std::min<int64_t>(16, C - j);
      const __mmask16 k = n == 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
      const __m128i mb = _mm_maskz_loadu_epi8(k, mask + o + j);
      const __mmask16 keep = _mm512_test_epi32_mask(_mm512_cvtepu8_epi32(mb), _mm512_cvtepu8_epi32(mb));
      __m512 t = ld(x + o + j, k);
      if (bias) t = _mm512_add_ps(t, ld(bias + j, k));
      t = _mm512_mul_ps(t, _mm512_maskz_mov_ps(keep, sv));
      if (res) t = _mm512_add_ps(t, ld(res + o + j, k));
      _mm512_mask_storeu_ps(y + o + j, k, t);
    }
  }
}

}  // namespace

bool fused_loops_available() { return use_avx512(); }

void skip_layer_norm_forward(const SkipLnForward& a) {
  for_row_chunks(a.rows, num_chunks(a.rows, a.cols),
                 [&](int64_t, int64_t r0, int64_t r1) { forward_rows_avx512(a, r0, r1); });
}

void skip_layer_norm_backward(const SkipLnBackward& a) {
  const int64_t C = a.cols, k = num_chunks(a.rows, C);
  std::vector<float> partial(static_cast<size_t>(3 * k * C), 0.f);  // per chunk: dgamma, dbeta, dbias
  for_row_chunks(a.rows, k, [&](int64_t c, int64_t r0, int64_t r1) {
    float* p = partial.data() + 3 * c * C;
    backward_rows_avx512(a, r0, r1, p, p + C, p + 2 * C);
  });
  float* outs[3] = {a.dgamma, a.dbeta, a.dbias};
  for (int w = 0; w < 3; ++w) {
    if (!outs[w]) continue;
    for (int64_t j = 0; j < C; ++j) {
      float t = 0.f;
      for (int64_t c = 0; c < k; ++c) t += partial[(3 * c + w) * C + j];
      outs[w][j] = t;
    }
  }
}

void bias_dropout_forward(const float* x, const float* bias, const float* residual, const bool* mask,
                          float scale, int64_t rows, int64_t cols, float* y) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1));
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    dropout_rows_avx512(x, bias, residual, mask, scale, cols, r0, r1, y);
  });
}

}  // namespace torch_ort::kernels::cpu
