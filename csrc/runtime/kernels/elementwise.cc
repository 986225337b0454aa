// Elementwise kernels: arithmetic with numpy broadcasting, unary math, comparisons, Where,
// Cast, Identity, variadic Sum and Dropout. ONNX gives both operands one dtype, so ATen type
// promotion never changes a result type except where noted (Pow, integer Div).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/add.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/log.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/native_dropout.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include "csrc/runtime/dtype.h"
#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

// Operands i and j, checked to be placed together.
std::pair<at::Tensor, at::Tensor> operands(const KernelCtx& c, int i = 0, int j = 1) {
  const at::Tensor& a = c.input(i);
  const at::Tensor& b = c.input(j);
  check_placed(c, a, b);
  return {a, b};
}

template <at::Tensor (*F)(const at::Tensor&)>
void unary(KernelCtx& c) { c.set_output(0, F(c.input(0))); }

// The operand whose buffer the result may overwrite (the plan's in-place choice, checked again
// by may_overwrite_input), or -1. Asked before the kernel copies any operand handle, so that the
// slot is the only holder. `commutative`: operand 1 qualifies too (a+b and b+a, a·b and b·a are
// the same IEEE result, so either way gives identical values).
int overwritable(const KernelCtx& c, bool commutative) {
  const at::Tensor& a = c.input(0);
  const at::Tensor& b = c.input(1);
  if (a.scalar_type() != b.scalar_type() || !at::isFloatingType(a.scalar_type())) return -1;
  const std::vector<int64_t> sizes = at::infer_size(a.sizes(), b.sizes());
  if (c.may_overwrite_input(0, sizes, a.scalar_type())) return 0;
  if (commutative && c.may_overwrite_input(1, sizes, b.scalar_type())) return 1;
  return -1;
}

void add_kernel(KernelCtx& c) {
  const int into = overwritable(c, true);
  auto [a, b] = operands(c);
  c.set_output(0, into == 0 ? a.add_(b) : into == 1 ? b.add_(a) : at::add(a, b));
}

void mul_kernel(KernelCtx& c) {
  const int into = overwritable(c, true);
  auto [a, b] = operands(c);
  c.set_output(0, into == 0 ? a.mul_(b) : into == 1 ? b.mul_(a) : at::mul(a, b));
}

void sub_kernel(KernelCtx& c) {
  const int into = overwritable(c, false);
  auto [a, b] = operands(c);
  c.set_output(0, into == 0 ? a.sub_(b) : at::sub(a, b));
}

void div_kernel(KernelCtx& c) {
  const int into = overwritable(c, false);  // floating operands only
  auto [a, b] = operands(c);
  // ONNX integer Div truncates toward zero (C semantics); ATen's true division would not.
  if (at::isIntegralType(a.scalar_type(), /*includeBool=*/true))
    c.set_output(0, at::div(a, b, "trunc"));
  else
    c.set_output(0, into == 0 ? a.div_(b) : at::div(a, b));
}

void pow_kernel(KernelCtx& c) {
  auto [x, y] = operands(c);
  // ONNX Pow may take an exponent of another dtype; the result keeps the base's dtype. A single
  // exponent held on the host (RMSNorm's x², its gradient's x¹) goes as a number: ATen then
  // squares, copies or takes the root as eager's x.pow(2) does, ~10x faster than std::pow per element.
  const bool number = y.is_cpu() && y.numel() == 1 && y.dim() <= x.dim();
  at::Tensor r = number ? at::pow(x, y.item()) : at::pow(x, y);
  c.set_output(0, r.scalar_type() == x.scalar_type() ? r : r.to(x.scalar_type()));
}

void equal_kernel(KernelCtx& c) { auto [a, b] = operands(c); c.set_output(0, at::eq(a, b)); }
void greater_kernel(KernelCtx& c) { auto [a, b] = operands(c); c.set_output(0, at::gt(a, b)); }
void less_kernel(KernelCtx& c) { auto [a, b] = operands(c); c.set_output(0, at::lt(a, b)); }

void where_kernel(KernelCtx& c) {
  at::Tensor cond = c.input(0);
  if (cond.scalar_type() != at::kBool) c.fail("condition must be bool, got " +
                                              std::string(c10::toString(cond.scalar_type())));
  auto [x, y] = operands(c, 1, 2);
  check_placed(c, cond, x);
  c.set_output(0, at::where(cond, x, y));
}

void identity_kernel(KernelCtx& c) { c.set_output(0, c.input(0)); }

void cast_kernel(KernelCtx& c) {
  if (!c.attrs.has("to")) c.fail("attribute 'to' is required");
  const auto to = static_cast<DType>(c.attrs.get_int("to", 0));
  c.set_output(0, c.input(0).to(to_aten(to, "Cast target of " + c.node.describe())));
}

void sum_kernel(KernelCtx& c) {
  // Variadic with broadcasting; a single operand passes through. Absent output gradients (zero
  // views, common.h) are skipped where the sum's shape does not depend on them. Summed in operand
  // order either way; into operand 0's buffer when the plan allows it (asked before any handle
  // of it is copied).
  if (c.num_inputs() == 0) c.fail("needs at least one input");
  std::vector<int64_t> shape = c.input(0).sizes().vec();
  for (int i = 1; i < c.num_inputs(); ++i) shape = at::infer_size(shape, c.input(i).sizes());
  const bool in_place = c.num_inputs() > 1 && at::isFloatingType(c.input(0).scalar_type()) &&
                        c.may_overwrite_input(0, shape, c.input(0).scalar_type());
  std::vector<at::Tensor> terms;
  for (int i = 0; i < c.num_inputs(); ++i)
    if (!is_absent_gradient(c.input(i))) terms.push_back(c.input(i));
  if (terms.empty()) return c.set_output(0, c.input(0).expand(shape));
  at::Tensor acc = terms[0];
  for (size_t i = 1; i < terms.size(); ++i) {
    check_placed(c, terms[i], acc);
    acc = in_place ? acc.add_(terms[i]) : at::add(acc, terms[i]);
  }
  if (!acc.sizes().equals(shape)) acc = at::add(acc, absent_gradient(shape, acc.options()));  // grow
  c.set_output(0, acc);
}

void dropout_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  // ratio is an input since opset 12 (an attribute before); training_mode defaults to false.
  const double p = c.input_scalar(1, c.attrs.get_float("ratio", 0.5f));
  const bool training = c.input_flag(2, false);
  if (p < 0.0 || p > 1.0) c.fail("ratio must be in [0, 1], got " + std::to_string(p));
  if (!training || p == 0.0) {
    c.set_output(0, x);
    if (c.output_wanted(1)) c.set_output(1, at::ones_like(x, x.options().dtype(at::kBool)));
    return;
  }
  // Draw exactly what eager F.dropout draws from the torch generator, so a seeded run matches:
  // at::dropout is native_dropout on the devices below (with 0 < p < 1), and elsewhere (CPU)
  // x * (bernoulli(1 - p) / (1 - p)): the same draws, scaled in the input's dtype.
  if (fused_dropout_device(x) && p < 1.0) {
    auto [out, mask] = at::native_dropout(x, p, true);
    c.set_output(0, std::move(out));
    return c.set_output(1, std::move(mask));
  }
  if (p == 1.0) {  // eager: x * 0 (nothing kept)
    c.set_output(0, at::mul(x, at::zeros({}, x.options())));
    return c.set_output(1, at::zeros_like(x, x.options().dtype(at::kBool)));
  }
  at::Tensor noise = at::empty_like(x);
  noise.bernoulli_(1.0 - p);
  c.set_output(1, noise.to(at::kBool));
  noise.div_(1.0 - p);
  c.set_output(0, at::mul(x, noise));
}

}  // namespace

REGISTER_KERNEL("Add", add_kernel);
REGISTER_KERNEL("Sub", sub_kernel);
REGISTER_KERNEL("Mul", mul_kernel);
REGISTER_KERNEL("Div", div_kernel);
REGISTER_KERNEL("Pow", pow_kernel);
REGISTER_KERNEL("Neg", unary<at::neg>);
REGISTER_KERNEL("Sqrt", unary<at::sqrt>);
REGISTER_KERNEL("Reciprocal", unary<at::reciprocal>);
REGISTER_KERNEL("Exp", unary<at::exp>);
REGISTER_KERNEL("Log", unary<at::log>);
REGISTER_KERNEL("Abs", unary<at::abs>);
REGISTER_KERNEL("Relu", unary<at::relu>);
REGISTER_KERNEL("Tanh", unary<at::tanh>);
REGISTER_KERNEL("Sigmoid", unary<at::sigmoid>);
REGISTER_KERNEL("Not", unary<at::logical_not>);
REGISTER_KERNEL("Equal", equal_kernel);
REGISTER_KERNEL("Greater", greater_kernel);
REGISTER_KERNEL("Less", less_kernel);
REGISTER_KERNEL("Where", where_kernel);
REGISTER_KERNEL("Identity", identity_kernel);
REGISTER_KERNEL("Cast", cast_kernel);
REGISTER_KERNEL("Sum", sum_kernel);
REGISTER_KERNEL("Dropout", dropout_kernel);

}  // namespace torch_ort::kernels
