// Shape rules of the fused normalisation and dropout ops (passes skip_layer_norm_fusion and
// bias_dropout_fusion) and of their gradient op.
#include "csrc/core/ir/graph.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

// SkipLayerNorm(X, Skip, Gamma, [Beta], [Bias]) -> (Y, Mean, InvStdDev, Sum): Y and Sum have X's
// shape (the pass fuses only adds without broadcasting); the statistics are per row, last dim 1.
void skip_layer_norm_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  c.set(0, x);
  c.set(3, x);
  if (!x.rank_known) return;
  if (x.rank() < 1) c.fail("input X must have rank >= 1, got a scalar");
  Shape stats = x;
  stats.dims.back() = Dim::known(1);
  c.set(1, stats);
  c.set(2, stats);
}

// BiasDropout(X, [Bias], [Residual], [ratio], [training_mode]) -> (Y, [Mask]): both X's shape.
void bias_dropout_shape(ShapeCtx& c) {
  c.set(0, c.in(0));
  c.set(1, c.in(0));
}

// SkipLayerNormGrad(dY, [dSum], Sum, Gamma, Mean, InvStdDev) -> (dX, [dGamma], [dBeta], [dBias]):
// the gradient builder declares each output like the input it differentiates.
void declared_by_gradient_builder(ShapeCtx&) {}

}  // namespace

REGISTER_SHAPE_RULE_IN(kOurDomain, "SkipLayerNorm", skip_layer_norm_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "BiasDropout", bias_dropout_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "SkipLayerNormGrad", declared_by_gradient_builder);

}  // namespace torch_ort
