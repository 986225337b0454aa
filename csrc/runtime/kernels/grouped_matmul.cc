// Our GroupedMatMul and its gradient: the experts of a mixture-of-experts layer, whose rows
// arrive sorted by expert (transformers' grouped_mm operator, exported to this op by
// torch_ort/ortmodule/export/translations/library.py).
//   GroupedMatMul(X (S, K), W (E, K, N), offs (E)) -> Y (S, N)
//   Y[offs[e-1]:offs[e]] = X[offs[e-1]:offs[e]]·W[e]  (offs[-1] = 0); rows from offs[E-1] on are 0
//   GroupedMatMulGrad(dY, X, W, offs) -> (dX, dW): dX[rows of e] = dY[rows of e]·W[e]ᵀ,
//   dW[e] = X[rows of e]ᵀ·dY[rows of e]; an expert without rows gets a zero dW[e].
// One GEMM per expert with rows, written straight into the output (as transformers' own loop and
// ATen's CPU grouped_mm do, so the values are theirs bit for bit); only what no GEMM writes is
// zeroed. offs is read on the host: free on the CPU; elsewhere placement copies it once per phase.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mm.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

// The group boundaries [0, offs[0], ..., offs[E-1]], checked: non-decreasing and within the rows.
// offs is a declared host input (csrc/core/ops/linalg.cc), so placement keeps it on the host.
std::vector<int64_t> group_bounds(const KernelCtx& c, int offs_input, int64_t groups, int64_t rows) {
  const at::Tensor& offs = c.input(offs_input);
  if (offs.dim() != 1 || offs.size(0) != groups)
    c.fail("offs must hold one end row per group (" + std::to_string(groups) + "), got shape " +
           c10::str(offs.sizes()));
  std::vector<int64_t> bounds{0};
  for (const int64_t end : c.input_ints(offs_input)) {
    if (end < bounds.back() || end > rows)
      c.fail("offs must be non-decreasing end rows within the " + std::to_string(rows) + " rows, got " +
             std::to_string(end) + " after " + std::to_string(bounds.back()) + " (group " +
             std::to_string(bounds.size() - 1) + ")");
    bounds.push_back(end);
  }
  return bounds;
}

void check_operands(const KernelCtx& c, const at::Tensor& x, const at::Tensor& w) {
  if (x.dim() != 2 || w.dim() != 3)
    c.fail("X must be 2-D (rows, K) and W 3-D (groups, K, N), got " + c10::str(x.sizes()) + " and " +
           c10::str(w.sizes()));
  if (x.size(1) != w.size(1))
    c.fail("inner dimensions differ: X " + c10::str(x.sizes()) + ", W " + c10::str(w.sizes()));
  if (x.scalar_type() != w.scalar_type())
    c.fail(std::string("X is ") + c10::toString(x.scalar_type()) + " but W is " + c10::toString(w.scalar_type()));
  check_placed(c, x, w);
}

void grouped_matmul_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const at::Tensor& w = c.input(1);
  check_operands(c, x, w);
  const std::vector<int64_t> b = group_bounds(c, 2, w.size(0), x.size(0));
  at::Tensor y = at::empty({x.size(0), w.size(2)}, x.options());
  for (int64_t e = 0; e < w.size(0); ++e) {
    if (b[e + 1] == b[e]) continue;
    at::Tensor rows = y.narrow(0, b[e], b[e + 1] - b[e]);
    at::mm_out(rows, x.narrow(0, b[e], b[e + 1] - b[e]), w[e]);
  }
  if (b.back() < x.size(0)) y.narrow(0, b.back(), x.size(0) - b.back()).zero_();
  c.set_output(0, y);
}

void grouped_matmul_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const at::Tensor& x = c.input(1);
  const at::Tensor& w = c.input(2);
  check_operands(c, x, w);
  if (dy.dim() != 2 || dy.size(0) != x.size(0) || dy.size(1) != w.size(2))
    c.fail("dY must be (" + std::to_string(x.size(0)) + ", " + std::to_string(w.size(2)) + "), got " +
           c10::str(dy.sizes()));
  const bool want_dx = c.output_wanted(0), want_dw = c.output_wanted(1);
  if (is_absent_gradient(dy)) {  // nobody differentiated Y: no GEMM over zeros
    if (want_dx) c.set_output(0, absent_gradient(x.sizes(), x.options()));
    if (want_dw) c.set_output(1, absent_gradient(w.sizes(), w.options()));
    return;
  }
  const std::vector<int64_t> b = group_bounds(c, 3, w.size(0), x.size(0));
  at::Tensor dx = want_dx ? at::empty(x.sizes(), x.options()) : at::Tensor();
  // dW in W's own layout: transformers passes its experts' weights transposed, so the gradient
  // of the transposed view is itself a transposed view and reaches the parameter contiguous (an
  // autograd leaf otherwise copies a gradient whose strides differ from its own).
  at::Tensor dw = want_dw ? at::empty_like(w) : at::Tensor();
  for (int64_t e = 0; e < w.size(0); ++e) {
    const int64_t n = b[e + 1] - b[e];
    if (n == 0) {
      if (want_dw) dw[e].zero_();
      continue;
    }
    const at::Tensor dy_e = dy.narrow(0, b[e], n);
    if (want_dx) {
      at::Tensor rows = dx.narrow(0, b[e], n);
      at::mm_out(rows, dy_e, w[e].t());
    }
    if (want_dw) {
      at::Tensor dw_e = dw[e];
      at::mm_out(dw_e, x.narrow(0, b[e], n).t(), dy_e);
    }
  }
  if (want_dx && b.back() < x.size(0)) dx.narrow(0, b.back(), x.size(0) - b.back()).zero_();
  if (want_dx) c.set_output(0, dx);
  if (want_dw) c.set_output(1, dw);
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, "GroupedMatMul", grouped_matmul_kernel);
REGISTER_KERNEL_IN(kOurDomain, "GroupedMatMulGrad", grouped_matmul_grad_kernel);

}  // namespace torch_ort::kernels
