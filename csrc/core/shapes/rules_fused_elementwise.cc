// Shape rules of the fused elementwise ops (bias_gelu_fusion, elementwise_chain_fusion) and their
// gradients: forward ops broadcast their inputs; each gradient has its forward input's shape.
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

// BiasGelu(X, [bias]), FusedElementwise(inputs...): every present input broadcast together.
void broadcast_inputs(ShapeCtx& c) {
  Shape s = c.in(0);
  for (int i = 1; i < c.num_inputs(); ++i)
    if (c.has_in(i)) s = broadcast(c, s, c.in(i));
  c.set(0, s);
}

// BiasGeluGrad(dY, X, [bias]) -> dX: X's shape.
void like_input1(ShapeCtx& c) { c.set(0, c.in(1)); }

// FusedElementwiseGrad(dY, inputs...) -> one gradient per forward input, shaped as it.
void like_forward_inputs(ShapeCtx& c) {
  for (int k = 0; k < c.num_outputs(); ++k) c.set(k, c.in(k + 1));
}

}  // namespace

REGISTER_SHAPE_RULE_IN(kOurDomain, "BiasGelu", broadcast_inputs);
REGISTER_SHAPE_RULE_IN(kOurDomain, "BiasGeluGrad", like_input1);
REGISTER_SHAPE_RULE_IN(kOurDomain, "FusedElementwise", broadcast_inputs);
REGISTER_SHAPE_RULE_IN(kOurDomain, "FusedElementwiseGrad", like_forward_inputs);

}  // namespace torch_ort
