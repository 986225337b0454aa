// sequence_to_split along a dynamic dim: each SequenceAt becomes Slice(x, start, end, [axis])
// (+ Squeeze for keepdims=0). Structure of tiny hand-written graphs, what the lowered graph and its
// gradient compute at two sizes of the dynamic dim (reference evaluator), and the errors for what
// cannot be lowered.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "tests/cpp/ir_builders.h"
#include "tests/cpp/reference_eval.h"

namespace torch_ort {
namespace {

using testing::add_node;
using ::testing::HasSubstr;

enum class SplitBy { kNothing, kConstant, kChunkOfShape };  // no split / scalar constant / ceil(T / k)

// x (2, T, 4), T symbolic -> SplitToSequence(x, split?, axis=1) -> one SequenceAt per position,
// each pick a graph output. `size`: the constant piece size, or the chunk count k.
struct Spec {
  SplitBy split;
  int64_t size;
  std::vector<int64_t> positions;
  int64_t keepdims = 1;
};

ValueId int64s(Graph& g, const std::string& name, std::vector<int64_t> v, bool scalar) {
  ValueId id = g.add_value(name, DType::kInt64, scalar ? Shape::of({}) : Shape::of({Dim::known(int64_t(v.size()))}));
  g.initializers[id] = TensorData::from_int64s(v, scalar);
  return id;
}

Graph dynamic_graph(const Spec& s) {
  Graph g;
  ValueId x = g.add_value("x", DType::kFloat, Shape::of({Dim::known(2), Dim::symbolic("T"), Dim::known(4)}));
  g.inputs = {x};
  std::vector<ValueId> ins{x};
  if (s.split == SplitBy::kConstant) ins.push_back(int64s(g, "split", {s.size}, true));
  if (s.split == SplitBy::kChunkOfShape) {  // the exporter's x.chunk(k, 1): (T + k - 1) / k
    ValueId t1 = g.add_value("t1", DType::kInt64, Shape::of({Dim::known(1)}));
    Node& shape = add_node(g, "Shape", {x}, {t1}, "/shape");
    shape.attrs.set("start", int64_t{1});
    shape.attrs.set("end", int64_t{2});
    ValueId t = g.add_value("t", DType::kInt64, Shape::of({}));
    add_node(g, "Squeeze", {t1}, {t}, "/squeeze");
    ValueId sum = g.add_value("t_plus", DType::kInt64, Shape::of({}));
    add_node(g, "Add", {t, int64s(g, "k_minus_1", {s.size - 1}, true)}, {sum}, "/add");
    ins.push_back(g.add_value("split", DType::kInt64, Shape::of({})));
    add_node(g, "Div", {sum, int64s(g, "k", {s.size}, true)}, {ins.back()}, "/div");
  }
  ValueId seq = g.add_value("seq", DType::kFloat, Shape::unknown());
  Node& split = add_node(g, "SplitToSequence", ins, {seq}, "/split");
  split.attrs.set("axis", int64_t{1});
  if (s.keepdims != 1) split.attrs.set("keepdims", s.keepdims);
  for (size_t i = 0; i < s.positions.size(); ++i) {
    ValueId item = g.add_value("item" + std::to_string(i), DType::kFloat, Shape::unknown());
    add_node(g, "SequenceAt", {seq, int64s(g, "pos" + std::to_string(i), {s.positions[i]}, true)}, {item},
             "/at" + std::to_string(i));
    g.outputs.push_back(item);
  }
  return g;
}

int count_op(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes) n += node.op_type == op;
  return n;
}

const Node& producer_of(const Graph& g, ValueId v) {
  for (const Node& n : g.nodes)
    for (ValueId o : n.outputs)
      if (o == v) return n;
  throw std::runtime_error("no producer of '" + g.value(v).name + "'");
}

// The constant behind v (an initializer), or {} when a node computes it.
std::vector<int64_t> init(const Graph& g, ValueId v) {
  auto it = g.initializers.find(v);
  return it == g.initializers.end() ? std::vector<int64_t>{} : it->second.as_int64s();
}

Graph lowered(const Spec& s) {
  Graph g = dynamic_graph(s);
  auto pass = make_sequence_to_split_pass();
  EXPECT_TRUE(pass->run(g));
  verify(g);
  EXPECT_EQ(count_op(g, "SplitToSequence") + count_op(g, "SequenceAt"), 0);
  EXPECT_FALSE(pass->run(g)) << "a second run changes nothing";
  return g;
}

TEST(SequenceToSlices, ConstantSizeAlongADynamicDim) {  // torch.split(x, 3, dim=1), pieces 0, 1, -1
  const Graph g = lowered({SplitBy::kConstant, 3, {0, 1, -1}});
  EXPECT_EQ(count_op(g, "Slice"), 3);
  EXPECT_EQ(count_op(g, "Split"), 0);
  const Node& first = producer_of(g, g.outputs[0]);
  ASSERT_EQ(first.op_type, "Slice");
  EXPECT_EQ(first.inputs[0], *g.find("x"));
  EXPECT_EQ(init(g, first.inputs[1]), std::vector<int64_t>{0});
  EXPECT_EQ(init(g, first.inputs[2]), std::vector<int64_t>{3});
  EXPECT_EQ(init(g, first.inputs[3]), std::vector<int64_t>{1});  // axes
  const Node& second = producer_of(g, g.outputs[1]);
  EXPECT_EQ(init(g, second.inputs[1]), std::vector<int64_t>{3});
  EXPECT_EQ(init(g, second.inputs[2]), std::vector<int64_t>{6});
  // The last piece starts at (ceil(T / 3) - 1) * 3: T from the input's shape, clamped at 0.
  const Node& last = producer_of(g, g.outputs[2]);
  EXPECT_EQ(producer_of(g, last.inputs[1]).op_type, "Max");
  EXPECT_EQ(producer_of(g, last.inputs[2]).op_type, "Max");
  ASSERT_EQ(count_op(g, "Shape"), 1);
  EXPECT_EQ(count_op(g, "Div"), 1);
  for (const Node& n : g.nodes) {
    if (n.op_type != "Shape") continue;
    EXPECT_EQ(n.inputs[0], *g.find("x"));
    EXPECT_EQ(n.attrs.get_int("start", -1), 1);
    EXPECT_EQ(n.attrs.get_int("end", -1), 2);
  }
  EXPECT_EQ(g.value(g.outputs[0]).shape.rank(), 3) << "a pick without a shape gets x's rank";
}

TEST(SequenceToSlices, ChunkSizeComputedFromTheShape) {  // x.chunk(2, dim=1): size (T + 1) / 2
  const Graph g = lowered({SplitBy::kChunkOfShape, 2, {0, 1}});
  EXPECT_EQ(count_op(g, "Slice"), 2);
  EXPECT_EQ(count_op(g, "Shape"), 1) << "only the exporter's: no negative position needs T";
  // Piece 0 is [0, s), piece 1 [s, s·2): s is the scalar size as a [1] for Slice.
  const Node& first = producer_of(g, g.outputs[0]);
  EXPECT_EQ(init(g, first.inputs[1]), std::vector<int64_t>{0});
  const Node& size = producer_of(g, first.inputs[2]);
  EXPECT_EQ(size.op_type, "Reshape");
  EXPECT_EQ(size.inputs[0], *g.find("split"));
  const Node& second = producer_of(g, g.outputs[1]);
  EXPECT_EQ(second.inputs[1], first.inputs[2]);
  const Node& end = producer_of(g, second.inputs[2]);
  ASSERT_EQ(end.op_type, "Mul");
  EXPECT_EQ(end.inputs[0], first.inputs[2]);
  EXPECT_EQ(init(g, end.inputs[1]), std::vector<int64_t>{2});
}

TEST(SequenceToSlices, KeepdimsZeroWithoutSplitSlicesOneAndSqueezes) {  // x.unbind(1)[0], [-1], [-2]
  const Graph g = lowered({SplitBy::kNothing, 0, {0, -1, -2}, 0});
  EXPECT_EQ(count_op(g, "Slice"), 3);
  EXPECT_EQ(count_op(g, "Squeeze"), 3);
  EXPECT_EQ(count_op(g, "Shape") + count_op(g, "Max"), 0) << "pieces of 1: Slice counts from the end itself";
  const std::vector<std::vector<int64_t>> want = {
      {0, 1}, {-1, std::numeric_limits<int64_t>::max()}, {-2, -1}};
  for (size_t i = 0; i < 3; ++i) {
    const Node& squeeze = producer_of(g, g.outputs[i]);
    ASSERT_EQ(squeeze.op_type, "Squeeze");
    EXPECT_EQ(init(g, squeeze.inputs[1]), std::vector<int64_t>{1});
    const Node& slice = producer_of(g, squeeze.inputs[0]);
    EXPECT_EQ(init(g, slice.inputs[1]), std::vector<int64_t>{want[i][0]});
    EXPECT_EQ(init(g, slice.inputs[2]), std::vector<int64_t>{want[i][1]});
    EXPECT_EQ(g.value(g.outputs[i]).shape.rank(), 2);
  }
}

// x = 0, 1, 2, ... of shape (2, T, 4): pieces as torch.split/chunk/unbind cut them, with the
// number of pieces counting negative positions from the end.
ref::Tensor iota(int64_t t) {
  ref::Tensor x{DType::kFloat, {2, t, 4}, {}, {}};
  for (int64_t i = 0; i < 2 * t * 4; ++i) x.reals.push_back(double(i));
  return x;
}
ref::Tensor expected_piece(const Spec& s, int64_t t, int64_t pos) {
  const int64_t size = s.split == SplitBy::kNothing ? 1 : s.split == SplitBy::kConstant ? s.size : (t + s.size - 1) / s.size;
  const int64_t n = (t + size - 1) / size, k = pos < 0 ? pos + n : pos;
  const int64_t lo = k * size, hi = std::min(t, lo + size);
  ref::Tensor y{DType::kFloat, {2, hi - lo, 4}, {}, {}};
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = lo; j < hi; ++j)
      for (int64_t c = 0; c < 4; ++c) y.reals.push_back(double((b * t + j) * 4 + c));
  if (s.split == SplitBy::kNothing && s.keepdims == 0) y.shape = {2, 4};
  return y;
}

TEST(SequenceToSlices, PiecesAndGradientAtTwoSizesOfTheDynamicDim) {
  const std::vector<Spec> specs = {{SplitBy::kConstant, 3, {0, 2, -1, -2}},
                                   {SplitBy::kChunkOfShape, 3, {-1, 0, 1}},
                                   {SplitBy::kChunkOfShape, 2, {1, -2}},
                                   {SplitBy::kNothing, 0, {0, -1, 2}, 0},
                                   {SplitBy::kNothing, 0, {-3, 1}, 1}};
  for (size_t si = 0; si < specs.size(); ++si) {
    const Spec& s = specs[si];
    Graph g = dynamic_graph(s);
    PipelineOptions opts;
    opts.verify_after_each = true;
    run_pipeline(g, default_forward_pipeline(), opts);
    const TrainingGraph tg = build_training_graph(g, {true});
    verify(as_exportable_graph(tg));
    ASSERT_NE(tg.input_grads[0], kNoValue);
    for (int64_t t : {7, 8}) {  // ragged last pieces at both sizes, and different piece sizes
      SCOPED_TRACE("spec " + std::to_string(si) + ", T = " + std::to_string(t));
      std::map<ValueId, ref::Tensor> feeds{{g.inputs[0], iota(t)}};
      std::vector<double> dx(2 * t * 4, 0.0);  // each dY = 1: dx counts the picks covering x
      for (size_t i = 0; i < s.positions.size(); ++i) {
        ref::Tensor want = expected_piece(s, t, s.positions[i]);
        const std::vector<double> ones(want.reals.size(), 1.0);
        feeds[tg.grad_of_outputs[i]] = ref::Tensor::of_reals(DType::kFloat, want.shape, ones);
        for (double v : want.reals) dx[static_cast<size_t>(v)] += 1.0;
      }
      const auto env = ref::evaluate(tg.graph, feeds);
      for (size_t i = 0; i < s.positions.size(); ++i) {
        const ref::Tensor want = expected_piece(s, t, s.positions[i]);
        EXPECT_EQ(env.at(g.outputs[i]).shape, want.shape) << "position " << s.positions[i];
        EXPECT_EQ(env.at(g.outputs[i]).reals, want.reals) << "position " << s.positions[i];
      }
      EXPECT_EQ(env.at(tg.input_grads[0]).reals, dx);
    }
  }
}

// The message of the error the pass throws on g, or "" (a test failure) when it throws none.
std::string lowering_error(Graph g) {
  try {
    make_sequence_to_split_pass()->run(g);
  } catch (const UnsupportedOpError& e) {
    return e.what();
  }
  ADD_FAILURE() << "the pass lowered a graph it cannot lower";
  return "";
}

TEST(SequenceToSlices, WhatCannotBeLoweredIsAnErrorNamingTheOpAndWhy) {
  Graph other_reader = dynamic_graph({SplitBy::kConstant, 3, {0}});
  ValueId cat = other_reader.add_value("cat", DType::kFloat, Shape::unknown());
  add_node(other_reader, "ConcatFromSequence", {*other_reader.find("seq")}, {cat}, "/cat").attrs.set("axis", int64_t{1});
  other_reader.outputs.push_back(cat);
  EXPECT_THAT(lowering_error(other_reader),
              HasSubstr("'SplitToSequence' (node /split): its sequence 'seq' is read by ConcatFromSequence (node /cat)"));

  Graph runtime_position = dynamic_graph({SplitBy::kChunkOfShape, 2, {0, 1}});
  ValueId p = runtime_position.add_value("p", DType::kInt64, Shape::of({}));
  runtime_position.inputs.push_back(p);
  for (Node& n : runtime_position.nodes)
    if (n.name == "/at1") n.inputs[1] = p;
  EXPECT_THAT(lowering_error(runtime_position),
              HasSubstr("(node /split): SequenceAt (node /at1) reads its sequence at a position computed at run time"));

  Graph sequence_output = dynamic_graph({SplitBy::kNothing, 0, {0}});
  sequence_output.outputs.push_back(*sequence_output.find("seq"));
  EXPECT_THAT(lowering_error(sequence_output), HasSubstr("its sequence 'seq' is a graph output"));

  Graph zero_size = dynamic_graph({SplitBy::kConstant, 0, {0}});
  EXPECT_THAT(lowering_error(zero_size), HasSubstr("holds the piece size 0"));

  Graph runtime_list = dynamic_graph({SplitBy::kChunkOfShape, 2, {0}});
  runtime_list.value(*runtime_list.find("split")).shape = Shape::of({Dim::symbolic("n")});
  EXPECT_THAT(lowering_error(runtime_list), HasSubstr("has a length known only at run time"));
}

TEST(SequenceToSlices, AnUnreadSequenceGoes) {
  Graph g = dynamic_graph({SplitBy::kConstant, 3, {}});
  g.outputs = {*g.find("x")};
  ASSERT_TRUE(make_sequence_to_split_pass()->run(g));
  verify(g);
  EXPECT_TRUE(g.nodes.empty());
}

}  // namespace
}  // namespace torch_ort
