// Gradient rule of our fused Attention (csrc/core/passes/attention_fusion.cc): one AttentionGrad
// node that recomputes the attention probabilities from the forward's LogSumExp (flash attention's
// backward), so no (L, S) matrix is kept between forward and backward.
#include "csrc/core/autodiff/gradient_registry.h"

namespace torch_ort {
namespace {

// P = softmax(scale·Q·Kᵀ + mask), Y = P·V:
// dV = Pᵀ·dY,  dS = P ⊙ (dY·Vᵀ − rowsum(dY ⊙ Y)),  dQ = scale·dS·K,  dK = scale·dSᵀ·Q.
// Only the needed input gradients are outputs; the mask gets none (the pass fuses only masks no
// gradient can reach). The pass's graphs never read LogSumExp but AttentionGrad; a gradient that
// does reach it (a graph that outputs it) adds dS += P ⊙ dLSE, passed as input 7.
void attention_grad(GradCtx& g) {
  if (!g.has_grad_out(0) && !g.has_grad_out(1)) return;
  Attributes a;
  a.set("causal", g.attrs().get_int("causal", 0));
  if (g.attrs().has("scale")) a.set("scale", g.attrs().get_float("scale", 1.0f));  // absent: 1/√D
  // The forward's backend choice (output 2) makes the backward run the same kernel family.
  const ValueId backend = g.node().outputs.size() > 2 ? g.node().outputs[2] : kNoValue;
  std::vector<ValueId> ins{g.grad_out(0), g.in(0),  g.in(1),  g.in(2), g.out(0),
                           g.out(1),      g.has_in(3) ? g.in(3) : kNoValue,
                           g.has_grad_out(1) ? g.grad_out(1) : kNoValue, backend};
  while (ins.back() == kNoValue) ins.pop_back();
  std::vector<ValueId> like;
  for (int i = 0; i < 3; ++i) like.push_back(g.needs(i) ? g.in(i) : kNoValue);
  const std::vector<ValueId> d = g.ours_multi("AttentionGrad", std::move(ins), like, std::move(a));
  for (int i = 0; i < 3; ++i)
    if (d[i] != kNoValue) g.set_grad(i, d[i]);
}

}  // namespace

REGISTER_GRADIENT_IN(kOurDomain, "Attention", attention_grad, {3});

}  // namespace torch_ort
