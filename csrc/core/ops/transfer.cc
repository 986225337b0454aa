// The transfer family: placement's crossings (csrc/core/planner/placement.h), ToHost and
// ToDevice: the same values elsewhere. They have no traits and no gradient (placement inserts
// them after autodiff). Kernels: csrc/runtime/kernels/transfer.cc.
// One home per op: its traits line (transfer_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
#include "csrc/core/ops/families.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {

std::vector<OpEntry> transfer_ops() {
  return {
      {kOurDomain, "ToDevice", {.arity = OpArity{1, 1, 1, 1}}},
      {kOurDomain, "ToHost", {.arity = OpArity{1, 1, 1, 1}}},
  };
}

}  // namespace torch_ort::ops

namespace torch_ort {

// Shape rules (shapes/shape_rules.h): the input's shape and values, on the other side.
REGISTER_SHAPE_RULE_IN(kOurDomain, "ToHost", identity_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "ToDevice", identity_shape);

}  // namespace torch_ort
