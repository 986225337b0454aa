// One-pass CPU loops of BiasGelu (fp32): y = gelu(x + bias) and dx = dy · gelu'(x + bias), the
// bias (optional) broadcast along the last dim, parallel over rows with at::parallel_for. AVX-512
// only (simd.h's use_avx512, which set_optim_cpu_path("portable") turns off): they return false
// without it, and the caller runs the ATen reference (a scalar loop lost to it, fused_kernels.py).
#pragma once

#include <cstdint>

namespace torch_ort::kernels::cpu {

// x, y: n contiguous floats; bias: `c` floats (x's last dim) or nullptr; n % c == 0 when bias.
bool bias_gelu_forward(const float* x, const float* bias, float* y, int64_t n, int64_t c, bool tanh);
bool bias_gelu_backward(const float* dy, const float* x, const float* bias, float* dx, int64_t n,
                        int64_t c, bool tanh);

// The same vectorised math for FusedElementwise's tile loop (fused_elementwise.cc): y = f(a) on
// n floats; false (nothing written) without AVX-512. Max error against float64 over [-10, 10]:
// exp, sigmoid ~1 ulp; tanh, erf ≤ 1.5e-7 absolute.
enum class UnaryFn { kExp, kTanh, kErf, kSigmoid, kExpNegSquare /* exp(−a²), Erf's derivative */ };
bool unary_loop(UnaryFn fn, const float* a, float* y, int64_t n);

}  // namespace torch_ort::kernels::cpu
