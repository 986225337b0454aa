// The random family: ops that draw random numbers (Dropout, our BiasDropout, Random*, ...), and
// DropoutGrad, which replays their mask. Kernels: csrc/runtime/kernels/random_bias_dropout.cc
// (Dropout: elementwise.cc, DropoutGrad: grad_ops.cc).
// One home per op: its traits line (random_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
//
// `random` is the one notion both cse and recompute need: the op's outputs are a fresh draw, so
// two equal nodes differ (never merged) and a clone would not reproduce them (never recomputed).
// DropoutGrad is not random: it reads the forward's mask and is deterministic.
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/graph.h"
#include "csrc/core/ops/families.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {
namespace {

// Dropout in training mode: backward reuses the forward's mask (output 1), never a new draw.
void add_dropout_mask(Graph& g, Node& n) {
  if (n.inputs.size() <= 2 || n.inputs[2] == kNoValue || (n.outputs.size() >= 2 && n.outputs[1] != kNoValue))
    return;
  const Value& data = g.value(n.inputs[0]);
  const ValueId mask = g.new_value(g.value(n.outputs[0]).name + "/mask", DType::kBool, data.shape);
  n.outputs.resize(2, kNoValue);
  n.outputs[1] = mask;
}

}  // namespace

std::vector<OpEntry> random_ops() {
  using enum ViewRule;
  return {
      // ratio, training_mode on the host; the mask (output 1) for the gradient, never a new draw.
      {"", "Dropout", {.random = true, .host_inputs = {1, 2}, .view = kDropout,
                       .output_dtypes = {DType::kUndefined, DType::kBool}, .add_outputs_for_gradient = add_dropout_mask}},
      {"", "Bernoulli", {.random = true}},
      {"", "Multinomial", {.random = true}},
      {"", "RandomNormal", {.random = true}},
      {"", "RandomNormalLike", {.random = true}},
      {"", "RandomUniform", {.random = true}},
      {"", "RandomUniformLike", {.random = true}},
      // host inputs: ratio, training_mode
      // arity: (X, [Bias], [Residual], [ratio], [training]) -> (Y, [Mask])
      {kOurDomain, "BiasDropout", {.random = true, .host_inputs = {3, 4}, .view = kBiasDropout, .arity = OpArity{1, 5, 1, 2}}},
      // arity: (dY, mask, [ratio], [training])
      {kOurDomain, "DropoutGrad", {.host_inputs = {2, 3}, .view = kDropoutGrad, .arity = OpArity{2, 4, 1, 1}}},  // ratio, training_mode
  };
}

}  // namespace torch_ort::ops

namespace torch_ort {
namespace {

// --- shape rules (shapes/shape_rules.h)


// Dropout(X, ratio?, training_mode?) -> (Y, mask): both have X's shape.
void dropout_shape(ShapeCtx& c) {
  c.set(0, c.in(0));
  c.set(1, c.in(0));
}

// BiasDropout(X, [Bias], [Residual], [ratio], [training_mode]) -> (Y, [Mask]): both X's shape.
void bias_dropout_shape(ShapeCtx& c) {
  c.set(0, c.in(0));
  c.set(1, c.in(0));
}

// --- gradient rules (autodiff/gradient_registry.h)

// Dropout(X, ratio?, training_mode?): dX = dY · mask / (1 − ratio) with the forward's mask; with
// no training_mode input the op is an identity (inference) and so is its gradient.
void dropout_grad(GradCtx& g) {
  if (!g.has_in(2)) return g.set_grad(0, g.grad_out(0));
  const ValueId ratio = g.has_in(1) ? g.in(1) : kNoValue;
  g.set_grad(0, g.ours("DropoutGrad", {g.grad_out(0), g.out(1), ratio, g.in(2)}, {}, DType::kUndefined,
                       g.info(g.in(0)).shape));
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

REGISTER_SHAPE_RULE("Dropout", dropout_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "BiasDropout", bias_dropout_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "DropoutGrad", same_as_input0);         // (dY, mask, ...)

REGISTER_GRADIENT("Dropout", dropout_grad, {1, 2});
REGISTER_GRADIENT_IN(kOurDomain, "BiasDropout", bias_dropout_grad, {3, 4});

}  // namespace torch_ort
