// Matrix products: MatMul (numpy matmul semantics, batched and broadcast), Gemm, Einsum; Det.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/einsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linalg_det.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>

#include "csrc/runtime/buffer_pool.h"
#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {

namespace {

// The (M, N) result of A·B, from the pool when it is mapped-allocation large (common.h). Sizes
// that do not chain (M, K)·(K, N) get plain at::empty: the BLAS call names the mismatch.
at::Tensor product_buffer(const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0) || a.scalar_type() != b.scalar_type())
    return at::empty({0}, a.options());
  return BufferPool::process().empty({a.size(0), b.size(1)}, a.options(), BufferPool::kMappedBytes);
}

}  // namespace

at::Tensor pooled_mm(const at::Tensor& a, const at::Tensor& b, double alpha) {
  at::Tensor y = product_buffer(a, b);
  at::mm_out(y, a, b);
  return alpha == 1.0 ? y : y.mul_(alpha);  // scaled after the product, as ONNX's reference rounds
}

at::Tensor pooled_addmm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double beta, double alpha) {
  at::Tensor y = product_buffer(a, b);
  return at::addmm_out(y, c, a, b, beta, alpha);
}

namespace {

void matmul_kernel(KernelCtx& c) { c.set_output(0, at::matmul(c.input(0), c.input(1))); }

// Y = alpha * A' B' + beta * C, A' = transA ? Aᵀ : A (both 2-D), C unidirectionally broadcast.
// Without C, a product with an absent gradient (common.h) is absent: the weight gradient of an
// output nobody differentiated runs no GEMM.
void gemm_kernel(KernelCtx& c) {
  at::Tensor a = c.input(0);
  at::Tensor b = c.input(1);
  if (a.dim() != 2 || b.dim() != 2)
    c.fail("A and B must be 2-D, got ranks " + std::to_string(a.dim()) + " and " +
           std::to_string(b.dim()));
  if (c.attrs.get_int("transA", 0)) a = a.t();  // views: addmm/mm read strides, no copy
  if (c.attrs.get_int("transB", 0)) b = b.t();
  const double alpha = c.attrs.get_float("alpha", 1.0f);
  const double beta = c.attrs.get_float("beta", 1.0f);
  const bool has_c = c.has_input(2) && beta != 0.0;
  if (!has_c && (is_absent_gradient(a) || is_absent_gradient(b))) {  // zero·B: no GEMM
    if (a.size(1) != b.size(0))
      c.fail("inner dimensions differ: " + c10::str(a.sizes()) + " · " + c10::str(b.sizes()));
    return c.set_output(0, absent_gradient({a.size(0), b.size(1)}, a.options()));
  }
  // addmm broadcasts C to (M, N) itself and fuses the scaling into the BLAS call.
  c.set_output(0, has_c ? pooled_addmm(c.input(2), a, b, beta, alpha) : pooled_mm(a, b, alpha));
}

// Einsum(inputs...; equation): ATen reads ONNX's equation language (explicit "->" or implicit
// output, "..." broadcast dims) the same way.
void einsum_kernel(KernelCtx& c) {
  const std::string equation = c.attrs.get_string("equation", "");
  if (equation.empty()) c.fail("attribute 'equation' is required");
  std::vector<at::Tensor> operands;
  for (int i = 0; i < c.num_inputs(); ++i) {
    operands.push_back(c.input(i));
    if (i > 0) check_placed(c, operands[0], operands.back());
  }
  c.set_output(0, at::einsum(equation, operands));
}

// Det(X): the determinant of each innermost square matrix.
void det_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  if (x.dim() < 2 || x.size(-1) != x.size(-2))
    c.fail("needs square matrices in the two innermost dims, got " + c10::str(x.sizes()));
  c.set_output(0, at::linalg_det(x));
}

}  // namespace

REGISTER_KERNEL("MatMul", matmul_kernel);
REGISTER_KERNEL("Einsum", einsum_kernel);
REGISTER_KERNEL("Det", det_kernel);
REGISTER_KERNEL("Gemm", gemm_kernel);

}  // namespace torch_ort::kernels
