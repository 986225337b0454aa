// Batch normalization: ONNX BatchNormalization (inference, and training_mode=1 as ONNX defines
// it), our BatchNormTraining (PyTorch's training semantics, what ORTModule exports for a module in
// train mode) and BatchNormalizationGrad. X is (N, C, D...); statistics are per channel C.
//
// BatchNormTraining(X, [scale], [B], [running_mean], [running_var]) -> (Y, running_mean_out,
// running_var_out, saved_mean, saved_inv_std); attributes epsilon and momentum in PyTorch's
// convention: new = (1 − momentum)·old + momentum·batch, the running variance from the unbiased
// (n−1) batch variance. It is at::native_batch_norm on copies of the running statistics — the
// kernel eager PyTorch runs — so Y, the statistics and the saved mean/inv-std for backward match
// eager to the bit on CPU. The graph stays functional: the module's buffers are updated by the
// caller from the running_*_out outputs (torch_ort/ortmodule/export/buffers.py).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <array>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/native_batch_norm.h>
#include <ATen/ops/native_batch_norm_backward.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/var_mean.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

using OptTensor = std::optional<at::Tensor>;

// Float attributes were Python doubles before export (momentum 0.1, eps 1e-5); ONNX keeps float32.
// The shortest decimal that rounds to the same float is what the user wrote (up to 9 digits), and
// eager computed with that double: use it, or running statistics drift from eager's in the last bit.
double attr_double(const KernelCtx& c, const char* name, float dflt) {
  const float f = c.attrs.get_float(name, dflt);
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    const double d = std::strtod(buf, nullptr);
    if (static_cast<float>(d) == f) return d;
  }
  return f;
}

OptTensor opt(const KernelCtx& c, int i) { return c.has_input(i) ? OptTensor(c.input(i)) : std::nullopt; }

std::vector<int64_t> reduce_dims(const KernelCtx& c, const at::Tensor& x) {
  if (x.dim() < 2) c.fail("expected an (N, C, ...) input, got shape " + c10::str(x.sizes()));
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

void check_channels(const KernelCtx& c, const at::Tensor& x, int i, const char* what) {
  if (c.has_input(i) && (c.input(i).dim() != 1 || c.input(i).size(0) != x.size(1)))
    c.fail(std::string(what) + " (input " + std::to_string(i) + ") has shape " +
           c10::str(c.input(i).sizes()) + "; expected (" + std::to_string(x.size(1)) + ") for input " +
           c10::str(x.sizes()));
}

// (X, scale, B, input_mean, input_var) -> Y; with training_mode=1 (opset 14+) also
// (running_mean, running_var) = input·momentum + batch·(1 − momentum), batch variance biased.
void batch_norm_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  for (int i = 1; i < 5; ++i) check_channels(c, x, i, i < 3 ? "scale/B" : "mean/var");
  const double eps = attr_double(c, "epsilon", 1e-5f);
  const bool training = c.opset >= 14 && c.attrs.get_int("training_mode", 0) != 0;
  if (c.opset < 14 && (c.output_wanted(1) || c.output_wanted(2) || c.output_wanted(3) || c.output_wanted(4)))
    c.fail("training outputs of opset-" + std::to_string(c.opset) +
           " BatchNormalization are not supported; export with opset >= 14");
  if (!training) {
    auto y = std::get<0>(at::native_batch_norm(x, opt(c, 1), opt(c, 2), c.input(3), c.input(4), false, 0.0, eps));
    return c.set_output(0, y);
  }
  auto y = std::get<0>(at::native_batch_norm(x, opt(c, 1), opt(c, 2), std::nullopt, std::nullopt, true, 0.0, eps));
  c.set_output(0, y);
  if (!c.output_wanted(1) && !c.output_wanted(2)) return;
  const double m = attr_double(c, "momentum", 0.9f);
  auto [var, mean] = at::var_mean(x, reduce_dims(c, x), /*correction=*/0, /*keepdim=*/false);
  c.set_output(1, at::add(at::mul(c.input(3), m), mean.to(c.input(3).scalar_type()), 1.0 - m));
  c.set_output(2, at::add(at::mul(c.input(4), m), var.to(c.input(4).scalar_type()), 1.0 - m));
}

void batch_norm_training_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  for (int i = 1; i < 5; ++i) check_channels(c, x, i, i < 3 ? "scale/B" : "running mean/var");
  if (c.has_input(3) != c.has_input(4)) c.fail("running_mean and running_var must be given together");
  OptTensor rm, rv;  // updated in place by ATen: copies, the inputs stay untouched
  if (c.has_input(3)) {
    rm = c.input(3).clone();
    rv = c.input(4).clone();
  }
  auto [y, saved_mean, saved_inv_std] = at::native_batch_norm(
      x, opt(c, 1), opt(c, 2), rm, rv, true, attr_double(c, "momentum", 0.1f), attr_double(c, "epsilon", 1e-5f));
  c.set_output(0, y);
  if ((c.output_wanted(1) || c.output_wanted(2)) && !rm) c.fail("running statistics requested but not given");
  if (rm) {
    c.set_output(1, *rm);
    c.set_output(2, *rv);
  }
  c.set_output(3, saved_mean);
  c.set_output(4, saved_inv_std);
}

// (dY, X, [scale], [mean], [inv_std | var]) -> (dX, dScale, dB); attributes epsilon, training.
// training=1: batch statistics — the forward's saved mean and inv-std, or, when absent (ONNX
// BatchNormalization keeps none), recomputed from X in one pass. training=0: inputs 3 and 4 are
// the running mean and variance the forward normalized with.
void batch_norm_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const at::Tensor& x = c.input(1);
  const double eps = attr_double(c, "epsilon", 1e-5f);
  const bool training = c.attrs.get_int("training", 1) != 0;
  const std::array<bool, 3> mask{c.output_wanted(0), c.output_wanted(1), c.output_wanted(2)};
  OptTensor running_mean, running_var, save_mean, save_inv_std;
  if (!training) {
    running_mean = c.input(3);
    running_var = c.input(4);
  } else if (c.has_input(3) && c.has_input(4)) {
    save_mean = c.input(3);
    save_inv_std = c.input(4);
  } else {
    auto [var, mean] = at::var_mean(x, reduce_dims(c, x), /*correction=*/0, /*keepdim=*/false);
    save_mean = mean;
    save_inv_std = at::rsqrt(at::add(var, eps));
  }
  auto [dx, dscale, db] = at::native_batch_norm_backward(dy, x, opt(c, 2), running_mean, running_var,
                                                         save_mean, save_inv_std, training, eps, mask);
  if (mask[0]) c.set_output(0, dx);
  if (mask[1]) c.set_output(1, dscale);
  if (mask[2]) c.set_output(2, db);
}

}  // namespace

REGISTER_KERNEL("BatchNormalization", batch_norm_kernel);
REGISTER_KERNEL_IN(kOurDomain, "BatchNormTraining", batch_norm_training_kernel);
REGISTER_KERNEL_IN(kOurDomain, "BatchNormalizationGrad", batch_norm_grad_kernel);

}  // namespace torch_ort::kernels
