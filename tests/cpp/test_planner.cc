// Planner: the saved set is what backward reads, no more; every other buffer dies at last use.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/planner/plan.h"

namespace torch_ort {
namespace {

Shape dims(std::vector<Dim> d) { return Shape::of(std::move(d)); }

// y = Relu(x · W + b); loss = ReduceSum(Tanh(y))  — a one-layer MLP with a scalar loss.
Graph mlp() {
  Graph g;
  const Dim n = Dim::symbolic("batch");
  ValueId x = g.add_value("x", DType::kFloat, dims({n, Dim::known(4)}));
  ValueId w = g.add_value("w", DType::kFloat, dims({Dim::known(3), Dim::known(4)}));
  ValueId b = g.add_value("b", DType::kFloat, dims({Dim::known(3)}));
  ValueId h = g.add_value("h", DType::kFloat, dims({n, Dim::known(3)}));
  ValueId r = g.add_value("r", DType::kFloat, dims({n, Dim::known(3)}));
  ValueId t = g.add_value("t", DType::kFloat, dims({n, Dim::known(3)}));
  ValueId loss = g.add_value("loss", DType::kFloat, dims({}));
  g.inputs = {x, w, b};
  Attributes gemm;
  gemm.set("transB", int64_t{1});
  Attributes reduce;
  reduce.set("keepdims", int64_t{0});
  g.nodes.push_back(Node{"", "Gemm", "gemm", {x, w, b}, {h}, gemm});
  g.nodes.push_back(Node{"", "Relu", "relu", {h}, {r}, {}});
  g.nodes.push_back(Node{"", "Tanh", "tanh", {r}, {t}, {}});
  g.nodes.push_back(Node{"", "ReduceSum", "sum", {t}, {loss}, reduce});
  g.outputs = {loss};
  return g;
}

std::set<std::string> names(const Graph& g, const std::vector<ValueId>& ids) {
  std::set<std::string> out;
  for (ValueId v : ids) out.insert(g.value(v).name);
  return out;
}

TEST(Planner, SavedSetIsExactlyWhatBackwardReads) {
  TrainingGraph tg = build_training_graph(mlp(), {false, true, true});
  Plan plan = plan_training(tg);
  const Graph& g = tg.graph;
  std::set<ValueId> read_by_backward;
  for (size_t s = tg.num_forward_nodes; s < g.nodes.size(); ++s)
    for (ValueId v : g.nodes[s].inputs)
      if (v != kNoValue && !g.initializers.count(v)) read_by_backward.insert(v);
  std::set<ValueId> saved(plan.saved.begin(), plan.saved.end());
  for (ValueId v : saved) EXPECT_TRUE(read_by_backward.count(v)) << g.value(v).name << " saved but unread";
  // Relu and Tanh keep their outputs (not inputs); the Gemm keeps x (for dW); h is not kept.
  const auto saved_names = names(g, plan.saved);
  EXPECT_TRUE(saved_names.count("r")) << "ReluGrad reads Relu's output";
  EXPECT_TRUE(saved_names.count("t")) << "TanhGrad reads Tanh's output";
  EXPECT_TRUE(saved_names.count("x")) << "dW = dYᵀ·x";
  EXPECT_FALSE(saved_names.count("h")) << "Relu's input is not needed by backward";
  EXPECT_LT(plan.num_saved_activations, plan.num_forward_values);
}

TEST(Planner, EveryUnsavedForwardValueIsFreedOnce) {
  TrainingGraph tg = build_training_graph(mlp(), {false, true, true});
  Plan plan = plan_training(tg);
  const Graph& g = tg.graph;
  std::multiset<ValueId> freed;
  for (const Step& s : plan.forward) freed.insert(s.free_after.begin(), s.free_after.end());
  std::set<ValueId> saved(plan.saved.begin(), plan.saved.end());
  for (const Step& s : plan.forward)
    for (ValueId v : g.nodes[s.node].outputs) {
      if (v == kNoValue) continue;
      const bool kept = saved.count(v) || std::count(g.outputs.begin(), g.outputs.end(), v);
      EXPECT_EQ(freed.count(v), kept ? 0u : 1u) << g.value(v).name;
    }
  // h (Gemm output) dies right after Relu reads it: step 1.
  ValueId h = *g.find("h");
  EXPECT_NE(std::find(plan.forward[1].free_after.begin(), plan.forward[1].free_after.end(), h),
            plan.forward[1].free_after.end());
}

TEST(Planner, BackwardFreesSavedValuesAndKeepsGradients) {
  TrainingGraph tg = build_training_graph(mlp(), {false, true, true});
  Plan plan = plan_training(tg);
  std::set<ValueId> freed;
  for (const Step& s : plan.backward) freed.insert(s.free_after.begin(), s.free_after.end());
  for (ValueId v : plan.saved) EXPECT_TRUE(freed.count(v)) << tg.graph.value(v).name;
  for (ValueId v : tg.input_grads)
    if (v != kNoValue) EXPECT_FALSE(freed.count(v)) << "a returned gradient must outlive backward";
  EXPECT_EQ(tg.input_grads[0], kNoValue);  // x does not require grad
}

TEST(Planner, InferencePlanSavesNothing) {
  Graph g = mlp();
  Plan plan = plan_inference(g);
  EXPECT_TRUE(plan.saved.empty());
  EXPECT_TRUE(plan.backward.empty());
  EXPECT_EQ(plan.forward.size(), g.nodes.size());
  EXPECT_EQ(plan.num_forward_values, 4);
}

}  // namespace
}  // namespace torch_ort
