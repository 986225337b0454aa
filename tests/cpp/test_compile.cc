// The front door (core/compile.h): one call runs every torch-free stage in the engine's order and
// returns what the runtime binds; bad options are refused before any stage runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "csrc/core/compile.h"
#include "csrc/core/ir/onnx_io.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "tests/cpp/shape_builders.h"

namespace torch_ort {
namespace {

using testing::A;
using testing::GraphBuilder;

// y = Gelu(x · Wᵀ + b); loss = ReduceSum(y); x: [batch, 4] float, ids: [batch] int64 (unused by
// the math, but an input gradients must skip).
std::string mlp_bytes() {
  GraphBuilder b;
  const ValueId x = b.input("x", "[batch,4]");
  const ValueId w = b.input("w", "[3,4]");
  const ValueId bias = b.input("b", "[3]");
  b.input("ids", "[batch]", DType::kInt64);
  const ValueId h = b.op("Add", {b.op("MatMul", {x, b.op("Transpose", {w}, A({{"perm", std::vector<int64_t>{1, 0}}}))}), bias});
  b.g.outputs = {b.op("ReduceSum", {b.op("Gelu", {h})}, A({{"keepdims", int64_t{0}}}))};
  return export_onnx(b.g);
}

core::CompileOptions training(std::vector<bool> requires_grad) {
  core::CompileOptions o;
  o.training = true;
  o.input_requires_grad = std::move(requires_grad);
  o.verify_after_each_pass = true;
  return o;
}

size_t count_ops(const Graph& g, const std::string& op) {
  return static_cast<size_t>(std::count_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return n.op_type == op; }));
}

TEST(Compile, TrainingReturnsEveryStageOfTheEngine) {
  const core::Compiled c = core::compile(mlp_bytes(), training({false, true, true, false}));
  ASSERT_TRUE(c.training.has_value());
  const TrainingGraph& tg = *c.training;
  verify(c.forward);
  verify(as_exportable_graph(tg));  // the gradient inputs are graph inputs only in this form
  // The forward pipeline ran: MatMul + bias Add and Add + Gelu fused, the transpose folded.
  EXPECT_EQ(count_ops(c.forward, "MatMul"), 0u);
  EXPECT_TRUE(std::find(c.passes_changed.begin(), c.passes_changed.end(), "bias_gelu_fusion") != c.passes_changed.end())
      << ::testing::PrintToString(c.passes_changed);
  // Gradients exactly for the inputs asked for.
  ASSERT_EQ(tg.input_grads.size(), 4u);
  EXPECT_EQ(tg.input_grads[0], kNoValue);
  EXPECT_NE(tg.input_grads[1], kNoValue);
  EXPECT_NE(tg.input_grads[2], kNoValue);
  EXPECT_EQ(tg.input_grads[3], kNoValue);
  // The plan covers every node of the executed graph once, forward then backward.
  EXPECT_EQ(&c.executed(), &tg.graph);
  EXPECT_EQ(c.plan.forward.size(), tg.num_forward_nodes);
  EXPECT_EQ(c.plan.forward.size() + c.plan.backward.size(), tg.graph.nodes.size());
  EXPECT_FALSE(c.plan.saved.empty());
  EXPECT_EQ(c.timeline.forward_live.size(), c.plan.forward.size());
  EXPECT_EQ(c.timeline.backward_live.size(), c.plan.backward.size());
  EXPECT_TRUE(c.timeline.unknown.empty()) << ::testing::PrintToString(c.timeline.unknown);
}

TEST(Compile, InferenceHasNoTrainingGraphAndPlansTheForward) {
  core::CompileOptions o;
  const core::Compiled c = core::compile(mlp_bytes(), o);
  EXPECT_FALSE(c.training.has_value());
  EXPECT_EQ(&c.executed(), &c.forward);
  EXPECT_EQ(c.plan.forward.size(), c.forward.nodes.size());
  EXPECT_TRUE(c.plan.backward.empty());
  EXPECT_TRUE(c.plan.saved.empty());
}

TEST(Compile, EveryFloatInputRequiresGradSkipsIntegerInputs) {
  core::CompileOptions o;
  o.training = true;
  o.every_float_input_requires_grad = true;
  const core::Compiled c = core::compile(mlp_bytes(), o);
  const std::vector<ValueId>& grads = c.training->input_grads;
  EXPECT_NE(grads[0], kNoValue);
  EXPECT_NE(grads[1], kNoValue);
  EXPECT_NE(grads[2], kNoValue);
  EXPECT_EQ(grads[3], kNoValue);
}

TEST(Compile, DisabledPassesAreSkippedAndNamed) {
  core::CompileOptions o = training({false, true, true, false});
  o.disabled_passes = {"bias_gelu_fusion"};
  const core::Compiled c = core::compile(mlp_bytes(), o);
  EXPECT_EQ(count_ops(c.forward, "BiasGelu"), 0u);
  EXPECT_EQ(std::find(c.passes_changed.begin(), c.passes_changed.end(), "bias_gelu_fusion"), c.passes_changed.end());

  o.disabled_passes = {"bias_gelu_fusoin"};
  try {
    core::compile(mlp_bytes(), o);
    FAIL() << "a misspelt pass name must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no pass named 'bias_gelu_fusoin'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bias_gelu_fusion"), std::string::npos) << e.what();
  }
  for (const std::string& required : required_pass_names()) {
    o.disabled_passes = {required};
    EXPECT_THROW(core::compile(mlp_bytes(), o), std::invalid_argument) << required;
  }
}

TEST(Compile, RequiresGradOfTheWrongLengthIsRefused) {
  try {
    core::compile(mlp_bytes(), training({true, true}));
    FAIL() << "a requires_grad list of the wrong length must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("input_requires_grad has 2 entries, but the graph has 4 inputs"),
              std::string::npos) << e.what();
  }
}

TEST(Compile, SameBytesAndOptionsCompileToTheSameGraph) {
  const core::CompileOptions o = training({true, true, true, false});
  const core::Compiled a = core::compile(mlp_bytes(), o);
  const core::Compiled b = core::compile(mlp_bytes(), o);
  EXPECT_EQ(export_onnx(as_exportable_graph(*a.training)), export_onnx(as_exportable_graph(*b.training)));
}

}  // namespace
}  // namespace torch_ort
