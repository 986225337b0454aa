// sequence_to_split: structure of tiny hand-written graphs before and after the pass.
#include <gtest/gtest.h>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/onnx_io.h"
#include "csrc/core/ir/type_inference.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "tests/cpp/ir_builders.h"
#include "tests/cpp/onnx_test_models.h"

namespace torch_ort {
namespace {

using testing::add_node;

ValueId int_const(Graph& g, const std::string& name, std::vector<int64_t> v, bool scalar) {
  ValueId id = g.add_value(name, DType::kInt64, scalar ? Shape::of({}) : Shape::of({Dim::known(int64_t(v.size()))}));
  g.initializers[id] = TensorData::from_int64s(v, scalar);
  return id;
}

// x (B, T, 96) -> SplitToSequence(x, split) -> SequenceAt at `positions` -> Add of the picks
// (nanoGPT's q, k, v = x.split(32, dim=2)). `split` is a scalar 32 unless `sizes` is given.
Graph qkv_graph(const std::vector<int64_t>& positions, std::vector<int64_t> sizes = {}, int64_t dim = 96) {
  Graph g;
  ValueId x = g.add_value("x", DType::kFloat, Shape::of({Dim::symbolic("B"), Dim::symbolic("T"),
                                                         dim < 0 ? Dim{} : Dim::known(dim)}));
  g.inputs = {x};
  ValueId split = sizes.empty() ? int_const(g, "split", {32}, true) : int_const(g, "split", sizes, false);
  ValueId seq = g.add_value("seq", DType::kFloat, Shape::unknown());
  add_node(g, "SplitToSequence", {x, split}, {seq}, "/split").attrs.set("axis", int64_t{2});
  std::vector<ValueId> picks;
  for (size_t i = 0; i < positions.size(); ++i) {
    ValueId p = g.add_value("pos" + std::to_string(i), DType::kInt64, Shape::of({}));
    add_node(g, "Constant", {}, {p}, "/pos" + std::to_string(i)).attrs.set("value", TensorData::from_int64s({positions[i]}, true));
    picks.push_back(g.add_value("item" + std::to_string(i), DType::kFloat, Shape::unknown()));
    add_node(g, "SequenceAt", {seq, p}, {picks.back()}, "/at" + std::to_string(i));
  }
  ValueId y = picks[0];
  for (size_t i = 1; i < picks.size(); ++i) {
    ValueId s = g.add_value("sum" + std::to_string(i), DType::kFloat, Shape::unknown());
    add_node(g, "Add", {y, picks[i]}, {s}, "/add" + std::to_string(i));
    y = s;
  }
  g.outputs = {y};
  return g;
}

const Node* find_op(const Graph& g, const std::string& op) {
  for (const Node& n : g.nodes)
    if (n.op_type == op) return &n;
  return nullptr;
}

TEST(SequenceToSplit, ScalarSplitBecomesOneSplitWhoseOutputsAreThePicks) {
  Graph g = qkv_graph({0, 1, -1});  // q, k, v with v picked as -1
  auto pass = make_sequence_to_split_pass();
  EXPECT_EQ(pass->name(), "sequence_to_split");
  ASSERT_TRUE(pass->run(g));
  verify(g);
  EXPECT_EQ(find_op(g, "SplitToSequence"), nullptr);
  EXPECT_EQ(find_op(g, "SequenceAt"), nullptr);
  const Node* split = find_op(g, "Split");
  ASSERT_NE(split, nullptr);
  EXPECT_EQ(split->attrs.get_int("axis", -1), 2);
  ASSERT_EQ(split->outputs.size(), 3u);
  EXPECT_EQ(g.initializers.at(split->inputs[1]).as_int64s(), (std::vector<int64_t>{32, 32, 32}));
  for (int k = 0; k < 3; ++k) EXPECT_EQ(g.value(split->outputs[k]).name, "item" + std::to_string(k));
  EXPECT_EQ(find_op(g, "Identity"), nullptr);
  EXPECT_FALSE(pass->run(g)) << "a second run changes nothing";
}

TEST(SequenceToSplit, UnevenSizesRepeatedAndUnusedPicks) {
  Graph g = qkv_graph({2, 2}, {}, 70);  // chunks 32, 32, 6; chunk 2 picked twice, 0 and 1 never
  ASSERT_TRUE(make_sequence_to_split_pass()->run(g));
  verify(g);
  const Node* split = find_op(g, "Split");
  ASSERT_NE(split, nullptr);
  EXPECT_EQ(g.initializers.at(split->inputs[1]).as_int64s(), (std::vector<int64_t>{32, 32, 6}));
  EXPECT_EQ(g.value(split->outputs[2]).name, "item0");
  EXPECT_EQ(g.value(split->outputs[0]).shape.dims[2].value, 32);
  const Node* id = find_op(g, "Identity");
  ASSERT_NE(id, nullptr) << "the second pick of chunk 2 reads the Split output through an Identity";
  EXPECT_EQ(id->inputs[0], split->outputs[2]);
  EXPECT_EQ(g.value(id->outputs[0]).name, "item1");
}

TEST(SequenceToSplit, ListedSizesAndKeepdimsZeroWithoutSplitSqueezes) {
  Graph g = qkv_graph({1}, {16, 80});
  ASSERT_TRUE(make_sequence_to_split_pass()->run(g));
  EXPECT_EQ(g.initializers.at(find_op(g, "Split")->inputs[1]).as_int64s(), (std::vector<int64_t>{16, 80}));

  // The same sizes from a Constant node whose output has no shape: still a list, not a scalar.
  Graph c = qkv_graph({1}, {16, 80});
  const ValueId split = *c.find("split");
  c.initializers.erase(split);
  c.value(split).shape = Shape::unknown();
  Node k{"", "Constant", "/sizes", {}, {split}, {}};
  k.attrs.set("value_ints", std::vector<int64_t>{16, 80});
  c.nodes.insert(c.nodes.begin(), k);
  ASSERT_TRUE(make_sequence_to_split_pass()->run(c));
  verify(c);
  EXPECT_EQ(c.initializers.at(find_op(c, "Split")->inputs[1]).as_int64s(), (std::vector<int64_t>{16, 80}));

  // No split input and keepdims=0: chunks of 1 with the axis dropped -> Split + Squeeze.
  Graph h = qkv_graph({0, 3}, {}, 4);
  Node& seq = h.nodes[0];
  ASSERT_EQ(seq.op_type, "SplitToSequence");
  seq.inputs.resize(1);
  seq.attrs.set("keepdims", int64_t{0});
  ASSERT_TRUE(make_sequence_to_split_pass()->run(h));
  verify(h);
  EXPECT_EQ(h.initializers.at(find_op(h, "Split")->inputs[1]).as_int64s(), (std::vector<int64_t>{1, 1, 1, 1}));
  int squeezes = 0;
  for (const Node& n : h.nodes) squeezes += n.op_type == "Squeeze";
  EXPECT_EQ(squeezes, 2);
}

TEST(SequenceToSplit, UnknownDimLowersToSlicesAndBadPositionsAreErrors) {
  // Unknown split dim with a scalar split: the piece count is not static -> one Slice per pick
  // (test_passes_sequence_slices.cc has the details).
  Graph unknown_dim = qkv_graph({0, 1}, {}, -1);
  ASSERT_TRUE(make_sequence_to_split_pass()->run(unknown_dim));
  verify(unknown_dim);
  EXPECT_EQ(find_op(unknown_dim, "SplitToSequence"), nullptr);
  EXPECT_NE(find_op(unknown_dim, "Slice"), nullptr);
  // A position out of range, and a position computed at run time: errors naming op and reader.
  Graph out_of_range = qkv_graph({0, 3});
  try {
    make_sequence_to_split_pass()->run(out_of_range);
    ADD_FAILURE() << "position 3 of 3 pieces lowered";
  } catch (const UnsupportedOpError& e) {
    EXPECT_NE(std::string(e.what()).find("'SplitToSequence' (node /split): SequenceAt (node /at1) reads "
                                         "position 3 of 3 pieces"), std::string::npos) << e.what();
  }
  Graph runtime_pos = qkv_graph({0, 1});
  ValueId p = runtime_pos.add_value("p", DType::kInt64, Shape::of({}));
  runtime_pos.inputs.push_back(p);
  for (Node& n : runtime_pos.nodes)
    if (n.op_type == "SequenceAt" && n.name == "/at1") n.inputs[1] = p;
  EXPECT_THROW(make_sequence_to_split_pass()->run(runtime_pos), UnsupportedOpError);
}

TEST(SequenceToSplit, PipelineRunsItBeforeDceWhichDropsThePositionConstants) {
  Graph g = qkv_graph({0, 1, 2});
  PipelineOptions opts;
  opts.verify_after_each = true;
  const std::vector<std::string> changed = run_pipeline(g, default_forward_pipeline(), opts);
  ASSERT_GE(changed.size(), 2u);
  EXPECT_EQ(changed.front(), "sequence_to_split");  // (constant_folding may also turn the
  EXPECT_EQ(changed.back(), "dce");                  //  position Constants into initializers)
  EXPECT_EQ(find_op(g, "Constant"), nullptr);
  EXPECT_EQ(g.nodes.size(), 3u);  // Split, Add, Add
}

// The ONNX side: a sequence-typed value_info (onnx shape inference writes one for the
// SplitToSequence output) imports as an untyped value, and the pipeline leaves no trace of it.
TEST(SequenceToSplit, ImportsSequenceValueInfoAndRewritesIt) {
  namespace pb = testmodels::pb;
  pb::ModelProto m;
  m.set_ir_version(10);
  m.add_opset_import()->set_version(20);
  pb::GraphProto* g = m.mutable_graph();
  pb::ValueInfoProto* x = g->add_input();
  testmodels::set_tensor_type(x, "x", pb::TensorProto_DataType_FLOAT);
  x->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(6);
  testmodels::set_tensor_type(g->add_output(), "y", pb::TensorProto_DataType_FLOAT);
  for (const char* name : {"two", "one"}) {
    pb::TensorProto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(pb::TensorProto_DataType_INT64);
    t->add_int64_data(name[0] == 't' ? 2 : 1);
  }
  pb::NodeProto* split = g->add_node();
  split->set_op_type("SplitToSequence");
  split->set_name("/split");
  split->add_input("x"), split->add_input("two"), split->add_output("seq");
  pb::NodeProto* at = g->add_node();
  at->set_op_type("SequenceAt");
  at->set_name("/at");
  at->add_input("seq"), at->add_input("one"), at->add_output("y");
  pb::ValueInfoProto* seq = g->add_value_info();
  seq->set_name("seq");
  seq->mutable_type()->mutable_sequence_type()->mutable_elem_type()->mutable_tensor_type()->set_elem_type(
      pb::TensorProto_DataType_FLOAT);

  Graph ir = import_onnx(m.SerializeAsString());
  infer_missing_dtypes(ir);
  verify(ir);
  PipelineOptions opts;
  opts.verify_after_each = true;
  run_pipeline(ir, default_forward_pipeline(), opts);
  ASSERT_EQ(ir.nodes.size(), 1u);
  EXPECT_EQ(ir.nodes[0].op_type, "Split");
  EXPECT_EQ(ir.nodes[0].outputs.size(), 3u);
  EXPECT_EQ(ir.value(ir.nodes[0].outputs[1]).name, "y");
}

}  // namespace
}  // namespace torch_ort
