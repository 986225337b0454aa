// Gradient rules of the fused normalisation and dropout ops (skip_layer_norm_fusion.cc,
// bias_dropout_fusion.cc).
#include <vector>

#include "csrc/core/autodiff/grad_ctx.h"
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/autodiff/rules_nn.h"

namespace torch_ort {
namespace {

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

// BiasDropout(X, [Bias], [Residual], [ratio], [training_mode]) -> (Y, [Mask]):
// dX = DropoutGrad(dY, Mask) = dY·Mask/(1 − ratio) (the forward's mask, never a new draw);
// dBias = Σ_rows dX;  dResidual = dY.
void bias_dropout_grad(GradCtx& g) {
  const bool training = g.has_in(4);
  ValueId dx = g.grad_out(0);
  if (training && (g.needs(0) || (g.has_in(1) && g.needs(1)))) {
    const ValueId ratio = g.has_in(3) ? g.in(3) : kNoValue;
    dx = g.ours("DropoutGrad", {g.grad_out(0), g.out(1), ratio, g.in(4)}, {}, DType::kUndefined,
                g.info(g.in(0)).shape);
  }
  g.set_grad(0, dx);
  if (g.has_in(1) && g.needs(1)) g.set_grad(1, g.sum_to_shape_of(dx, g.in(1)));
  if (g.has_in(2)) g.set_grad(2, g.grad_out(0));
}

}  // namespace

REGISTER_GRADIENT_IN(kOurDomain, "SkipLayerNorm", skip_layer_norm_grad, {});
REGISTER_GRADIENT_IN(kOurDomain, "BiasDropout", bias_dropout_grad, {3, 4});

}  // namespace torch_ort
