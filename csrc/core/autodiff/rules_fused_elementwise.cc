// Gradient rules of the fused elementwise ops. Both backward kernels recompute what they need
// from the forward inputs (X + bias, or the chain's intermediates tile by tile), so forward saves
// only its inputs.
#include "csrc/core/autodiff/gradient_registry.h"

namespace torch_ort {
namespace {

// BiasGelu(X, [b]): dX = dY · gelu'(X + b), db = Σ over leading dims of dX.
void bias_gelu_grad(GradCtx& g) {
  Attributes a;
  a.set("approximate", g.attrs().get_string("approximate", "none"));
  std::vector<ValueId> ins{g.grad_out(0), g.in(0)};
  if (g.has_in(1)) ins.push_back(g.in(1));
  const ValueId dx = g.ours("BiasGeluGrad", ins, std::move(a), DType::kUndefined, g.info(g.out(0)).shape);
  if (g.needs(0)) g.set_grad(0, g.sum_to_shape_of(dx, g.in(0)));
  if (g.has_in(1) && g.needs(1)) g.set_grad(1, g.sum_to_shape_of(dx, g.in(1)));
}

// FusedElementwise(inputs...): one FusedElementwiseGrad(dY, inputs...) with the same program,
// emitting dInput_i (already reduced to input i's shape) only for the inputs that need one.
void fused_elementwise_grad(GradCtx& g) {
  std::vector<ValueId> ins{g.grad_out(0)}, like;
  for (int i = 0; i < static_cast<int>(g.node().inputs.size()); ++i) {
    ins.push_back(g.in(i));
    like.push_back(g.needs(i) ? g.in(i) : kNoValue);
  }
  const std::vector<ValueId> grads = g.ours_multi("FusedElementwiseGrad", ins, like, g.attrs());
  for (int i = 0; i < static_cast<int>(grads.size()); ++i)
    if (grads[i] != kNoValue) g.set_grad(i, grads[i]);
}

}  // namespace

REGISTER_GRADIENT_IN(kOurDomain, "BiasGelu", bias_gelu_grad, {});
REGISTER_GRADIENT_IN(kOurDomain, "FusedElementwise", fused_elementwise_grad, {});

}  // namespace torch_ort
