// matmul_bias_fusion, transpose_matmul_fusion, softmax_cross_entropy_fusion and label_sparsity:
// structure of tiny hand-written graphs after each pass (fires; stays when a condition fails), the
// verifier after every run, a second run that changes nothing, and the FusedMatMul gradient's
// structure.
#include <gtest/gtest.h>

#include <algorithm>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/shapes/infer_shapes.h"
#include "tests/cpp/ir_builders.h"

namespace torch_ort {
namespace {

using testing::add_node;

Shape dims(std::vector<Dim> d) { return Shape::of(std::move(d)); }
Dim k(int64_t v) { return Dim::known(v); }
Dim s(const char* name) { return Dim::symbolic(name); }

int count(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes) n += node.op_type == op;
  return n;
}

const Node* find(const Graph& g, const std::string& op) {
  for (const Node& n : g.nodes)
    if (n.op_type == op) return &n;
  return nullptr;
}

void run_twice(Pass& pass, Graph& g, bool changes = true) {
  EXPECT_EQ(pass.run(g), changes) << pass.name();
  verify(g);
  EXPECT_FALSE(pass.run(g)) << pass.name() << ": a second run changes nothing";
  verify(g);
}

// A Linear layer as the exporter writes it: x (B, T, 8), W (16, 8) -> Transpose -> MatMul -> Add(b).
struct Linear {
  Graph g;
  ValueId x, w, wt, b, mm, y;
};
Linear linear_graph(Shape bias_shape, bool bias_first = false) {
  Linear l;
  Graph& g = l.g;
  l.x = g.add_value("x", DType::kFloat, dims({s("B"), s("T"), k(8)}));
  l.w = g.add_value("w", DType::kFloat, dims({k(16), k(8)}));
  l.b = g.add_value("b", DType::kFloat, std::move(bias_shape));
  g.inputs = {l.x, l.w, l.b};
  l.wt = g.add_value("wt", DType::kFloat, dims({k(8), k(16)}));
  add_node(g, "Transpose", {l.w}, {l.wt}, "/T").attrs.set("perm", std::vector<int64_t>{1, 0});
  l.mm = g.add_value("mm", DType::kFloat, dims({s("B"), s("T"), k(16)}));
  add_node(g, "MatMul", {l.x, l.wt}, {l.mm}, "/MatMul");
  l.y = g.add_value("y", DType::kFloat, dims({s("B"), s("T"), k(16)}));
  add_node(g, "Add", bias_first ? std::vector<ValueId>{l.b, l.mm} : std::vector<ValueId>{l.mm, l.b}, {l.y}, "/Add");
  g.outputs = {l.y};
  return l;
}

TEST(MatMulBiasFusion, LinearOn3DActivationBecomesOneFusedMatMulWithBias) {
  for (bool bias_first : {false, true}) {
    Linear l = linear_graph(dims({k(16)}), bias_first);
    auto pass = make_matmul_bias_fusion_pass();
    EXPECT_EQ(pass->name(), "matmul_bias_fusion");
    run_twice(*pass, l.g);
    ASSERT_EQ(l.g.nodes.size(), 2u);
    const Node& f = l.g.nodes[1];
    EXPECT_EQ(f.domain, kOurDomain);
    EXPECT_EQ(f.op_type, "FusedMatMul");
    EXPECT_EQ(f.inputs, (std::vector<ValueId>{l.x, l.wt, l.b}));
    EXPECT_EQ(f.outputs, std::vector<ValueId>{l.y});
    EXPECT_EQ(f.attrs.get_int("transB", 0), 0);
  }
}

TEST(MatMulBiasFusion, BroadcastRowBiasFires) {
  Linear l = linear_graph(dims({k(1), k(1), k(16)}));
  auto pass = make_matmul_bias_fusion_pass();
  run_twice(*pass, l.g);
  EXPECT_EQ(count(l.g, "FusedMatMul"), 1);
}

TEST(MatMulBiasFusion, NonBiasOperandsAndSharedProductsStay) {
  auto pass = make_matmul_bias_fusion_pass();
  // A residual (B, T, 16), a per-row (T, 1) term, and a bias of unknown shape are no bias.
  for (Shape other : {dims({s("B"), s("T"), k(16)}), dims({s("T"), k(1)}), Shape::unknown(), dims({k(4), k(16)})}) {
    Linear l = linear_graph(other);
    run_twice(*pass, l.g, /*changes=*/false);
    EXPECT_EQ(count(l.g, "MatMul"), 1) << other.to_string();
    EXPECT_EQ(count(l.g, "Add"), 1) << other.to_string();
  }
  // The product is also read elsewhere: fusing would compute it twice.
  Linear l = linear_graph(dims({k(16)}));
  l.g.outputs.push_back(l.mm);
  run_twice(*pass, l.g, /*changes=*/false);
  EXPECT_EQ(count(l.g, "MatMul"), 1);
}

TEST(TransposeMatMulFusion, WeightTransposeBecomesTransBAfterBiasFusion) {
  Linear l = linear_graph(dims({k(16)}));
  auto bias = make_matmul_bias_fusion_pass();
  ASSERT_TRUE(bias->run(l.g));
  auto pass = make_transpose_matmul_fusion_pass();
  EXPECT_EQ(pass->name(), "transpose_matmul_fusion");
  run_twice(*pass, l.g);
  ASSERT_EQ(l.g.nodes.size(), 1u) << "the Transpose had no other reader and went";
  const Node& f = l.g.nodes[0];
  EXPECT_EQ(f.op_type, "FusedMatMul");
  EXPECT_EQ(f.inputs, (std::vector<ValueId>{l.x, l.w, l.b}));
  EXPECT_EQ(f.attrs.get_int("transA", 0), 0);
  EXPECT_EQ(f.attrs.get_int("transB", 0), 1);
}

TEST(TransposeMatMulFusion, MatMulBecomesFusedMatMulAndGemmTogglesItsFlag) {
  Graph g;
  ValueId a = g.add_value("a", DType::kFloat, dims({s("B"), k(4), k(8), k(3)}));
  ValueId b = g.add_value("b", DType::kFloat, dims({s("B"), k(4), k(8), k(5)}));
  ValueId c = g.add_value("c", DType::kFloat, dims({k(6), k(3)}));
  ValueId d = g.add_value("d", DType::kFloat, dims({k(5), k(6)}));
  g.inputs = {a, b, c, d};
  ValueId at = g.add_value("at", DType::kFloat, dims({s("B"), k(4), k(3), k(8)}));
  add_node(g, "Transpose", {a}, {at}, "/Ta").attrs.set("perm", std::vector<int64_t>{0, 1, 3, 2});
  ValueId p = g.add_value("p", DType::kFloat, dims({s("B"), k(4), k(3), k(5)}));
  add_node(g, "MatMul", {at, b}, {p}, "/MatMul");  // aᵀ·b, batched
  ValueId ct = g.add_value("ct", DType::kFloat, dims({k(3), k(6)}));
  add_node(g, "Transpose", {c}, {ct}, "/Tc");  // default perm: reversed, a swap for rank 2
  ValueId q = g.add_value("q", DType::kFloat, dims({k(3), k(5)}));
  add_node(g, "Gemm", {ct, d}, {q}, "/Gemm").attrs.set("transB", int64_t{1});
  ValueId other = g.add_value("other", DType::kFloat, dims({k(3), k(6)}));
  add_node(g, "Relu", {ct}, {other}, "/Relu");  // ct has another reader: its Transpose stays
  g.outputs = {p, q, other};
  auto pass = make_transpose_matmul_fusion_pass();
  run_twice(*pass, g);
  const Node* mm = find(g, "FusedMatMul");
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(mm->domain, kOurDomain);
  EXPECT_EQ(mm->inputs, (std::vector<ValueId>{a, b}));
  EXPECT_EQ(mm->attrs.get_int("transA", 0), 1);
  const Node* gemm = find(g, "Gemm");
  EXPECT_EQ(gemm->inputs, (std::vector<ValueId>{c, d}));
  EXPECT_EQ(gemm->attrs.get_int("transA", 0), 1);
  EXPECT_EQ(gemm->attrs.get_int("transB", 0), 1);
  EXPECT_EQ(count(g, "Transpose"), 1);
  EXPECT_EQ(count(g, "MatMul"), 0);
}

TEST(TransposeMatMulFusion, OtherPermutationsAndVectorOperandsStay) {
  Graph g;
  ValueId a = g.add_value("a", DType::kFloat, dims({k(2), k(3), k(4)}));
  ValueId v = g.add_value("v", DType::kFloat, dims({k(2)}));
  g.inputs = {a, v};
  ValueId at = g.add_value("at", DType::kFloat, dims({k(3), k(2), k(4)}));
  add_node(g, "Transpose", {a}, {at}, "/T").attrs.set("perm", std::vector<int64_t>{1, 0, 2});
  ValueId x = g.add_value("x", DType::kFloat, dims({k(3), k(2), k(3)}));
  add_node(g, "MatMul", {at, a}, {x}, "/MatMul");  // not a last-two swap
  ValueId a2 = g.add_value("a2", DType::kFloat, dims({k(2), k(3)}));
  ValueId a2t = g.add_value("a2t", DType::kFloat, dims({k(3), k(2)}));
  g.inputs.push_back(a2);
  add_node(g, "Transpose", {a2}, {a2t}, "/T2").attrs.set("perm", std::vector<int64_t>{1, 0});
  ValueId y = g.add_value("y", DType::kFloat, dims({k(3)}));
  add_node(g, "MatMul", {a2t, v}, {y}, "/MatVec");  // rank-1 operand: numpy semantics differ
  g.outputs = {x, y};
  auto pass = make_transpose_matmul_fusion_pass();
  run_twice(*pass, g, /*changes=*/false);
  EXPECT_EQ(count(g, "MatMul"), 2);
  EXPECT_EQ(count(g, "Transpose"), 2);
}

// Attention written by hand (HF GPT-2, eager attention): K = Transpose(k, 0,2,1,3) read only by
// Transpose(K, last two) read by the MatMul. The fold makes the MatMul read K itself, so K's
// Transpose must stay although its only original reader goes (regression: it was dropped).
TEST(TransposeMatMulFusion, TheFoldedOperandsProducerStaysAlive) {
  Graph g;
  ValueId q = g.add_value("q", DType::kFloat, dims({k(2), k(3), k(4), k(5)}));
  ValueId kk = g.add_value("k", DType::kFloat, dims({k(2), k(4), k(3), k(5)}));
  g.inputs = {q, kk};
  ValueId kh = g.add_value("kh", DType::kFloat, dims({k(2), k(3), k(4), k(5)}));
  add_node(g, "Transpose", {kk}, {kh}, "/heads").attrs.set("perm", std::vector<int64_t>{0, 2, 1, 3});
  ValueId kt = g.add_value("kt", DType::kFloat, dims({k(2), k(3), k(5), k(4)}));
  add_node(g, "Transpose", {kh}, {kt}, "/kT").attrs.set("perm", std::vector<int64_t>{0, 1, 3, 2});
  ValueId sc = g.add_value("scores", DType::kFloat, dims({k(2), k(3), k(4), k(4)}));
  add_node(g, "MatMul", {q, kt}, {sc}, "/scores");
  g.outputs = {sc};
  auto pass = make_transpose_matmul_fusion_pass();
  run_twice(*pass, g);
  ASSERT_EQ(count(g, "Transpose"), 1);
  EXPECT_EQ(find(g, "Transpose")->outputs[0], kh);
  const Node* mm = find(g, "FusedMatMul");
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(mm->inputs[1], kh);
  EXPECT_EQ(mm->attrs.get_int("transB", 0), 1);
}

TEST(TransposeMatMulFusion, TrainingGraphChainsFoldAndNodesKeepTheirPhase) {
  // Backward of MatMul(x, Transpose(w)) written by a rule: dx = dy · Transpose(Transpose(w)).
  Graph g;
  ValueId w = g.add_value("w", DType::kFloat, dims({k(16), k(8)}));
  ValueId dy = g.add_value("dy", DType::kFloat, dims({s("N"), k(16)}));
  g.inputs = {w, dy};
  ValueId wt = g.add_value("wt", DType::kFloat, dims({k(8), k(16)}));
  add_node(g, "Transpose", {w}, {wt}, "/fwd/T").attrs.set("perm", std::vector<int64_t>{1, 0});
  ValueId wtt = g.add_value("wtt", DType::kFloat, dims({k(16), k(8)}));
  add_node(g, "Transpose", {wt}, {wtt}, "/bwd/T").attrs.set("perm", std::vector<int64_t>{1, 0});
  g.nodes.back().in_backward = true;
  ValueId dx = g.add_value("dx", DType::kFloat, dims({s("N"), k(8)}));
  add_node(g, "MatMul", {dy, wtt}, {dx}, "/bwd/MatMul").in_backward = true;
  g.outputs = {dx};
  auto pass = make_transpose_matmul_fusion_pass();
  run_twice(*pass, g);
  ASSERT_EQ(g.nodes.size(), 1u) << "both links of the chain went";
  const Node& f = g.nodes[0];
  EXPECT_EQ(f.op_type, "FusedMatMul");
  EXPECT_EQ(f.inputs, (std::vector<ValueId>{dy, w}));
  EXPECT_EQ(f.attrs.get_int("transB", 0), 0) << "two swaps cancel";
  EXPECT_TRUE(f.in_backward);
}

// --- softmax_cross_entropy_fusion

Graph nll_graph(int64_t axis, bool lp_also_output, int64_t rank = 2) {
  Graph g;
  ValueId x = g.add_value("x", DType::kFloat, rank == 2 ? dims({s("N"), k(5)}) : dims({s("N"), k(5), k(7)}));
  ValueId y = g.add_value("y", DType::kInt64, rank == 2 ? dims({s("N")}) : dims({s("N"), k(7)}));
  ValueId w = g.add_value("w", DType::kFloat, dims({k(5)}));
  g.inputs = {x, y, w};
  ValueId lp = g.add_value("lp", DType::kFloat, g.value(x).shape);
  add_node(g, "LogSoftmax", {x}, {lp}, "/LogSoftmax").attrs.set("axis", axis);
  ValueId loss = g.add_value("loss", DType::kFloat, dims({}));
  Node& nll = add_node(g, "NegativeLogLikelihoodLoss", {lp, y, w}, {loss}, "/nll");
  nll.attrs.set("reduction", std::string("sum"));
  nll.attrs.set("ignore_index", int64_t{3});
  g.outputs = {loss};
  if (lp_also_output) g.outputs.push_back(lp);
  return g;
}

TEST(SoftmaxCrossEntropyFusion, LogSoftmaxIntoNllBecomesOneLossKeepingAttributes) {
  for (auto [axis, rank] : {std::pair<int64_t, int64_t>{1, 2}, {-1, 2}, {1, 3}, {-2, 3}}) {
    Graph g = nll_graph(axis, false, rank);
    auto pass = make_softmax_cross_entropy_fusion_pass();
    EXPECT_EQ(pass->name(), "softmax_cross_entropy_fusion");
    run_twice(*pass, g);
    ASSERT_EQ(g.nodes.size(), 1u);
    const Node& n = g.nodes[0];
    EXPECT_EQ(n.op_type, "SoftmaxCrossEntropyLoss");
    EXPECT_TRUE(n.domain.empty());
    EXPECT_EQ(n.inputs, (std::vector<ValueId>{g.inputs[0], g.inputs[1], g.inputs[2]}));
    EXPECT_EQ(n.attrs.get_string("reduction", ""), "sum");
    EXPECT_EQ(n.attrs.get_int("ignore_index", 0), 3);
  }
}

TEST(SoftmaxCrossEntropyFusion, OtherAxisOrSharedLogProbsStay) {
  auto pass = make_softmax_cross_entropy_fusion_pass();
  Graph other_axis = nll_graph(-1, false, 3);  // normalises the last dim, not the classes
  run_twice(*pass, other_axis, /*changes=*/false);
  EXPECT_EQ(count(other_axis, "LogSoftmax"), 1);
  Graph shared = nll_graph(1, true);
  run_twice(*pass, shared, /*changes=*/false);
  EXPECT_EQ(count(shared, "NegativeLogLikelihoodLoss"), 1);
}

// --- label_sparsity

// An LM head and its loss as a causal LM exports them: h (B, T, 8) · W (V, 8)ᵀ -> (B, T, V),
// [Cast], Reshape (-1, V), SoftmaxCrossEntropyLoss(ignore_index) against labels (N).
struct Head {
  Graph g;
  ValueId logits, loss;
};

Head head_graph(int64_t vocab, bool cast, bool logits_output, bool ignore = true) {
  Head h;
  Graph& g = h.g;
  ValueId x = g.add_value("h", DType::kFloat, dims({s("B"), s("T"), k(8)}));
  ValueId w = g.add_value("W", DType::kFloat, dims({k(vocab), k(8)}));
  ValueId y = g.add_value("labels", DType::kInt64, dims({s("N")}));
  g.inputs = {x, y, w};
  h.logits = g.add_value("logits", DType::kFloat, dims({s("B"), s("T"), k(vocab)}));
  Node& mm = add_node(g, "FusedMatMul", {x, w}, {h.logits}, "/lm_head");
  mm.domain = kOurDomain;
  mm.attrs.set("transB", int64_t{1});
  ValueId scores = h.logits;
  if (cast) {
    scores = g.add_value("logits_f64", DType::kDouble, dims({s("B"), s("T"), k(vocab)}));
    add_node(g, "Cast", {h.logits}, {scores}, "/cast").attrs.set("to", int64_t{11});
  }
  ValueId shape = g.add_value("shape", DType::kInt64, dims({k(2)}));
  g.initializers[shape] = TensorData::from_int64s({-1, vocab});
  ValueId flat = g.add_value("flat", g.value(scores).dtype, dims({s("N"), k(vocab)}));
  add_node(g, "Reshape", {scores, shape}, {flat}, "/view");
  h.loss = g.add_value("loss", g.value(scores).dtype, dims({}));
  Node& sce = add_node(g, "SoftmaxCrossEntropyLoss", {flat, y}, {h.loss}, "/loss");
  if (ignore) sce.attrs.set("ignore_index", int64_t{-100});
  g.outputs = {h.loss};
  if (logits_output) g.outputs.push_back(h.logits);
  return h;
}

TEST(LabelSparsity, TheHeadAndLossRunOnTheGatheredRows) {
  for (bool cast : {false, true}) {
    Head h = head_graph(2048, cast, /*logits_output=*/false);
    auto pass = make_label_sparsity_pass();
    EXPECT_EQ(pass->name(), "label_sparsity");
    run_twice(*pass, h.g);
    make_dce_pass()->run(h.g);
    verify(h.g);
    const GraphIndex idx(h.g);
    const Node& loss = h.g.nodes[idx.producer[h.loss]];
    const Node* scores = &h.g.nodes[idx.producer[loss.inputs[0]]];
    if (cast) {
      EXPECT_EQ(scores->op_type, "Cast");
      scores = &h.g.nodes[idx.producer[scores->inputs[0]]];
    }
    ASSERT_EQ(scores->op_type, "FusedMatMul");
    EXPECT_EQ(scores->attrs.get_int("transB", 0), 1);
    EXPECT_FALSE(h.g.value(scores->outputs[0]).shape.dims[0].is_known()) << "the valid rows: data";
    const Node& rows = h.g.nodes[idx.producer[scores->inputs[0]]];
    EXPECT_EQ(rows.op_type, "Gather");
    EXPECT_EQ(h.g.nodes[idx.producer[rows.inputs[1]]].op_type, "LabelRows");
    EXPECT_EQ(h.g.nodes[idx.producer[loss.inputs[1]]].op_type, "Gather");
    EXPECT_EQ(count(h.g, "FusedMatMul"), 1) << "the full product is dead without the logits output";
    EXPECT_EQ(count(h.g, "Reshape"), 0);
  }
}

TEST(LabelSparsity, ReturnedLogitsKeepTheFullProduct) {
  Head h = head_graph(2048, false, /*logits_output=*/true);
  run_twice(*make_label_sparsity_pass(), h.g);
  make_dce_pass()->run(h.g);
  EXPECT_EQ(count(h.g, "FusedMatMul"), 1) << "one GEMM: the logits";
  const Node* rows = find(h.g, "ProductRows");
  ASSERT_NE(rows, nullptr) << "the loss reads the valid rows of the logits";
  EXPECT_EQ(rows->inputs[3], h.logits);
  EXPECT_EQ(rows->inputs[2], kNoValue);
  EXPECT_EQ(rows->attrs.get_int("transB", 0), 1);
  EXPECT_EQ(h.g.nodes[GraphIndex(h.g).producer[rows->inputs[4]]].op_type, "LabelRows");
  // Its gradient is the product's over the gathered rows: GEMMs on them, nothing into the logits.
  TrainingGraph tg = build_training_graph(h.g, {false, false, true});
  verify(as_exportable_graph(tg));
  int gemms_on_rows = 0;
  for (size_t i = tg.num_forward_nodes; i < tg.graph.nodes.size(); ++i) {
    const Node& n = tg.graph.nodes[i];
    if (n.op_type == "FusedMatMul" || n.op_type == "Gemm")
      for (ValueId v : n.inputs) gemms_on_rows += v == rows->inputs[0];
  }
  EXPECT_EQ(gemms_on_rows, 1) << "dW from the gathered rows";
}

// head_graph with h made row by row from x (B, T, 8): h = (x + x·W1)·gamma; a = x·W1 is also
// returned where a_returned.
Head head_after_rows(bool a_returned) {
  Head h = head_graph(2048, false, /*logits_output=*/false);
  Graph& g = h.g;
  const ValueId hv = g.inputs[0];
  const ValueId x = g.add_value("x", DType::kFloat, dims({s("B"), s("T"), k(8)}));
  const ValueId w1 = g.add_value("W1", DType::kFloat, dims({k(8), k(8)}));
  const ValueId gamma = g.add_value("gamma", DType::kFloat, dims({k(8)}));
  const ValueId a = g.add_value("a", DType::kFloat, dims({s("B"), s("T"), k(8)}));
  const ValueId sum = g.add_value("sum", DType::kFloat, dims({s("B"), s("T"), k(8)}));
  const size_t head_nodes = g.nodes.size();
  add_node(g, "FusedMatMul", {x, w1}, {a}, "/w1", kOurDomain);
  add_node(g, "Add", {x, a}, {sum}, "/residual");
  add_node(g, "Mul", {sum, gamma}, {hv}, "/scale");
  std::rotate(g.nodes.begin(), g.nodes.begin() + static_cast<std::ptrdiff_t>(head_nodes), g.nodes.end());
  g.inputs = {x, g.inputs[1], g.inputs[2], w1, gamma};
  if (a_returned) g.outputs.push_back(a);
  verify(g);
  return h;
}

TEST(LabelSparsity, TheGatherMovesBackPastTheRowWiseWork) {
  for (bool a_returned : {false, true}) {
    Head h = head_after_rows(a_returned);
    const ValueId x = h.g.inputs[0], a = *h.g.find("a");
    run_twice(*make_label_sparsity_pass(), h.g);
    make_dce_pass()->run(h.g);
    verify(h.g);
    const GraphIndex idx(h.g);
    const auto made = [&](ValueId v) -> const Node& { return h.g.nodes[idx.producer[v]]; };
    const Node& head = made(made(h.loss).inputs[0]);
    ASSERT_EQ(head.op_type, "FusedMatMul");
    const Node& scale = made(head.inputs[0]);
    ASSERT_EQ(scale.op_type, "Mul") << "the head reads the scaled rows, not a gather";
    const Shape& rows = h.g.value(scale.outputs[0]).shape;
    EXPECT_EQ(rows.rank(), 2);
    EXPECT_TRUE(rows.dims[0].is_symbolic()) << "one symbol for the counted rows";
    const Node& sum = made(scale.inputs[0]);
    ASSERT_EQ(sum.op_type, "Add");
    EXPECT_TRUE(h.g.value(sum.outputs[0]).shape.same_as(rows));
    // What is gathered: x's rows, and a's where a is returned (its GEMM then runs on every row).
    std::vector<ValueId> gathered;
    for (const Node& n : h.g.nodes)
      if (n.op_type == "Gather" && made(n.inputs[1]).op_type == "LabelRows" && idx.producer[n.inputs[0]] >= 0 &&
          made(n.inputs[0]).op_type == "Flatten")
        gathered.push_back(made(n.inputs[0]).inputs[0]);
    std::sort(gathered.begin(), gathered.end());
    const std::vector<ValueId> want = a_returned ? std::vector<ValueId>{x, a} : std::vector<ValueId>{x};
    EXPECT_EQ(gathered, want);
    const Node* w1 = nullptr;
    for (const Node& n : h.g.nodes)
      if (n.op_type == "FusedMatMul" && n.inputs[1] == h.g.inputs[3]) w1 = &n;
    ASSERT_NE(w1, nullptr);
    EXPECT_EQ(h.g.value(w1->inputs[0]).shape.rank(), a_returned ? 3 : 2);
    EXPECT_EQ(count(h.g, "FusedMatMul"), 2);
    TrainingGraph tg = build_training_graph(h.g, {true, false, true, true, true});
    verify(as_exportable_graph(tg));
  }
}

TEST(LabelSparsity, FewClassesOrNoIgnoreIndexStay) {
  auto pass = make_label_sparsity_pass();
  Head small = head_graph(64, false, false);
  run_twice(*pass, small.g, /*changes=*/false);
  Head no_ignore = head_graph(2048, false, false, /*ignore=*/false);
  run_twice(*pass, no_ignore.g, /*changes=*/false);
  EXPECT_EQ(count(no_ignore.g, "LabelRows"), 0);
}

// --- LinearCrossEntropy fusion: the head and its loss as one chunked op

// head_graph's cast, made the mixed-precision form: a bfloat16 head whose logits go up to float.
void make_bf16_head(Head& h) {
  Graph& g = h.g;
  for (ValueId v : {g.inputs[0], g.inputs[2], h.logits}) g.value(v).dtype = DType::kBFloat16;
  for (Node& n : g.nodes) {
    if (n.op_type == "Cast") n.attrs.set("to", int64_t{1});
    if (n.op_type == "Cast" || n.op_type == "Reshape" || n.op_type == "SoftmaxCrossEntropyLoss")
      g.value(n.outputs[0]).dtype = DType::kFloat;
  }
}

TEST(LinearCrossEntropyFusion, TheGatheredHeadAndItsLossBecomeOneOp) {
  for (bool cast : {false, true}) {
    Head h = head_graph(2048, cast, /*logits_output=*/false);
    if (cast) make_bf16_head(h);
    run_twice(*make_label_sparsity_pass(), h.g);
    auto pass = make_linear_cross_entropy_fusion_pass();
    EXPECT_EQ(pass->name(), "linear_cross_entropy_fusion");
    run_twice(*pass, h.g);
    make_dce_pass()->run(h.g);
    verify(h.g);
    const GraphIndex idx(h.g);
    const Node& fused = h.g.nodes[idx.producer[h.loss]];
    ASSERT_EQ(fused.op_type, "LinearCrossEntropy");
    EXPECT_EQ(h.g.nodes[idx.producer[fused.inputs[0]]].op_type, "Gather") << "the valid rows";
    EXPECT_EQ(h.g.nodes[idx.producer[fused.inputs[3]]].op_type, "Gather") << "their labels";
    EXPECT_EQ(fused.attrs.get_int("transB", 0), 1);
    EXPECT_EQ(fused.inputs.size(), 4u) << "no product computed elsewhere";
    EXPECT_EQ(count(h.g, "FusedMatMul") + count(h.g, "MatMul") + count(h.g, "Cast"), 0)
        << "no GEMM over the vocabulary outside the op";
    // Its gradients come out of forward; backward scales them, one Mul each.
    TrainingGraph tg = build_training_graph(h.g, {false, false, true});
    infer_shapes(tg.graph);
    run_training_pipeline(tg, default_training_pipeline(), {});
    verify(as_exportable_graph(tg));
    const Node* f = find(tg.graph, "LinearCrossEntropy");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(f->outputs.size(), 4u);
    EXPECT_EQ(f->outputs[1], kNoValue) << "X needs no gradient: dce drops it";
    EXPECT_NE(f->outputs[2], kNoValue) << "dW";
    for (size_t i = tg.num_forward_nodes; i < tg.graph.nodes.size(); ++i) {
      const Node& n = tg.graph.nodes[i];
      EXPECT_TRUE(n.op_type != "FusedMatMul" && n.op_type != "Gemm" && n.op_type != "MatMul") << n.describe();
    }
  }
}

TEST(LinearCrossEntropyFusion, ReturnedLogitsAreReadRowByRow) {
  Head h = head_graph(2048, false, /*logits_output=*/true);
  run_twice(*make_label_sparsity_pass(), h.g);
  run_twice(*make_linear_cross_entropy_fusion_pass(), h.g);
  make_dce_pass()->run(h.g);
  verify(h.g);
  const Node* f = find(h.g, "LinearCrossEntropy");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(f->inputs.size(), 6u);
  EXPECT_EQ(f->inputs[4], h.logits);
  EXPECT_EQ(h.g.nodes[GraphIndex(h.g).producer[f->inputs[5]]].op_type, "LabelRows");
  EXPECT_EQ(count(h.g, "ProductRows"), 0);
  EXPECT_EQ(count(h.g, "FusedMatMul"), 1) << "one GEMM: the logits";
  // Without label sparsity the product is read in order: no row index.
  Head dense = head_graph(2048, false, /*logits_output=*/true);
  run_twice(*make_linear_cross_entropy_fusion_pass(), dense.g);
  make_dce_pass()->run(dense.g);
  const Node* d = find(dense.g, "LinearCrossEntropy");
  ASSERT_NE(d, nullptr);
  ASSERT_EQ(d->inputs.size(), 5u);
  EXPECT_EQ(d->inputs[4], dense.logits);
}

TEST(LinearCrossEntropyFusion, FewClassesOrScoresNotInFloatStay) {
  Head small = head_graph(64, false, false);
  run_twice(*make_linear_cross_entropy_fusion_pass(), small.g, /*changes=*/false);
  // Scores in double: the op's float arithmetic would round differently from the loss's.
  Head f64 = head_graph(2048, /*cast=*/true, false);
  run_twice(*make_linear_cross_entropy_fusion_pass(), f64.g, /*changes=*/false);
}

// --- FusedMatMul: shape rule and gradient structure

TEST(FusedMatMul, ShapeRuleAndGradientAreFlagAwareGemms) {
  Linear l = linear_graph(dims({k(16)}));
  ASSERT_TRUE(make_matmul_bias_fusion_pass()->run(l.g));
  ASSERT_TRUE(make_transpose_matmul_fusion_pass()->run(l.g));
  l.g.value(l.y).shape = Shape::unknown();
  infer_shapes(l.g);
  EXPECT_TRUE(l.g.value(l.y).shape.same_as(dims({s("B"), s("T"), k(16)}))) << l.g.value(l.y).shape.to_string();
  TrainingGraph tg = build_training_graph(l.g, {true, true, true});
  verify(as_exportable_graph(tg));
  int transposes = 0, gemms = 0, fused = 0;
  for (size_t i = tg.num_forward_nodes; i < tg.graph.nodes.size(); ++i) {
    const Node& n = tg.graph.nodes[i];
    transposes += n.op_type == "Transpose";
    gemms += n.op_type == "Gemm";
    fused += n.op_type == "FusedMatMul";
  }
  EXPECT_EQ(transposes, 0) << "flags, never a materialised transpose";
  EXPECT_EQ(gemms, 1) << "dW: one Gemm over the flattened rows";
  EXPECT_EQ(fused, 1) << "dX";
  for (ValueId gv : tg.input_grads) ASSERT_NE(gv, kNoValue);
  EXPECT_TRUE(tg.graph.value(tg.input_grads[1]).shape.same_as(dims({k(16), k(8)})));
  EXPECT_TRUE(tg.graph.value(tg.input_grads[2]).shape.same_as(dims({k(16)})));
}

}  // namespace
}  // namespace torch_ort
