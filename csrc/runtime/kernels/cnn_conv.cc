// Convolutions: Conv and ConvTranspose (1-D to 3-D; group, strides, dilations, pads, auto_pad,
// output_padding, output_shape) and their gradient ops, through at::convolution(_backward) — the
// calls eager PyTorch makes, so forward and backward pick the same backend (and bits) as eager.
// ATen pads symmetrically; asymmetric pads (auto_pad SAME, foreign models) pad the input
// explicitly for Conv and crop the full output for ConvTranspose, and their gradients mirror that.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <array>
#include <optional>

#include <ATen/core/Tensor.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>

#include "csrc/runtime/kernels/common.h"
#include "csrc/runtime/kernels/cnn_spatial.h"

namespace torch_ort::kernels {
namespace {

struct ConvArgs {
  Spatial s;
  std::vector<int64_t> output_padding;  // ConvTranspose only (zeros for Conv)
  int64_t groups;
  bool transposed;
  std::vector<int64_t> zeros;           // one 0 per spatial dim (padding of the explicit path)
  std::vector<int64_t> padding() const { return s.symmetric() ? s.begin : zeros; }
};

// x: (N, C_in, D...); Conv w: (C_out, C_in/group, k...); ConvTranspose w: (C_in, C_out/group, k...).
ConvArgs conv_args(const KernelCtx& c, const at::Tensor& x, const at::Tensor& w, bool transposed) {
  if (w.dim() != x.dim())
    c.fail("weight of shape " + c10::str(w.sizes()) + " does not match input of shape " +
           c10::str(x.sizes()) + " (expected rank " + std::to_string(x.dim()) + ")");
  std::vector<int64_t> kernel(w.sizes().begin() + 2, w.sizes().end());
  if (c.attrs.has("kernel_shape") && c.attrs.get_ints("kernel_shape", {}) != kernel)
    c.fail("kernel_shape " + c10::str(c.attrs.get_ints("kernel_shape", {})) +
           " disagrees with the weight's spatial sizes " + c10::str(kernel));
  ConvArgs a{resolve_spatial(c, x.sizes(), std::move(kernel), transposed), {}, c.attrs.get_int("group", 1),
             transposed, {}};
  const int64_t n = a.s.rank();
  a.zeros.assign(n, 0);
  for (int64_t d = 0; d < n; ++d)
    if (a.s.begin[d] < 0 || a.s.end[d] < 0)
      c.fail("negative pads (begin " + c10::str(a.s.begin) + ", end " + c10::str(a.s.end) +
             ") are not supported" + (transposed ? "; is output_shape larger than the natural output?" : ""));
  a.output_padding = transposed ? c.attrs.get_ints("output_padding", a.zeros) : a.zeros;
  if (static_cast<int64_t>(a.output_padding.size()) != n)
    c.fail("output_padding " + c10::str(a.output_padding) + " needs " + std::to_string(n) + " values");
  if (a.groups < 1) c.fail("group must be >= 1, got " + std::to_string(a.groups));
  return a;
}

std::optional<at::Tensor> optional_input(const KernelCtx& c, int i) {
  return c.has_input(i) ? std::optional<at::Tensor>(c.input(i)) : std::nullopt;
}

// (X, W, [B]) -> Y
void conv_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& w = c.input(1);
  const ConvArgs a = conv_args(c, x, w, false);
  const at::Tensor xp = a.s.symmetric() ? x : pad_spatial(x, a.s, 0.0);
  c.set_output(0, at::convolution(xp, w, optional_input(c, 2), a.s.strides, a.padding(), a.s.dilations,
                                  false, a.output_padding, a.groups));
}

// (X, W, [B]) -> Y; asymmetric pads crop the full (unpadded) transposed convolution.
void conv_transpose_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& w = c.input(1);
  const ConvArgs a = conv_args(c, x, w, true);
  at::Tensor y = at::convolution(x, w, optional_input(c, 2), a.s.strides, a.padding(), a.s.dilations,
                                 true, a.output_padding, a.groups);
  c.set_output(0, a.s.symmetric() ? y : crop_spatial(y, a.s));
}

// (dY, X, W) -> (dX, dW, dB), each computed only when its output is wanted.
// dX = conv_transpose(dY, W), dW = conv(X, dY) per group, dB = Σ dY over N and space.
template <bool kTransposed>
void conv_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const at::Tensor& x = c.input(1);
  const at::Tensor& w = c.input(2);
  const ConvArgs a = conv_args(c, x, w, kTransposed);
  const std::array<bool, 3> mask{c.output_wanted(0), c.output_wanted(1), c.output_wanted(2)};
  const std::vector<int64_t> bias_sizes{kTransposed ? w.size(1) * a.groups : w.size(0)};
  at::Tensor xp = x, dyp = dy;
  if (!a.s.symmetric()) {
    if (kTransposed) dyp = pad_spatial(dy, a.s, 0.0);  // the cropped border had no gradient
    else xp = pad_spatial(x, a.s, 0.0);
  }
  auto [dx, dw, db] = at::convolution_backward(dyp, xp, w, bias_sizes, a.s.strides, a.padding(),
                                               a.s.dilations, kTransposed, a.output_padding,
                                               a.groups, mask);
  if (mask[0]) c.set_output(0, !kTransposed && !a.s.symmetric() ? crop_spatial(dx, a.s) : dx);
  if (mask[1]) c.set_output(1, dw);
  if (mask[2]) c.set_output(2, db);
}

}  // namespace

REGISTER_KERNEL("Conv", conv_kernel);
REGISTER_KERNEL("ConvTranspose", conv_transpose_kernel);
REGISTER_KERNEL_IN(kOurDomain, "ConvGrad", conv_grad_kernel<false>);
REGISTER_KERNEL_IN(kOurDomain, "ConvTransposeGrad", conv_grad_kernel<true>);

}  // namespace torch_ort::kernels
