// Shape inference through whole training graphs: symbolic batch end to end, fewer SumToShape.
#include <gtest/gtest.h>

#include <algorithm>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/shapes/shape_rules.h"
#include "tests/cpp/shape_builders.h"

namespace torch_ort {
namespace {

using testing::A;
using testing::GraphBuilder;
using Ints = std::vector<int64_t>;

int count_op(const Graph& g, const std::string& op) {
  return static_cast<int>(std::count_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return n.op_type == op; }));
}

std::string grad_shape(const TrainingGraph& tg, size_t input) {
  return tg.graph.value(tg.input_grads.at(input)).shape.to_string();
}

// x (batch, 4) -> Gemm -> +b1 -> Relu -> MatMul -> +b2 -> SoftmaxCrossEntropyLoss; the exporter
// gave shapes to the inputs only.
GraphBuilder mlp_with_unshaped_intermediates() {
  GraphBuilder b;
  ValueId x = b.input("x", "[batch,4]");
  ValueId labels = b.input("labels", "[batch]", DType::kInt64);
  ValueId w1 = b.input("w1", "[8,4]"), b1 = b.input("b1", "[8]");
  ValueId w2 = b.input("w2", "[8,3]"), b2 = b.input("b2", "[3]");
  ValueId h = b.op("Relu", {b.op("Add", {b.op("Gemm", {x, w1}, A({{"transB", int64_t{1}}})), b1})});
  ValueId logits = b.op("Add", {b.op("MatMul", {h, w2}), b2});
  b.g.outputs = {b.op("SoftmaxCrossEntropyLoss", {logits, labels}), logits};
  return b;
}

TEST(ShapeTraining, SymbolicBatchFlowsThroughForwardAndBackward) {
  GraphBuilder b = mlp_with_unshaped_intermediates();
  infer_shapes(b.g);
  EXPECT_EQ(b.g.value(b.g.outputs[0]).shape.to_string(), "[]");
  EXPECT_EQ(b.g.value(b.g.outputs[1]).shape.to_string(), "[batch,3]");
  TrainingGraph tg = build_training_graph(b.g, {true, false, true, true, true, true});
  const ShapeCoverage cov = infer_shapes(tg.graph);
  verify(as_exportable_graph(tg));  // output gradients become inputs there
  EXPECT_EQ(cov.num_rank_known, cov.num_values) << cov.rank_unknown.size() << " values of unknown rank";
  EXPECT_EQ(cov.num_dims_named, cov.num_values) << "every dim is a size or the symbol batch";
  EXPECT_EQ(grad_shape(tg, 0), "[batch,4]");
  EXPECT_EQ(grad_shape(tg, 2), "[8,4]");
  EXPECT_EQ(grad_shape(tg, 3), "[8]");
  EXPECT_EQ(grad_shape(tg, 4), "[8,3]");
  EXPECT_EQ(grad_shape(tg, 5), "[3]");
  // Only the two biases are broadcast; every other gradient provably has its input's shape.
  EXPECT_EQ(count_op(tg.graph, "SumToShape"), 2);
}

TEST(ShapeTraining, InferredForwardShapesLetAutodiffSkipSumToShape) {
  // y = x·z with the product's shape left out by the exporter.
  auto build = [](bool infer_first) {
    GraphBuilder b;
    ValueId x = b.input("x", "[batch,4]"), z = b.input("z", "[batch,4]");
    b.g.outputs = {b.op("ReduceSum", {b.op("Mul", {x, z})}, A({{"keepdims", int64_t{0}}}))};
    if (infer_first) infer_shapes(b.g);
    return build_training_graph(b.g, {true, true});
  };
  EXPECT_EQ(count_op(build(false).graph, "SumToShape"), 2) << "unknown product shape: reduce to be safe";
  EXPECT_EQ(count_op(build(true).graph, "SumToShape"), 0) << "[batch,4] == [batch,4]: nothing to reduce";
}

// One attention head pair, as the exporter writes x.view(B, T, 2, C // 2).transpose(1, 2).
TEST(ShapeTraining, AttentionBlockHasEveryRankKnownAfterAutodiff) {
  GraphBuilder b;
  ValueId x = b.input("x", "[batch,seq,16]");
  ValueId wq = b.input("wq", "[16,16]"), wk = b.input("wk", "[16,16]");
  ValueId shape = b.op("Shape", {x});
  auto dim = [&](int64_t i) { return b.op("Unsqueeze", {b.op("Gather", {shape, b.ints({i}, true)}), b.ints({0})}); };
  ValueId target = b.op("Concat", {dim(0), dim(1), b.ints({2, 8})}, A({{"axis", int64_t{0}}}));
  auto heads = [&](ValueId w) {
    return b.op("Transpose", {b.op("Reshape", {b.op("MatMul", {x, w}), target})}, A({{"perm", Ints{0, 2, 1, 3}}}));
  };
  ValueId q = heads(wq), k = heads(wk);
  ValueId kt = b.op("Transpose", {k}, A({{"perm", Ints{0, 1, 3, 2}}}));
  ValueId att = b.op("Softmax", {b.op("MatMul", {q, kt})}, A({{"axis", int64_t{-1}}}));
  ValueId y = b.op("Reshape", {b.op("Transpose", {b.op("MatMul", {att, q})}, A({{"perm", Ints{0, 2, 1, 3}}})),
                               b.ints({0, 0, -1})});
  b.g.outputs = {b.op("ReduceMean", {y}, A({{"keepdims", int64_t{0}}})), y};
  infer_shapes(b.g);
  EXPECT_EQ(b.shape(att), "[batch,2,seq,seq]");
  EXPECT_EQ(b.shape(y), "[batch,seq,16]");

  TrainingGraph tg = build_training_graph(b.g, {true, true, true});
  const ShapeCoverage cov = infer_shapes(tg.graph);
  verify(as_exportable_graph(tg));  // output gradients become inputs there
  std::string unknown;
  for (ValueId v : cov.rank_unknown) unknown += " " + tg.graph.value(v).name;
  EXPECT_EQ(cov.num_rank_known, cov.num_values) << "rank unknown:" << unknown;
  EXPECT_EQ(grad_shape(tg, 0), "[batch,seq,16]");
  EXPECT_EQ(grad_shape(tg, 1), "[16,16]");
  int softmax_grads = 0;
  for (const Node& n : tg.graph.nodes) {
    if (n.op_type != "SoftmaxGrad") continue;
    ++softmax_grads;
    EXPECT_EQ(tg.graph.value(n.outputs[0]).shape.to_string(), "[batch,2,seq,seq]");
  }
  EXPECT_EQ(softmax_grads, 1);
}

TEST(ShapeTraining, ContradictingAGradientsDeclaredShapeIsAVerifyError) {
  GraphBuilder b = mlp_with_unshaped_intermediates();
  infer_shapes(b.g);
  TrainingGraph tg = build_training_graph(b.g, {true, false, true, true, true, true});
  for (Node& n : tg.graph.nodes)  // a gradient rule that declared a wrong shape
    if (n.op_type == "ReluGrad") tg.graph.value(n.outputs[0]).shape = testing::S("[batch,9]");
  try {
    infer_shapes(tg.graph);
    FAIL() << "expected VerifyError";
  } catch (const VerifyError& e) {
    EXPECT_NE(std::string(e.what()).find("ReluGrad"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[batch,9]"), std::string::npos) << e.what();
  }
}

// Style rule 1: the tables are walked. Every op with a gradient decision, and every op our
// gradient rules emit, has a shape rule.
TEST(ShapeRegistry, EveryDifferentiableOpAndEveryGradientOpOfOursHasARule) {
  const auto& shapes = ShapeRegistry::instance();
  std::vector<std::string> missing;
  for (const std::string& key : GradientRegistry::instance().ops()) {
    const size_t sep = key.find("::");
    if (!shapes.find(key.substr(0, sep), key.substr(sep + 2))) missing.push_back(key);
  }
  for (const char* op : {"ReluGrad", "SigmoidGrad", "TanhGrad", "SoftmaxGrad", "LogSoftmaxGrad", "SumToShape",
                         "ReduceSumGrad", "ReduceMeanGrad", "SoftmaxCrossEntropyLossGrad",
                         "NegativeLogLikelihoodLossGrad", "DropoutGrad"})
    if (!shapes.find(kOurDomain, op)) missing.push_back(std::string(kOurDomain) + "::" + op);
  EXPECT_TRUE(missing.empty()) << "no shape rule (add REGISTER_SHAPE_RULE in csrc/core/ops/<family>.cc): "
                               << ::testing::PrintToString(missing);
}

}  // namespace
}  // namespace torch_ort
