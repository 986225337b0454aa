// The core evaluator (csrc/core/eval): integers exact where doubles would not be, failures as
// EvalError, the result bound checked before anything is built, and the test oracle delegating
// the evaluator's ops to it.
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

#include "csrc/core/eval/eval.h"
#include "csrc/core/eval/expression.h"
#include "tests/cpp/reference_eval.h"

namespace torch_ort {
namespace {

using eval::Tensor;

Node op(const std::string& type) {
  Node n;
  n.op_type = type;
  n.name = "/" + type;
  return n;
}
Tensor i64(eval::Dims shape, std::vector<int64_t> v) { return Tensor::of_ints(DType::kInt64, std::move(shape), std::move(v)); }

TEST(Eval, Int64ArithmeticIsExactAndOverflowThrows) {
  const int64_t big = std::numeric_limits<int64_t>::max() - 1;  // not a double
  const Tensor a = i64({1}, {big}), one = i64({}, {1});
  EXPECT_EQ(eval::eval_node(op("Add"), {&a, &one}).at(0).ints, std::vector<int64_t>{big + 1});
  const Tensor two = i64({}, {2});
  EXPECT_THROW(eval::eval_node(op("Add"), {&a, &two}), eval::EvalError);
  const Tensor zero = i64({}, {0});
  EXPECT_THROW(eval::eval_node(op("Div"), {&a, &zero}), eval::EvalError);
  const Tensor m7 = i64({}, {-7});
  EXPECT_EQ(eval::eval_node(op("Div"), {&m7, &two}).at(0).ints, std::vector<int64_t>{-3});  // truncates
}

TEST(Eval, SliceToInt64MaxAndBackwards) {
  const Tensor x = i64({5}, {10, 11, 12, 13, 14});
  const Tensor s = i64({1}, {1}), e = i64({1}, {std::numeric_limits<int64_t>::max()});
  EXPECT_EQ(eval::eval_node(op("Slice"), {&x, &s, &e}).at(0).ints, (std::vector<int64_t>{11, 12, 13, 14}));
  const Tensor s2 = i64({1}, {-1}), e2 = i64({1}, {std::numeric_limits<int64_t>::min()}), ax = i64({1}, {0}),
               st = i64({1}, {-2});
  EXPECT_EQ(eval::eval_node(op("Slice"), {&x, &s2, &e2, &ax, &st}).at(0).ints, (std::vector<int64_t>{14, 12, 10}));
}

TEST(Eval, ResultBoundIsCheckedBeforeBuilding) {
  const Tensor x = i64({}, {1}), shape = i64({2}, {1 << 20, 1 << 20});
  EXPECT_THROW(eval::eval_node(op("Expand"), {&x, &shape}, {1024}), eval::EvalError);
  const Tensor small = i64({1}, {4});
  EXPECT_EQ(eval::eval_node(op("Expand"), {&x, &small}, {1024}).at(0).ints.size(), 4u);
}

TEST(Eval, FloatsAreNotRoundedToTheirDtype) {
  const Tensor a = Tensor::of_reals(DType::kFloat, {}, {1.0}), b = Tensor::of_reals(DType::kFloat, {}, {3.0});
  const Tensor r = eval::eval_node(op("Div"), {&a, &b}).at(0);
  EXPECT_EQ(r.reals.at(0), 1.0 / 3.0);
  EXPECT_EQ(eval::round_to_dtype(DType::kFloat, r.reals[0]), double(1.0f / 3.0f));
}

TEST(Eval, OracleDelegatesTheEvaluatorsOps) {
  EXPECT_TRUE(eval::has_op("", "Gather"));
  EXPECT_FALSE(eval::has_op("", "MatMul"));
  Node g = op("Gather");
  const Tensor x = Tensor::of_reals(DType::kFloat, {3}, {1.5, 2.5, 3.5}), idx = ref::ints({2, -3});
  const auto out = ref::eval_node(g, {&x, &idx});
  EXPECT_EQ(out.at(0).reals, (std::vector<double>{3.5, 1.5}));
  const Tensor bad = ref::ints({3});
  EXPECT_THROW(ref::eval_node(g, {&x, &bad}), std::runtime_error);
}

// x (B, T, D): the graph computes factor = c / Sqrt(CastLike(Gather(Shape(x), index), x)).
struct ScaleGraph {
  Graph g;
  ValueId x, factor;
  ScaleGraph(Dim d, int64_t index, double c) {
    x = g.add_value("x", DType::kFloat, Shape::of({Dim::symbolic("B"), Dim::symbolic("T"), d}));
    g.inputs = {x};
    auto value = [&](const char* name, DType t, Shape s) { return g.add_value(name, t, std::move(s)); };
    const ValueId shape = value("shape", DType::kInt64, Shape::of({Dim::known(3)}));
    const ValueId at = value("at", DType::kInt64, Shape::of({}));
    const ValueId dim = value("dim", DType::kInt64, Shape::of({})), dim_f = value("dim_f", DType::kFloat, Shape::of({}));
    const ValueId root = value("root", DType::kFloat, Shape::of({})), cst = value("c", DType::kFloat, Shape::of({}));
    factor = value("factor", DType::kFloat, Shape::of({}));
    g.initializers[at] = TensorData::from_int64s({index}, true);
    g.initializers[cst] = TensorData::scalar_float(DType::kFloat, c);
    g.nodes.push_back(Node{"", "Shape", "/shape", {x}, {shape}, {}});
    g.nodes.push_back(Node{"", "Gather", "/gather", {shape, at}, {dim}, {}});
    g.nodes.push_back(Node{"", "CastLike", "/cast", {dim, x}, {dim_f}, {}});
    g.nodes.push_back(Node{"", "Sqrt", "/sqrt", {dim_f}, {root}, {}});
    g.nodes.push_back(Node{"", "Div", "/div", {cst, root}, {factor}, {}});
    g.outputs = {factor};
  }
};

TEST(Expression, AScaleFromAKnownDimIsAConstant) {
  ScaleGraph s(Dim::known(16), -1, 2.0);
  const GraphIndex idx(s.g);
  EXPECT_DOUBLE_EQ(eval::scalar(s.g, idx, s.factor).value(), 0.5);
}

TEST(Expression, AScaleFromAnUnknownLastDimIsAPowerOfIt) {
  ScaleGraph s(Dim::symbolic("D"), -1, 3.0);
  const GraphIndex idx(s.g);
  const std::optional<eval::Monomial> m = eval::monomial(s.g, idx, s.factor);
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(m->coef, 3.0, 1e-12);
  EXPECT_EQ(m->power, -0.5);
  EXPECT_EQ(m->dim_of, std::vector<ValueId>{s.x});
  EXPECT_FALSE(eval::scalar(s.g, idx, s.factor).has_value());  // not a constant
}

TEST(Expression, AValueOfAnotherUnknownDimOrOfAGraphInputIsNoMonomial) {
  ScaleGraph seq(Dim::known(16), 1, 1.0);  // 1/√T
  const GraphIndex idx(seq.g);
  EXPECT_FALSE(eval::monomial(seq.g, idx, seq.factor).has_value());
  EXPECT_FALSE(eval::monomial(seq.g, idx, seq.x).has_value());  // a graph input: no data
}

// Two unknown dims of one size each would hide L - S; a truncating Cast at small square sizes would
// hide that floor(√D) is no power of D; a mask's -inf fill is a constant all the same.
TEST(Expression, NeitherDimsThatCancelNorRoundingPassForAConstantOrAPower) {
  Graph g;
  const ValueId q = g.add_value("q", DType::kFloat, Shape::of({Dim::symbolic("L"), Dim::symbolic("D")}));
  const ValueId k = g.add_value("k", DType::kFloat, Shape::of({Dim::symbolic("S"), Dim::symbolic("D")}));
  g.inputs = {q, k};
  auto value = [&](const std::string& name, DType t) { return g.add_value(name, t, Shape::of({})); };
  auto node = [&](const std::string& op, std::vector<ValueId> ins, ValueId out, Attributes a = {}) {
    g.nodes.push_back(Node{"", op, "/" + g.value(out).name, std::move(ins), {out}, std::move(a)});
    return out;
  };
  auto dim = [&](ValueId x, int64_t i, const std::string& name) {
    const ValueId shape = node("Shape", {x}, g.add_value(name + "_shape", DType::kInt64, Shape::of({Dim::known(2)})));
    const ValueId at = value(name + "_at", DType::kInt64);
    g.initializers[at] = TensorData::from_int64s({i}, true);
    return node("Gather", {shape, at}, value(name, DType::kInt64));
  };
  const ValueId diff = node("Sub", {dim(k, 0, "s"), dim(q, 0, "l")}, value("diff", DType::kInt64));
  Attributes to_float, to_int;
  to_float.set("to", int64_t{1});
  to_int.set("to", int64_t{7});
  const ValueId d = node("Cast", {dim(q, 1, "d")}, value("d_f", DType::kFloat), to_float);
  const ValueId floor = node("Cast", {node("Sqrt", {d}, value("root", DType::kFloat))}, value("floor", DType::kInt64), to_int);
  const ValueId floor_f = node("Cast", {floor}, value("floor_f", DType::kFloat), to_float);
  const ValueId inf = value("fill", DType::kFloat);
  g.initializers[inf] = TensorData::scalar_float(DType::kFloat, -std::numeric_limits<float>::infinity());
  const GraphIndex idx(g);
  EXPECT_FALSE(eval::monomial(g, idx, diff).has_value());  // S - L: two dims, neither last
  const std::optional<eval::Monomial> root = eval::monomial(g, idx, g.find("root").value());
  ASSERT_TRUE(root.has_value());
  EXPECT_EQ(root->power, 0.5);
  EXPECT_FALSE(eval::monomial(g, idx, floor_f).has_value());  // floor(√D) is no power of D
  EXPECT_EQ(eval::scalar(g, idx, inf), -std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace torch_ort
