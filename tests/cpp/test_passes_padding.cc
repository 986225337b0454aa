// padding_elimination: the token-wise ops run on the rows PaddingRows keeps, attention reads
// them padded back, the loss's row gather keeps its rows; the graphs it must leave alone.
#include <gtest/gtest.h>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "tests/cpp/ir_builders.h"

namespace torch_ort {
namespace {

using testing::add_node;
using testing::count_ops;
using testing::dims;
constexpr auto k = testing::known;
constexpr auto s = testing::sym;

ValueId ints(Graph& g, const std::string& name, std::vector<int64_t> v) {
  const ValueId c = g.add_value(name, DType::kInt64, dims({k(static_cast<int64_t>(v.size()))}));
  g.initializers[c] = TensorData::from_int64s(v);
  return c;
}

// One layer as the exporter writes a transformer's: ids (B, T) -> Embedding -> x (B, T, 8) ->
// FusedMatMul -> Reshape (B, T, 1, 8) -> Transpose (B, 1, T, 8) -> Attention(q, q, q, mask) ->
// Transpose -> Reshape -> Add(x, ·) -> h; the loss's rows: LabelRows(labels) gathered from
// Flatten(h). The attention mask is Unsqueeze(Cast(attention_mask)).
struct Layer {
  Graph g;
  ValueId ids, mask, labels, x, q, h, gathered;
  NodeId attention;
};

Layer layer(bool h_is_output = false, bool mixes_sequence = false) {
  Layer l;
  Graph& g = l.g;
  l.ids = g.add_value("input_ids", DType::kInt64, dims({s("B"), s("T")}));
  l.mask = g.add_value("attention_mask", DType::kInt64, dims({s("B2"), s("T")}));
  l.labels = g.add_value("labels", DType::kInt64, dims({s("N")}));
  const ValueId table = g.add_value("table", DType::kFloat, dims({k(100), k(8)}));
  const ValueId w = g.add_value("w", DType::kFloat, dims({k(8), k(8)}));
  g.inputs = {l.ids, l.mask, l.labels, table, w};
  l.x = g.add_value("x", DType::kFloat, dims({s("B"), s("T"), k(8)}));
  add_node(g, "Embedding", {table, l.ids}, {l.x}, "/embedding", kOurDomain);
  l.q = g.add_value("q", DType::kFloat, dims({s("B"), s("T"), k(8)}));
  add_node(g, "FusedMatMul", {l.x, w}, {l.q}, "/q", kOurDomain);
  const ValueId heads = g.add_value("heads", DType::kFloat, dims({s("B"), s("T"), k(1), k(8)}));
  add_node(g, "Reshape", {l.q, ints(g, "to_heads", {0, 0, 1, 8})}, {heads}, "/view");
  const ValueId qt = g.add_value("qt", DType::kFloat, dims({s("B"), k(1), s("T"), k(8)}));
  add_node(g, "Transpose", {heads}, {qt}, "/transpose").attrs.set("perm", std::vector<int64_t>{0, 2, 1, 3});
  const ValueId maskf = g.add_value("maskf", DType::kFloat, dims({s("B2"), s("T")}));
  add_node(g, "Cast", {l.mask}, {maskf}, "/cast").attrs.set("to", int64_t{1});
  const ValueId bias = g.add_value("bias", DType::kFloat, dims({s("B2"), k(1), k(1), s("T")}));
  add_node(g, "Unsqueeze", {maskf, ints(g, "axes12", {1, 2})}, {bias}, "/mask");
  const ValueId att = g.add_value("att", DType::kFloat, dims({s("B"), k(1), s("T"), k(8)}));
  const ValueId lse = g.add_value("lse", DType::kFloat, dims({s("B"), k(1), s("T")}));
  add_node(g, "Attention", {qt, qt, qt, bias}, {att, lse}, "/attention", kOurDomain);
  l.attention = static_cast<NodeId>(g.nodes.size() - 1);
  const ValueId back = g.add_value("back", DType::kFloat, dims({s("B"), s("T"), k(1), k(8)}));
  add_node(g, "Transpose", {att}, {back}, "/transpose_back").attrs.set("perm", std::vector<int64_t>{0, 2, 1, 3});
  const ValueId merged = g.add_value("merged", DType::kFloat, dims({s("B"), s("T"), k(8)}));
  add_node(g, "Reshape", {back, ints(g, "to_rows", {0, 0, 8})}, {merged}, "/merge");
  l.h = g.add_value("h", DType::kFloat, dims({s("B"), s("T"), k(8)}));
  add_node(g, "Add", {l.x, merged}, {l.h}, "/residual");
  ValueId read = l.h;
  if (mixes_sequence) {  // a mean over the sequence: every row of it reads every position
    read = g.add_value("pooled", DType::kFloat, dims({s("B"), k(1), k(8)}));
    add_node(g, "ReduceMean", {l.h, ints(g, "axis1", {1})}, {read}, "/pool");
  }
  const ValueId rows = g.add_value("rows", DType::kInt64, dims({Dim{}}));
  add_node(g, "LabelRows", {l.labels}, {rows}, "/rows", kOurDomain).attrs.set("ignore_index", int64_t{-100});
  const ValueId flat = g.add_value("flat", DType::kFloat, dims({Dim{}, k(8)}));
  add_node(g, "Flatten", {read}, {flat}, "/flat").attrs.set("axis", int64_t{2});
  l.gathered = g.add_value("gathered", DType::kFloat, dims({Dim{}, k(8)}));
  add_node(g, "Gather", {flat, rows}, {l.gathered}, "/gather").attrs.set("axis", int64_t{0});
  g.outputs = {l.gathered};
  if (h_is_output) g.outputs.push_back(l.h);
  verify(g);
  return l;
}

const Node& producer_of(const Graph& g, ValueId v) { return g.nodes[GraphIndex(g).producer[v]]; }

TEST(PaddingElimination, TokenWiseOpsRunOnTheKeptRows) {
  Layer l = layer();
  auto pass = make_padding_elimination_pass();
  EXPECT_EQ(pass->name(), "padding_elimination");
  ASSERT_TRUE(pass->run(l.g));
  verify(l.g);
  EXPECT_FALSE(pass->run(l.g)) << "a second run changes nothing";
  make_dce_pass()->run(l.g);
  verify(l.g);
  const Graph& g = l.g;
  const Node& rows = [&]() -> const Node& {
    for (const Node& n : g.nodes)
      if (n.op_type == "PaddingRows") return n;
    throw std::runtime_error("no PaddingRows");
  }();
  EXPECT_EQ(rows.inputs, (std::vector<ValueId>{l.mask, l.ids, l.labels})) << "the loss's rows are kept";
  for (const Node& n : g.nodes) {
    if (n.op_type == "Embedding") {
      const Node& ids = producer_of(g, n.inputs[1]);
      EXPECT_EQ(ids.op_type, "PackRows");
      EXPECT_EQ(ids.inputs[0], l.ids);
      EXPECT_EQ(g.value(n.outputs[0]).shape.dims[0].symbol, "padding_rows");
      EXPECT_EQ(g.value(n.outputs[0]).shape.rank(), 2);
    }
    if (n.op_type == "FusedMatMul") EXPECT_EQ(g.value(n.inputs[0]).shape.rank(), 2) << "packed rows";
    if (n.op_type == "Reshape" && n.name == "/view") EXPECT_EQ(producer_of(g, n.inputs[0]).op_type, "PadRows");
    if (n.op_type == "Add") {  // the residual: packed x plus attention's output gathered again
      EXPECT_EQ(producer_of(g, n.inputs[1]).op_type, "PackRows");
      EXPECT_EQ(g.value(n.outputs[0]).shape.rank(), 2);
    }
    if (n.op_type == "Flatten") EXPECT_EQ(producer_of(g, n.inputs[0]).op_type, "PadRows");
  }
  const Node& attention = [&]() -> const Node& {
    for (const Node& n : g.nodes)
      if (n.op_type == "Attention") return n;
    throw std::runtime_error("no Attention");
  }();
  EXPECT_EQ(producer_of(g, attention.inputs[3]).op_type, "PaddingMaskCheck");
  EXPECT_EQ(count_ops(g, "PadRows"), 2);  // q for attention, h for the loss's gather
  EXPECT_EQ(count_ops(g, "PackRows"), 2);  // the ids, attention's output

  // The moves are each other's gradients: the table's and the weight's gradients build.
  TrainingGraph tg = build_training_graph(g, {false, false, false, true, true});
  verify(as_exportable_graph(tg));
}

TEST(PaddingElimination, LeavesAloneWhatCouldReadThePadding) {
  for (bool output : {false, true}) {
    Layer l = layer(/*h_is_output=*/output, /*mixes_sequence=*/!output);
    const size_t before = l.g.nodes.size();
    EXPECT_FALSE(make_padding_elimination_pass()->run(l.g)) << (output ? "h is returned" : "a mean over T");
    EXPECT_EQ(l.g.nodes.size(), before);
  }
  // An attention without a mask: nothing says which keys a counted row may see.
  Layer l = layer();
  l.g.nodes[l.attention].inputs.resize(3);
  EXPECT_FALSE(make_padding_elimination_pass()->run(l.g));
  // An embedding whose gradient scales by each id's count over every position.
  Layer freq = layer();
  for (Node& n : freq.g.nodes)
    if (n.op_type == "Embedding") n.attrs.set("scale_grad_by_freq", int64_t{1});
  EXPECT_FALSE(make_padding_elimination_pass()->run(freq.g));
}

}  // namespace
}  // namespace torch_ort
