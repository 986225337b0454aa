// The fused family: our fused ops (passes/*_fusion.cc) BiasGelu, FusedElementwise, FusedMatMul,
// SkipLayerNorm, and their gradient ops. (Attention is in attention.cc, BiasDropout in
// random.cc.) Kernels: csrc/runtime/kernels/fused_*.cc. The backward kernels of the
// elementwise fusions recompute what they need from the forward inputs, so forward saves only
// its inputs.
// One home per op: its traits line (fused_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
#include <vector>

#include "csrc/core/autodiff/grad_ctx.h"
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/graph.h"
#include "csrc/core/ops/families.h"
#include "csrc/core/ops/linalg.h"
#include "csrc/core/ops/nn.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {

std::vector<OpEntry> fused_ops() {
  return {
      // arity: (X, [b])
      {kOurDomain, "BiasGelu", {.recomputable = true, .arity = OpArity{1, 2, 1, 1}}},
      // Its kernel is plain ATen arithmetic on small host tensors too.
      // arity: (X_i...)
      {kOurDomain, "FusedElementwise", {.recomputable = true, .host_computable = true, .arity = OpArity{1, kVariadic, 1, 1}}},
      // arity: (A, B, [bias])
      {kOurDomain, "FusedMatMul", {.recomputable = true, .arity = OpArity{2, 3, 1, 1}}},
      // (A, B, [bias], Full, rows): FusedMatMul(A, B, [bias]) read as rows of a product already
      // computed (passes/label_sparsity.cc); its gradient is FusedMatMul's, none flows into Full.
      {kOurDomain, "ProductRows", {.arity = OpArity{5, 5, 1, 1, 1u << 2}}},
      // arity: (X, Skip, Gamma, [Beta], [Bias]) -> (Y, Mean, InvStdDev, Sum)
      {kOurDomain, "SkipLayerNorm", {.recomputable = true, .arity = OpArity{3, 5, 4, 4}}},
      {kOurDomain, "BiasGeluGrad", {.arity = OpArity{2, 3, 1, 1}}},  // (dY, X, [b])
      {kOurDomain, "FusedElementwiseGrad", {.arity = OpArity{2, kVariadic, 1, kVariadic, 0, slots({0})}}},  // (dY, X_i...) -> ([dX_i]...)
      // (dY, [dSum], Sum, Gamma, Mean, InvStdDev) -> ([dX], [dGamma], [dBeta], [dBias])
      {kOurDomain, "SkipLayerNormGrad", {.arity = OpArity{6, 6, 4, 4, slots({1}), slots({0, 1, 2, 3})}}},
  };
}

}  // namespace torch_ort::ops

namespace torch_ort {
namespace {

// --- shape rules (shapes/shape_rules.h)

// BiasGelu(X, [bias]), FusedElementwise(inputs...): every present input broadcast together.
void broadcast_inputs(ShapeCtx& c) {
  Shape s = c.in(0);
  for (int i = 1; i < c.num_inputs(); ++i)
    if (c.has_in(i)) s = broadcast(c, s, c.in(i));
  c.set(0, s);
}

// BiasGeluGrad(dY, X, [bias]) -> dX: X's shape.
void like_input1(ShapeCtx& c) { c.set(0, c.in(1)); }

// FusedElementwiseGrad(dY, inputs...) -> one gradient per forward input, shaped as it; with
// `join` (passes/split_grad_join.cc) output join[0] holds the listed inputs' gradients side by
// side along the last dim.
void like_forward_inputs(ShapeCtx& c) {
  for (int k = 0; k < c.num_outputs(); ++k) c.set(k, c.in(k + 1));
  const std::vector<int64_t> join = c.attrs().get_ints("join", {});
  if (join.empty() || join[0] < 0 || join[0] >= c.num_outputs()) return;
  Shape joint = c.in(join[0] + 1);
  if (!joint.rank_known || joint.rank() == 0) return;
  for (size_t q = 1; q < join.size(); ++q) {
    const Shape piece = c.in(join[q] + 1);
    joint.dims.back() = piece.rank_known && piece.rank() == joint.rank() ? dim_add(joint.dims.back(), piece.dims.back())
                                                                         : Dim{};
  }
  c.set(join[0], joint);
}

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


// --- gradient rules (autodiff/gradient_registry.h)

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

// SkipLayerNorm(X, Skip, Gamma, [Beta], [Bias]) -> (Y, Mean, InvStdDev, Sum), Sum = X + Skip (+ Bias):
// one SkipLayerNormGrad(dY, [dSum], Sum, Gamma, Mean, InvStdDev) -> (dS, [dGamma], [dBeta], [dBias])
// with x̂ = (Sum − μ)·r:  dS = r·(g − mean(g) − x̂·mean(g·x̂)) + dSum,  g = dY·Gamma;
// dGamma = Σ_rows dY·x̂;  dBeta = Σ_rows dY;  dBias = Σ_rows dS;  dX = dSkip = dS.
void skip_layer_norm_grad(GradCtx& g) {
  const bool has_beta = g.has_in(3), has_bias = g.has_in(4);
  const bool need_bias = has_bias && g.needs(4), need_beta = has_beta && g.needs(3);
  if (!g.has_grad_out(0)) {  // only Sum/statistics are read downstream: Gamma/Beta get zero gradients
    ValueId ds = g.grad_out(3);
    if (g.has_grad_out(1) || g.has_grad_out(2)) {
      const ValueId st = layer_norm_stats_grad(g, g.out(3), -1);
      ds = ds == kNoValue ? st : g.add(ds, st);
    }
    g.set_grad(0, ds);
    g.set_grad(1, ds);
    if (need_bias && ds != kNoValue) g.set_grad(4, g.sum_to_shape_of(ds, g.in(4)));
    for (int i : {2, 3})
      if (g.has_in(i) && g.needs(i))
        g.set_grad(i, g.mul(g.in(i), g.const_scalar(0.0, g.info(g.in(i)).dtype)));
    return;
  }
  ValueId dsum = g.has_grad_out(3) ? g.grad_out(3) : kNoValue;
  if (g.has_grad_out(1) || g.has_grad_out(2)) {  // folded into dSum: both add straight into dS
    const ValueId ds = layer_norm_stats_grad(g, g.out(3), -1);
    dsum = dsum == kNoValue ? ds : g.add(dsum, ds);
  }
  const bool need_dx = g.needs(0) || g.needs(1) || need_bias;
  if (!need_dx && !g.needs(2) && !need_beta) return;
  Attributes a;
  a.set("epsilon", g.attrs().get_float("epsilon", 1e-5f));
  const std::vector<ValueId> outs =
      g.ours_multi("SkipLayerNormGrad", {g.grad_out(0), dsum, g.out(3), g.in(2), g.out(1), g.out(2)},
                   {need_dx ? g.in(0) : kNoValue, g.needs(2) ? g.in(2) : kNoValue,
                    need_beta ? g.in(3) : kNoValue, need_bias ? g.in(4) : kNoValue},
                   std::move(a));
  if (need_dx) {
    g.set_grad(0, outs[0]);
    g.set_grad(1, outs[0]);
  }
  g.set_grad(2, outs[1]);
  if (need_beta) g.set_grad(3, outs[2]);
  if (need_bias) g.set_grad(4, outs[3]);
}

}  // namespace

REGISTER_SHAPE_RULE_IN(kOurDomain, "BiasGelu", broadcast_inputs);
REGISTER_SHAPE_RULE_IN(kOurDomain, "BiasGeluGrad", like_input1);
REGISTER_SHAPE_RULE_IN(kOurDomain, "FusedElementwise", broadcast_inputs);
REGISTER_SHAPE_RULE_IN(kOurDomain, "FusedElementwiseGrad", like_forward_inputs);
REGISTER_SHAPE_RULE_IN(kOurDomain, "FusedMatMul", fused_matmul_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "ProductRows", fused_matmul_shape);  // A·B: its inputs 0-2
REGISTER_SHAPE_RULE_IN(kOurDomain, "SkipLayerNorm", skip_layer_norm_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "SkipLayerNormGrad", declared_by_gradient_builder);

REGISTER_GRADIENT_IN(kOurDomain, "BiasGelu", bias_gelu_grad, {});
REGISTER_GRADIENT_IN(kOurDomain, "FusedElementwise", fused_elementwise_grad, {});
REGISTER_GRADIENT_IN(kOurDomain, "FusedMatMul", fused_matmul_grad, {});
REGISTER_GRADIENT_IN(kOurDomain, "ProductRows", fused_matmul_grad, {3, 4});
REGISTER_GRADIENT_IN(kOurDomain, "SkipLayerNorm", skip_layer_norm_grad, {});

}  // namespace torch_ort
