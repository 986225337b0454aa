// skip_layer_norm_fusion and bias_dropout_fusion: graph structure after each pass on tiny
// hand-written graphs (fires; leaves alone what it must not fuse; a second run changes nothing),
// and the backward the fused ops get (one SkipLayerNormGrad, no fan-out Add).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"

namespace torch_ort {
namespace {

constexpr int64_t kC = 8;

Shape act() { return Shape::of({Dim::symbolic("batch"), Dim::symbolic("seq"), Dim::known(kC)}); }
Shape vec(int64_t n = kC) { return Shape::of({Dim::known(n)}); }

ValueId input(Graph& g, const std::string& name, Shape s, DType dt = DType::kFloat) {
  ValueId v = g.add_value(name, dt, std::move(s));
  g.inputs.push_back(v);
  return v;
}
ValueId op(Graph& g, const std::string& type, std::vector<ValueId> ins, Shape s, Attributes a = {},
           DType dt = DType::kFloat) {
  ValueId out = g.new_value(type + "_out", dt, std::move(s));
  g.nodes.push_back(Node{"", type, g.unique_node_name("/" + type), std::move(ins), {out}, std::move(a)});
  return out;
}
ValueId layer_norm(Graph& g, ValueId x, ValueId gamma, ValueId beta, int64_t axis = -1) {
  Attributes a;
  a.set("axis", axis);
  a.set("epsilon", 1e-5f);
  return op(g, "LayerNormalization", {x, gamma, beta}, g.value(x).shape, a);
}
int count(const Graph& g, const std::string& type) {
  return int(std::count_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return n.op_type == type; }));
}
const Node& only(const Graph& g, const std::string& type) {
  for (const Node& n : g.nodes)
    if (n.op_type == type) return n;
  throw std::runtime_error("no " + type + " node");
}

// Runs the pass, checks the verifier, and that a second run changes nothing.
bool run_twice(Pass& p, Graph& g) {
  const bool changed = p.run(g);
  verify(g);
  EXPECT_FALSE(p.run(g)) << p.name() << ": a second run changed the graph";
  return changed;
}

// Pre-LN block: s = x + r; y = LN(s); out = s + y (the sum is read again, as NanoGPT's residual).
struct PreLn {
  Graph g;
  ValueId x, r, gamma, beta, s, y, out;
  PreLn() {
    x = input(g, "x", act());
    r = input(g, "r", act());
    gamma = input(g, "ln.weight", vec());
    beta = input(g, "ln.bias", vec());
    s = op(g, "Add", {x, r}, act());
    y = layer_norm(g, s, gamma, beta);
    out = op(g, "Add", {s, y}, act());
    g.outputs = {out};
  }
};

TEST(SkipLayerNormFusion, FusesResidualAddAndKeepsTheSumForItsOtherReader) {
  PreLn t;
  auto pass = make_skip_layer_norm_fusion_pass();
  EXPECT_EQ(pass->name(), "skip_layer_norm_fusion");
  ASSERT_TRUE(run_twice(*pass, t.g));
  EXPECT_EQ(count(t.g, "LayerNormalization"), 0);
  EXPECT_EQ(count(t.g, "Add"), 1);  // the reader of the sum, untouched
  const Node& n = only(t.g, "SkipLayerNorm");
  EXPECT_EQ(n.domain, kOurDomain);
  EXPECT_EQ(n.inputs, (std::vector<ValueId>{t.x, t.r, t.gamma, t.beta}));
  ASSERT_EQ(n.outputs.size(), 4u);
  EXPECT_EQ(n.outputs[0], t.y);
  EXPECT_EQ(n.outputs[3], t.s) << "Sum is the residual add's own value";
  EXPECT_EQ(t.g.value(n.outputs[1]).dtype, DType::kFloat);
  EXPECT_EQ(t.g.value(n.outputs[1]).shape.to_string(), "[batch,seq,1]");
  EXPECT_FLOAT_EQ(n.attrs.get_float("epsilon", 0.f), 1e-5f);
}

// Post-LN with a bias: LN((h + bias) + r); the bias add is folded when only the residual add reads it.
TEST(SkipLayerNormFusion, FoldsABiasAddReadOnlyByTheResidualAdd) {
  Graph g;
  ValueId h = input(g, "h", act()), r = input(g, "r", act()), bias = input(g, "dense.bias", vec());
  ValueId gamma = input(g, "ln.weight", vec()), beta = input(g, "ln.bias", vec());
  ValueId hb = op(g, "Add", {h, bias}, act());
  ValueId s = op(g, "Add", {r, hb}, act());
  g.outputs = {layer_norm(g, s, gamma, beta)};
  ASSERT_TRUE(run_twice(*make_skip_layer_norm_fusion_pass(), g));
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].inputs, (std::vector<ValueId>{h, r, gamma, beta, bias}));
}

TEST(SkipLayerNormFusion, KeepsABiasAddThatAnotherNodeReads) {
  Graph g;
  ValueId h = input(g, "h", act()), r = input(g, "r", act()), bias = input(g, "dense.bias", vec());
  ValueId gamma = input(g, "ln.weight", vec());
  ValueId hb = op(g, "Add", {h, bias}, act());
  ValueId s = op(g, "Add", {hb, r}, act());
  ValueId y = op(g, "LayerNormalization", {s, gamma}, act());
  g.outputs = {y, op(g, "Relu", {hb}, act())};
  ASSERT_TRUE(run_twice(*make_skip_layer_norm_fusion_pass(), g));
  const Node& n = only(g, "SkipLayerNorm");
  EXPECT_EQ(n.inputs, (std::vector<ValueId>{hb, r, gamma})) << "no Beta, no Bias";
  EXPECT_EQ(count(g, "Add"), 1);
}

TEST(SkipLayerNormFusion, LeavesLayerNormOverMoreThanTheLastDim) {
  Graph g;
  ValueId x = input(g, "x", act()), r = input(g, "r", act());
  ValueId gamma = input(g, "w", Shape::of({Dim::symbolic("seq"), Dim::known(kC)}));
  ValueId beta = input(g, "b", Shape::of({Dim::symbolic("seq"), Dim::known(kC)}));
  g.outputs = {layer_norm(g, op(g, "Add", {x, r}, act()), gamma, beta, /*axis=*/1)};
  EXPECT_FALSE(make_skip_layer_norm_fusion_pass()->run(g));
  EXPECT_EQ(count(g, "LayerNormalization"), 1);
}

TEST(SkipLayerNormFusion, LeavesLayerNormWhoseStatisticsAreRead) {
  PreLn t;
  Node& ln = t.g.nodes[1];
  ValueId mean = t.g.new_value("mean", DType::kFloat,
                               Shape::of({Dim::symbolic("batch"), Dim::symbolic("seq"), Dim::known(1)}));
  ln.outputs.push_back(mean);
  t.g.outputs.push_back(mean);
  EXPECT_FALSE(make_skip_layer_norm_fusion_pass()->run(t.g));
}

TEST(SkipLayerNormFusion, LeavesABroadcastingAdd) {
  Graph g;  // BERT's embeddings: (batch, seq, C) + (1, seq, C) position embeddings
  ValueId x = input(g, "x", act());
  ValueId pos = input(g, "pos", Shape::of({Dim::known(1), Dim::symbolic("seq"), Dim::known(kC)}));
  ValueId gamma = input(g, "w", vec()), beta = input(g, "b", vec());
  g.outputs = {layer_norm(g, op(g, "Add", {x, pos}, act()), gamma, beta)};
  EXPECT_FALSE(make_skip_layer_norm_fusion_pass()->run(g));
}

TEST(SkipLayerNormFusion, LeavesLayerNormWithoutAResidualAdd) {
  Graph g;  // NanoGPT's first ln_1 reads the embedding dropout directly
  ValueId x = input(g, "x", act()), gamma = input(g, "w", vec()), beta = input(g, "b", vec());
  g.outputs = {layer_norm(g, op(g, "Relu", {x}, act()), gamma, beta)};
  EXPECT_FALSE(make_skip_layer_norm_fusion_pass()->run(g));
}

// One SkipLayerNormGrad computes dX (= dSkip, with the sum's other gradient added in), dGamma,
// dBeta: no LayerNormalizationGrad, no ReduceSum for dBeta, no Add for the sum's fan-out.
TEST(SkipLayerNormFusion, BackwardIsOneSkipLayerNormGrad) {
  PreLn t;
  ASSERT_TRUE(make_skip_layer_norm_fusion_pass()->run(t.g));
  TrainingGraph tg = build_training_graph(t.g, {true, true, true, true});
  std::map<std::string, int> bw;
  for (size_t i = tg.num_forward_nodes; i < tg.graph.nodes.size(); ++i) ++bw[tg.graph.nodes[i].op_type];
  EXPECT_EQ(bw["SkipLayerNormGrad"], 1);
  EXPECT_EQ(bw["LayerNormalizationGrad"], 0);
  EXPECT_EQ(bw["ReduceSum"] + bw["SumToShape"], 0);
  const Node* grad = nullptr;
  for (size_t i = tg.num_forward_nodes; i < tg.graph.nodes.size(); ++i)
    if (tg.graph.nodes[i].op_type == "SkipLayerNormGrad") grad = &tg.graph.nodes[i];
  ASSERT_NE(grad, nullptr);
  EXPECT_NE(grad->inputs[1], kNoValue) << "the sum's other reader sends its gradient in as dSum";
  EXPECT_EQ(tg.input_grads[0], tg.input_grads[1]) << "dX = dSkip: one tensor";
}

// --- bias_dropout_fusion

ValueId dropout(Graph& g, ValueId x, ValueId ratio, ValueId mode) {
  return op(g, "Dropout", {x, ratio, mode}, g.value(x).shape);
}

struct DropoutBlock {
  Graph g;
  ValueId h, bias, res, ratio, mode, hb, d, out;
  explicit DropoutBlock(bool residual_first = true) {
    h = input(g, "h", act());
    bias = input(g, "dense.bias", vec());
    ratio = input(g, "ratio", Shape::of({}));
    mode = input(g, "training_mode", Shape::of({}), DType::kBool);
    ValueId x = input(g, "x", act());
    res = residual_first ? op(g, "Relu", {x}, act()) : kNoValue;
    hb = op(g, "Add", {h, bias}, act());
    d = dropout(g, hb, ratio, mode);
    if (!residual_first) res = op(g, "Relu", {x}, act());
    out = op(g, "Add", {d, res}, act());
    g.outputs = {out};
  }
};

TEST(BiasDropoutFusion, FusesBiasDropoutAndResidual) {
  DropoutBlock t;
  auto pass = make_bias_dropout_fusion_pass();
  EXPECT_EQ(pass->name(), "bias_dropout_fusion");
  ASSERT_TRUE(run_twice(*pass, t.g));
  EXPECT_EQ(count(t.g, "Add"), 0);
  EXPECT_EQ(count(t.g, "Dropout"), 0);
  const Node& n = only(t.g, "BiasDropout");
  EXPECT_EQ(n.domain, kOurDomain);
  EXPECT_EQ(n.inputs, (std::vector<ValueId>{t.h, t.bias, t.res, t.ratio, t.mode}));
  ASSERT_EQ(n.outputs.size(), 2u);
  EXPECT_EQ(n.outputs[0], t.out);
  EXPECT_EQ(t.g.value(n.outputs[1]).dtype, DType::kBool) << "the mask backward reuses";
}

// The random draw must stay where eager makes it: a residual computed after the Dropout stays out.
TEST(BiasDropoutFusion, ResidualComputedAfterTheDropoutIsNotFolded) {
  DropoutBlock t(/*residual_first=*/false);
  ASSERT_TRUE(run_twice(*make_bias_dropout_fusion_pass(), t.g));
  const Node& n = only(t.g, "BiasDropout");
  EXPECT_EQ(n.inputs, (std::vector<ValueId>{t.h, t.bias, kNoValue, t.ratio, t.mode}));
  EXPECT_EQ(count(t.g, "Add"), 1);
}

TEST(BiasDropoutFusion, LeavesDropoutWhoseNeighboursHaveOtherReaders) {
  DropoutBlock t;
  t.g.outputs.push_back(t.hb);  // the biased value is read elsewhere: cannot fold the bias
  t.g.outputs.push_back(t.d);   // the dropout output too: cannot fold the residual
  EXPECT_FALSE(make_bias_dropout_fusion_pass()->run(t.g));
  EXPECT_EQ(count(t.g, "Dropout"), 1);
}

TEST(BiasDropoutFusion, LeavesAnAddThatIsNotABias) {
  Graph g;  // GPT-2's embeddings: dropout(wte + wpe); the residual reads the dropout twice
  ValueId a = input(g, "a", act()), b = input(g, "b", act());
  ValueId ratio = input(g, "ratio", Shape::of({})), mode = input(g, "m", Shape::of({}), DType::kBool);
  ValueId d = dropout(g, op(g, "Add", {a, b}, act()), ratio, mode);
  g.outputs = {op(g, "Add", {d, d}, act())};
  EXPECT_FALSE(make_bias_dropout_fusion_pass()->run(g));
}

// BERT post-LN: LN(dropout(h + bias) + residual). skip_layer_norm_fusion runs first and takes
// the residual add; bias_dropout_fusion then takes the bias.
TEST(BiasDropoutFusion, AfterSkipLayerNormOnPostLnBlock) {
  DropoutBlock t;
  ValueId gamma = input(t.g, "ln.weight", vec()), beta = input(t.g, "ln.bias", vec());
  // LN's parameters are graph inputs: they exist before the residual add.
  t.g.outputs = {layer_norm(t.g, t.out, gamma, beta)};
  PipelineOptions opts;
  opts.verify_after_each = true;
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(make_skip_layer_norm_fusion_pass());
  passes.push_back(make_bias_dropout_fusion_pass());
  EXPECT_EQ(run_pipeline(t.g, passes, opts),
            (std::vector<std::string>{"skip_layer_norm_fusion", "bias_dropout_fusion"}));
  const Node& bd = only(t.g, "BiasDropout");
  EXPECT_EQ(bd.inputs, (std::vector<ValueId>{t.h, t.bias, kNoValue, t.ratio, t.mode}));
  const Node& sln = only(t.g, "SkipLayerNorm");
  EXPECT_EQ(sln.inputs[0], bd.outputs[0]);
  EXPECT_EQ(sln.inputs[1], t.res);
  EXPECT_EQ(count(t.g, "Add") + count(t.g, "Dropout") + count(t.g, "LayerNormalization"), 0);
}

TEST(BiasDropoutFusion, BackwardReusesTheForwardMask) {
  DropoutBlock t;
  ASSERT_TRUE(make_bias_dropout_fusion_pass()->run(t.g));
  const ValueId mask = only(t.g, "BiasDropout").outputs[1];
  TrainingGraph tg = build_training_graph(t.g, {true, true, false, false, true});
  int dropout_grads = 0;
  for (size_t i = tg.num_forward_nodes; i < tg.graph.nodes.size(); ++i) {
    const Node& n = tg.graph.nodes[i];
    EXPECT_NE(n.op_type, "BiasDropout") << "backward never draws again";
    if (n.op_type == "DropoutGrad") {
      ++dropout_grads;
      EXPECT_EQ(n.inputs[1], mask);
    }
  }
  EXPECT_EQ(dropout_grads, 1);
}

}  // namespace
}  // namespace torch_ort
