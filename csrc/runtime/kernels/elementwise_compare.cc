// Comparison and logic kernels (GreaterOrEqual, LessOrEqual, And, Or, Xor, IsNaN, IsInf), variadic
// Max/Min with their shared gradient op, and CastLike. Equal/Greater/Less/Not live with the
// elementwise kernels.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/div.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/isneginf.h>
#include <ATen/ops/isposinf.h>
#include <ATen/ops/le.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/logical_xor.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/zeros_like.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

// Two operands, checked to be placed together (shape arithmetic: both on the host).
std::pair<at::Tensor, at::Tensor> aligned(const KernelCtx& c, const at::Tensor& a, const at::Tensor& b) {
  check_placed(c, a, b);
  return {a, b};
}

template <at::Tensor (*F)(const at::Tensor&, const at::Tensor&)>
void binary(KernelCtx& c) {
  auto [a, b] = aligned(c, c.input(0), c.input(1));
  c.set_output(0, F(a, b));
}

void is_nan_kernel(KernelCtx& c) { c.set_output(0, at::isnan(c.input(0))); }

// IsInf: detect_positive / detect_negative (both default 1) pick which infinities count.
void is_inf_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const bool pos = c.attrs.get_int("detect_positive", 1) != 0,
             neg = c.attrs.get_int("detect_negative", 1) != 0;
  if (pos && neg) return c.set_output(0, at::logical_or(at::isposinf(x), at::isneginf(x)));
  if (pos) return c.set_output(0, at::isposinf(x));
  if (neg) return c.set_output(0, at::isneginf(x));
  c.set_output(0, at::zeros_like(x, x.options().dtype(at::kBool)));
}

// Variadic Max/Min with numpy broadcasting; one operand passes through.
template <at::Tensor (*F)(const at::Tensor&, const at::Tensor&)>
void variadic(KernelCtx& c) {
  if (c.num_inputs() == 0) c.fail("needs at least one input");
  at::Tensor acc = c.input(0);
  for (int i = 1; i < c.num_inputs(); ++i) {
    auto [a, b] = aligned(c, acc, c.input(i));
    acc = F(a, b);
  }
  c.set_output(0, acc);
}

// (dY, Y, X_0, ..., X_n-1) -> dX_i = sum_to_size(dY · [X_i == Y] / #ties, shape(X_i)). Serves
// Max and Min alike: Y says which operands won.
void min_max_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const at::Tensor& y = c.input(1);
  const int n = c.num_inputs() - 2;
  std::vector<at::Tensor> hits;
  at::Tensor count;
  for (int i = 0; i < n; ++i) {
    check_placed(c, c.input(2 + i), y);
    hits.push_back(at::eq(c.input(2 + i), y));
    count = count.defined() ? at::add(count, hits.back()) : hits.back().to(dy.scalar_type());
  }
  const at::Tensor share = at::div(dy, count);  // count >= 1: Y is one of the X_i
  for (int i = 0; i < n; ++i) {
    if (!c.output_wanted(i)) continue;
    const c10::IntArrayRef x_sizes = c.input(2 + i).sizes();
    at::Tensor g = at::mul(share, hits[i]);
    c.set_output(i, g.sizes().equals(x_sizes) ? g : g.sum_to_size(x_sizes));
  }
}

void cast_like_kernel(KernelCtx& c) {
  c.set_output(0, c.input(0).to(c.input(1).scalar_type()));
}

}  // namespace

REGISTER_KERNEL("GreaterOrEqual", binary<at::ge>);
REGISTER_KERNEL("LessOrEqual", binary<at::le>);
REGISTER_KERNEL("And", binary<at::logical_and>);
REGISTER_KERNEL("Or", binary<at::logical_or>);
REGISTER_KERNEL("Xor", binary<at::logical_xor>);
REGISTER_KERNEL("IsNaN", is_nan_kernel);
REGISTER_KERNEL("IsInf", is_inf_kernel);
REGISTER_KERNEL("Max", variadic<at::maximum>);
REGISTER_KERNEL("Min", variadic<at::minimum>);
REGISTER_KERNEL("CastLike", cast_like_kernel);
REGISTER_KERNEL_IN(kOurDomain, "MinMaxGrad", min_max_grad_kernel);

}  // namespace torch_ort::kernels
