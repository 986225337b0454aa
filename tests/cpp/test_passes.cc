// Passes: structure of the graph after each pass, on tiny hand-written graphs.
#include <gtest/gtest.h>

#include "csrc/core/ir/errors.h"
#include "csrc/core/passes/pass.h"

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

}  // namespace
}  // namespace torch_ort
