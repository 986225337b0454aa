// Unary math and the activations with attributes (trigonometric and hyperbolic functions,
// rounding, Sign, Softplus, Softsign, Elu, Celu, Selu, LeakyRelu, HardSigmoid, HardSwish, Mish,
// ThresholdedRelu, Clip, PRelu), Mod, and the bitwise ops. Each is ATen's op where ATen's
// definition is ONNX's; where an ONNX attribute has no ATen parameter, the formula is written out.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/acos.h>
#include <ATen/ops/acosh.h>
#include <ATen/ops/add.h>
#include <ATen/ops/asin.h>
#include <ATen/ops/asinh.h>
#include <ATen/ops/atan.h>
#include <ATen/ops/atanh.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_left_shift.h>
#include <ATen/ops/bitwise_not.h>
#include <ATen/ops/bitwise_or.h>
#include <ATen/ops/bitwise_right_shift.h>
#include <ATen/ops/bitwise_xor.h>
#include <ATen/ops/ceil.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/cosh.h>
#include <ATen/ops/div.h>
#include <ATen/ops/elu.h>
#include <ATen/ops/floor.h>
#include <ATen/ops/fmod.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/hardswish.h>
#include <ATen/ops/leaky_relu.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/mish.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/remainder.h>
#include <ATen/ops/round.h>
#include <ATen/ops/sign.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/sinh.h>
#include <ATen/ops/softplus.h>
#include <ATen/ops/tan.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

void require_float(const KernelCtx& c, const at::Tensor& x) {
  if (!at::isFloatingType(x.scalar_type()))
    c.fail("needs a floating-point input, got " + std::string(c10::toString(x.scalar_type())));
}

// ONNX Softplus is log(1 + exp(x)); ATen's returns x itself above its threshold (20), where the
// two differ by less than exp(-20) relative: below float32's resolution there.
void softplus_kernel(KernelCtx& c) { c.set_output(0, at::softplus(c.input(0), 1, 20)); }

void softsign_kernel(KernelCtx& c) {  // x / (1 + |x|)
  const at::Tensor& x = c.input(0);
  c.set_output(0, at::div(x, at::add(at::abs(x), 1)));
}

void elu_kernel(KernelCtx& c) {
  c.set_output(0, at::elu(c.input(0), c.attrs.get_float("alpha", 1.0f)));
}

void celu_kernel(KernelCtx& c) {  // max(0, x) + min(0, alpha·(exp(x/alpha) − 1)) = elu with input_scale 1/alpha
  const double alpha = c.attrs.get_float("alpha", 1.0f);
  if (alpha == 0.0) c.fail("alpha must not be 0");
  c.set_output(0, at::elu(c.input(0), alpha, 1, 1.0 / alpha));
}

void selu_kernel(KernelCtx& c) {  // gamma · (x > 0 ? x : alpha·(exp(x) − 1))
  c.set_output(0, at::elu(c.input(0), c.attrs.get_float("alpha", 1.67326319217681884765625f),
                          c.attrs.get_float("gamma", 1.05070102214813232421875f)));
}

void leaky_relu_kernel(KernelCtx& c) {
  c.set_output(0, at::leaky_relu(c.input(0), c.attrs.get_float("alpha", 0.01f)));
}

void hard_sigmoid_kernel(KernelCtx& c) {  // max(0, min(1, alpha·x + beta))
  const at::Tensor& x = c.input(0);
  c.set_output(0, at::clamp(at::add(at::mul(x, c.attrs.get_float("alpha", 0.2f)), c.attrs.get_float("beta", 0.5f)),
                            0, 1));
}

void thresholded_relu_kernel(KernelCtx& c) {  // x > alpha ? x : 0
  const at::Tensor& x = c.input(0);
  c.set_output(0, at::where(at::gt(x, c.attrs.get_float("alpha", 1.0f)), x, at::zeros_like(x)));
}

void prelu_kernel(KernelCtx& c) {  // x < 0 ? slope·x : x, the slope broadcast to x
  const at::Tensor& x = c.input(0);
  const at::Tensor& slope = c.input(1);
  check_placed(c, x, slope);
  c.set_output(0, at::where(at::lt(x, 0), at::mul(x, slope), x));
}

// Clip(X, [min], [max]): bounds are inputs since opset 11 (attributes before); an absent bound
// does not bind. A min above max gives max everywhere, as in ONNX and torch.clamp.
void clip_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  if (c.opset < 11) {
    const float lo = c.attrs.get_float("min", -std::numeric_limits<float>::infinity());
    const float hi = c.attrs.get_float("max", std::numeric_limits<float>::infinity());
    return c.set_output(0, at::clamp(x, lo, hi));
  }
  std::optional<at::Tensor> lo, hi;
  if (c.has_input(1)) lo = c.input(1);
  if (c.has_input(2)) hi = c.input(2);
  for (const auto& b : {lo, hi}) {
    if (!b) continue;
    if (b->numel() != 1) c.fail("min and max must be scalars, got " + std::to_string(b->numel()) + " elements");
    check_placed(c, x, *b);
  }
  if (!lo && !hi) return c.set_output(0, x);
  c.set_output(0, at::clamp(x, lo ? std::optional<at::Tensor>(lo->reshape({})) : std::nullopt,
                            hi ? std::optional<at::Tensor>(hi->reshape({})) : std::nullopt));
}

// Mod(A, B; fmod): fmod = 0 takes the divisor's sign (Python's %, integers only); fmod = 1 the
// dividend's (C's fmod), required for floating-point operands.
void mod_kernel(KernelCtx& c) {
  const at::Tensor& a = c.input(0);
  const at::Tensor& b = c.input(1);
  check_placed(c, a, b);
  const bool fmod = c.attrs.get_int("fmod", 0) != 0;
  if (!fmod && at::isFloatingType(a.scalar_type()))
    c.fail("fmod must be 1 for floating-point operands (ONNX Mod), got 0");
  c.set_output(0, fmod ? at::fmod(a, b) : at::remainder(a, b));
}

void require_integral(const KernelCtx& c, const at::Tensor& x) {
  if (!at::isIntegralType(x.scalar_type(), /*includeBool=*/true))
    c.fail("needs integer or bool operands, got " + std::string(c10::toString(x.scalar_type())));
}

template <at::Tensor (*F)(const at::Tensor&, const at::Tensor&)>
void bitwise(KernelCtx& c) {
  const at::Tensor& a = c.input(0);
  const at::Tensor& b = c.input(1);
  require_integral(c, a);
  check_placed(c, a, b);
  c.set_output(0, F(a, b));
}

void bitwise_not_kernel(KernelCtx& c) {
  require_integral(c, c.input(0));
  c.set_output(0, at::bitwise_not(c.input(0)));
}

void bit_shift_kernel(KernelCtx& c) {
  const std::string direction = c.attrs.get_string("direction", "");
  if (direction != "LEFT" && direction != "RIGHT")
    c.fail("direction must be \"LEFT\" or \"RIGHT\", got \"" + direction + "\"");
  const at::Tensor& a = c.input(0);
  const at::Tensor& b = c.input(1);
  require_integral(c, a);
  check_placed(c, a, b);
  c.set_output(0, direction == "LEFT" ? at::bitwise_left_shift(a, b) : at::bitwise_right_shift(a, b));
}

template <at::Tensor (*F)(const at::Tensor&)>
void float_unary(KernelCtx& c) {
  require_float(c, c.input(0));
  c.set_output(0, F(c.input(0)));
}

void sign_kernel(KernelCtx& c) { c.set_output(0, at::sign(c.input(0))); }  // integers too

// Rounding is the identity on integers (ATen's floor/ceil/round are too; ONNX types them float only).
at::Tensor round_even(const at::Tensor& x) { return at::round(x); }  // halves to even, as ONNX

}  // namespace

REGISTER_KERNEL("Sin", float_unary<at::sin>);
REGISTER_KERNEL("Cos", float_unary<at::cos>);
REGISTER_KERNEL("Tan", float_unary<at::tan>);
REGISTER_KERNEL("Asin", float_unary<at::asin>);
REGISTER_KERNEL("Acos", float_unary<at::acos>);
REGISTER_KERNEL("Atan", float_unary<at::atan>);
REGISTER_KERNEL("Sinh", float_unary<at::sinh>);
REGISTER_KERNEL("Cosh", float_unary<at::cosh>);
REGISTER_KERNEL("Asinh", float_unary<at::asinh>);
REGISTER_KERNEL("Acosh", float_unary<at::acosh>);
REGISTER_KERNEL("Atanh", float_unary<at::atanh>);
REGISTER_KERNEL("Floor", float_unary<at::floor>);
REGISTER_KERNEL("Ceil", float_unary<at::ceil>);
REGISTER_KERNEL("Round", float_unary<round_even>);
REGISTER_KERNEL("Sign", sign_kernel);
REGISTER_KERNEL("Softplus", softplus_kernel);
REGISTER_KERNEL("Softsign", softsign_kernel);
REGISTER_KERNEL("Elu", elu_kernel);
REGISTER_KERNEL("Celu", celu_kernel);
REGISTER_KERNEL("Selu", selu_kernel);
REGISTER_KERNEL("LeakyRelu", leaky_relu_kernel);
REGISTER_KERNEL("HardSigmoid", hard_sigmoid_kernel);
REGISTER_KERNEL("HardSwish", float_unary<at::hardswish>);
REGISTER_KERNEL("Mish", float_unary<at::mish>);
REGISTER_KERNEL("ThresholdedRelu", thresholded_relu_kernel);
REGISTER_KERNEL("PRelu", prelu_kernel);
REGISTER_KERNEL("Clip", clip_kernel);
REGISTER_KERNEL("Mod", mod_kernel);
REGISTER_KERNEL("BitwiseAnd", bitwise<at::bitwise_and>);
REGISTER_KERNEL("BitwiseOr", bitwise<at::bitwise_or>);
REGISTER_KERNEL("BitwiseXor", bitwise<at::bitwise_xor>);
REGISTER_KERNEL("BitwiseNot", bitwise_not_kernel);
REGISTER_KERNEL("BitShift", bit_shift_kernel);

}  // namespace torch_ort::kernels
