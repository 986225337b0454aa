// Shape rules of the fused attention ops (csrc/core/passes/attention_fusion.cc).
#include "csrc/core/ir/graph.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

// Attention(Q (B, H, L, D), K (B, H, S, D), V (B, H, S, Dv), [mask]) -> (Y (B, H, L, Dv),
// LogSumExp (B, H, L), [Backend ()]). A known rank other than 4 is a contradiction: the kernel
// takes only 4-D.
void attention_shape(ShapeCtx& c) {
  c.set(2, Shape::of({}));
  for (int i = 0; i < 3; ++i)
    if (c.rank(i) >= 0 && c.rank(i) != 4)
      c.fail("input " + std::to_string(i) + " (Q, K, V) must have rank 4 (B, H, T, D), got " +
             c.in(i).to_string());
  const Shape q = c.in(0), v = c.in(2);
  if (!q.rank_known) {
    c.set(0, unknown_dims(4));
    c.set(1, unknown_dims(3));
    return;
  }
  c.set(0, Shape::of({q.dims[0], q.dims[1], q.dims[2], v.rank_known ? v.dims[3] : Dim{}}));
  c.set(1, Shape::of({q.dims[0], q.dims[1], q.dims[2]}));
}

// AttentionGrad(dY, Q, K, V, Y, LogSumExp, [mask], [dLogSumExp]) -> (dQ, dK, dV), each shaped as its input.
void attention_grad_shape(ShapeCtx& c) {
  for (int k = 0; k < 3; ++k) c.set(k, c.in(k + 1));
}

}  // namespace

REGISTER_SHAPE_RULE_IN(kOurDomain, "Attention", attention_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "AttentionGrad", attention_grad_shape);

}  // namespace torch_ort
