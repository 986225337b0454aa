// Gradient rule of our FusedMatMul: Y = alpha·A'·B' + bias, A' = transA ? Aᵀ : A, B' = transB ?
// Bᵀ : B (ᵀ swaps the two innermost dims), numpy batch broadcasting.
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"

namespace torch_ort {
namespace {

ValueId fused_matmul(GradCtx& g, ValueId a, ValueId b, bool ta, bool tb, float alpha) {
  Attributes at;
  at.set("transA", static_cast<int64_t>(ta));
  at.set("transB", static_cast<int64_t>(tb));
  if (alpha != 1.0f) at.set("alpha", alpha);
  return g.ours("FusedMatMul", {a, b}, std::move(at));
}

ValueId gemm(GradCtx& g, ValueId a, ValueId b, bool ta, bool tb, float alpha) {
  Attributes at;
  at.set("transA", static_cast<int64_t>(ta));
  at.set("transB", static_cast<int64_t>(tb));
  if (alpha != 1.0f) at.set("alpha", alpha);
  return g.op("Gemm", {a, b}, std::move(at));
}

ValueId flatten_rows(GradCtx& g, ValueId x, int64_t rank) {  // (..., K) -> (rows, K)
  Attributes at;
  at.set("axis", rank - 1);
  return g.op("Flatten", {x}, std::move(at));
}

//   dA' = alpha·dY·B'ᵀ  ->  dA = transA ? alpha·B'·dYᵀ : alpha·dY·B'ᵀ
//   dB' = alpha·A'ᵀ·dY  ->  dB = transB ? alpha·dYᵀ·A' : alpha·A'ᵀ·dY
//   dbias = dY summed to bias's shape (the row sum for a 1-D bias)
// Each product is one FusedMatMul with flags: no Transpose is materialised. A 2-D B shared by a
// batched A (a Linear layer on (B, T, C)) gets its gradient as ONE Gemm over the flattened rows,
// Σ_i A_iᵀ·dY_i = flat(A)ᵀ·flat(dY), not a batched product summed afterwards.
void fused_matmul_grad(GradCtx& g) {
  const int64_t ra = g.rank(g.in(0)), rb = g.rank(g.in(1));
  if (ra < 2 || rb < 2)
    throw GradientError(g.node().describe() + ": FusedMatMul needs operands of rank >= 2, got ranks " +
                        std::to_string(ra) + " and " + std::to_string(rb));
  const bool ta = g.attrs().get_int("transA", 0) != 0, tb = g.attrs().get_int("transB", 0) != 0;
  const float alpha = g.attrs().get_float("alpha", 1.0f);
  const ValueId a = g.in(0), b = g.in(1), dy = g.grad_out(0);
  if (g.needs(0)) {
    const ValueId d = ta ? fused_matmul(g, b, dy, tb, true, alpha) : fused_matmul(g, dy, b, false, !tb, alpha);
    g.set_grad(0, g.sum_to_shape_of(d, a));
  }
  if (g.needs(1)) {
    if (rb == 2 && ra > 2 && !ta) {
      const ValueId fa = flatten_rows(g, a, ra), fdy = flatten_rows(g, dy, ra);
      g.set_grad(1, tb ? gemm(g, fdy, fa, true, false, alpha) : gemm(g, fa, fdy, true, false, alpha));
    } else {
      const ValueId d = tb ? fused_matmul(g, dy, a, true, ta, alpha) : fused_matmul(g, a, dy, !ta, false, alpha);
      g.set_grad(1, g.sum_to_shape_of(d, b));
    }
  }
  if (g.has_in(2) && g.needs(2)) g.set_grad(2, g.sum_to_shape_of(dy, g.in(2)));
}

}  // namespace

REGISTER_GRADIENT_IN(kOurDomain, "FusedMatMul", fused_matmul_grad, {});

}  // namespace torch_ort
