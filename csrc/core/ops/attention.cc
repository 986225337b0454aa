// The attention family: our fused Attention (passes/attention_fusion.cc) and AttentionGrad, which
// recomputes the attention probabilities from the forward's LogSumExp (flash attention's
// backward), so no (L, S) matrix is kept between forward and backward. With a `dropout` rate the
// forward also returns the random state its draw came from (outputs 3 and 4), and AttentionGrad
// replays exactly that draw from it. Kernels: csrc/runtime/kernels/attention.cc.
// One home per op: its traits line (attention_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/graph.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/ops/families.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {
namespace {

// Attention with a dropout rate draws its mask: a clone would draw another (never recomputed,
// never merged by cse).
bool drops(const Node& n) { return n.attrs.get_float("dropout", 0.0f) > 0.0f; }

// Q, K, V at inputs q, q+1, q+2 take ATen's fused path (one head size, equal B, and equal H or
// grouped K and V: fewer heads, a divisor of Q's), whose kernels allocate Y (in backward
// dQ/dK/dV) like Q (K, V): empty_like, not row-major. The math path's matmul results are row-major.
bool fused_path(const Graph& g, const Node& n, int q) {
  if (!pattern::has_input(n, q) || !pattern::has_input(n, q + 1) || !pattern::has_input(n, q + 2)) return false;
  const Shape& sq = g.value(n.inputs[q]).shape;
  const Shape& sk = g.value(n.inputs[q + 1]).shape;
  const Shape& sv = g.value(n.inputs[q + 2]).shape;
  if (sq.rank() != 4 || sk.rank() != 4 || sv.rank() != 4) return false;
  if (!sq.dims[0].same_as(sk.dims[0]) || !sq.dims[0].same_as(sv.dims[0]) || !sk.dims[1].same_as(sv.dims[1]))
    return false;
  const Dim &h = sq.dims[1], &hkv = sk.dims[1];
  const bool grouped =
      h.is_known() && hkv.is_known() && hkv.value > 0 && hkv.value < h.value && h.value % hkv.value == 0;
  return (h.same_as(hkv) || grouped) && sq.dims[3].same_as(sv.dims[3]);
}
int y_like_q(const Graph& g, const Node& n, int k) { return k == 0 && fused_path(g, n, 0) ? 0 : -1; }
// dQ, dK, dV like Q, K, V; not with dLogSumExp (input 7), which takes the math path.
int grads_like_qkv(const Graph& g, const Node& n, int k) {
  return k < 3 && fused_path(g, n, 1) && !pattern::has_input(n, 7) ? 1 + k : -1;
}

}  // namespace

std::vector<OpEntry> attention_ops() {
  return {
      // arity: (Q, K, V, [mask]) -> (Y, LogSumExp, [Backend], [RngState0], [RngState1])
      // host output: Backend (the kernel's choice, read by the backward on the host)
      {kOurDomain, "Attention", {.random_when = drops, .recomputable = true, .arity = OpArity{3, 4, 2, 5},
                                 .host_outputs = {2}, .output_like_input = y_like_q}},
      // ([dY], Q, K, V, Y, LogSumExp, [mask], [dLogSumExp], [Backend], [RngState0], [RngState1])
      //   -> ([dQ], [dK], [dV]); host input: Backend (the forward's choice). The random state
      //   stays where the forward made it (on the device for CUDA graphs): no host input.
      {kOurDomain, "AttentionGrad", {.host_inputs = {8}, .arity = OpArity{6, 11, 3, 3, slots({0}), slots({0, 1, 2})},
                                     .output_like_input = grads_like_qkv}},
  };
}

}  // namespace torch_ort::ops

namespace torch_ort {
namespace {

// --- shape rules (shapes/shape_rules.h)

// Attention(Q (B, H, L, D), K (B, Hkv, S, D), V (B, Hkv, S, Dv), [mask]) -> (Y (B, H, L, Dv),
// LogSumExp (B, H, L), [Backend ()], [RngState0], [RngState1]). The random state's form is the
// backend's (a fused kernel's philox seed and offset, the math path's CPU generator state or
// keep-mask): no shape.
// A known rank other than 4 is a contradiction: the kernel takes only 4-D.
void attention_shape(ShapeCtx& c) {
  c.set(2, Shape::of({}));
  c.set(3, Shape::unknown());
  c.set(4, Shape::unknown());
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

// AttentionGrad(dY, Q, K, V, Y, LogSumExp, [mask], [dLogSumExp], [Backend], [RngState0],
// [RngState1]) -> (dQ, dK, dV), each shaped as its input.
void attention_grad_shape(ShapeCtx& c) {
  for (int k = 0; k < 3; ++k) c.set(k, c.in(k + 1));
}

// --- gradient rules (autodiff/gradient_registry.h)

// P = softmax(scale·Q·Kᵀ + mask), Y = (P ⊙ M/(1−p))·V (M the forward's keep-mask, 1 without
// dropout): dV = (P ⊙ M/(1−p))ᵀ·dY,  dS = P ⊙ ((dY·Vᵀ) ⊙ M/(1−p) − rowsum(dY ⊙ Y)),
// dQ = scale·dS·K,  dK = scale·dSᵀ·Q. M is replayed from the forward's random state (outputs 3, 4).
// Only the needed input gradients are outputs; the mask gets none (the pass fuses only masks no
// gradient can reach). The pass's graphs never read LogSumExp but AttentionGrad; a gradient that
// does reach it (a graph that outputs it) adds dS += P ⊙ dLSE, passed as input 7.
void attention_grad(GradCtx& g) {
  if (!g.has_grad_out(0) && !g.has_grad_out(1)) return;
  Attributes a;
  a.set("causal", g.attrs().get_int("causal", 0));
  if (g.attrs().has("scale")) a.set("scale", g.attrs().get_float("scale", 1.0f));  // absent: 1/√D
  if (g.attrs().has("dropout")) a.set("dropout", g.attrs().get_float("dropout", 0.0f));
  // The forward's backend choice (output 2) makes the backward run the same kernel family, and
  // its random state (outputs 3, 4) the same dropout mask.
  const auto out_or_none = [&](size_t i) { return g.node().outputs.size() > i ? g.node().outputs[i] : kNoValue; };
  std::vector<ValueId> ins{g.grad_out(0), g.in(0),  g.in(1),  g.in(2), g.out(0),
                           g.out(1),      g.has_in(3) ? g.in(3) : kNoValue,
                           g.has_grad_out(1) ? g.grad_out(1) : kNoValue, out_or_none(2), out_or_none(3),
                           out_or_none(4)};
  while (ins.back() == kNoValue) ins.pop_back();
  std::vector<ValueId> like;
  for (int i = 0; i < 3; ++i) like.push_back(g.needs(i) ? g.in(i) : kNoValue);
  const std::vector<ValueId> d = g.ours_multi("AttentionGrad", std::move(ins), like, std::move(a));
  for (int i = 0; i < 3; ++i)
    if (d[i] != kNoValue) g.set_grad(i, d[i]);
}

}  // namespace

REGISTER_SHAPE_RULE_IN(kOurDomain, "Attention", attention_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "AttentionGrad", attention_grad_shape);

REGISTER_GRADIENT_IN(kOurDomain, "Attention", attention_grad, {3});

}  // namespace torch_ort
