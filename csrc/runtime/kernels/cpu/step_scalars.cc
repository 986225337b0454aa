// StepScalars on the CPU: the device scalars of a sync-free step, read on the host (a CPU tensor
// is already there) and turned into the plain kernels' arguments, so both devices take one path.
#include <ATen/ops/scalar_tensor.h>

#include "csrc/runtime/kernels/multi_tensor.h"

namespace torch_ort::optim {
namespace {

const c10::Device kCpu(c10::DeviceType::CPU);

bool skipped(const char* call, const StepScalars& d) {
  check_scalar(call, "skip", d.skip, at::kFloat, kCpu);
  check_scalar(call, "scale_by", d.scale_by, at::kDouble, kCpu);
  check_scalar(call, "step", d.step, at::kDouble, kCpu);
  return d.skip.defined() && *d.skip.data_ptr<float>() != 0.0f;
}

int64_t step_of(int64_t step, const at::Tensor& t) {
  return t.defined() ? int64_t(*t.data_ptr<double>()) : step;
}

double times(double grad_scale, const at::Tensor& scale_by) {
  return scale_by.defined() ? grad_scale * *scale_by.data_ptr<double>() : grad_scale;
}

}  // namespace

// One update with the device scalars applied on the host: a skipped step makes the checks a
// real step would make and writes nothing; otherwise the scale and the step count fold into
// the hyperparameters of the host kernel.
template <typename Hyper, typename Kernel>
void step_with_scalars(const char* name, const std::vector<at::Tensor>& params,
                       const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& exp_avgs,
                       const std::vector<at::Tensor>& exp_avg_sqs, const Hyper& h, const StepScalars& d,
                       Kernel kernel) {
  if (skipped(name, d)) {
    check_lists(name, {&params, &grads, &exp_avgs, &exp_avg_sqs},
                {"params", "grads", "exp_avgs", "exp_avg_sqs"}, 2, c10::DeviceType::CPU);
    return check_grad_dtypes(name, params, grads);
  }
  Hyper r = h;
  r.grad_scale = times(h.grad_scale, d.scale_by);
  r.step = step_of(h.step, d.step);
  kernel(params, grads, exp_avgs, exp_avg_sqs, r);
}

void adam_cpu_scalars(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                      const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                      const AdamHyper& h, const StepScalars& d) {
  step_with_scalars("multi_tensor_adam", params, grads, exp_avgs, exp_avg_sqs, h, d, adam_cpu);
}

void lamb_cpu_scalars(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                      const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                      const LambHyper& h, const StepScalars& d) {
  step_with_scalars("multi_tensor_lamb", params, grads, exp_avgs, exp_avg_sqs, h, d, lamb_cpu);
}

void scale_flag_cpu(const std::vector<at::Tensor>& src, const std::vector<at::Tensor>& dst, double scale,
                    const at::Tensor& scale_by, const at::Tensor& found) {
  check_scalar("multi_tensor_scale_flag", "scale_by", scale_by, at::kDouble, kCpu);
  check_scalar("multi_tensor_scale_flag", "found", found, at::kFloat, kCpu);
  if (scale_cpu(src, dst, times(scale, scale_by)) && found.defined()) *found.data_ptr<float>() = 1.0f;
}

at::Tensor l2norm_tensor_cpu(const std::vector<at::Tensor>& tensors) {
  return at::scalar_tensor(l2norm_cpu(tensors), at::TensorOptions().dtype(at::kDouble));
}

}  // namespace torch_ort::optim
