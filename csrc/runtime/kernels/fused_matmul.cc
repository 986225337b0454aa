// Our FusedMatMul: Y = alpha·A'·B' + bias in one GEMM call, A' = transA ? A with its two innermost
// dims swapped : A (B' likewise). The transposes are strided views, never copies; a batched A
// times a 2-D B is one addmm over the flattened rows (a view of a contiguous A), with the bias
// added by the BLAS epilogue as eager F.linear does; a product as large as an LM head's logits is
// written into a buffer from the CPU pool (common.h). A product with an absent gradient (the zero
// of an output nobody differentiated, common.h) and no bias is absent too: no GEMM over zeros.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/matmul.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

std::string sizes_of(const at::Tensor& t) { return c10::str(t.sizes()); }

// The sizes of A·B (both rank >= 2, inner dims checked): the batch dims broadcast, then (M, N).
std::vector<int64_t> product_sizes(const KernelCtx& c, const at::Tensor& a, const at::Tensor& b) {
  std::vector<int64_t> batch;
  try {
    batch = at::infer_size(a.sizes().slice(0, a.dim() - 2), b.sizes().slice(0, b.dim() - 2));
  } catch (const std::exception&) {
    c.fail("batch dimensions of " + sizes_of(a) + " and " + sizes_of(b) + " do not broadcast");
  }
  batch.push_back(a.size(-2));
  batch.push_back(b.size(-1));
  return batch;
}

// The bias must broadcast onto Y without growing it: rank <= Y's, each dim 1 or Y's.
void check_bias(const KernelCtx& c, const at::Tensor& bias, c10::IntArrayRef y) {
  const int64_t off = static_cast<int64_t>(y.size()) - bias.dim();
  bool ok = off >= 0;
  for (int64_t i = 0; ok && i < bias.dim(); ++i) ok = bias.size(i) == 1 || bias.size(i) == y[off + i];
  if (!ok) c.fail("bias of shape " + sizes_of(bias) + " does not broadcast onto the product " + c10::str(y));
}

void fused_matmul_kernel(KernelCtx& c) {
  at::Tensor a = c.input(0), b = c.input(1);
  if (a.dim() < 2 || b.dim() < 2)
    c.fail("A and B must have rank >= 2, got shapes " + sizes_of(a) + " and " + sizes_of(b));
  if (c.attrs.get_int("transA", 0)) a = a.transpose(-1, -2);  // views: BLAS reads the strides
  if (c.attrs.get_int("transB", 0)) b = b.transpose(-1, -2);
  if (a.size(-1) != b.size(-2))
    c.fail("inner dimensions differ: " + sizes_of(a) + " · " + sizes_of(b) + " (after transA/transB)");
  const double alpha = c.attrs.get_float("alpha", 1.0f);
  const bool has_bias = c.has_input(2);
  const at::Tensor bias = has_bias ? c.input(2) : at::Tensor();
  if (!has_bias && (is_absent_gradient(a) || is_absent_gradient(b)))  // zero·B: no GEMM
    return c.set_output(0, absent_gradient(product_sizes(c, a, b), a.options()));
  if (has_bias && bias.scalar_type() != a.scalar_type())
    c.fail("bias dtype " + std::string(c10::toString(bias.scalar_type())) + " differs from A's " +
           std::string(c10::toString(a.scalar_type())));

  // (..., M, K)·(K, N): one (rows, K)·(K, N) GEMM. A transposed batched A has no row view, and a
  // batched B needs the batched product, so those take at::matmul (bmm on strided views).
  if (b.dim() == 2 && (a.dim() == 2 || !c.attrs.get_int("transA", 0))) {
    std::vector<int64_t> ys(a.sizes().begin(), a.sizes().end());
    ys.back() = b.size(1);
    const at::Tensor a2 = a.dim() == 2 ? a : a.reshape({-1, a.size(-1)});
    at::Tensor y2;
    if (has_bias) {
      check_bias(c, bias, ys);
      // A bias varying along the last dim only is a 1-D row view; others (a (M, N) bias) broadcast
      // onto the 2-D product through addmm's own expansion.
      at::Tensor bias2 = bias;  // a 0-dim bias broadcasts as it is
      if (bias.dim() > 0)
        bias2 = bias.numel() == bias.size(-1) ? bias.reshape({bias.size(-1)})
                                              : bias.expand(ys).reshape({-1, ys.back()});
      y2 = pooled_addmm(bias2, a2, b, 1.0, alpha);
    } else {
      y2 = pooled_mm(a2, b, alpha);
    }
    c.set_output(0, a.dim() == 2 ? y2 : y2.view(ys));
    return;
  }
  at::Tensor y = at::matmul(a, b);
  if (alpha != 1.0) y.mul_(alpha);
  if (has_bias) {
    check_bias(c, bias, y.sizes());
    y.add_(bias);
  }
  c.set_output(0, y);
}

// ProductRows(A, B, [bias], Full, rows): the rows of Full (A·B over every row, computed already
// for an output) that A holds: Full's rows flattened, then `rows` picked. No GEMM.
void product_rows_kernel(KernelCtx& c) {
  const at::Tensor& full = c.input(3);
  const at::Tensor& rows = c.input(4);
  if (full.dim() < 2 || rows.dim() != 1)
    c.fail("expects a product of rank >= 2 and 1-D rows, got " + sizes_of(full) + " and " + sizes_of(rows));
  const at::Tensor flat = full.reshape({-1, full.size(-1)});
  if (c.input(0).size(0) != rows.size(0))
    c.fail("A has " + std::to_string(c.input(0).size(0)) + " rows, the row index " + std::to_string(rows.size(0)));
  c.set_output(0, flat.index_select(0, rows));
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, "FusedMatMul", fused_matmul_kernel);
REGISTER_KERNEL_IN(kOurDomain, "ProductRows", product_rows_kernel);

}  // namespace torch_ort::kernels
