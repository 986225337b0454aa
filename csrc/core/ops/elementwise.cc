// The elementwise family: arithmetic, activations (and our gradients of them), comparisons and
// logic, casts, Where, Trilu, variadic Sum/Mean/Max/Min. Kernels: csrc/runtime/kernels/
// elementwise*.cc, except Gelu, Erf and their gradients (nn.cc), ReluGrad, SigmoidGrad, TanhGrad
// (grad_ops.cc) and Trilu (shape_tile.cc). Dropout is in random.cc, CumSum in reduce.cc.
// One home per op: its traits line (elementwise_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
//
// Integer arithmetic on shape values (Add/Sub/Mul/Div of sizes) is carried symbolically;
// broadcasting is undone in the gradients with sum_to_shape_of.
#include <cstdint>

#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/dtype.h"
#include "csrc/core/ops/families.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {
namespace {

DType cast_to(const Graph&, const Node& n, size_t) { return static_cast<DType>(n.attrs.get_int("to", 0)); }
// CastLike(X, like), Where(cond, X, Y): the dtype of input 1 when it is there.
DType like_input_1(const Graph& g, const Node& n, size_t) {
  return n.inputs.size() > 1 && n.inputs[1] != kNoValue ? g.value(n.inputs[1]).dtype : DType::kUndefined;
}

}  // namespace

std::vector<OpEntry> elementwise_ops() {
  using enum FusedInstr;
  using enum ViewRule;
  const std::vector<DType> kBoolOut{DType::kBool};
  return {
      {"", "Abs", {.recomputable = true, .host_computable = true}},
      {"", "Add", {.fused = kBinary, .commutative = true, .recomputable = true, .host_computable = true,
                   .inplace_inputs = {0, 1}}},
      {"", "And", {.commutative = true, .recomputable = true, .host_computable = true,
                   .output_dtypes = kBoolOut}},
      {"", "Cast", {.recomputable = true, .host_computable = true, .view = kSameDtype, .output_dtype_of = cast_to}},
      {"", "CastLike", {.host_computable = true, .view = kSameDtype, .output_dtype_of = like_input_1}},
      {"", "Div", {.fused = kBinary, .recomputable = true, .host_computable = true, .inplace_inputs = {0}}},
      {"", "Equal", {.commutative = true, .recomputable = true, .host_computable = true,
                     .output_dtypes = kBoolOut}},
      {"", "Erf", {.fused = kUnary, .recomputable = true}},
      {"", "Exp", {.fused = kUnary, .recomputable = true, .host_computable = true}},
      {"", "Gelu", {.recomputable = true}},
      {"", "Greater", {.recomputable = true, .host_computable = true, .output_dtypes = kBoolOut}},
      {"", "GreaterOrEqual", {.recomputable = true, .host_computable = true, .output_dtypes = kBoolOut}},
      {"", "Identity", {.recomputable = true, .host_computable = true, .view = kInput0}},
      {"", "IsInf", {.output_dtypes = kBoolOut}},
      {"", "IsNaN", {.output_dtypes = kBoolOut}},
      {"", "Less", {.recomputable = true, .host_computable = true, .output_dtypes = kBoolOut}},
      {"", "LessOrEqual", {.recomputable = true, .host_computable = true, .output_dtypes = kBoolOut}},
      {"", "Log", {.fused = kUnary, .recomputable = true, .host_computable = true}},
      {"", "Max", {.commutative = true, .recomputable = true, .host_computable = true}},
      {"", "Mean", {.commutative = true}},
      {"", "Min", {.commutative = true, .recomputable = true, .host_computable = true}},
      {"", "Mul", {.fused = kBinary, .commutative = true, .recomputable = true, .host_computable = true,
                   .inplace_inputs = {0, 1}}},
      {"", "Neg", {.fused = kUnary, .recomputable = true, .host_computable = true}},
      {"", "Not", {.recomputable = true, .host_computable = true, .output_dtypes = kBoolOut}},
      {"", "Or", {.commutative = true, .recomputable = true, .host_computable = true,
                  .output_dtypes = kBoolOut}},
      {"", "Pow", {.fused = kBinary, .recomputable = true, .host_computable = true}},
      {"", "Reciprocal", {.fused = kUnary, .recomputable = true}},
      {"", "Relu", {.fused = kUnary, .recomputable = true}},
      {"", "Sigmoid", {.fused = kUnary, .recomputable = true}},
      {"", "Sqrt", {.fused = kUnary, .recomputable = true, .host_computable = true}},
      {"", "Sub", {.fused = kBinary, .recomputable = true, .host_computable = true, .inplace_inputs = {0}}},
      // The kernel sums into operand 0; a lone operand passes through.
      {"", "Sum", {.commutative = true, .host_computable = true, .inplace_inputs = {0}, .view = kSingleSum}},
      {"", "Tanh", {.fused = kUnary, .recomputable = true}},
      {"", "Trilu", {.host_inputs = {1}}},  // k
      {"", "Where", {.recomputable = true, .host_computable = true, .output_dtype_of = like_input_1}},
      {"", "Xor", {.commutative = true, .host_computable = true, .output_dtypes = kBoolOut}},
      {kOurDomain, "ErfGrad", {.arity = OpArity{2, 2, 1, 1}}},  // (dY, X)
      {kOurDomain, "GeluGrad", {.arity = OpArity{2, 2, 1, 1}}},  // (dY, X)
      {kOurDomain, "MinMaxGrad", {.arity = OpArity{3, kVariadic, 1, kVariadic, 0, slots({0})}}},  // (dY, Y, X_i...) -> ([dX_i]...)
      {kOurDomain, "ReluGrad", {.arity = OpArity{2, 2, 1, 1}}},  // (dY, Y)
      {kOurDomain, "SigmoidGrad", {.arity = OpArity{2, 2, 1, 1}}},
      {kOurDomain, "TanhGrad", {.arity = OpArity{2, 2, 1, 1}}},
  };
}

}  // namespace torch_ort::ops

namespace torch_ort {
namespace {

// --- shape rules (shapes/shape_rules.h)


void neg_shape(ShapeCtx& c) {
  c.set(0, c.in(0));
  if (const SymValues* v = c.values(0)) {
    SymValues out;
    for (const SymInt& x : *v) out.push_back(x ? SymInt(SymExpr::constant(0) - *x) : std::nullopt);
    c.set_values(0, std::move(out), c.rank(0) == 0);
  }
}

bool is_integer(DType t) {
  return t == DType::kInt64 || t == DType::kInt32 || t == DType::kInt16 || t == DType::kInt8 ||
         t == DType::kUInt8 || t == DType::kUInt16 || t == DType::kUInt32 || t == DType::kUInt64;
}

// Cast keeps the values of an integer shape computation cast to another integer type.
void cast_shape(ShapeCtx& c) {
  c.set(0, c.in(0));
  const auto to = static_cast<DType>(c.attrs().get_int("to", 0));
  if (const SymValues* v = c.values(0); v && is_integer(to)) c.set_values(0, *v, c.rank(0) == 0);
}

// Every present input broadcast together (Add ... Where, Sum, Max).
void broadcast_shape(ShapeCtx& c) {
  Shape out = Shape::of({});
  for (int i = 0; i < c.num_inputs(); ++i)
    if (c.has_in(i)) out = broadcast(c, out, c.in(i));
  c.set(0, out);
}

// Elementwise arithmetic on the values of two small int tensors (sizes), when both are known.
template <typename F>
void binary_values(ShapeCtx& c, F f) {
  const SymValues *a = c.values(0), *b = c.values(1);
  if (!a || !b || c.rank(0) > 1 || c.rank(1) > 1 || c.rank(0) < 0 || c.rank(1) < 0) return;
  if (a->size() != b->size() && a->size() != 1 && b->size() != 1) return;
  SymValues out;
  for (size_t k = 0; k < std::max(a->size(), b->size()); ++k) {
    const SymInt& x = (*a)[a->size() == 1 ? 0 : k];
    const SymInt& y = (*b)[b->size() == 1 ? 0 : k];
    out.push_back(x && y ? f(*x, *y) : std::nullopt);
  }
  c.set_values(0, std::move(out), c.rank(0) == 0 && c.rank(1) == 0);
}

void add_shape(ShapeCtx& c) {
  broadcast_shape(c);
  binary_values(c, [](const SymExpr& x, const SymExpr& y) -> SymInt { return x + y; });
}

void sub_shape(ShapeCtx& c) {
  broadcast_shape(c);
  binary_values(c, [](const SymExpr& x, const SymExpr& y) -> SymInt { return x - y; });
}

void mul_shape(ShapeCtx& c) {
  broadcast_shape(c);
  binary_values(c, [](const SymExpr& x, const SymExpr& y) -> SymInt { return x * y; });
}

void div_shape(ShapeCtx& c) {
  broadcast_shape(c);
  if (!is_integer(c.dtype(0))) return;
  binary_values(c, [](const SymExpr& x, const SymExpr& y) -> SymInt {
    if (x.is_constant() && y.is_constant())  // ONNX integer Div truncates
      return y.constant_value() == 0 || (y.constant_value() == -1 && x.constant_value() == INT64_MIN)
                 ? SymInt()  // no quotient, or one that overflows int64
                 : SymInt(SymExpr::constant(x.constant_value() / y.constant_value()));
    const Dim q = dim_floordiv(x.to_dim(), y.to_dim());  // sizes: non-negative, so floor == trunc
    return SymExpr::of(q);
  });
}

// Our activation gradients read (dY, Y): the gradient has their common shape.
void activation_grad_shape(ShapeCtx& c) { c.set(0, broadcast(c, c.in(0), c.in(1))); }


// --- gradient rules (autodiff/gradient_registry.h)

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

void reciprocal_grad(GradCtx& g) {  // Y = 1/X: dX = −dY·Y²
  g.set_grad(0, g.neg(g.mul(g.grad_out(0), g.mul(g.out(0), g.out(0)))));
}

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

// dX = Trilu(dY, k) with the forward's `upper`: the kept triangle passes dY, the rest is zero.
void trilu_grad(GradCtx& g) {
  std::vector<ValueId> ins{g.grad_out(0)};
  if (g.has_in(1)) ins.push_back(g.in(1));
  g.set_grad(0, g.op("Trilu", std::move(ins), g.attrs(), DType::kUndefined, g.info(g.in(0)).shape));
}

// dX = cast(dY, dtype(X)); the `like` input only names a dtype.
void cast_like_grad(GradCtx& g) {
  const DType to = g.info(g.in(0)).dtype;
  if (g.info(g.grad_out(0)).dtype == to) return g.set_grad(0, g.grad_out(0));
  Attributes a;
  a.set("to", static_cast<int64_t>(to));
  g.set_grad(0, g.op("Cast", {g.grad_out(0)}, std::move(a), to, g.info(g.in(0)).shape));
}

// Variadic Max/Min: dX_i = sum_to_shape(dY · [X_i == Y] / #{j : X_j == Y}) — ties share dY
// equally, as torch.maximum/minimum split it between two equal operands.
void min_max_grad(GradCtx& g) {
  std::vector<ValueId> ins{g.grad_out(0), g.out(0)}, like;
  for (int i = 0; i < static_cast<int>(g.node().inputs.size()); ++i) {
    ins.push_back(g.in(i));
    like.push_back(g.needs(i) ? g.in(i) : kNoValue);
  }
  std::vector<ValueId> grads = g.ours_multi("MinMaxGrad", std::move(ins), like);
  for (int i = 0; i < static_cast<int>(grads.size()); ++i) g.set_grad(i, grads[i]);
}

// Gelu: dX = dY · Φ'(X) (exact or tanh form, as the forward's `approximate`); reads X.
void gelu_grad(GradCtx& g) {
  Attributes a;
  a.set("approximate", g.attrs().get_string("approximate", "none"));
  g.set_grad(0, g.ours("GeluGrad", {g.grad_out(0), g.in(0)}, std::move(a), DType::kUndefined,
                       g.info(g.in(0)).shape));
}

void erf_grad(GradCtx& g) {  // dX = dY · 2/√π · exp(−X²)
  g.set_grad(0, g.ours("ErfGrad", {g.grad_out(0), g.in(0)}, {}, DType::kUndefined, g.info(g.in(0)).shape));
}

void sin_grad(GradCtx& g) {  // dX = dY·cos(X)
  g.set_grad(0, g.mul(g.grad_out(0), g.op("Cos", {g.in(0)})));
}

void cos_grad(GradCtx& g) {  // dX = −dY·sin(X)
  g.set_grad(0, g.neg(g.mul(g.grad_out(0), g.op("Sin", {g.in(0)}))));
}

void softplus_grad(GradCtx& g) {  // dX = dY·sigmoid(X)
  g.set_grad(0, g.mul(g.grad_out(0), g.op("Sigmoid", {g.in(0)})));
}

void leaky_relu_grad(GradCtx& g) {  // dX = X > 0 ? dY : alpha·dY (torch's rule at 0: alpha)
  const DType dt = g.info(g.grad_out(0)).dtype;
  ValueId positive = g.op("Greater", {g.in(0), g.const_scalar(0.0, g.info(g.in(0)).dtype)}, {}, DType::kBool);
  ValueId scaled = g.mul(g.grad_out(0), g.const_scalar(g.attrs().get_float("alpha", 0.01f), dt));
  g.set_grad(0, g.op("Where", {positive, g.grad_out(0), scaled}, {}, dt));
}

// Clip: dY passes where min <= X <= max (both inclusive, as torch.clamp's gradient); bounds get none.
void clip_grad(GradCtx& g) {
  const DType dt = g.info(g.grad_out(0)).dtype;
  ValueId inside = kNoValue;
  auto bound = [&](const char* op, ValueId b) {
    ValueId ok = g.op(op, {g.in(0), b}, {}, DType::kBool);
    inside = inside == kNoValue ? ok : g.op("And", {inside, ok}, {}, DType::kBool);
  };
  if (g.opset() < 11) {
    const DType xt = g.info(g.in(0)).dtype;
    if (g.attrs().has("min")) bound("GreaterOrEqual", g.const_scalar(g.attrs().get_float("min", 0), xt));
    if (g.attrs().has("max")) bound("LessOrEqual", g.const_scalar(g.attrs().get_float("max", 0), xt));
  } else {
    if (g.has_in(1)) bound("GreaterOrEqual", g.in(1));
    if (g.has_in(2)) bound("LessOrEqual", g.in(2));
  }
  if (inside == kNoValue) return g.set_grad(0, g.grad_out(0));
  g.set_grad(0, g.op("Where", {inside, g.grad_out(0), g.const_scalar(0.0, dt)}, {}, dt, g.info(g.in(0)).shape));
}

}  // namespace

// Unary: the output has the input's shape.
REGISTER_SHAPE_RULE("Abs", same_as_input0);
REGISTER_SHAPE_RULE("Acos", same_as_input0);
REGISTER_SHAPE_RULE("Acosh", same_as_input0);
REGISTER_SHAPE_RULE("Asin", same_as_input0);
REGISTER_SHAPE_RULE("Asinh", same_as_input0);
REGISTER_SHAPE_RULE("Atan", same_as_input0);
REGISTER_SHAPE_RULE("Atanh", same_as_input0);
REGISTER_SHAPE_RULE("BitwiseNot", same_as_input0);
REGISTER_SHAPE_RULE("Ceil", same_as_input0);
REGISTER_SHAPE_RULE("Celu", same_as_input0);
REGISTER_SHAPE_RULE("Clip", same_as_input0);
REGISTER_SHAPE_RULE("Cos", same_as_input0);
REGISTER_SHAPE_RULE("Cosh", same_as_input0);
REGISTER_SHAPE_RULE("Elu", same_as_input0);
REGISTER_SHAPE_RULE("Erf", same_as_input0);
REGISTER_SHAPE_RULE("Exp", same_as_input0);
REGISTER_SHAPE_RULE("Floor", same_as_input0);
REGISTER_SHAPE_RULE("Gelu", same_as_input0);
REGISTER_SHAPE_RULE("HardSigmoid", same_as_input0);
REGISTER_SHAPE_RULE("HardSwish", same_as_input0);
REGISTER_SHAPE_RULE("IsInf", same_as_input0);
REGISTER_SHAPE_RULE("IsNaN", same_as_input0);
REGISTER_SHAPE_RULE("LeakyRelu", same_as_input0);
REGISTER_SHAPE_RULE("Log", same_as_input0);
REGISTER_SHAPE_RULE("Mish", same_as_input0);
REGISTER_SHAPE_RULE("Not", same_as_input0);
REGISTER_SHAPE_RULE("Reciprocal", same_as_input0);
REGISTER_SHAPE_RULE("Relu", same_as_input0);
REGISTER_SHAPE_RULE("Round", same_as_input0);
REGISTER_SHAPE_RULE("Selu", same_as_input0);
REGISTER_SHAPE_RULE("Sigmoid", same_as_input0);
REGISTER_SHAPE_RULE("Sign", same_as_input0);
REGISTER_SHAPE_RULE("Sin", same_as_input0);
REGISTER_SHAPE_RULE("Sinh", same_as_input0);
REGISTER_SHAPE_RULE("Softplus", same_as_input0);
REGISTER_SHAPE_RULE("Softsign", same_as_input0);
REGISTER_SHAPE_RULE("Sqrt", same_as_input0);
REGISTER_SHAPE_RULE("Tan", same_as_input0);
REGISTER_SHAPE_RULE("Tanh", same_as_input0);
REGISTER_SHAPE_RULE("ThresholdedRelu", same_as_input0);
REGISTER_SHAPE_RULE("Trilu", same_as_input0);
REGISTER_SHAPE_RULE("EyeLike", same_as_input0);
REGISTER_SHAPE_RULE("Identity", identity_shape);
REGISTER_SHAPE_RULE("Neg", neg_shape);
REGISTER_SHAPE_RULE("Cast", cast_shape);
REGISTER_SHAPE_RULE("CastLike", same_as_input0);

// N-ary with numpy broadcasting.
REGISTER_SHAPE_RULE("Add", add_shape);
REGISTER_SHAPE_RULE("Sub", sub_shape);
REGISTER_SHAPE_RULE("Mul", mul_shape);
REGISTER_SHAPE_RULE("Div", div_shape);
REGISTER_SHAPE_RULE("Pow", broadcast_shape);
REGISTER_SHAPE_RULE("Mod", broadcast_shape);
REGISTER_SHAPE_RULE("Max", broadcast_shape);
REGISTER_SHAPE_RULE("Min", broadcast_shape);
REGISTER_SHAPE_RULE("Mean", broadcast_shape);
REGISTER_SHAPE_RULE("Sum", broadcast_shape);
REGISTER_SHAPE_RULE("PRelu", broadcast_shape);
REGISTER_SHAPE_RULE("Where", broadcast_shape);
REGISTER_SHAPE_RULE("And", broadcast_shape);
REGISTER_SHAPE_RULE("Or", broadcast_shape);
REGISTER_SHAPE_RULE("Xor", broadcast_shape);
REGISTER_SHAPE_RULE("BitShift", broadcast_shape);
REGISTER_SHAPE_RULE("BitwiseAnd", broadcast_shape);
REGISTER_SHAPE_RULE("BitwiseOr", broadcast_shape);
REGISTER_SHAPE_RULE("BitwiseXor", broadcast_shape);
REGISTER_SHAPE_RULE("Equal", broadcast_shape);
REGISTER_SHAPE_RULE("Greater", broadcast_shape);
REGISTER_SHAPE_RULE("GreaterOrEqual", broadcast_shape);
REGISTER_SHAPE_RULE("Less", broadcast_shape);
REGISTER_SHAPE_RULE("LessOrEqual", broadcast_shape);

// Our gradient ops (com.torch_ort).
REGISTER_SHAPE_RULE_IN(kOurDomain, "ReluGrad", activation_grad_shape);     // (dY, Y)
REGISTER_SHAPE_RULE_IN(kOurDomain, "SigmoidGrad", activation_grad_shape);  // (dY, Y)
REGISTER_SHAPE_RULE_IN(kOurDomain, "TanhGrad", activation_grad_shape);     // (dY, Y)
// Declared by the gradient builder when it emits them (like the inputs they differentiate).
REGISTER_SHAPE_RULE_IN(kOurDomain, "MinMaxGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "GeluGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "ErfGrad", declared_by_gradient_builder);

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
REGISTER_GRADIENT("Reciprocal", reciprocal_grad, {});
REGISTER_GRADIENT("Log", log_grad, {});
REGISTER_GRADIENT("Where", where_grad, {0});
REGISTER_GRADIENT("Relu", relu_grad, {});
REGISTER_GRADIENT("Sigmoid", sigmoid_grad, {});
REGISTER_GRADIENT("Tanh", tanh_grad, {});
REGISTER_GRADIENT("Gelu", gelu_grad, {});
REGISTER_GRADIENT("Erf", erf_grad, {});
REGISTER_GRADIENT("Trilu", trilu_grad, {1});
REGISTER_GRADIENT("CastLike", cast_like_grad, {1});
REGISTER_GRADIENT("Max", min_max_grad, {});
REGISTER_GRADIENT("Sin", sin_grad, {});
REGISTER_GRADIENT("Cos", cos_grad, {});
REGISTER_GRADIENT("Softplus", softplus_grad, {});
REGISTER_GRADIENT("LeakyRelu", leaky_relu_grad, {});
REGISTER_GRADIENT("Clip", clip_grad, {1, 2});
REGISTER_GRADIENT("Min", min_max_grad, {});

// Boolean outputs: no gradient flows through them.
NO_GRADIENT("Equal", "boolean output");
NO_GRADIENT("Greater", "boolean output");
NO_GRADIENT("Less", "boolean output");
NO_GRADIENT("Not", "boolean output");
NO_GRADIENT("GreaterOrEqual", "boolean output");
NO_GRADIENT("LessOrEqual", "boolean output");
NO_GRADIENT("And", "boolean output");
NO_GRADIENT("Or", "boolean output");
NO_GRADIENT("Xor", "boolean output");
NO_GRADIENT("IsNaN", "boolean output");
NO_GRADIENT("IsInf", "boolean output");
NO_GRADIENT("BitwiseAnd", "integer operands");
NO_GRADIENT("BitwiseOr", "integer operands");
NO_GRADIENT("BitwiseXor", "integer operands");
NO_GRADIENT("BitwiseNot", "integer operands");
NO_GRADIENT("BitShift", "integer operands");

}  // namespace torch_ort
