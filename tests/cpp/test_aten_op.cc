// Structure of the ATen fallback node in training graphs: the autograd outputs it gains, the one
// ATenOpGrad it gets, what the planner saves, and gradient errors that name every missing rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "csrc/core/ir/aten_op.h"
#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/planner/plan.h"

namespace torch_ort {
namespace {

Shape s34() { return Shape::of({Dim::symbolic("batch"), Dim::known(4)}); }

// y, idx = aten::cummax(x, 1); loss-like output z = y * w. Inputs: x, w (float), k (int64).
struct AtenGraph {
  Graph g;
  ValueId x, w, k, y, idx, z;
  AtenGraph() {
    x = g.add_value("x", DType::kFloat, s34());
    w = g.add_value("w", DType::kFloat, s34());
    k = g.add_value("k", DType::kInt64, Shape::of({}));
    g.inputs = {x, w, k};
    y = g.add_value("y", DType::kFloat, s34());
    idx = g.add_value("idx", DType::kInt64, s34());
    Attributes a;
    a.set("aten_op", std::string("aten::cummax.default"));
    a.set("arg_kinds", std::vector<std::string>{"tensor", "item"});
    a.set("arg0", int64_t{0});
    a.set("arg1", int64_t{1});
    g.nodes.push_back(Node{kOurDomain, kAtenOp, "/cummax", {x, k}, {y, idx}, a});
    z = g.add_value("z", DType::kFloat, s34());
    g.nodes.push_back(Node{"", "Mul", "/mul", {y, w}, {z}, {}});
    g.outputs = {z, idx};
  }
};

const Node* find_op(const TrainingGraph& tg, const std::string& op) {
  for (const Node& n : tg.graph.nodes)
    if (n.op_type == op) return &n;
  return nullptr;
}

TEST(AtenOpGradient, ForwardNodeGainsAutogradOutputsAndOneGradNode) {
  AtenGraph ag;
  TrainingGraph tg = build_training_graph(ag.g, {true, false, false});
  verify(as_exportable_graph(tg));
  const Node* fwd = find_op(tg, kAtenOp);
  ASSERT_NE(fwd, nullptr);
  EXPECT_EQ(fwd->attrs.get_int("num_results", -1), 2);
  // 2 results + 2 results with history + one leaf per input (x: float; k: int64 -> none).
  ASSERT_EQ(fwd->outputs.size(), 6u);
  EXPECT_NE(fwd->outputs[2], kNoValue);
  EXPECT_NE(fwd->outputs[4], kNoValue);
  EXPECT_EQ(fwd->outputs[5], kNoValue) << "an int64 input can never require grad: no leaf";

  const Node* bwd = find_op(tg, kAtenOpGrad);
  ASSERT_NE(bwd, nullptr);
  EXPECT_EQ(bwd->domain, kOurDomain);
  // (dy, d idx = none, y with history, idx with history, leaf of x) -> dx
  ASSERT_EQ(bwd->inputs.size(), 5u);
  EXPECT_NE(bwd->inputs[0], kNoValue);
  EXPECT_EQ(bwd->inputs[1], kNoValue) << "no gradient flows into the indices";
  EXPECT_EQ(bwd->inputs[2], fwd->outputs[2]);
  EXPECT_EQ(bwd->inputs[3], kNoValue) << "no gradient reaches idx: its history is not kept";
  EXPECT_EQ(bwd->inputs[4], fwd->outputs[4]);
  ASSERT_EQ(bwd->outputs.size(), 1u);
  EXPECT_EQ(tg.input_grads[0], bwd->outputs[0]);
  EXPECT_EQ(tg.graph.value(bwd->outputs[0]).dtype, DType::kFloat);
  EXPECT_TRUE(tg.graph.value(bwd->outputs[0]).shape.same_as(s34()));
}

TEST(AtenOpGradient, PlannerSavesAutogradStateNotTheResult) {
  AtenGraph ag;
  TrainingGraph tg = build_training_graph(ag.g, {true, true, false});
  Plan plan = plan_training(tg);
  const Node* fwd = find_op(tg, kAtenOp);
  auto saved = [&](ValueId v) { return std::count(plan.saved.begin(), plan.saved.end(), v) > 0; };
  EXPECT_TRUE(saved(fwd->outputs[2])) << "y with its autograd history";
  EXPECT_TRUE(saved(fwd->outputs[4])) << "the leaf of x";
  EXPECT_FALSE(saved(fwd->outputs[3])) << "the indices' history is never differentiated";
  EXPECT_TRUE(saved(ag.y)) << "Mul's gradient dW = dZ·y reads the detached result";
}

TEST(AtenOpGradient, NoGradientWantedMeansNoGradNode) {
  AtenGraph ag;
  TrainingGraph tg = build_training_graph(ag.g, {false, true, false});
  EXPECT_EQ(find_op(tg, kAtenOpGrad), nullptr);
  Plan plan = plan_training(tg);
  const Node* fwd = find_op(tg, kAtenOp);
  for (size_t i = 2; i < fwd->outputs.size(); ++i)
    if (fwd->outputs[i] != kNoValue)
      EXPECT_EQ(std::count(plan.saved.begin(), plan.saved.end(), fwd->outputs[i]), 0)
          << "unread autograd outputs must not be kept (the kernel then runs without grad mode)";
}

TEST(AtenOpGradient, MissingRulesAreAllNamedInOneError) {
  Graph g;
  ValueId x = g.add_value("x", DType::kFloat, s34());
  g.inputs = {x};
  ValueId a = g.add_value("a", DType::kFloat, s34()), b = g.add_value("b", DType::kFloat, s34());
  ValueId c = g.add_value("c", DType::kFloat, s34());
  g.nodes.push_back(Node{"", "NoSuchOpA", "/first", {x}, {a}, {}});
  g.nodes.push_back(Node{"", "NoSuchOpB", "/second", {x}, {b}, {}});
  g.nodes.push_back(Node{"", "Add", "/add", {a, b}, {c}, {}});
  g.outputs = {c};
  try {
    build_training_graph(g, {true});
    FAIL() << "expected a GradientError";
  } catch (const GradientError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'NoSuchOpA' (node /first)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'NoSuchOpB' (node /second)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace torch_ort
