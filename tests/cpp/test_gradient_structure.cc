// Structure tests of the gradient builder: which nodes it emits and where, not the numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/errors.h"

namespace torch_ort {
namespace {

Dim k(int64_t v) { return Dim::known(v); }
Dim sym(const char* s) { return Dim::symbolic(s); }
Shape shp(std::vector<Dim> d) { return Shape::of(std::move(d)); }

ValueId input(Graph& g, const std::string& name, Shape s, DType dt = DType::kFloat) {
  ValueId v = g.add_value(name, dt, std::move(s));
  g.inputs.push_back(v);
  return v;
}
ValueId node(Graph& g, const std::string& op, std::vector<ValueId> ins, DType dt, Shape s,
             const std::string& name = "", Attributes attrs = {}) {
  ValueId out = g.new_value(op + "_out", dt, std::move(s));
  g.nodes.push_back(Node{"", op, name.empty() ? g.unique_node_name("/" + op) : name, std::move(ins), {out},
                         std::move(attrs)});
  return out;
}

// Backward section only.
std::vector<const Node*> backward(const TrainingGraph& tg) {
  std::vector<const Node*> out;
  for (size_t i = tg.num_forward_nodes; i < tg.graph.nodes.size(); ++i) out.push_back(&tg.graph.nodes[i]);
  return out;
}
int count_bw(const TrainingGraph& tg, const std::string& op) {
  auto bw = backward(tg);
  return int(std::count_if(bw.begin(), bw.end(), [&](const Node* n) { return n->op_type == op; }));
}
std::map<std::string, int> bw_histogram(const TrainingGraph& tg) {
  std::map<std::string, int> h;
  for (const Node* n : backward(tg)) ++h[n->op_type];
  return h;
}
std::string str(const std::map<std::string, int>& h) {
  std::string s;
  for (const auto& [op, n] : h) s += op + "x" + std::to_string(n) + " ";
  return s;
}
bool backward_reads(const TrainingGraph& tg, ValueId v) {
  for (const Node* n : backward(tg))
    if (std::count(n->inputs.begin(), n->inputs.end(), v)) return true;
  return false;
}
int producer_index(const TrainingGraph& tg, ValueId v) {
  for (size_t i = 0; i < tg.graph.nodes.size(); ++i)
    if (std::count(tg.graph.nodes[i].outputs.begin(), tg.graph.nodes[i].outputs.end(), v)) return int(i);
  return -1;
}

TEST(GradientStructure, MatMulOnlyAEmitsOnlyDA) {
  Graph g;
  ValueId a = input(g, "A", shp({sym("batch"), k(4)})), b = input(g, "B", shp({k(4), k(5)}));
  g.outputs = {node(g, "MatMul", {a, b}, DType::kFloat, shp({sym("batch"), k(5)}))};
  TrainingGraph tg = build_training_graph(g, {true, false});
  EXPECT_NE(tg.input_grads[0], kNoValue);
  EXPECT_EQ(tg.input_grads[1], kNoValue);
  EXPECT_EQ(count_bw(tg, "MatMul"), 1) << str(bw_histogram(tg));
  EXPECT_FALSE(backward_reads(tg, a)) << "dA = dY·Bᵀ does not need A; backward must not keep it alive";
  // 2-D operands: dY·Bᵀ already has A's shape; a broadcast reduction would be a wasted copy.
  EXPECT_EQ(count_bw(tg, "SumToShape"), 0) << str(bw_histogram(tg));
}

TEST(GradientStructure, MatMulBothEmitsTwoProducts) {
  Graph g;
  ValueId a = input(g, "A", shp({k(3), k(4)})), b = input(g, "B", shp({k(4), k(5)}));
  g.outputs = {node(g, "MatMul", {a, b}, DType::kFloat, shp({k(3), k(5)}))};
  TrainingGraph tg = build_training_graph(g, {true, true});
  EXPECT_EQ(count_bw(tg, "MatMul"), 2) << str(bw_histogram(tg));
  EXPECT_NE(tg.input_grads[0], tg.input_grads[1]);
}

TEST(GradientStructure, MatMulSharedWeightGradientIsOneGemmOverFlattenedRows) {
  Graph g;  // a Linear layer on (batch, seq, 4) input: the weight is shared by every batch
  ValueId a = input(g, "A", shp({sym("batch"), sym("seq"), k(4)})), b = input(g, "B", shp({k(4), k(5)}));
  g.outputs = {node(g, "MatMul", {a, b}, DType::kFloat, shp({sym("batch"), sym("seq"), k(5)}))};
  TrainingGraph tg = build_training_graph(g, {true, true});
  // dB = flat(A)ᵀ·flat(dY): no batched (batch, 4, 5) product and no reduction over the batch.
  EXPECT_EQ(count_bw(tg, "Gemm"), 1) << str(bw_histogram(tg));
  EXPECT_EQ(count_bw(tg, "Flatten"), 2) << str(bw_histogram(tg));
  EXPECT_EQ(count_bw(tg, "MatMul"), 1) << str(bw_histogram(tg));  // dA = dY·Bᵀ only
  EXPECT_EQ(count_bw(tg, "SumToShape"), 0) << str(bw_histogram(tg));
  EXPECT_EQ(count_bw(tg, "ReduceSum"), 0) << str(bw_histogram(tg));
}

TEST(GradientStructure, GemmLinearLayerWeightAndBiasOnly) {
  Graph g;  // Y = X·Wᵀ + b, X needs no gradient (the first layer's input)
  ValueId x = input(g, "X", shp({sym("batch"), k(3)})), w = input(g, "W", shp({k(5), k(3)}));
  ValueId b = input(g, "b", shp({k(5)}));
  Attributes at;
  at.set("transB", int64_t{1});
  g.outputs = {node(g, "Gemm", {x, w, b}, DType::kFloat, shp({sym("batch"), k(5)}), "", at)};
  TrainingGraph tg = build_training_graph(g, {false, true, true});
  EXPECT_EQ(tg.input_grads[0], kNoValue);
  EXPECT_EQ(count_bw(tg, "Gemm"), 1) << str(bw_histogram(tg));      // dW only
  EXPECT_EQ(count_bw(tg, "SumToShape"), 1) << str(bw_histogram(tg));  // db: sum over batch
  EXPECT_EQ(count_bw(tg, "Transpose"), 0) << "transposes belong in Gemm's flags";
  EXPECT_FALSE(backward_reads(tg, w)) << "dW = dYᵀ·X needs no W";
}

TEST(GradientStructure, AddEqualShapesEmitsNoSumToShape) {
  Graph g;
  ValueId a = input(g, "a", shp({sym("batch"), k(4)})), b = input(g, "b", shp({sym("batch"), k(4)}));
  g.outputs = {node(g, "Add", {a, b}, DType::kFloat, shp({sym("batch"), k(4)}))};
  TrainingGraph tg = build_training_graph(g, {true, true});
  EXPECT_EQ(count_bw(tg, "SumToShape"), 0) << str(bw_histogram(tg));
  EXPECT_NE(tg.input_grads[0], kNoValue);
  EXPECT_NE(tg.input_grads[1], kNoValue);
}

TEST(GradientStructure, AddBroadcastEmitsOneSumToShape) {
  Graph g;
  ValueId a = input(g, "a", shp({sym("batch"), k(4)})), b = input(g, "b", shp({k(4)}));
  g.outputs = {node(g, "Add", {a, b}, DType::kFloat, shp({sym("batch"), k(4)}))};
  TrainingGraph tg = build_training_graph(g, {true, true});
  ASSERT_EQ(count_bw(tg, "SumToShape"), 1) << str(bw_histogram(tg));
  int p = producer_index(tg, tg.input_grads[1]);
  ASSERT_GE(p, 0);
  EXPECT_EQ(tg.graph.nodes[p].op_type, "SumToShape") << "the bias gradient is the reduced one";
}

TEST(GradientStructure, BroadcastShapeNodesRunInForward) {
  Graph g;  // symbolic dims: the reduction target is only known at run time
  ValueId a = input(g, "a", shp({sym("batch"), sym("n")})), b = input(g, "b", shp({k(1), sym("n")}));
  g.outputs = {node(g, "Mul", {a, b}, DType::kFloat, shp({sym("batch"), sym("n")}))};
  TrainingGraph tg = build_training_graph(g, {true, true});
  int shapes = 0, reductions = 0;
  for (size_t i = 0; i < tg.graph.nodes.size(); ++i) {
    const Node& n = tg.graph.nodes[i];
    if (n.op_type == "Shape") {
      ++shapes;
      EXPECT_LT(i, tg.num_forward_nodes) << n.name << " runs in backward";
    }
    if (n.op_type == "SumToShape") {
      ++reductions;
      const ValueId target = n.inputs.at(1);
      const int p = producer_index(tg, target);
      EXPECT_TRUE(tg.graph.initializers.count(target) || (p >= 0 && size_t(p) < tg.num_forward_nodes))
          << n.name << ": its target shape is computed in backward";
    }
  }
  EXPECT_GE(shapes, 1);
  EXPECT_GE(reductions, 1);
}

TEST(GradientStructure, FanOutContributionsAreSummedOnce) {
  Graph g;  // y = relu(x) + tanh(x)
  ValueId x = input(g, "x", shp({sym("batch"), k(4)}));
  ValueId r = node(g, "Relu", {x}, DType::kFloat, shp({sym("batch"), k(4)}));
  ValueId t = node(g, "Tanh", {x}, DType::kFloat, shp({sym("batch"), k(4)}));
  g.outputs = {node(g, "Add", {r, t}, DType::kFloat, shp({sym("batch"), k(4)}))};
  TrainingGraph tg = build_training_graph(g, {true});
  EXPECT_EQ(count_bw(tg, "Sum") + count_bw(tg, "Add"), 1) << str(bw_histogram(tg));
  int p = producer_index(tg, tg.input_grads[0]);
  ASSERT_GE(p, 0);
  const Node& acc = tg.graph.nodes[p];
  EXPECT_TRUE(acc.op_type == "Sum" || acc.op_type == "Add") << acc.op_type;
  EXPECT_EQ(acc.inputs.size(), 2u);
}

// y = (w[i0] + w[i1] + w[i2], tanh(w)): three GatherGrads chained into one buffer. Built in
// reverse, the gradient of a Tanh after the Gathers is made first and starts the chain (no Sum,
// no zeros); a Tanh before them is made last and is summed with the chain's result.
TEST(GradientStructure, GathersOfOneWeightAccumulateIntoOneBuffer) {
  for (const bool tanh_first : {false, true}) {
    Graph g;
    ValueId w = input(g, "w", shp({k(5), k(3)}));
    ValueId t = tanh_first ? node(g, "Tanh", {w}, DType::kFloat, shp({k(5), k(3)})) : kNoValue;
    std::vector<ValueId> rows;
    for (int i = 0; i < 3; ++i)
      rows.push_back(node(g, "Gather", {w, input(g, "i" + std::to_string(i), shp({k(2)}), DType::kInt64)},
                          DType::kFloat, shp({k(2), k(3)})));
    ValueId sum = node(g, "Add", {node(g, "Add", {rows[0], rows[1]}, DType::kFloat, shp({k(2), k(3)})), rows[2]},
                       DType::kFloat, shp({k(2), k(3)}));
    if (!tanh_first) t = node(g, "Tanh", {w}, DType::kFloat, shp({k(5), k(3)}));
    g.outputs = {sum, t};
    TrainingGraph tg = build_training_graph(g, {true, false, false, false});
    std::vector<const Node*> grads;
    for (const Node* n : backward(tg))
      if (n->op_type == "GatherGrad") grads.push_back(n);
    ASSERT_EQ(grads.size(), 3u) << str(bw_histogram(tg));
    for (size_t i = 1; i < grads.size(); ++i) {
      ASSERT_EQ(grads[i]->inputs.size(), 4u);
      EXPECT_EQ(grads[i]->inputs[3], grads[i - 1]->outputs[0]);
    }
    if (tanh_first) {  // zeros, then a Sum with Tanh's contribution
      EXPECT_EQ(grads[0]->inputs.size(), 3u);
      const Node& acc = tg.graph.nodes[producer_index(tg, tg.input_grads[0])];
      ASSERT_EQ(acc.op_type, "Sum");
      EXPECT_EQ(acc.inputs.size(), 2u);
      EXPECT_TRUE(std::count(acc.inputs.begin(), acc.inputs.end(), grads.back()->outputs[0]));
    } else {  // Tanh's contribution is the first accumulator; the chain's end is w's gradient
      ASSERT_EQ(grads[0]->inputs.size(), 4u);
      EXPECT_NE(producer_index(tg, grads[0]->inputs[3]), -1);
      EXPECT_EQ(count_bw(tg, "Sum"), 0) << str(bw_histogram(tg));
      EXPECT_EQ(tg.input_grads[0], grads.back()->outputs[0]);
    }
  }
}

// A tied embedding: the head's weight gradient, made first, is what the embedding's adds into.
TEST(GradientStructure, TiedEmbeddingGradientAddsIntoTheHeads) {
  Graph g;  // (Embedding(w, ids), Tanh(w))
  ValueId w = input(g, "w", shp({k(7), k(3)}));
  ValueId ids = input(g, "ids", shp({k(2), k(4)}), DType::kInt64);
  ValueId e = g.new_value("emb", DType::kFloat, shp({k(2), k(4), k(3)}));
  g.nodes.push_back(Node{kOurDomain, "Embedding", "/emb", {w, ids}, {e}, {}});
  g.outputs = {e, node(g, "Tanh", {w}, DType::kFloat, shp({k(7), k(3)}))};
  TrainingGraph tg = build_training_graph(g, {true, false});
  const Node& grad = tg.graph.nodes[producer_index(tg, tg.input_grads[0])];
  ASSERT_EQ(grad.op_type, "EmbeddingGrad") << str(bw_histogram(tg));
  ASSERT_EQ(grad.inputs.size(), 4u);
  EXPECT_NE(producer_index(tg, grad.inputs[3]), -1);
  EXPECT_EQ(count_bw(tg, "Sum"), 0) << str(bw_histogram(tg));
}

TEST(GradientStructure, SameNodeReadingAValueTwiceIsSummed) {
  Graph g;  // y = x * x
  ValueId x = input(g, "x", shp({k(3), k(4)}));
  g.outputs = {node(g, "Mul", {x, x}, DType::kFloat, shp({k(3), k(4)}))};
  TrainingGraph tg = build_training_graph(g, {true});
  EXPECT_EQ(count_bw(tg, "Sum") + count_bw(tg, "Add"), 1) << str(bw_histogram(tg));
}

// Summing fan-out contributions adds values while the builder may hold references into the value
// table; growing the table at every possible point must not corrupt names or crash.
TEST(GradientStructure, FanOutSurvivesValueTableGrowth) {
  for (int pad = 0; pad < 40; ++pad) {  // y = tanh^(pad % 8)(x * x + x), pad / 8 unused values
    Graph g;
    for (int i = 0; i < pad / 8; ++i) g.add_value("pad" + std::to_string(i), DType::kFloat, shp({k(1)}));
    ValueId x = input(g, "x", shp({k(3)}));
    ValueId y = node(g, "Add", {node(g, "Mul", {x, x}, DType::kFloat, shp({k(3)})), x}, DType::kFloat, shp({k(3)}));
    for (int i = 0; i < pad % 8; ++i) y = node(g, "Tanh", {y}, DType::kFloat, shp({k(3)}));
    g.outputs = {y};
    TrainingGraph tg;
    ASSERT_NO_THROW(tg = build_training_graph(g, {true})) << "pad " << pad;
    for (ValueId v = 0; v < tg.graph.num_values(); ++v)
      ASSERT_EQ(tg.graph.find(tg.graph.value(v).name), v) << "pad " << pad << ": value names corrupted";
    for (const Node* n : backward(tg))
      ASSERT_TRUE(!n->name.empty() && std::all_of(n->name.begin(), n->name.end(), [](char c) { return c >= 32 && c < 127; }))
          << "pad " << pad << ": node name corrupted";
  }
}

TEST(GradientStructure, ReluGradientReadsOutputNotInput) {
  Graph g;
  ValueId x = input(g, "x", shp({sym("batch"), k(4)}));
  ValueId y = node(g, "Relu", {x}, DType::kFloat, shp({sym("batch"), k(4)}));
  g.outputs = {y};
  TrainingGraph tg = build_training_graph(g, {true});
  ASSERT_EQ(count_bw(tg, "ReluGrad"), 1) << str(bw_histogram(tg));
  for (const Node* n : backward(tg))
    if (n->op_type == "ReluGrad") {
      EXPECT_EQ(n->domain, kOurDomain);
      EXPECT_TRUE(std::count(n->inputs.begin(), n->inputs.end(), y));
    }
  EXPECT_FALSE(backward_reads(tg, x));
}

TEST(GradientStructure, MissingRuleOnPathThrowsNamingOpAndNode) {
  Graph g;
  ValueId x = input(g, "x", shp({k(3)}));
  g.outputs = {node(g, "FancyOp", {x}, DType::kFloat, shp({k(3)}), "/block/FancyOp_7")};
  try {
    build_training_graph(g, {true});
    FAIL() << "expected GradientError";
  } catch (const GradientError& e) {
    EXPECT_NE(std::string(e.what()).find("FancyOp"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/block/FancyOp_7"), std::string::npos) << e.what();
  }
}

// The builder does not rely on the verifier alone: a Sigmoid whose gradient arrives on a second
// output (a malformed node, as the fuzzer made it) is a GradientError, not an out-of-range read of
// the absent grad_out(0).
TEST(GradientStructure, RuleWithoutItsOutputGradientThrowsGradientError) {
  Graph g;
  ValueId x = input(g, "x", shp({k(3)}));
  ValueId y0 = g.new_value("y0", DType::kFloat, shp({k(3)}));
  ValueId y1 = g.new_value("y1", DType::kFloat, shp({k(3)}));
  g.nodes.push_back(Node{"", "Sigmoid", "/Sigmoid_2", {x}, {y0, y1}, {}});
  g.outputs = {y1};
  try {
    build_training_graph(g, {true});
    FAIL() << "expected GradientError";
  } catch (const GradientError& e) {
    EXPECT_NE(std::string(e.what()).find("/Sigmoid_2"), std::string::npos) << e.what();
  }
}

TEST(GradientStructure, MissingRuleOffPathDoesNotThrow) {
  Graph g;  // FancyOp only sees z, which needs no gradient
  ValueId x = input(g, "x", shp({k(3)})), z = input(g, "z", shp({k(3)}));
  ValueId f = node(g, "FancyOp", {z}, DType::kFloat, shp({k(3)}), "/block/FancyOp_7");
  g.outputs = {node(g, "Add", {node(g, "Relu", {x}, DType::kFloat, shp({k(3)})), f}, DType::kFloat, shp({k(3)}))};
  TrainingGraph tg;
  EXPECT_NO_THROW(tg = build_training_graph(g, {true, false}));
  EXPECT_NE(tg.input_grads[0], kNoValue);
}

TEST(GradientStructure, NoGradientOpsDoNotThrow) {
  Graph g;  // outputs: relu(x) and shape(x)
  ValueId x = input(g, "x", shp({sym("batch"), k(4)}));
  ValueId y = node(g, "Relu", {x}, DType::kFloat, shp({sym("batch"), k(4)}));
  ValueId s = node(g, "Shape", {x}, DType::kInt64, shp({k(2)}));
  g.outputs = {y, s};
  TrainingGraph tg;
  ASSERT_NO_THROW(tg = build_training_graph(g, {true}));
  ASSERT_EQ(tg.grad_of_outputs.size(), 2u);
  EXPECT_NE(tg.grad_of_outputs[0], kNoValue);
  EXPECT_EQ(tg.grad_of_outputs[1], kNoValue);
}

TEST(GradientStructure, InputGradsAbsentWhenNotRequestedOrUnreachable) {
  Graph g;
  ValueId x = input(g, "x", shp({k(2), k(6)}));     // requires grad, reaches the output
  ValueId w = input(g, "w", shp({k(2), k(6)}));     // requires grad, never used
  ValueId z = input(g, "z", shp({k(2), k(6)}));     // used, but no grad requested
  ValueId u = input(g, "u", shp({k(2), k(6)}));     // requires grad, only feeds a dead node
  ValueId s = input(g, "s", shp({k(3), k(4)}));     // requires grad, only its Shape is used
  node(g, "Relu", {u}, DType::kFloat, shp({k(2), k(6)}));
  ValueId r = node(g, "Reshape", {node(g, "Mul", {x, z}, DType::kFloat, shp({k(2), k(6)})),
                                  node(g, "Shape", {s}, DType::kInt64, shp({k(2)}))},
                   DType::kFloat, shp({k(3), k(4)}));
  (void)w;
  g.outputs = {r};
  TrainingGraph tg = build_training_graph(g, {true, true, false, true, true});
  ASSERT_EQ(tg.input_grads.size(), 5u);
  EXPECT_NE(tg.input_grads[0], kNoValue);
  EXPECT_EQ(tg.input_grads[1], kNoValue) << "unused input";
  EXPECT_EQ(tg.input_grads[2], kNoValue) << "not requested";
  EXPECT_EQ(tg.input_grads[3], kNoValue) << "feeds only a node that reaches no output";
  EXPECT_EQ(tg.input_grads[4], kNoValue) << "reaches the output only through Shape";
}

TEST(GradientStructure, IntegerOutputsTakeNoGradient) {
  Graph g;
  ValueId x = input(g, "x", shp({k(3)})), y = input(g, "y", shp({k(3)}));
  Attributes to_int;
  to_int.set("to", int64_t(DType::kInt64));
  g.outputs = {node(g, "Tanh", {x}, DType::kFloat, shp({k(3)})),
               node(g, "Equal", {x, y}, DType::kBool, shp({k(3)})),
               node(g, "Cast", {x}, DType::kInt64, shp({k(3)}), "", to_int),
               node(g, "Shape", {y}, DType::kInt64, shp({k(1)}))};
  TrainingGraph tg = build_training_graph(g, {true, true});
  ASSERT_EQ(tg.grad_of_outputs.size(), 4u);
  EXPECT_NE(tg.grad_of_outputs[0], kNoValue);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(tg.grad_of_outputs[i], kNoValue) << "output " << i;
  EXPECT_EQ(tg.input_grads[1], kNoValue) << "y reaches outputs only through Equal and Shape";
}

TEST(GradientStructure, ForwardSectionKeepsForwardNodesFirst) {
  Graph g;
  ValueId x = input(g, "x", shp({sym("batch"), k(4)})), b = input(g, "b", shp({k(4)}));
  ValueId h = node(g, "Add", {x, b}, DType::kFloat, shp({sym("batch"), k(4)}), "/add");
  g.outputs = {node(g, "Sigmoid", {h}, DType::kFloat, shp({sym("batch"), k(4)}), "/sig")};
  TrainingGraph tg = build_training_graph(g, {false, true});
  ASSERT_GE(tg.graph.nodes.size(), 2u);
  EXPECT_EQ(tg.graph.nodes[0].name, "/add");
  EXPECT_EQ(tg.graph.nodes[1].name, "/sig");
  EXPECT_GE(tg.num_forward_nodes, 2u);
  EXPECT_EQ(count_bw(tg, "SigmoidGrad"), 1) << str(bw_histogram(tg));
  EXPECT_EQ(g.nodes.size(), 2u) << "the forward graph is not modified";
}

TEST(GradientStructure, CrossEntropyGradientThroughLogProbIsAClearErrorOrWorks) {
  Graph g;  // log_prob is itself a graph output that receives a gradient
  ValueId s = input(g, "scores", shp({sym("batch"), k(4)}));
  ValueId l = input(g, "labels", shp({sym("batch")}), DType::kInt64);
  ValueId loss = g.new_value("loss", DType::kFloat, shp({}));
  ValueId lp = g.new_value("log_prob", DType::kFloat, shp({sym("batch"), k(4)}));
  g.nodes.push_back(Node{"", "SoftmaxCrossEntropyLoss", "/loss/SCE", {s, l}, {loss, lp}, {}});
  g.outputs = {loss, lp};
  try {
    TrainingGraph tg = build_training_graph(g, {true, false});
    EXPECT_NE(tg.input_grads[0], kNoValue);
  } catch (const GradientError& e) {
    EXPECT_NE(std::string(e.what()).find("/loss/SCE"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace torch_ort
