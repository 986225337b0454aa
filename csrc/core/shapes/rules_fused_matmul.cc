// Shape rule of our FusedMatMul: Y = alpha·A'·B' + bias, A' = transA ? A with its last two dims
// swapped : A (B' likewise), numpy batch broadcasting, bias broadcast onto Y.
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

Shape swapped_last2(Shape s) {
  std::swap(s.dims[s.dims.size() - 2], s.dims[s.dims.size() - 1]);
  return s;
}

// (..., M, K)·(..., K, N) -> (broadcast ..., M, N); both operands must have rank >= 2 (the
// fusions only emit FusedMatMul for such products).
void fused_matmul_shape(ShapeCtx& c) {
  Shape a = c.in(0), b = c.in(1);
  if (!a.rank_known || !b.rank_known) return;
  if (a.rank() < 2 || b.rank() < 2)
    c.fail("A and B must have rank >= 2, got " + a.to_string() + " and " + b.to_string());
  if (c.attrs().get_int("transA", 0)) a = swapped_last2(std::move(a));
  if (c.attrs().get_int("transB", 0)) b = swapped_last2(std::move(b));
  const Dim& ka = a.dims.back();
  const Dim& kb = b.dims[b.dims.size() - 2];
  if (ka.is_known() && kb.is_known() && ka.value != kb.value)
    c.fail("inner dimensions differ: " + a.to_string() + " · " + b.to_string() + " (after transA/transB)");
  Shape y = broadcast(c, Shape::of({a.dims.begin(), a.dims.end() - 2}), Shape::of({b.dims.begin(), b.dims.end() - 2}));
  if (!y.rank_known) return;
  y.dims.push_back(a.dims[a.dims.size() - 2]);
  y.dims.push_back(b.dims.back());
  if (c.has_in(2)) {
    const Shape bias = c.in(2);
    if (bias.rank_known && bias.rank() > y.rank())
      c.fail("bias " + bias.to_string() + " has a higher rank than the product " + y.to_string());
    y = broadcast(c, y, bias);
  }
  c.set(0, std::move(y));
}

}  // namespace

REGISTER_SHAPE_RULE_IN(kOurDomain, "FusedMatMul", fused_matmul_shape);

}  // namespace torch_ort
