// Gradient rules of elementwise ops. Broadcasting is undone with sum_to_shape_of.
#include "csrc/core/autodiff/gradient_registry.h"

namespace torch_ort {
namespace {

void add_grad(GradCtx& g) {  // dA = dY, dB = dY (each summed to its shape)
  if (g.needs(0)) g.set_grad(0, g.sum_to_shape_of(g.grad_out(0), g.in(0)));
  if (g.needs(1)) g.set_grad(1, g.sum_to_shape_of(g.grad_out(0), g.in(1)));
}

void sub_grad(GradCtx& g) {  // dA = dY, dB = -dY
  if (g.needs(0)) g.set_grad(0, g.sum_to_shape_of(g.grad_out(0), g.in(0)));
  if (g.needs(1)) g.set_grad(1, g.sum_to_shape_of(g.neg(g.grad_out(0)), g.in(1)));
}

void mul_grad(GradCtx& g) {  // dA = dY·B, dB = dY·A
  if (g.needs(0)) g.set_grad(0, g.sum_to_shape_of(g.mul(g.grad_out(0), g.in(1)), g.in(0)));
  if (g.needs(1)) g.set_grad(1, g.sum_to_shape_of(g.mul(g.grad_out(0), g.in(0)), g.in(1)));
}

void div_grad(GradCtx& g) {  // dA = dY / B, dB = -dY·Y / B
  if (g.needs(0)) g.set_grad(0, g.sum_to_shape_of(g.div(g.grad_out(0), g.in(1)), g.in(0)));
  if (g.needs(1)) {
    ValueId t = g.div(g.mul(g.grad_out(0), g.out(0)), g.in(1));
    g.set_grad(1, g.sum_to_shape_of(g.neg(t), g.in(1)));
  }
}

void neg_grad(GradCtx& g) { g.set_grad(0, g.neg(g.grad_out(0))); }  // dX = -dY

void identity_grad(GradCtx& g) { g.set_grad(0, g.grad_out(0)); }  // dX = dY

void cast_grad(GradCtx& g) {  // dX = cast(dY, dtype(X))
  const DType to = g.info(g.in(0)).dtype;
  if (g.info(g.grad_out(0)).dtype == to) return g.set_grad(0, g.grad_out(0));
  Attributes a;
  a.set("to", static_cast<int64_t>(to));
  g.set_grad(0, g.op("Cast", {g.grad_out(0)}, std::move(a), to, g.info(g.in(0)).shape));
}

void sum_grad(GradCtx& g) {  // dX_i = dY (each summed to its shape)
  for (int i = 0; i < static_cast<int>(g.node().inputs.size()); ++i)
    if (g.needs(i)) g.set_grad(i, g.sum_to_shape_of(g.grad_out(0), g.in(i)));
}

void pow_grad(GradCtx& g) {  // dX = dY · p · X^(p-1)   (the exponent gets no gradient)
  const DType dt = g.info(g.in(0)).dtype;
  ValueId p = g.in(1);
  if (g.info(p).dtype != dt) {
    Attributes a;
    a.set("to", static_cast<int64_t>(dt));
    p = g.op("Cast", {p}, std::move(a), dt, g.info(p).shape);
  }
  ValueId x_pm1 = g.op("Pow", {g.in(0), g.sub(p, g.const_scalar(1.0, dt))});
  g.set_grad(0, g.sum_to_shape_of(g.mul(g.grad_out(0), g.mul(p, x_pm1)), g.in(0)));
}

void sqrt_grad(GradCtx& g) {  // dX = dY / (2·Y)
  const DType dt = g.info(g.in(0)).dtype;
  g.set_grad(0, g.div(g.grad_out(0), g.mul(g.out(0), g.const_scalar(2.0, dt))));
}

void exp_grad(GradCtx& g) { g.set_grad(0, g.mul(g.grad_out(0), g.out(0))); }  // dX = dY·Y

void log_grad(GradCtx& g) { g.set_grad(0, g.div(g.grad_out(0), g.in(0))); }  // dX = dY / X

void where_grad(GradCtx& g) {  // dA = where(c, dY, 0), dB = where(c, 0, dY)
  const DType dt = g.info(g.grad_out(0)).dtype;
  ValueId zero = g.const_scalar(0.0, dt);
  if (g.needs(1))
    g.set_grad(1, g.sum_to_shape_of(g.op("Where", {g.in(0), g.grad_out(0), zero}, {}, dt), g.in(1)));
  if (g.needs(2))
    g.set_grad(2, g.sum_to_shape_of(g.op("Where", {g.in(0), zero, g.grad_out(0)}, {}, dt), g.in(2)));
}

// Activations: the backward reads the forward *output* Y, so X need not be saved.
void relu_grad(GradCtx& g) {  // dX = dY · (Y > 0)
  g.set_grad(0, g.ours("ReluGrad", {g.grad_out(0), g.out(0)}, {}, DType::kUndefined, g.info(g.in(0)).shape));
}
void sigmoid_grad(GradCtx& g) {  // dX = dY · Y · (1 − Y)
  g.set_grad(0, g.ours("SigmoidGrad", {g.grad_out(0), g.out(0)}, {}, DType::kUndefined, g.info(g.in(0)).shape));
}
void tanh_grad(GradCtx& g) {  // dX = dY · (1 − Y²)
  g.set_grad(0, g.ours("TanhGrad", {g.grad_out(0), g.out(0)}, {}, DType::kUndefined, g.info(g.in(0)).shape));
}

}  // namespace

REGISTER_GRADIENT("Add", add_grad, {});
REGISTER_GRADIENT("Sub", sub_grad, {});
REGISTER_GRADIENT("Mul", mul_grad, {});
REGISTER_GRADIENT("Div", div_grad, {});
REGISTER_GRADIENT("Neg", neg_grad, {});
REGISTER_GRADIENT("Identity", identity_grad, {});
REGISTER_GRADIENT("Cast", cast_grad, {});
REGISTER_GRADIENT("Sum", sum_grad, {});
REGISTER_GRADIENT("Pow", pow_grad, {1});
REGISTER_GRADIENT("Sqrt", sqrt_grad, {});
REGISTER_GRADIENT("Exp", exp_grad, {});
REGISTER_GRADIENT("Log", log_grad, {});
REGISTER_GRADIENT("Where", where_grad, {0});
REGISTER_GRADIENT("Relu", relu_grad, {});
REGISTER_GRADIENT("Sigmoid", sigmoid_grad, {});
REGISTER_GRADIENT("Tanh", tanh_grad, {});

}  // namespace torch_ort
