// Recompute memory optimizer: clusters and layers found on a hand-built pre-LN transformer, what
// each level and config entry drops from the saved set, and bit-identical gradients after it.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/planner/memory.h"
#include "csrc/core/planner/plan.h"
#include "csrc/core/planner/recompute.h"
#include "tests/cpp/reference_eval.h"
#include "tests/cpp/shape_builders.h"

namespace torch_ort {
namespace {

using testing::GraphBuilder;

struct Transformer {
  int layers = 2;
  bool fused = false;  // the forward pipeline runs first: residual Add + next LN -> SkipLayerNorm
  bool gated = false;  // every layer scales its LN output by one gate, Sigmoid(g), built once
};

// x (batch, 4) -> layers × [LN -> MatMul(4→8) -> Gelu -> MatMul(8→4) -> + residual] -> LN -> Tanh
// -> ReduceSum. Per layer backward reads the LN output and statistics, the Gelu input and output:
// "LayerNormalization+", "MatMul+", "Gelu+"; x0, x1, x2 are the residual stream.
TrainingGraph pre_ln_transformer(const Transformer& t = {}) {
  GraphBuilder b;
  ValueId x = b.input("x0", "[batch,4]");
  const ValueId gate = t.gated ? b.op("Sigmoid", {b.input("g", "[4]")}) : kNoValue;
  for (int k = 0; k < t.layers; ++k) {
    const std::string p = "l" + std::to_string(k) + ".";
    ValueId gamma = b.input(p + "gamma", "[4]"), beta = b.input(p + "beta", "[4]");
    ValueId w1 = b.input(p + "w1", "[4,8]"), w2 = b.input(p + "w2", "[8,4]");
    ValueId h = b.node("LayerNormalization", {x, gamma, beta}, {}, 3)[0];
    if (t.gated) h = b.op("Mul", {h, gate});
    ValueId y = b.op("MatMul", {b.op("Gelu", {b.op("MatMul", {h, w1})}), w2});
    const ValueId sum = b.g.add_value("x" + std::to_string(k + 1), DType::kFloat, Shape::unknown());
    b.g.nodes.push_back(Node{"", "Add", b.g.unique_node_name("/Add"), {x, y}, {sum}, {}});
    x = sum;
  }
  ValueId gamma = b.input("lnf.gamma", "[4]"), beta = b.input("lnf.beta", "[4]");
  ValueId out = b.op("Tanh", {b.node("LayerNormalization", {x, gamma, beta}, {}, 3)[0]});
  Attributes keep;
  keep.set("keepdims", int64_t{0});
  b.g.outputs = {b.op("ReduceSum", {out}, keep)};
  infer_shapes(b.g);
  if (t.fused) run_pipeline(b.g, default_forward_pipeline(), {});
  TrainingGraph tg = build_training_graph(b.g, std::vector<bool>(b.g.inputs.size(), true));
  infer_shapes(tg.graph);
  run_training_pipeline(tg, default_training_pipeline(), {});
  return tg;
}

std::set<std::string> saved_names(const TrainingGraph& tg) {
  std::set<std::string> out;
  for (ValueId v : plan_training(tg).saved) out.insert(tg.graph.value(v).name);
  return out;
}

const RecomputeOpportunity* find(const RecomputeResult& r, const std::string& cluster, int strategy) {
  for (const RecomputeOpportunity& o : r.opportunities)
    if (o.cluster == cluster && o.strategy == strategy) return &o;
  return nullptr;
}

std::string name_of(const TrainingGraph& tg, ValueId v) { return tg.graph.value(v).name; }

TEST(Recompute, FindsOneClusterPerOpWithOneOccurrencePerLayer) {
  TrainingGraph tg = pre_ln_transformer();
  const RecomputeResult r = analyze_recompute(tg);
  EXPECT_EQ(r.num_layers, 2);
  std::set<std::string> boundaries;
  for (ValueId v : r.layer_boundaries) boundaries.insert(name_of(tg, v));
  EXPECT_EQ(boundaries, (std::set<std::string>{"x0", "x1", "x2"}));

  const RecomputeOpportunity* gelu = find(r, "Gelu+", 1);
  ASSERT_NE(gelu, nullptr);
  ASSERT_EQ(gelu->occurrences.size(), 2u);
  EXPECT_EQ(gelu->occurrences[0].layer, 0);
  EXPECT_EQ(gelu->occurrences[1].layer, 1);
  EXPECT_EQ(gelu->bytes_saved_each.to_string(), "32*batch");  // (batch, 8) fp32
  EXPECT_TRUE(gelu->occurrences[0].new_saved.empty());
  ASSERT_NE(find(r, "MatMul+", 1), nullptr);
  EXPECT_EQ(find(r, "MatMul+", 1)->occurrences.size(), 2u);

  // The LayerNorm output and its statistics are one occurrence: one clone recomputes all three.
  const RecomputeOpportunity* ln = find(r, "LayerNormalization+", 1);
  ASSERT_NE(ln, nullptr);
  ASSERT_EQ(ln->occurrences.size(), 3u);  // two layers and the final LN (outside every layer)
  EXPECT_EQ(ln->occurrences[0].more_activations.size(), 2u);
  EXPECT_EQ(ln->bytes_saved_each.to_string(), "24*batch");  // 16 (Y) + 4 (mean) + 4 (inv_std)
  EXPECT_EQ(ln->occurrences[2].layer, -1);
  for (const RecomputeOpportunity& o : r.opportunities)
    for (const RecomputeOccurrence& occ : o.occurrences) EXPECT_FALSE(occ.enabled) << o.cluster;
}

// Fused, layer k's LN output comes from SkipLayerNorm(branch output of layer k-1, x_{k-1}):
// recomputing it would need layer k-1's branch recomputed, and so on down to layer 0.
TEST(Recompute, LevelOneDoesNotChainThroughLayers) {
  TrainingGraph tg = pre_ln_transformer({.layers = 3, .fused = true});
  const RecomputeResult r = apply_recompute(tg, 1, {});
  EXPECT_EQ(r.num_layers, 3);
  int gelus = 0, skip_norms = 0;
  for (const RecomputeOpportunity& o : r.opportunities) {
    if (o.cluster.find("Gelu+") != std::string::npos) gelus += static_cast<int>(o.enabled_count());
    if (o.cluster.find("SkipLayerNorm+") == std::string::npos) continue;
    skip_norms += static_cast<int>(o.occurrences.size());
    EXPECT_EQ(o.enabled_count(), 0) << o.cluster << " would recompute the layer before its own";
  }
  EXPECT_EQ(gelus, 3);
  EXPECT_EQ(skip_norms, 4);  // two layers' LN outputs, the final LN's statistics, the Tanh after it
  // Per layer the MatMul and the Gelu from the kept LN output; layer 0's LN from x0.
  EXPECT_EQ(r.nodes_cloned, 3 * 2 + 1);
}

// The gate is built before layer 0's residual add, but both layers read it: it lies in no layer.
// Its clone, made at its first backward reader, lives until its last one, as the saved value
// would have; between forward and that reader it takes no memory.
TEST(Recompute, AValueEveryLayerReadsLiesInNoLayer) {
  TrainingGraph tg = pre_ln_transformer({.gated = true});
  const RecomputeResult r = apply_recompute(tg, 1, {});
  const RecomputeOpportunity* gate = find(r, "Sigmoid+", 1);
  ASSERT_NE(gate, nullptr);
  ASSERT_EQ(gate->occurrences.size(), 1u);
  EXPECT_EQ(gate->occurrences[0].layer, -1);
  // It reads only the graph input: standalone, so level 1 recomputes it too, and the layers that
  // read it still recompute (no chain runs through a standalone clone).
  EXPECT_TRUE(gate->occurrences[0].standalone);
  EXPECT_EQ(gate->enabled_count(), 1);
  EXPECT_EQ(find(r, "Gelu+", 1)->enabled_count(), 2);
}

// Backward reads r = Reshape(x): a view of the graph input x, which stays anyway. Dropping r
// would free nothing, so it is no candidate; Relu's output is a buffer of its own.
TEST(Recompute, AViewOfAKeptBufferIsNoCandidate) {
  GraphBuilder b;
  ValueId x = b.input("x", "[batch,4]");
  ValueId r = b.op("Reshape", {x, b.ints({-1, 2, 2})});
  ValueId y = b.op("Relu", {b.op("Mul", {r, r})});
  Attributes keep;
  keep.set("keepdims", int64_t{0});
  b.g.outputs = {b.op("ReduceSum", {b.op("Mul", {y, y})}, keep)};
  infer_shapes(b.g);
  TrainingGraph tg = build_training_graph(b.g, {true});
  infer_shapes(tg.graph);
  ASSERT_TRUE(saved_names(tg).count(name_of(tg, r)));
  const RecomputeResult res = analyze_recompute(tg);
  EXPECT_EQ(find(res, "Reshape+", 1), nullptr);
  EXPECT_NE(find(res, "Mul+Relu+", 1), nullptr);  // from r, which stays saved
}

TEST(Recompute, LevelZeroChangesNothing) {
  TrainingGraph tg = pre_ln_transformer();
  const size_t nodes = tg.graph.nodes.size();
  const RecomputeResult r = apply_recompute(tg, 0, {});
  EXPECT_EQ(r.nodes_cloned, 0);
  EXPECT_EQ(tg.graph.nodes.size(), nodes);
}

TEST(Recompute, LevelOneDropsInLayerActivationsAndKeepsTheResidualStream) {
  TrainingGraph tg = pre_ln_transformer();
  const std::set<std::string> before = saved_names(tg);
  const size_t num_forward = tg.num_forward_nodes;
  const RecomputeResult r = apply_recompute(tg, 1, {});
  const std::set<std::string> after = saved_names(tg);
  EXPECT_EQ(tg.num_forward_nodes, num_forward);
  EXPECT_GT(r.nodes_cloned, 0);
  EXPECT_NO_THROW(verify(as_exportable_graph(tg)));

  for (const RecomputeOpportunity& o : r.opportunities)
    for (const RecomputeOccurrence& occ : o.occurrences) {
      EXPECT_EQ(occ.enabled, o.strategy == 1 && occ.layer >= 0) << o.cluster;
      EXPECT_TRUE(before.count(name_of(tg, occ.activation)));
      EXPECT_EQ(after.count(name_of(tg, occ.activation)), occ.enabled ? 0u : 1u)
          << name_of(tg, occ.activation) << " of " << o.cluster;
      for (ValueId v : occ.more_activations)
        EXPECT_EQ(after.count(name_of(tg, v)), occ.enabled ? 0u : 1u) << name_of(tg, v);
    }
  for (const char* stream : {"x0", "x1", "x2"}) EXPECT_TRUE(after.count(stream)) << stream;
  // No activation is newly kept: the clones read the residual stream and parameters (the LN's
  // beta, which no gradient needed before) only.
  for (const std::string& v : after)
    if (!before.count(v)) {
      EXPECT_NE(v.find(".beta"), std::string::npos) << v << " newly saved";
    }
  // Each forward node is cloned at most once, and every clone runs in backward.
  EXPECT_EQ(r.nodes_cloned, 6);  // per layer: LN, MatMul, Gelu
  for (size_t i = num_forward; i < tg.graph.nodes.size(); ++i) EXPECT_TRUE(tg.graph.nodes[i].in_backward);
}

TEST(Recompute, ARequestEnablesTheFirstCountOccurrences) {
  TrainingGraph tg = pre_ln_transformer();
  const RecomputeResult r = apply_recompute(tg, 0, {{"Gelu+", 1, 1}});
  const RecomputeOpportunity* gelu = find(r, "Gelu+", 1);
  ASSERT_NE(gelu, nullptr);
  EXPECT_EQ(gelu->enabled_count(), 1);
  EXPECT_TRUE(gelu->occurrences[0].enabled);
  EXPECT_EQ(r.nodes_cloned, 1);
  const std::set<std::string> after = saved_names(tg);
  EXPECT_FALSE(after.count(name_of(tg, gelu->occurrences[0].activation)));
  EXPECT_TRUE(after.count(name_of(tg, gelu->occurrences[1].activation)));
}

TEST(Recompute, StrategyZeroTurnsAClusterOffAtLevelOne) {
  TrainingGraph tg = pre_ln_transformer();
  const RecomputeResult r = apply_recompute(tg, 1, {{"Gelu+", 0, -1}});
  EXPECT_EQ(find(r, "Gelu+", 1)->enabled_count(), 0);
  EXPECT_EQ(find(r, "MatMul+", 1)->enabled_count(), 2);
  const std::set<std::string> after = saved_names(tg);
  for (const RecomputeOccurrence& occ : find(r, "Gelu+", 1)->occurrences)
    EXPECT_TRUE(after.count(name_of(tg, occ.activation)));
}

TEST(Recompute, BadRequestsNameTheValidClusters) {
  TrainingGraph tg = pre_ln_transformer();
  try {
    apply_recompute(tg, 0, {{"BiasGelu+", 1, -1}});
    FAIL() << "an unknown cluster must throw";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ORTMODULE_MEMORY_OPT_CONFIG: no recompute cluster 'BiasGelu+'"), std::string::npos) << what;
    EXPECT_NE(what.find("Gelu+ (strategy 1, 2 occurrences)"), std::string::npos) << what;
    EXPECT_NE(what.find("LayerNormalization+ (strategy 1, 3 occurrences)"), std::string::npos) << what;
  }
  EXPECT_THROW(apply_recompute(tg, 0, {{"Gelu+", 3, -1}}), std::invalid_argument);
  EXPECT_THROW(apply_recompute(tg, 0, {{"Gelu+", 1, -2}}), std::invalid_argument);
  EXPECT_THROW(apply_recompute(tg, 0, {{"Gelu+", 2, -1}}), std::invalid_argument);  // no compromise here
  EXPECT_THROW(apply_recompute(tg, 3, {}), std::invalid_argument);
}

// x (fp16) · w (fp16) -> Cast to fp32 -> Gelu: backward reads the fp32 Cast output. Recomputing it
// in full clones the MatMul too (strategy 1); the compromise keeps the fp16 product instead.
TEST(Recompute, ACastToFp32HasACompromiseSavingHalf) {
  GraphBuilder b;
  ValueId x = b.input("x", "[batch,4]", DType::kFloat16), w = b.input("w", "[4,8]", DType::kFloat16);
  Attributes to;
  to.set("to", static_cast<int64_t>(DType::kFloat));
  ValueId v = b.node("Cast", {b.op("MatMul", {x, w})}, to)[0];
  b.g.value(v).dtype = DType::kFloat;
  Attributes keep;
  keep.set("keepdims", int64_t{0});
  b.g.outputs = {b.op("ReduceSum", {b.op("Gelu", {v})}, keep)};
  infer_shapes(b.g);
  TrainingGraph tg = build_training_graph(b.g, {false, true});
  infer_shapes(tg.graph);

  const RecomputeResult r = analyze_recompute(tg);
  ASSERT_NE(find(r, "MatMul+Cast+", 1), nullptr);
  const RecomputeOpportunity* cast = find(r, "Cast+", 2);
  ASSERT_NE(cast, nullptr);
  ASSERT_EQ(cast->occurrences.size(), 1u);
  EXPECT_EQ(cast->bytes_saved_each.to_string(), "16*batch");  // 32·batch fp32 − 16·batch fp16
  ASSERT_EQ(cast->occurrences[0].new_saved.size(), 1u);

  const ValueId u = cast->occurrences[0].new_saved[0];
  const std::string u_name = name_of(tg, u);
  apply_recompute(tg, 0, {{"Cast+", 2, -1}});
  const std::set<std::string> after = saved_names(tg);
  EXPECT_FALSE(after.count(name_of(tg, v)));
  EXPECT_TRUE(after.count(u_name)) << "the fp16 product is kept instead";
}

// ----- numerics: the same gradients, bit for bit ---------------------------------------------
std::map<ValueId, ref::Tensor> random_feeds(const TrainingGraph& tg, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.5, 1.5);
  std::map<ValueId, ref::Tensor> feeds;
  const auto fill = [&](ValueId v) {
    std::vector<int64_t> shape;
    for (const Dim& d : tg.graph.value(v).shape.dims) shape.push_back(d.value >= 0 ? d.value : 3);  // batch = 3
    ref::Tensor t = ref::zeros(tg.graph.value(v).dtype, shape);
    for (int64_t i = 0; i < t.numel(); ++i) ref::set(t, i, dist(rng));
    feeds[v] = t;
  };
  for (ValueId v : tg.graph.inputs) fill(v);
  for (ValueId v : tg.grad_of_outputs)
    if (v != kNoValue) fill(v);
  return feeds;
}

std::vector<std::vector<double>> input_grads(const TrainingGraph& tg, const std::map<ValueId, ref::Tensor>& feeds) {
  ref::evaluate(tg.graph, feeds, tg.num_forward_nodes);  // forward reads no backward value
  auto env = ref::evaluate(tg.graph, feeds);
  std::vector<std::vector<double>> out;
  for (ValueId v : tg.input_grads) out.push_back(v == kNoValue ? std::vector<double>{} : env.at(v).reals);
  return out;
}

TEST(Recompute, GradientsAreBitIdentical) {
  const uint64_t seed = 20261123;
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (bool fused : {false, true}) {
    const TrainingGraph plain = pre_ln_transformer({.layers = 3, .fused = fused});
    const auto feeds = random_feeds(plain, seed);
    const auto expected = input_grads(plain, feeds);
    const std::string gelu = fused ? "BiasGelu+" : "Gelu+";
    const std::vector<std::pair<int, std::vector<RecomputeRequest>>> configs = {
        {1, {}}, {0, {{gelu, 1, 1}}}, {1, {{"MatMul+", 0, -1}}}, {0, {{"MatMul+", 1, -1}, {gelu, 1, -1}}}};
    for (const auto& [level, requests] : configs) {
      TrainingGraph tg = pre_ln_transformer({.layers = 3, .fused = fused});
      const RecomputeResult r = apply_recompute(tg, level, requests);
      const std::string config = std::string(fused ? "fused" : "plain") + ", level " + std::to_string(level) +
                                 ", " + std::to_string(requests.size()) + " requests";
      EXPECT_GT(r.nodes_cloned, 0) << config;
      EXPECT_NO_THROW(verify(as_exportable_graph(tg))) << config;
      EXPECT_EQ(input_grads(tg, feeds), expected) << config;
    }
  }
}

TEST(Recompute, ASecondApplyAtLevelZeroChangesNothing) {
  TrainingGraph tg = pre_ln_transformer();
  apply_recompute(tg, 1, {});
  std::vector<std::string> names;
  for (const Node& n : tg.graph.nodes) names.push_back(n.name);
  const RecomputeResult again = apply_recompute(tg, 0, {});
  EXPECT_EQ(again.nodes_cloned, 0);
  std::vector<std::string> names_after;
  for (const Node& n : tg.graph.nodes) names_after.push_back(n.name);
  EXPECT_EQ(names_after, names);
  EXPECT_NO_THROW(verify(as_exportable_graph(tg)));
}

}  // namespace
}  // namespace torch_ort

