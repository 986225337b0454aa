// bias_gelu_fusion and elementwise_chain_fusion: structure after each pass on tiny graphs — fires,
// does not fire when an intermediate is read elsewhere or a shape/constant condition fails, a
// second run changes nothing, and the verifier accepts every result. And split_grad_join on the
// training graph of a fused chain over a Split's halves.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "tests/cpp/ir_builders.h"
#include "tests/cpp/reference_eval.h"

namespace torch_ort {
namespace {

using testing::add_node;

Shape bt(int64_t n) { return Shape::of({Dim::symbolic("batch"), Dim::known(n)}); }

ValueId fv(Graph& g, const std::string& name, Shape s) { return g.add_value(name, DType::kFloat, std::move(s)); }

// A float scalar initializer.
ValueId scalar(Graph& g, const std::string& name, double v) {
  ValueId c = g.add_value(name, DType::kFloat, Shape::of({}));
  g.initializers[c] = TensorData::scalar_float(DType::kFloat, v);
  return c;
}

std::map<std::string, int> histogram(const Graph& g) {
  std::map<std::string, int> h;
  for (const Node& n : g.nodes) ++h[n.op_type];
  return h;
}

const Node* find_op(const Graph& g, const std::string& op) {
  for (const Node& n : g.nodes)
    if (n.op_type == op) return &n;
  return nullptr;
}

// z = x + b (b of x's last dim), y = Gelu(z).
Graph add_gelu(const std::string& approx, Shape bias_shape = Shape::of({Dim::known(4)})) {
  Graph g;
  ValueId x = fv(g, "x", bt(4)), b = fv(g, "b", std::move(bias_shape)), z = fv(g, "z", bt(4)), y = fv(g, "y", bt(4));
  g.inputs = {x, b};
  add_node(g, "Add", {x, b}, {z}, "add");
  add_node(g, "Gelu", {z}, {y}, "gelu").attrs.set("approximate", approx);
  g.outputs = {y};
  return g;
}

TEST(BiasGeluFusion, AddThenGeluBecomesOneBiasGelu) {
  Graph g = add_gelu("tanh");
  auto pass = make_bias_gelu_fusion_pass();
  EXPECT_EQ(pass->name(), "bias_gelu_fusion");
  ASSERT_TRUE(pass->run(g));
  verify(g);
  ASSERT_EQ(g.nodes.size(), 1u);
  const Node& n = g.nodes[0];
  EXPECT_EQ(n.domain, kOurDomain);
  EXPECT_EQ(n.op_type, "BiasGelu");
  EXPECT_EQ(n.inputs, (std::vector<ValueId>{*g.find("x"), *g.find("b")}));
  EXPECT_EQ(n.outputs, std::vector<ValueId>{*g.find("y")});
  EXPECT_EQ(n.attrs.get_string("approximate", ""), "tanh");
  EXPECT_FALSE(pass->run(g)) << "a second run changes nothing";
}

TEST(BiasGeluFusion, SharedSumKeepsTheAddAndFusesTheGeluAlone) {
  Graph g = add_gelu("none");
  ValueId z = *g.find("z"), w = fv(g, "w", bt(4));
  add_node(g, "Neg", {z}, {w}, "other_reader");
  g.outputs.push_back(w);
  ASSERT_TRUE(make_bias_gelu_fusion_pass()->run(g));
  verify(g);
  EXPECT_EQ(histogram(g), (std::map<std::string, int>{{"Add", 1}, {"BiasGelu", 1}, {"Neg", 1}}));
  EXPECT_EQ(find_op(g, "BiasGelu")->inputs, std::vector<ValueId>{z}) << "no bias: the sum is read elsewhere";
}

TEST(BiasGeluFusion, BiasNotOfTheLastDimIsNotFolded) {
  for (Shape s : {Shape::of({Dim::known(1), Dim::known(4)}), Shape::of({Dim::known(3)}), Shape::unknown()}) {
    Graph g = add_gelu("none", s);
    ASSERT_TRUE(make_bias_gelu_fusion_pass()->run(g));
    verify(g);
    EXPECT_EQ(histogram(g), (std::map<std::string, int>{{"Add", 1}, {"BiasGelu", 1}})) << s.to_string();
  }
}

// y = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) as HF GPT-2 exports it (Constant nodes for the
// scalars), x = h + b when `bias`.
Graph gelu_new(bool bias, double half = 0.5) {
  Graph g;
  ValueId h = fv(g, "h", bt(8)), x = bias ? fv(g, "x", bt(8)) : h;
  g.inputs = {h};
  if (bias) {
    ValueId b = fv(g, "b", Shape::of({Dim::known(8)}));
    g.inputs.push_back(b);
    add_node(g, "Add", {b, h}, {x}, "bias_add");
  }
  auto konst = [&](const std::string& name, float v) {
    ValueId c = g.add_value(name, DType::kFloat, Shape::of({}));
    add_node(g, "Constant", {}, {c}, name).attrs.set("value", TensorData::scalar_float(DType::kFloat, v));
    return c;
  };
  auto t = [&](const std::string& name) { return fv(g, name, bt(8)); };
  ValueId m0 = t("mul_half"), p = t("pow"), m1 = t("mul_kappa"), a0 = t("inner_add"), m2 = t("mul_beta");
  ValueId th = t("tanh"), a1 = t("one_plus"), y = t("y");
  add_node(g, "Mul", {x, konst("c_half", static_cast<float>(half))}, {m0}, "mul_22");
  add_node(g, "Pow", {x, konst("c_three", 3.0f)}, {p}, "pow_1");
  add_node(g, "Mul", {p, konst("c_kappa", 0.044715f)}, {m1}, "mul_23");
  add_node(g, "Add", {x, m1}, {a0}, "add_5");
  add_node(g, "Mul", {a0, konst("c_beta", 0.7978845608f)}, {m2}, "mul_24");
  add_node(g, "Tanh", {m2}, {th}, "tanh");
  add_node(g, "Add", {th, konst("c_one", 1.0f)}, {a1}, "add_6");
  add_node(g, "Mul", {m0, a1}, {y}, "mul_25");
  g.outputs = {y};
  return g;
}

TEST(BiasGeluFusion, DecomposedTanhGeluBecomesBiasGelu) {
  Graph g = gelu_new(false);
  ASSERT_TRUE(make_bias_gelu_fusion_pass()->run(g));
  verify(g);
  const Node* n = find_op(g, "BiasGelu");
  ASSERT_NE(n, nullptr) << "nodes: " << g.nodes.size();
  EXPECT_EQ(n->attrs.get_string("approximate", ""), "tanh");
  EXPECT_EQ(n->inputs, std::vector<ValueId>{*g.find("h")});
  EXPECT_EQ(n->name, "mul_25") << "the final Mul is rewritten in place";
  for (const Node& m : g.nodes) EXPECT_TRUE(m.op_type == "BiasGelu" || m.op_type == "Constant") << m.op_type;
  EXPECT_FALSE(make_bias_gelu_fusion_pass()->run(g));
}

TEST(BiasGeluFusion, DecomposedTanhGeluFoldsItsBias) {
  Graph g = gelu_new(true);
  ASSERT_TRUE(make_bias_gelu_fusion_pass()->run(g));
  verify(g);
  const Node* n = find_op(g, "BiasGelu");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->inputs, (std::vector<ValueId>{*g.find("h"), *g.find("b")}));
  EXPECT_EQ(find_op(g, "Add"), nullptr);
}

TEST(BiasGeluFusion, DecomposedGeluWithAnIntermediateReadElsewhereStays) {
  Graph g = gelu_new(false);
  g.outputs.push_back(*g.find("tanh"));  // tanh's result escapes
  const size_t before = g.nodes.size();
  EXPECT_FALSE(make_bias_gelu_fusion_pass()->run(g));
  EXPECT_EQ(g.nodes.size(), before);
}

TEST(BiasGeluFusion, WrongConstantIsNotAGelu) {
  Graph g = gelu_new(false, 0.6);
  EXPECT_FALSE(make_bias_gelu_fusion_pass()->run(g));
}

// y = (x · 0.5) · (1 + erf(x / √2)), x = h + b.
TEST(BiasGeluFusion, DecomposedErfGeluWithBias) {
  Graph g;
  ValueId h = fv(g, "h", bt(4)), b = fv(g, "b", Shape::of({Dim::known(4)})), x = fv(g, "x", bt(4));
  ValueId d = fv(g, "d", bt(4)), e = fv(g, "e", bt(4)), a = fv(g, "a", bt(4)), m = fv(g, "m", bt(4)),
          y = fv(g, "y", bt(4));
  g.inputs = {h, b};
  add_node(g, "Add", {h, b}, {x}, "bias_add");
  add_node(g, "Div", {x, scalar(g, "sqrt2", 1.4142135623730951)}, {d}, "div");
  add_node(g, "Erf", {d}, {e}, "erf");
  add_node(g, "Add", {scalar(g, "one", 1.0), e}, {a}, "add");
  add_node(g, "Mul", {x, scalar(g, "half", 0.5)}, {m}, "mul_half");
  add_node(g, "Mul", {m, a}, {y}, "mul");
  g.outputs = {y};
  ASSERT_TRUE(make_bias_gelu_fusion_pass()->run(g));
  verify(g);
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].op_type, "BiasGelu");
  EXPECT_EQ(g.nodes[0].attrs.get_string("approximate", ""), "none");
  EXPECT_EQ(g.nodes[0].inputs, (std::vector<ValueId>{h, b}));
}

// ---- elementwise_chain_fusion

// t = tanh(x · 2), y = t + b (b a last-dim row), graph output y.
Graph chain() {
  Graph g;
  ValueId x = fv(g, "x", bt(4)), b = fv(g, "b", Shape::of({Dim::known(4)}));
  ValueId m = fv(g, "m", bt(4)), t = fv(g, "t", bt(4)), y = fv(g, "y", bt(4));
  g.inputs = {x, b};
  add_node(g, "Mul", {x, scalar(g, "two", 2.0)}, {m}, "mul");
  add_node(g, "Tanh", {m}, {t}, "tanh");
  add_node(g, "Add", {t, b}, {y}, "add");
  g.outputs = {y};
  return g;
}

TEST(ElementwiseChainFusion, ChainBecomesOneProgram) {
  Graph g = chain();
  auto pass = make_elementwise_chain_fusion_pass();
  EXPECT_EQ(pass->name(), "elementwise_chain_fusion");
  ASSERT_TRUE(pass->run(g));
  verify(g);
  ASSERT_EQ(g.nodes.size(), 1u);
  const Node& n = g.nodes[0];
  EXPECT_EQ(n.domain, kOurDomain);
  EXPECT_EQ(n.op_type, "FusedElementwise");
  EXPECT_EQ(n.name, "add");
  EXPECT_EQ(n.inputs, (std::vector<ValueId>{*g.find("x"), *g.find("b")}));
  EXPECT_EQ(n.attrs.get_strings("ops", {}), (std::vector<std::string>{"Mul", "Tanh", "Add"}));
  // Mul(input 0, const 0), Tanh(result 0), Add(result 1, input 1); two inputs, so results start at 2.
  EXPECT_EQ(n.attrs.get_ints("operands", {}), (std::vector<int64_t>{0, -1, 2, 0, 3, 1}));
  EXPECT_EQ(n.attrs.get_floats("consts", {}), std::vector<float>{2.0f});
  EXPECT_FALSE(pass->run(g)) << "a second run changes nothing";
}

TEST(ElementwiseChainFusion, IntermediateReadElsewhereEndsTheChain) {
  Graph g = chain();
  g.outputs.push_back(*g.find("t"));  // tanh's result escapes: Mul+Tanh fuse, the Add stays alone
  ASSERT_TRUE(make_elementwise_chain_fusion_pass()->run(g));
  verify(g);
  EXPECT_EQ(histogram(g), (std::map<std::string, int>{{"Add", 1}, {"FusedElementwise", 1}}));
  EXPECT_EQ(find_op(g, "FusedElementwise")->attrs.get_strings("ops", {}), (std::vector<std::string>{"Mul", "Tanh"}));

  Graph g2 = chain();
  g2.outputs.push_back(*g2.find("m"));  // the Mul escapes: Tanh+Add fuse
  ASSERT_TRUE(make_elementwise_chain_fusion_pass()->run(g2));
  EXPECT_EQ(histogram(g2), (std::map<std::string, int>{{"FusedElementwise", 1}, {"Mul", 1}}));
}

TEST(ElementwiseChainFusion, OperandThatDoesNotBroadcastPerElementBlocksTheOp) {
  Graph g = chain();
  // b of shape [batch, 1] broadcasts along the last dim, not as a row: the Add cannot join.
  g.value(*g.find("b")).shape = Shape::of({Dim::symbolic("batch"), Dim::known(1)});
  ASSERT_TRUE(make_elementwise_chain_fusion_pass()->run(g));
  verify(g);
  EXPECT_EQ(histogram(g), (std::map<std::string, int>{{"Add", 1}, {"FusedElementwise", 1}}));
}

TEST(ElementwiseChainFusion, SingleOpsAndNonFloatChainsStay) {
  Graph g;
  ValueId x = fv(g, "x", bt(4)), e = fv(g, "e", bt(4));
  ValueId i = g.add_value("i", DType::kInt64, bt(4)), j = g.add_value("j", DType::kInt64, bt(4)),
          k = g.add_value("k", DType::kInt64, bt(4));
  g.inputs = {x, i};
  add_node(g, "Exp", {x}, {e}, "exp");
  add_node(g, "Add", {i, i}, {j}, "iadd");
  add_node(g, "Mul", {j, i}, {k}, "imul");
  g.outputs = {e, k};
  EXPECT_FALSE(make_elementwise_chain_fusion_pass()->run(g));
  EXPECT_EQ(g.nodes.size(), 3u);
}

TEST(ElementwiseChainFusion, PowNeedsAConstantExponent) {
  Graph g;
  ValueId x = fv(g, "x", bt(4)), p = fv(g, "p", Shape::of({})), a = fv(g, "a", bt(4)), y = fv(g, "y", bt(4));
  g.inputs = {x, p};
  add_node(g, "Pow", {x, p}, {a}, "pow");
  add_node(g, "Neg", {a}, {y}, "neg");
  g.outputs = {y};
  EXPECT_FALSE(make_elementwise_chain_fusion_pass()->run(g)) << "x^p with p an input has no fused derivative";
}

TEST(FusionPipeline, BiasGeluIsNotReclaimedByTheChainFusion) {
  Graph g = add_gelu("none");
  ValueId y = *g.find("y"), s = fv(g, "s", bt(4)), t = fv(g, "t", bt(4));
  add_node(g, "Mul", {y, scalar(g, "three", 3.0)}, {s}, "scale");
  add_node(g, "Tanh", {s}, {t}, "tanh");
  g.outputs = {t};
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(make_bias_gelu_fusion_pass());
  passes.push_back(make_elementwise_chain_fusion_pass());
  PipelineOptions opts;
  opts.verify_after_each = true;
  EXPECT_EQ(run_pipeline(g, passes, opts),
            (std::vector<std::string>{"bias_gelu_fusion", "elementwise_chain_fusion"}));
  EXPECT_EQ(histogram(g), (std::map<std::string, int>{{"BiasGelu", 1}, {"FusedElementwise", 1}}));
  EXPECT_EQ(find_op(g, "FusedElementwise")->inputs, std::vector<ValueId>{y});
}

// ---- gradient rules of the fused ops: structure of the backward they emit

// The backward node producing v, or nullptr.
const Node* backward_producer(const TrainingGraph& tg, ValueId v) {
  for (size_t i = tg.num_forward_nodes; i < tg.graph.nodes.size(); ++i)
    for (ValueId o : tg.graph.nodes[i].outputs)
      if (o == v) return &tg.graph.nodes[i];
  return nullptr;
}

int count_backward(const TrainingGraph& tg, const std::string& op) {
  int n = 0;
  for (size_t i = tg.num_forward_nodes; i < tg.graph.nodes.size(); ++i) n += tg.graph.nodes[i].op_type == op;
  return n;
}

TEST(FusedGradients, BiasGeluEmitsOneGradWhoseRowSumIsTheBiasGradient) {
  Graph g = add_gelu("tanh");
  ASSERT_TRUE(make_bias_gelu_fusion_pass()->run(g));
  const TrainingGraph tg = build_training_graph(g, {true, true});
  EXPECT_EQ(count_backward(tg, "BiasGeluGrad"), 1);
  const Node* dx = backward_producer(tg, tg.input_grads[0]);
  ASSERT_NE(dx, nullptr);
  EXPECT_EQ(dx->op_type, "BiasGeluGrad") << "x has the output's shape: no reduction";
  EXPECT_EQ(dx->attrs.get_string("approximate", ""), "tanh");
  EXPECT_EQ(dx->inputs.size(), 3u) << "(dY, X, bias)";
  const Node* db = backward_producer(tg, tg.input_grads[1]);
  ASSERT_NE(db, nullptr);
  EXPECT_NE(db->op_type, "BiasGeluGrad") << "the bias gradient is dX summed to the bias's shape";
  EXPECT_EQ(db->inputs[0], dx->outputs[0]);
}

TEST(FusedGradients, FusedElementwiseEmitsOnlyTheNeededInputGradients) {
  Graph g = chain();
  ASSERT_TRUE(make_elementwise_chain_fusion_pass()->run(g));
  const TrainingGraph tg = build_training_graph(g, {true, false});  // x trainable, b not
  ASSERT_EQ(count_backward(tg, "FusedElementwiseGrad"), 1);
  const Node* n = backward_producer(tg, tg.input_grads[0]);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->op_type, "FusedElementwiseGrad");
  EXPECT_EQ(n->attrs, g.nodes[0].attrs) << "the backward runs the forward's program";
  ASSERT_EQ(n->outputs.size(), 2u);
  EXPECT_EQ(n->outputs[1], kNoValue) << "b needs no gradient";
  EXPECT_EQ(tg.input_grads[1], kNoValue);
}

// X (3, 2·5) split in two halves along the last dim, then one fused chain over both (SwiGLU-like:
// a·sigmoid(a)·b): the chain's gradients are exactly the SplitGrad's pieces.
Graph split_chain() {
  Graph g;
  const Shape half = Shape::of({Dim::known(3), Dim::known(5)});
  ValueId x = fv(g, "x", Shape::of({Dim::known(3), Dim::known(10)}));
  ValueId a = fv(g, "a", half), b = fv(g, "b", half), s = fv(g, "s", half), as = fv(g, "as", half),
          y = fv(g, "y", half);
  g.inputs = {x};
  add_node(g, "Split", {x}, {a, b}, "split").attrs.set("axis", int64_t{-1});
  add_node(g, "Sigmoid", {a}, {s}, "sigmoid");
  add_node(g, "Mul", {a, s}, {as}, "silu");
  add_node(g, "Mul", {as, b}, {y}, "gate");
  g.outputs = {y};
  return g;
}

TEST(SplitGradJoin, TheChainWritesBothHalvesOfTheSplitsGradient) {
  Graph g = split_chain();
  ASSERT_TRUE(make_elementwise_chain_fusion_pass()->run(g));
  TrainingGraph before = build_training_graph(g, {true});
  TrainingGraph tg = before;
  ASSERT_EQ(count_backward(tg, "SplitGrad"), 1);
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(make_split_grad_join_pass());
  passes.push_back(make_dce_pass());
  PipelineOptions opts;
  opts.verify_after_each = true;
  EXPECT_EQ(run_training_pipeline(tg, passes, opts), (std::vector<std::string>{"split_grad_join", "dce"}));
  EXPECT_EQ(count_backward(tg, "SplitGrad"), 0);
  const Node* f = backward_producer(tg, tg.input_grads[0]);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->op_type, "FusedElementwiseGrad");
  EXPECT_EQ(f->attrs.get_ints("join", {}), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(f->outputs[0], tg.input_grads[0]);
  EXPECT_EQ(f->outputs[1], kNoValue);
  EXPECT_EQ(tg.graph.value(tg.input_grads[0]).shape.to_string(), "[3,10]");

  // The same dX through the reference evaluator.
  auto dx_of = [](const TrainingGraph& t) {
    const Graph e = as_exportable_graph(t);
    std::map<ValueId, ref::Tensor> feeds;
    double v = 0.1;
    for (ValueId in : e.inputs) {
      ref::Dims dims;
      for (const Dim& d : e.value(in).shape.dims) dims.push_back(d.value);
      ref::Tensor x = ref::zeros(e.value(in).dtype, dims);
      for (int64_t i = 0; i < x.numel(); ++i) x.reals[i] = (v = std::fmod(v * 7.3 + 0.37, 2.0)) - 1.0;
      feeds[in] = x;
    }
    return ref::evaluate(e, feeds).at(t.input_grads[0]).reals;
  };
  const std::vector<double> want = dx_of(before), got = dx_of(tg);
  ASSERT_EQ(got.size(), 30u);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
}

TEST(SplitGradJoin, LeavesAPieceReadElsewhereOtherAxesAndBroadcastPieces) {
  for (const char* why : {"a piece also read elsewhere", "split along another axis", "a piece broadcast"}) {
    Graph g = split_chain();
    if (std::string(why) == "split along another axis") {
      g.nodes[0].attrs.set("axis", int64_t{0});
      g.value(*g.find("x")).shape = Shape::of({Dim::known(6), Dim::known(5)});
    }
    if (std::string(why) == "a piece broadcast") {  // x (3, 6) split [1, 5]: a (3, 1) broadcast against b
      g.value(*g.find("x")).shape = Shape::of({Dim::known(3), Dim::known(6)});
      ValueId sizes = g.add_value("sizes", DType::kInt64, Shape::of({Dim::known(2)}));
      g.initializers[sizes] = TensorData::from_int64s({1, 5});
      g.nodes[0].inputs.push_back(sizes);
      for (const char* v : {"a", "s", "as"}) g.value(*g.find(v)).shape = Shape::of({Dim::known(3), Dim::known(1)});
    }
    ASSERT_TRUE(make_elementwise_chain_fusion_pass()->run(g));
    TrainingGraph tg = build_training_graph(g, {true});
    if (std::string(why) == "a piece also read elsewhere") {
      const Node* s = nullptr;
      for (const Node& n : tg.graph.nodes)
        if (n.op_type == "SplitGrad") s = &n;
      ASSERT_NE(s, nullptr);
      tg.graph.outputs.push_back(s->inputs[2]);
    }
    ASSERT_EQ(count_backward(tg, "SplitGrad"), 1) << why;
    std::vector<std::unique_ptr<Pass>> passes;
    passes.push_back(make_split_grad_join_pass());
    EXPECT_TRUE(run_training_pipeline(tg, passes, PipelineOptions{}).empty()) << why;
    EXPECT_EQ(count_backward(tg, "SplitGrad"), 1) << why;
  }
}

}  // namespace
}  // namespace torch_ort
