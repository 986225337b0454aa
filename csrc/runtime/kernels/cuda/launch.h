// The boundary between the ATen glue (multi_tensor_cuda.cc, compiled by the host compiler) and the
// CUDA kernels (multi_tensor.cu, compiled by nvcc without torch headers, so it builds in seconds):
// plain pointers, sizes, an element-type tag and the step's scalars.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

namespace torch_ort::optim::cuda {

enum class Elem : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// depth parallel lists of `n` tensors: ptrs[list][tensor], numel[tensor]. All tensors of one list
// share one element type (the glue groups them so).
struct Lists {
  std::vector<std::vector<void*>> ptrs;
  std::vector<int64_t> numel;
};

// A step's device scalars (StepScalars, multi_tensor.h): read by every block where it runs.
struct DeviceScalars {
  double grad_scale = 1.0;           // the host's grad_scale, unrounded: scale_by multiplies it
  const double* scale_by = nullptr;  // null: grad_scale alone
  const float* skip = nullptr;       // null or 0: update; else every kernel returns at once
  // The step counted on the device (steps it skipped do not count): null, or the bias
  // corrections are computed from *step in each block, as adam_terms/lamb_terms do on the host.
  const double* step = nullptr;
  double lr = 0, beta1 = 0, beta2 = 0;
  bool bias_correction = true;
};

struct AdamArgs {
  float b1, one_minus_b1, b2, one_minus_b2, eps, grad_scale;
  float step_size, inv_sqrt_bc2, decay, l2;  // AdamTerms (multi_tensor.h)
  int mode;                                  // AdamWMode
  DeviceScalars dev;
};

struct LambArgs {
  float b1, m_weight, b2, one_minus_b2, eps, wd, inv_bc1, inv_bc2, grad_scale;
  bool adam_w;
  // Trust ratio (fused_lamb.py): applied when `ratio_on`, clipped to [ratio_min, ratio_max]. In
  // double, as the CPU kernel computes lr·ratio before rounding it to float.
  bool ratio_on;
  double lr, ratio_min, ratio_max, max_weight_norm;  // max_weight_norm <= 0: no clamp
  DeviceScalars dev;
};

// Sums (‖p‖², ‖u‖², Σx²) are deterministic: every block writes its partial to its own slot of a
// `partials` buffer, numbered by (tensor, chunk) in call order, and a second kernel adds each
// tensor's slots in that order. chunk_offsets(l)[t] is tensor t's first slot (n + 1 entries; the
// last is the number of slots); the glue uploads it as `offsets`.
std::vector<int64_t> chunk_offsets(const Lists& l);

// Lists: params (P), grads (G), exp_avgs, exp_avg_sqs (fp32).
void adam(const Lists& l, Elem p, Elem g, const AdamArgs& a, cudaStream_t stream);
// Same lists. Device scratch: `partials` 2·slots doubles, `offsets` the n + 1 chunk offsets,
// `sums` 2·n doubles (‖p‖², ‖u‖² per tensor), `scaled_lr` n floats.
void lamb(const Lists& l, Elem p, Elem g, const LambArgs& a, double* partials, const int64_t* offsets,
          double* sums, float* scaled_lr, cudaStream_t stream);
// Lists: src (S), dst (D); dst = src·factor, factor = float(scale·*scale_by) when scale_by is not
// null, else float(scale). Sets *found = 1 (device float, never cleared) when src has inf/nan.
void scale(const Lists& l, Elem s, Elem d, double scale, const double* scale_by, float* found,
           cudaStream_t stream);
// One list. Writes Σx² to *sum (a device double). Scratch: `partials` (one double per slot) and
// `offsets` = {0, slots} on the device.
void sum_squares(const Lists& l, Elem t, double* partials, const int64_t* offsets, double* sum,
                 cudaStream_t stream);

}  // namespace torch_ort::optim::cuda
