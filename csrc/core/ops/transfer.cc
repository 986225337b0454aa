// The transfer family: placement's crossings (csrc/core/planner/placement.h), ToHost and
// ToDevice: the same values elsewhere. They have no traits and no gradient (placement inserts
// them after autodiff). And DecisionCheck(X, cond): X, once the host has read that cond holds —
// a decision the export took from the values it saw (torch_ort/ortmodule/export/decisions.py).
// Kernels: csrc/runtime/kernels/transfer.cc.
// One home per op: its traits line (transfer_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ops/families.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {

std::vector<OpEntry> transfer_ops() {
  return {
      {kOurDomain, "ToDevice", {.arity = OpArity{1, 1, 1, 1}}},
      {kOurDomain, "ToHost", {.arity = OpArity{1, 1, 1, 1}}},
      // (X, cond; message) -> X: cond is read on the host (a counted read)
      {kOurDomain, "DecisionCheck", {.host_inputs = {1}, .view = ViewRule::kInput0, .arity = OpArity{2, 2, 1, 1}}},
  };
}

}  // namespace torch_ort::ops

namespace torch_ort {

// Shape rules (shapes/shape_rules.h): the input's shape and values, on the other side.
REGISTER_SHAPE_RULE_IN(kOurDomain, "ToHost", identity_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "ToDevice", identity_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "DecisionCheck", identity_shape);

namespace {
void decision_check_grad(GradCtx& g) { g.set_grad(0, g.grad_out(0)); }  // X passes through
}  // namespace
REGISTER_GRADIENT_IN(kOurDomain, "DecisionCheck", decision_check_grad, {1});

}  // namespace torch_ort
