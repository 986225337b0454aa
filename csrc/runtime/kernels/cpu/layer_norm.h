// fp32 CPU loops of the fused residual-add + LayerNorm (SkipLayerNorm) and bias + dropout +
// residual (BiasDropout) kernels: one pass over memory per row where the math allows, 16 lanes
// at a time on AVX-512 (simd.h). Only where they win: without AVX-512 (or with the optimizer's
// CPU path forced to "portable") fused_loops_available() is false and the kernels run their ATen
// reference. Rows are split over at::parallel_for in a fixed number of chunks, so column sums are
// the same on every run.
#pragma once

#include <cstdint>

namespace torch_ort::kernels::cpu {

bool fused_loops_available();  // AVX-512 present and not switched off (optim::set_cpu_path)

// Rows of C contiguous floats. Optional pointers (bias, beta, dsum, dgamma, dbeta, dbias) may be
// nullptr.
struct SkipLnForward {
  const float *x, *skip, *bias, *gamma, *beta;
  float eps;
  int64_t rows, cols;
  float *y, *mean, *invstd, *sum;  // (rows, C), (rows), (rows), (rows, C)
};
// sum = (x + bias) + skip;  y = (sum − μ)·r·gamma + beta,  μ, r = 1/√(var + eps) per row.
void skip_layer_norm_forward(const SkipLnForward& a);

struct SkipLnBackward {
  const float *dy, *dsum, *sum, *gamma, *mean, *invstd;
  int64_t rows, cols;
  float *dx, *dgamma, *dbeta, *dbias;  // dx (rows, C); the others (C), written (not accumulated)
};
// x̂ = (sum − μ)·r, g = dy·gamma:  dx = r·(g − mean(g) − x̂·mean(g·x̂)) + dsum;
// dgamma = Σ dy·x̂, dbeta = Σ dy, dbias = Σ dx over rows.
void skip_layer_norm_backward(const SkipLnBackward& a);

// y = ((x + bias) · (mask ? scale : 0)) + residual, in eager's order of operations (so that a
// seeded run is bitwise eager's); mask holds 0/1 bytes drawn beforehand. bias (C), residual
// (rows, C) may be nullptr.
void bias_dropout_forward(const float* x, const float* bias, const float* residual, const bool* mask,
                          float scale, int64_t rows, int64_t cols, float* y);

}  // namespace torch_ort::kernels::cpu
