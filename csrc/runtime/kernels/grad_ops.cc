// Gradient ops of our domain (com.torch_ort), emitted by the autodiff: each is the backward of
// one forward op, computed from the forward's output (Y) or input shape, never re-running it.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <algorithm>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_log_softmax_backward_data.h>
#include <ATen/ops/_softmax_backward_data.h>
#include <ATen/ops/div.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/native_dropout_backward.h>
#include <ATen/ops/sigmoid_backward.h>
#include <ATen/ops/tanh_backward.h>
#include <ATen/ops/threshold_backward.h>
#include <ATen/ops/zeros_like.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

// dX = dY * (Y > 0); Y > 0 exactly where X > 0, so the output serves as the mask.
void relu_grad_kernel(KernelCtx& c) {
  c.set_output(0, at::threshold_backward(c.input(0), c.input(1), 0));
}
// dX = dY * Y * (1 - Y)
void sigmoid_grad_kernel(KernelCtx& c) { c.set_output(0, at::sigmoid_backward(c.input(0), c.input(1))); }
// dX = dY * (1 - Y²)
void tanh_grad_kernel(KernelCtx& c) { c.set_output(0, at::tanh_backward(c.input(0), c.input(1))); }

// dX = Y * (dY - sum(dY * Y, axis))
void softmax_grad_kernel(KernelCtx& c) {
  const at::Tensor& y = c.input(1);
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", -1), y.dim());
  c.set_output(0, at::_softmax_backward_data(c.input(0), y, axis, y.scalar_type()));
}
// dX = dY - exp(Y) * sum(dY, axis)
void log_softmax_grad_kernel(KernelCtx& c) {
  const at::Tensor& y = c.input(1);
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", -1), y.dim());
  c.set_output(0, at::_log_softmax_backward_data(c.input(0), y, axis, y.scalar_type()));
}

// (dY, mask, [ratio], [training_mode]) -> dX = dY * mask / (1 - ratio); the forward's own
// ratio/training_mode inputs, so that an inference-mode Dropout passes dY straight through.
// Computed as eager autograd does on each device (see the Dropout kernel): native_dropout's
// backward where the forward was native_dropout, else dY * (mask / (1 - p)) in dY's dtype.
// Never draws a new mask.
void dropout_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const double p = c.input_scalar(2, 0.5);
  const bool training = c.input_flag(3, false);
  if (!training || p == 0.0) return c.set_output(0, dy);
  const at::Tensor& mask = c.input(1);
  if (fused_dropout_device(dy) && p < 1.0)
    return c.set_output(0, at::native_dropout_backward(dy, mask, 1.0 / (1.0 - p)));
  if (p == 1.0) return c.set_output(0, at::zeros_like(dy));
  c.set_output(0, at::mul(dy, mask.to(dy.scalar_type()).div_(1.0 - p)));
}

// Reduces a broadcast gradient back to an operand's shape (inverse of numpy broadcasting).
void sum_to_shape_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const std::vector<int64_t> shape = c.input_ints(1);
  if (dy.sizes().equals(shape)) return c.set_output(0, dy);
  c.set_output(0, dy.sum_to_size(shape));
}

// dY of Reduce{Sum,Mean}(X) spread back over X's shape: re-insert the reduced axes when the
// forward dropped them, then broadcast (a view: nothing is copied).
at::Tensor spread_reduced(KernelCtx& c, at::Tensor dy, const std::vector<int64_t>& x_shape) {
  const int64_t r = static_cast<int64_t>(x_shape.size());
  // Axes: the forward's own axes input when it was not a constant, else the attribute.
  std::vector<int64_t> axes = c.has_input(2) ? c.input_ints(2) : c.attrs.get_ints("axes", {});
  if (axes.empty() && c.attrs.get_int("noop_with_empty_axes", 0) != 0) return dy;  // was an identity
  if (axes.empty())
    for (int64_t d = 0; d < r; ++d) axes.push_back(d);  // empty: every axis was reduced
  axes = norm_axes(c, std::move(axes), r);
  if (c.attrs.get_int("keepdims", 1) == 0) {
    std::sort(axes.begin(), axes.end());
    axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
    for (int64_t a : axes) dy = dy.unsqueeze(a);  // ascending keeps later indices right
  }
  if (dy.dim() != r)
    c.fail("gradient of shape " + c10::str(dy.sizes()) + " does not fit input shape " +
           c10::str(x_shape) + " with axes " + c10::str(axes));
  return dy.expand(x_shape);
}

void reduce_sum_grad_kernel(KernelCtx& c) {
  c.set_output(0, spread_reduced(c, c.input(0), c.input_ints(1)));
}

void reduce_mean_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const std::vector<int64_t> x_shape = c.input_ints(1);
  int64_t numel_x = 1;
  for (int64_t d : x_shape) numel_x *= d;
  // Divide the small dY before broadcasting; the count is numel(X) / numel(dY).
  const int64_t count = dy.numel() == 0 ? 1 : numel_x / dy.numel();
  c.set_output(0, spread_reduced(c, at::div(dy, count), x_shape));
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, "ReluGrad", relu_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "SigmoidGrad", sigmoid_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "TanhGrad", tanh_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "SoftmaxGrad", softmax_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "LogSoftmaxGrad", log_softmax_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "DropoutGrad", dropout_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "SumToShape", sum_to_shape_kernel);
REGISTER_KERNEL_IN(kOurDomain, "ReduceSumGrad", reduce_sum_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "ReduceMeanGrad", reduce_mean_grad_kernel);

}  // namespace torch_ort::kernels
