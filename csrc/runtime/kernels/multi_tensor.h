// Multi-tensor optimizer kernels: one call updates every tensor of a parameter group, in chunks
// spread over threads (CPU, kernels/cpu/multi_tensor.cc) or over thread blocks (CUDA,
// kernels/cuda/multi_tensor.cu). The update rules are written down in torch_ort/optim/*.py and
// README "Optimizers"; each kernel is tested step by step against a plain PyTorch reference.
//
// Dtypes: parameters and gradients fp32, fp16 or bf16 (a gradient of a low-precision parameter
// may also be fp32); optimizer state is fp32. All math is fp32; a low-precision parameter is
// rounded to nearest-even once per step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch_ort::optim {

// torch_ort.optim.AdamWMode; the numbers are ONNX Runtime's.
enum class AdamWMode : int64_t { kAdamL2 = 0, kAdamWTransformers = 1, kAdamWTorch = 2 };

struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.0;
  int64_t step = 1;             // this group's step, counted from 1 (after its increment)
  bool bias_correction = true;  // false: bc1 = bc2 = 1
  AdamWMode mode = AdamWMode::kAdamWTransformers;
  double grad_scale = 1.0;      // every gradient is multiplied by it first (unscale, clipping)
};

struct LambHyper {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
  int64_t step = 1;
  bool bias_correction = true;
  bool adam_w_mode = true;      // decoupled decay (u += wd·p); false: L2 (g += wd·p)
  bool grad_averaging = true;   // m's gradient weight is 1-β1 (true) or 1
  bool use_nvlamb = false;      // apply the trust ratio even when weight_decay == 0
  double ratio_min = 0.0;       // trust ratio clipped to [ratio_min, ratio_max]
  double ratio_max = 1e30;
  double max_weight_norm = -1;  // > 0: ‖p‖ clamped to it before the ratio (pytorch-lamb)
  double grad_scale = 1.0;      // global clipping / unscale factor applied to every gradient
};

// The device scalars of a step that never waits for the device (FusedLamb and FP16_Optimizer on
// CUDA): the kernels read them where they run, so no value comes back to the host. One element
// each, on the kernels' device; undefined when absent.
struct StepScalars {
  at::Tensor scale_by;  // float64: multiplies grad_scale (the global clipping factor, 1/loss scale)
  at::Tensor skip;      // float32: nonzero leaves every tensor as it was (overflow, non-finite norm)
  at::Tensor step;      // float64: this update's step, counted on the device (replaces the hyper's)
};

// Checks the tensor lists of one call: one entry per parameter in every list, equal sizes at one
// index, contiguous, dense, on `device`; lists[0] (and the first `param_like` lists) fp32, fp16 or
// bf16, the others fp32 (state) unless `any_float`. Errors name the call, the list and the index:
// InputMismatchError (a TypeError in Python) for dtype/device/layout, std::invalid_argument (a
// ValueError) for counts and sizes.
void check_lists(const char* call, const std::vector<const std::vector<at::Tensor>*>& lists,
                 const std::vector<const char*>& names, size_t param_like, c10::DeviceType device);

// Every gradient has its parameter's dtype or fp32 (InputMismatchError otherwise), checked before
// any tensor is touched.
void check_grad_dtypes(const char* call, const std::vector<at::Tensor>& params,
                       const std::vector<at::Tensor>& grads);

// The scalar bias-correction and step-size terms of a step, shared by the CPU and CUDA kernels.
struct AdamTerms {
  float step_size;       // modes 0/1: lr·√bc2/bc1;  mode 2: lr/bc1
  float inv_sqrt_bc2;    // mode 2 only: 1/√bc2 (denominator √v/√bc2 + eps)
  float decay;           // modes 1/2: 1 - lr·wd multiplies p;  mode 0: 1
  float l2;              // mode 0: wd (g += wd·p);  modes 1/2: 0
};
AdamTerms adam_terms(const AdamHyper& h);

struct LambTerms {
  float m_weight;          // m's gradient weight: 1-β1 with grad averaging, else 1
  float inv_bc1, inv_bc2;  // 1/bc1, 1/bc2 (1 without bias correction)
  bool ratio_on;           // the trust ratio applies: weight decay on, or use_nvlamb
};
LambTerms lamb_terms(const LambHyper& h);

// CPU entry points (kernels/cpu/multi_tensor.cc).
void adam_cpu(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
              const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
              const AdamHyper& h);
void lamb_cpu(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
              const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
              const LambHyper& h);
// dst[i] = src[i]·scale (dtype converted); returns whether any src element is inf or nan.
// dst may be src.
bool scale_cpu(const std::vector<at::Tensor>& src, const std::vector<at::Tensor>& dst, double scale);
// √(Σ‖t‖²) over every tensor, accumulated in double; inf or nan when an element is.
double l2norm_cpu(const std::vector<at::Tensor>& tensors);

// CUDA entry points (kernels/cuda/multi_tensor_cuda.cc, in torch_ort._C_cuda): the same contract.
// scale and l2norm wait for their result (the caller branches on it).
void adam_cuda(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const AdamHyper& h);
void lamb_cuda(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
               const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
               const LambHyper& h);
bool scale_cuda(const std::vector<at::Tensor>& src, const std::vector<at::Tensor>& dst, double scale);
double l2norm_cuda(const std::vector<at::Tensor>& tensors);

// The same with StepScalars. On the CPU they are read on the host (no device to wait for) and the
// plain kernels run with grad_scale·scale_by, or not at all when skip is set (after the checks).
void adam_cpu_scalars(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                      const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                      const AdamHyper& h, const StepScalars& d);
void lamb_cpu_scalars(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                      const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                      const LambHyper& h, const StepScalars& d);
// dst = src·scale·scale_by; sets found[0] = 1 (float32, one element, never cleared) when src holds
// an inf or nan. No host read on CUDA.
void scale_flag_cpu(const std::vector<at::Tensor>& src, const std::vector<at::Tensor>& dst, double scale,
                    const at::Tensor& scale_by, const at::Tensor& found);
// √(Σ‖t‖²) as a 0-dim float64 tensor on the tensors' device (the same value l2norm_* returns).
at::Tensor l2norm_tensor_cpu(const std::vector<at::Tensor>& tensors);

void adam_cuda_scalars(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                       const AdamHyper& h, const StepScalars& d);
void lamb_cuda_scalars(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                       const LambHyper& h, const StepScalars& d);
void scale_flag_cuda(const std::vector<at::Tensor>& src, const std::vector<at::Tensor>& dst, double scale,
                     const at::Tensor& scale_by, const at::Tensor& found);
at::Tensor l2norm_tensor_cuda(const std::vector<at::Tensor>& tensors);

// Checks one StepScalars tensor: one element, `dtype`, on `device` (InputMismatchError otherwise).
void check_scalar(const char* call, const char* name, const at::Tensor& t, at::ScalarType dtype,
                  const c10::Device& device);

// Which CPU path runs: "avx512", "avx2" (only LinearCrossEntropy's rows have an AVX2 loop; the
// rest runs portable) or "portable". set_cpu_path caps it at a narrower one (tests run each);
// set_cpu_path("auto") picks the widest the processor has.
std::string cpu_path();
void set_cpu_path(const std::string& path);

}  // namespace torch_ort::optim
