// The declarative rewrite vocabulary (passes/rewrite.h): what a pattern matches, the choices it
// backtracks over, and what a rewrite keeps and removes.
#include <gtest/gtest.h>

#include <algorithm>

#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/rewrite.h"
#include "tests/cpp/ir_builders.h"

namespace torch_ort {
namespace {

using namespace rewrite;
using testing::add_node;
using testing::fvalue;

// y = Relu(Neg(a)) + b, with a, b graph inputs of shape [batch, 4].
struct Chain {
  Graph g;
  ValueId a, b, n, r, y;
};
Chain chain() {
  Chain c;
  c.a = fvalue(c.g, "a");
  c.b = fvalue(c.g, "b");
  c.g.inputs = {c.a, c.b};
  c.n = fvalue(c.g, "n");
  c.r = fvalue(c.g, "r");
  c.y = fvalue(c.g, "y");
  add_node(c.g, "Neg", {c.a}, {c.n}, "/neg");
  add_node(c.g, "Relu", {c.n}, {c.r}, "/relu");
  add_node(c.g, "Add", {c.r, c.b}, {c.y}, "/add");
  c.g.outputs = {c.y};
  return c;
}

// Relu(Neg(x)) + other -> Sub(other, x)... a nonsense rewrite whose structure is easy to check.
Rule add_of_relu_of_neg(std::function<bool(const Graph&, const Match&)> condition = {}) {
  return Rule{"Add(Relu(Neg(x)), other) -> Sub(other, x)",
              op("Add").commutative().in({from(op("Relu").as("relu").in({from(op("Neg").in({val("x")}))})),
                                          val("other")}),
              std::move(condition),
              [](const Graph&, const Match& m, const Node& root) {
                return Node{"", "Sub", "", {m.value("other"), m.value("x")}, root.outputs, {}};
              }};
}

TEST(Rewrite, TreeMatchReplacesTheRootAndRemovesTheInterior) {
  Chain c = chain();
  c.g.nodes[2].in_backward = true;  // the root's phase is kept
  ASSERT_TRUE(apply(c.g, {add_of_relu_of_neg()}));
  verify(c.g);
  ASSERT_EQ(c.g.nodes.size(), 1u);
  const Node& n = c.g.nodes[0];
  EXPECT_EQ(n.op_type, "Sub");
  EXPECT_EQ(n.name, "/add");  // an empty builder name keeps the root's
  EXPECT_TRUE(n.in_backward);
  EXPECT_EQ(n.inputs, (std::vector<ValueId>{c.b, c.a}));
  EXPECT_EQ(n.outputs, (std::vector<ValueId>{c.y}));
}

TEST(Rewrite, CommutativeRootTriesTheOtherOrderWhenTheConditionFails) {
  // y = Relu(Neg(a)) + Relu(Neg(c)): both orders match; the condition accepts only x = c.
  Chain ch = chain();
  Graph& g = ch.g;
  const ValueId c = fvalue(g, "c"), nc = fvalue(g, "nc"), rc = fvalue(g, "rc");
  g.inputs = {ch.a, c};
  add_node(g, "Neg", {c}, {nc}, "/neg_c");
  add_node(g, "Relu", {nc}, {rc}, "/relu_c");
  std::rotate(g.nodes.begin() + 2, g.nodes.begin() + 3, g.nodes.end());  // the Add last
  g.nodes.back().inputs = {ch.r, rc};
  std::vector<ValueId> tried;
  ASSERT_TRUE(apply(g, {add_of_relu_of_neg([&](const Graph&, const Match& m) {
    tried.push_back(m.value("x"));
    return m.value("x") == c;
  })}));
  EXPECT_EQ(tried, (std::vector<ValueId>{ch.a, c}));
  verify(g);
  // The matched side's Relu and Neg went; the other side's stay, read by the Sub.
  ASSERT_EQ(g.nodes.size(), 3u);
  EXPECT_EQ(g.nodes.back().op_type, "Sub");
  EXPECT_EQ(g.nodes.back().inputs, (std::vector<ValueId>{ch.r, c}));
}

TEST(Rewrite, AConditionThatNeverHoldsChangesNothing) {
  Chain ch = chain();
  int tried = 0;
  EXPECT_FALSE(apply(ch.g, {add_of_relu_of_neg([&](const Graph&, const Match&) { return ++tried, false; })}));
  EXPECT_EQ(ch.g.nodes.size(), 3u);
  EXPECT_EQ(tried, 1);  // (b, r) never reaches the condition: b is not Relu's output
}

TEST(Rewrite, AnInteriorValueReadElsewhereBlocksTheMatch) {
  Chain c = chain();
  c.g.outputs.push_back(c.n);  // Neg's output is also a graph output
  EXPECT_FALSE(apply(c.g, {add_of_relu_of_neg()}));
  Chain d = chain();
  const ValueId extra = fvalue(d.g, "extra");
  add_node(d.g, "Exp", {d.r}, {extra}, "/exp");  // Relu's output has a second reader
  d.g.outputs.push_back(extra);
  EXPECT_FALSE(apply(d.g, {add_of_relu_of_neg()}));
  EXPECT_EQ(d.g.nodes.size(), 4u);
}

TEST(Rewrite, OptionalInputsAndArity) {
  Graph g;
  const ValueId x = fvalue(g, "x"), y = fvalue(g, "y"), z = fvalue(g, "z");
  g.inputs = {x, y};
  add_node(g, "Add", {x, y}, {z}, "/add");
  g.outputs = {z};
  std::vector<ValueId> seen;
  const Rule two_plus_optional{"", op("Add").in({val("a"), val("b"), opt("c")}),
                               [&](const Graph&, const Match& m) { seen.push_back(m.value("c")); return false; },
                               [](const Graph&, const Match&, const Node& r) { return r; }};
  EXPECT_FALSE(apply(g, {two_plus_optional}));
  EXPECT_EQ(seen, (std::vector<ValueId>{kNoValue}));  // absent: kNoValue

  const Rule one_input{"", op("Add").in({val("a")}), {}, [](const Graph&, const Match&, const Node& r) { return r; }};
  EXPECT_FALSE(apply(g, {one_input}));  // two inputs where one is listed: no match
  Rule prefix = one_input;
  prefix.root.at_least_these_inputs();
  EXPECT_TRUE(apply(g, {prefix}));
}

TEST(Rewrite, TheSameCaptureNameMustBeTheSameValue) {
  Graph g;
  const ValueId x = fvalue(g, "x"), y = fvalue(g, "y"), sq = fvalue(g, "sq"), xy = fvalue(g, "xy");
  g.inputs = {x, y};
  add_node(g, "Mul", {x, x}, {sq}, "/square");
  add_node(g, "Mul", {x, y}, {xy}, "/product");
  g.outputs = {sq, xy};
  const Rule square{"Mul(a, a) -> Pow", op("Mul").in({val("a"), val("a")}), {},
                    [](const Graph&, const Match& m, const Node& r) {
                      return Node{"", "Neg", "", {m.value("a")}, r.outputs, {}};
                    }};
  ASSERT_TRUE(apply(g, {square}));
  EXPECT_EQ(g.nodes[0].op_type, "Neg");
  EXPECT_EQ(g.nodes[1].op_type, "Mul");
}

TEST(Rewrite, UnknownCaptureNamesThrow) {
  Match m;
  EXPECT_THROW(m.node("nope"), std::out_of_range);
  EXPECT_THROW(m.value("nope"), std::out_of_range);
}

}  // namespace
}  // namespace torch_ort
