// Shape rules of elementwise ops: unary, broadcasting, casts, comparisons, Dropout, our *Grad ops.
//
// Integer arithmetic on shape values (Add/Sub/Mul/Div of sizes) is carried symbolically.
#include <cstdint>

#include "csrc/core/ir/dtype.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

void same_as_input0(ShapeCtx& c) { c.set(0, c.in(0)); }

// Identity-like ops also pass the values of a shape computation through.
void identity_shape(ShapeCtx& c) {
  c.set(0, c.in(0));
  if (const SymValues* v = c.values(0)) c.set_values(0, *v, c.rank(0) == 0);
}

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

// Dropout(X, ratio?, training_mode?) -> (Y, mask): both have X's shape.
void dropout_shape(ShapeCtx& c) {
  c.set(0, c.in(0));
  c.set(1, c.in(0));
}

// Our activation gradients read (dY, Y): the gradient has their common shape.
void activation_grad_shape(ShapeCtx& c) { c.set(0, broadcast(c, c.in(0), c.in(1))); }

}  // namespace

// Unary: the output has the input's shape.
REGISTER_SHAPE_RULE("Abs", same_as_input0);
REGISTER_SHAPE_RULE("Acos", same_as_input0);
REGISTER_SHAPE_RULE("Asin", same_as_input0);
REGISTER_SHAPE_RULE("Atan", same_as_input0);
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
REGISTER_SHAPE_RULE("CumSum", same_as_input0);
REGISTER_SHAPE_RULE("Identity", identity_shape);
REGISTER_SHAPE_RULE("Neg", neg_shape);
REGISTER_SHAPE_RULE("Cast", cast_shape);
REGISTER_SHAPE_RULE("CastLike", same_as_input0);
REGISTER_SHAPE_RULE("Dropout", dropout_shape);

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
REGISTER_SHAPE_RULE_IN(kOurDomain, "DropoutGrad", same_as_input0);         // (dY, mask, ...)
// Placement's crossings (csrc/core/planner/placement.h): the same values elsewhere.
REGISTER_SHAPE_RULE_IN(kOurDomain, "ToHost", identity_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "ToDevice", identity_shape);

}  // namespace torch_ort
