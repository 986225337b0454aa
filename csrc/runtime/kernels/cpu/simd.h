// The SIMD vocabulary of the CPU optimizer kernels: 16-lane fp32 loads and stores from fp32, fp16
// and bf16 memory. Functions marked TORCH_ORT_AVX512 are compiled for AVX-512 whatever the build
// flags, and run only when use_avx512() says the processor has it; those marked TORCH_ORT_AVX2
// (8 lanes, for the loops that also have a path for processors without AVX-512) only when
// use_avx2() says so.
#pragma once

#include <cstdint>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <immintrin.h>

// No fused multiply-add contraction: the AVX-512 and portable paths then round identically, and
// match a plain PyTorch reference of the same formula (these kernels are memory-bound anyway).
#pragma GCC optimize("fp-contract=off")
// GCC 12 flags the deliberately undefined registers of its own AVX-512 intrinsics once an optimize
// pragma is active (the headers' _mm512_undefined_*); nothing of ours is uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define TORCH_ORT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define TORCH_ORT_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace torch_ort::optim::simd {

// True when the AVX-512 path runs: the processor has it and set_cpu_path did not force "avx2" or
// "portable".
bool use_avx512();
// True when the AVX2 loops may run: the processor has AVX2, FMA and F16C and set_cpu_path did not
// force "portable" (also true where AVX-512 runs).
bool use_avx2();

TORCH_ORT_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
TORCH_ORT_AVX512 inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
TORCH_ORT_AVX512 inline __m512 load16(const c10::BFloat16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

TORCH_ORT_AVX512 inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
TORCH_ORT_AVX512 inline void store16(c10::Half* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// Round to nearest even, NaN to 0x7fc0: c10::BFloat16(float)'s rounding, on 16 lanes.
TORCH_ORT_AVX512 inline void store16(c10::BFloat16* p, __m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i out = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  out = _mm512_mask_mov_epi32(out, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(out));
}

// Lanes where x is inf or nan (x - x is nan exactly there).
TORCH_ORT_AVX512 inline __mmask16 nonfinite(__m512 x) {
  const __m512 d = _mm512_sub_ps(x, x);
  return _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
}

// e^x = 2^n · e^r with n = round(x·log2 e), r = x − n·ln2 (ln2 in two parts, so r is exact),
// |r| ≤ ln2/2, and e^r by Taylor to r⁷ (error < 1e-8): Horner from 1/7! down, these the factors.
inline constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f,
                       kLn2Lo = 1.428606765330187e-06f;
inline constexpr float kExpTaylor[] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};

// e^x on 16 lanes, 2^n by scalef (which saturates to 0 / inf for huge |n|, so the clamp only
// keeps r finite).
TORCH_ORT_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-150.0f)), _mm512_set1_ps(150.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpTaylor[i]));
  return _mm512_scalef_ps(p, n);
}

// Sums of squares kept in double (two 8-lane halves), so a long chunk loses no precision.
struct SquareSum {
  __m512d lo, hi;
};
TORCH_ORT_AVX512 inline SquareSum square_sum_zero() { return {_mm512_setzero_pd(), _mm512_setzero_pd()}; }
TORCH_ORT_AVX512 inline void add_squares(SquareSum& acc, __m512 x) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  acc.lo = _mm512_fmadd_pd(lo, lo, acc.lo);
  acc.hi = _mm512_fmadd_pd(hi, hi, acc.hi);
}
// The lanes' total, lane by lane in a fixed order (the same result every run).
TORCH_ORT_AVX512 inline double total(const SquareSum& acc) {
  alignas(64) double lanes[16];
  _mm512_store_pd(lanes, acc.lo);
  _mm512_store_pd(lanes + 8, acc.hi);
  double s = 0;
  for (double d : lanes) s += d;
  return s;
}

// 8 lanes (AVX2): the same loads, stores and exp as the 16-lane ones above.
TORCH_ORT_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
TORCH_ORT_AVX2 inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
TORCH_ORT_AVX2 inline __m256 load8(const c10::BFloat16* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
TORCH_ORT_AVX2 inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }
TORCH_ORT_AVX2 inline void store8(c10::Half* p, __m256 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// bf16 through c10's own rounding (nearest even, NaN kept): AVX2 has no 32-to-16-bit narrowing
// store, and these loops are bound by the float passes before it.
TORCH_ORT_AVX2 inline void store8(c10::BFloat16* p, __m256 x) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, x);
  for (int i = 0; i < 8; ++i) p[i] = c10::BFloat16(lanes[i]);
}

// e^x on 8 lanes, with 2^n built in the exponent bits (AVX2 has no scalef): x is clamped so that
// n stays in [-126, 127], and lanes below e^-87.34 (the smallest normal float, -inf included)
// are 0, where exact exp gives a denormal or 0.
TORCH_ORT_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3365478515625f);
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpTaylor[i]));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(pow2)));
}

}  // namespace torch_ort::optim::simd
