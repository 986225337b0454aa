// Passes: structure of the graph after each pass, on tiny hand-written graphs.
#include <algorithm>

#include <gtest/gtest.h>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "tests/cpp/ir_builders.h"

namespace torch_ort {
namespace {

Graph with_dead_branch() {
  Graph g;
  ValueId x = g.add_value("x", DType::kFloat, Shape::of({Dim::symbolic("n")}));
  ValueId unused = g.add_value("unused_input", DType::kFloat, Shape::of({}));
  ValueId a = g.add_value("a", DType::kFloat, Shape::unknown());
  ValueId dead = g.add_value("dead", DType::kFloat, Shape::unknown());
  ValueId dead2 = g.add_value("dead2", DType::kFloat, Shape::unknown());
  ValueId c = g.add_value("c", DType::kFloat, Shape::of({}));
  ValueId cdead = g.add_value("cdead", DType::kFloat, Shape::of({}));
  g.initializers[c] = TensorData::scalar_float(DType::kFloat, 2.0);
  g.initializers[cdead] = TensorData::scalar_float(DType::kFloat, 3.0);
  g.inputs = {x, unused};
  g.nodes.push_back(Node{"", "Mul", "mul", {x, c}, {a}, {}});
  g.nodes.push_back(Node{"", "Exp", "exp_dead", {x}, {dead}, {}});
  g.nodes.push_back(Node{"", "Mul", "mul_dead", {dead, cdead}, {dead2}, {}});
  g.outputs = {a};
  return g;
}

TEST(DeadCodeElimination, RemovesUnreachableNodesAndConstantsKeepsInputs) {
  Graph g = with_dead_branch();
  auto dce = make_dce_pass();
  EXPECT_EQ(dce->name(), "dce");
  EXPECT_TRUE(dce->run(g));
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].name, "mul");
  EXPECT_EQ(g.initializers.size(), 1u);
  EXPECT_EQ(g.inputs.size(), 2u) << "inputs are bound by position and never removed";
  EXPECT_FALSE(dce->run(g)) << "a second run changes nothing";
}

TEST(Pipeline, DisableByNameAndVerifyAfterEachPass) {
  Graph g = with_dead_branch();
  PipelineOptions opts;
  opts.verify_after_each = true;
  opts.disabled = {"dce"};
  EXPECT_TRUE(run_pipeline(g, default_forward_pipeline(), opts).empty());
  EXPECT_EQ(g.nodes.size(), 3u);
  opts.disabled.clear();
  EXPECT_EQ(run_pipeline(g, default_forward_pipeline(), opts), std::vector<std::string>{"dce"});
  EXPECT_EQ(g.nodes.size(), 1u);
}

// A pass that breaks the graph: the pipeline's verifier must name it.
struct BreakingPass final : Pass {
  std::string_view name() const override { return "breaker"; }
  bool run(Graph& g) override {
    g.outputs.push_back(g.add_value("never_defined", DType::kFloat, Shape::unknown()));
    return true;
  }
};

TEST(Pipeline, VerifierNamesThePassThatBrokeTheGraph) {
  Graph g = with_dead_branch();
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(std::make_unique<BreakingPass>());
  PipelineOptions opts;
  opts.verify_after_each = true;
  try {
    run_pipeline(g, passes, opts);
    FAIL() << "expected VerifyError";
  } catch (const VerifyError& e) {
    EXPECT_NE(std::string(e.what()).find("breaker"), std::string::npos) << e.what();
  }
}

// y = Exp(x) * w, plus a dead forward branch Neg(x): the training graph of (x, w), both trainable.
TrainingGraph small_training_graph() {
  using testing::add_node;
  using testing::fvalue;
  Graph g;
  ValueId x = fvalue(g, "x"), w = fvalue(g, "w"), e = fvalue(g, "e"), y = fvalue(g, "y");
  ValueId dead = fvalue(g, "dead");
  g.inputs = {x, w};
  add_node(g, "Exp", {x}, {e}, "exp");
  add_node(g, "Neg", {x}, {dead}, "neg_dead");
  add_node(g, "Mul", {e, w}, {y}, "mul");
  g.outputs = {y};
  return build_training_graph(g, {true, true});
}

// Appends one node reading `from` (a value of the caller's choice), phase left at its default.
struct AppendNode final : Pass {
  explicit AppendNode(ValueId from) : from(from) {}
  std::string_view name() const override { return "append"; }
  bool run(Graph& g) override {
    ValueId out = g.new_value("appended", DType::kFloat, g.value(from).shape);
    testing::add_node(g, "Neg", {from}, {out}, "appended");
    g.outputs.push_back(out);  // keep it alive through the pipeline
    return true;
  }
  ValueId from;
};

TEST(TrainingPipeline, DceCountsTheForwardNodesAgainAndKeepsInputGradients) {
  TrainingGraph tg = small_training_graph();
  ASSERT_EQ(tg.graph.nodes[1].name, "neg_dead");
  const size_t nf = tg.num_forward_nodes, n = tg.graph.nodes.size();
  const std::vector<ValueId> grads = tg.input_grads;
  PipelineOptions opts;
  opts.verify_after_each = true;
  EXPECT_EQ(run_training_pipeline(tg, default_training_pipeline(), opts),
            std::vector<std::string>{"dce"});
  EXPECT_EQ(tg.num_forward_nodes, nf - 1);
  EXPECT_EQ(tg.graph.nodes.size(), n - 1);
  EXPECT_EQ(tg.input_grads, grads);
  EXPECT_EQ(tg.graph.inputs.size(), 2u) << "gradient inputs are taken back out after the passes";
  EXPECT_EQ(tg.graph.outputs.size(), 1u);
  for (size_t i = 0; i < tg.graph.nodes.size(); ++i)
    EXPECT_EQ(tg.graph.nodes[i].in_backward, i >= tg.num_forward_nodes) << tg.graph.nodes[i].name;
  verify(as_exportable_graph(tg));
}

TEST(TrainingPipeline, ANewNodeReadingAGradientRunsInBackward) {
  TrainingGraph tg = small_training_graph();
  const size_t nf = tg.num_forward_nodes;
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(std::make_unique<AppendNode>(tg.grad_of_outputs[0]));
  run_training_pipeline(tg, passes, PipelineOptions{});
  EXPECT_EQ(tg.num_forward_nodes, nf);
  EXPECT_EQ(tg.graph.nodes.back().name, "appended");
  EXPECT_TRUE(tg.graph.nodes.back().in_backward);
}

TEST(TrainingPipeline, ANewNodeReadingOnlyForwardValuesMovesAheadOfBackward) {
  TrainingGraph tg = small_training_graph();
  const size_t nf = tg.num_forward_nodes;
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(std::make_unique<AppendNode>(tg.graph.inputs[0]));
  run_training_pipeline(tg, passes, PipelineOptions{});
  ASSERT_EQ(tg.num_forward_nodes, nf + 1);
  EXPECT_EQ(tg.graph.nodes[nf].name, "appended") << "last forward node, before every backward one";
  EXPECT_TRUE(tg.graph.nodes[nf + 1].in_backward);
}

TEST(Pipeline, PassNamesListEachPassOnceInOrder) {
  const std::vector<std::string> names = pass_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "sequence_to_split");
  EXPECT_EQ(std::count(names.begin(), names.end(), "dce"), 1);
}

}  // namespace
}  // namespace torch_ort
