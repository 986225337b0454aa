// BiasDropout (bias_dropout_fusion.cc): Y = Dropout(X + Bias) + Residual, Mask 1 byte/element.
// Seeded runs keep drawing exactly what eager's F.dropout draws (see the Dropout kernel in
// elementwise.cc). On the CPU: one bernoulli_(1 − p) over X's shape, written straight into the
// mask (the draws do not depend on the destination dtype), then for fp32 on AVX-512 one pass for
// add/scale/add (cpu/layer_norm.cc) in eager's order of operations, else eager's own ops. On CUDA
// and the other fused-dropout devices: ATen's native_dropout of (X + Bias) — the unfused
// reference, which is what eager runs there; no custom CUDA kernel — then + Residual.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/native_dropout.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include "csrc/runtime/kernels/common.h"
#include "csrc/runtime/kernels/cpu/layer_norm.h"

namespace torch_ort::kernels {
namespace {

// (X, [Bias], [Residual], [ratio], [training_mode]) -> (Y, [Mask])
void bias_dropout_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  if (x.dim() < 1) c.fail("input X must have rank >= 1, got a scalar");
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  at::Tensor bias, res;
  if (c.has_input(1)) {
    bias = c.input(1);
    if (bias.numel() != cols || bias.scalar_type() != x.scalar_type())
      c.fail("Bias of shape " + c10::str(bias.sizes()) + " (" + c10::toString(bias.scalar_type()) +
             ") must hold " + std::to_string(cols) + " " + c10::toString(x.scalar_type()) +
             " values (the last dim of X)");
    bias = bias.reshape({cols});
  }
  if (c.has_input(2)) {
    res = c.input(2);
    if (!res.sizes().equals(x.sizes()) || res.scalar_type() != x.scalar_type())
      c.fail("Residual of shape " + c10::str(res.sizes()) + " (" + c10::toString(res.scalar_type()) +
             ") does not match X of shape " + c10::str(x.sizes()) + " (" + c10::toString(x.scalar_type()) +
             ")");
  }
  const double p = c.input_scalar(3, 0.5);
  const bool training = c.input_flag(4, false);
  if (p < 0.0 || p > 1.0) c.fail("ratio must be in [0, 1], got " + std::to_string(p));
  auto finish = [&](at::Tensor y, at::Tensor mask) {
    c.set_output(0, res.defined() ? at::add(y, res) : std::move(y));
    c.set_output(1, std::move(mask));
  };
  if (!training || p == 0.0)
    return finish(bias.defined() ? at::add(x, bias) : x,
                  c.output_wanted(1) ? at::ones_like(x, x.options().dtype(at::kBool)) : at::Tensor());
  if (p == 1.0) {  // eager: x * 0 (nothing kept)
    const at::Tensor in = bias.defined() ? at::add(x, bias) : x;
    return finish(at::mul(in, at::zeros({}, x.options())), at::zeros_like(x, x.options().dtype(at::kBool)));
  }
  if (fused_dropout_device(x)) {
    auto [out, mask] = at::native_dropout(bias.defined() ? at::add(x, bias) : x, p, true);
    return finish(std::move(out), std::move(mask));
  }
  at::Tensor mask = at::empty(x.sizes(), x.options().dtype(at::kBool));
  mask.bernoulli_(1.0 - p);  // eager's draw: bernoulli_(1 − p) over X's shape
  if (x.scalar_type() == at::kFloat && rows > 0 && cpu::fused_loops_available()) {
    // The kept value eager multiplies by: 1 divided by (1 − p) in float, as noise.div_(1 − p).
    const float scale = at::ones({}, x.options()).div_(1.0 - p).item<float>();
    const at::Tensor xc = x.contiguous(), rc = res.defined() ? res.contiguous() : res;
    const at::Tensor bc = bias.defined() ? bias.contiguous() : bias;
    at::Tensor y = at::empty(x.sizes(), x.options());
    cpu::bias_dropout_forward(xc.data_ptr<float>(), bc.defined() ? bc.data_ptr<float>() : nullptr,
                              rc.defined() ? rc.data_ptr<float>() : nullptr, mask.data_ptr<bool>(), scale,
                              rows, cols, y.data_ptr<float>());
    c.set_output(0, std::move(y));
    return c.set_output(1, std::move(mask));
  }
  // Reference (other dtypes, no AVX-512): eager's x * (noise / (1 − p)) in X's dtype, then + Residual.
  at::Tensor noise = mask.to(x.scalar_type()).div_(1.0 - p);
  finish(at::mul(bias.defined() ? at::add(x, bias) : x, noise), std::move(mask));
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, "BiasDropout", bias_dropout_kernel);

}  // namespace torch_ort::kernels
