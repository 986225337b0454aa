// constant_folding and cse: structure of tiny hand-written graphs after each pass (what folds or
// merges, what must not), the verifier after every run, and a second run that changes nothing.
#include <cmath>

#include <gtest/gtest.h>

#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "tests/cpp/ir_builders.h"

namespace torch_ort {
namespace {

using testing::add_node;

ValueId ints(Graph& g, const std::string& name, std::vector<int64_t> v) {
  ValueId id = g.add_value(name, DType::kInt64, Shape::of({Dim::known(int64_t(v.size()))}));
  g.initializers[id] = TensorData::from_int64s(v);
  return id;
}

ValueId out(Graph& g, const std::string& name, DType t = DType::kFloat) { return g.add_value(name, t, Shape::unknown()); }

int count(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes) n += node.op_type == op;
  return n;
}

// Runs `pass` (expecting `changes`), verifies, and checks that a second run changes nothing.
void run_twice(Pass& pass, Graph& g, bool changes = true) {
  EXPECT_EQ(pass.run(g), changes) << pass.name();
  verify(g);
  EXPECT_FALSE(pass.run(g)) << pass.name() << ": a second run changes nothing";
  verify(g);
}

// nanoGPT's attention scale: 1 / sqrt(Shape(q)[-1]) cast like q, q (B, 4, T, 32) -> y = q * scale.
Graph attention_scale_graph(Dim head_dim) {
  Graph g;
  ValueId q = g.add_value("q", DType::kFloat, Shape::of({Dim::symbolic("B"), Dim::known(4), Dim::symbolic("T"), head_dim}));
  g.inputs = {q};
  ValueId shape = g.add_value("shape", DType::kInt64, Shape::of({Dim::known(4)}));
  add_node(g, "Shape", {q}, {shape}, "/Shape");
  ValueId last = out(g, "last", DType::kInt64);
  add_node(g, "Gather", {shape, ints(g, "minus1", {-1})}, {last}, "/Gather").attrs.set("axis", int64_t{0});
  ValueId lastf = out(g, "lastf");
  add_node(g, "CastLike", {last, q}, {lastf}, "/CastLike");
  ValueId one = out(g, "one");
  add_node(g, "Constant", {}, {one}, "/one").attrs.set("value_float", 1.0f);
  ValueId root = out(g, "root");
  add_node(g, "Sqrt", {lastf}, {root}, "/Sqrt");
  ValueId scale = out(g, "scale");
  add_node(g, "Div", {one, root}, {scale}, "/Div");
  ValueId y = out(g, "y");
  add_node(g, "Mul", {q, scale}, {y}, "/Mul");
  g.outputs = {y};
  return g;
}

TEST(ConstantFolding, AttentionScaleOfAKnownHeadDimFoldsToOneInitializer) {
  Graph g = attention_scale_graph(Dim::known(32));
  auto pass = make_constant_folding_pass();
  EXPECT_EQ(pass->name(), "constant_folding");
  run_twice(*pass, g);
  // Only the Mul by the activation remains; the Shape is dead for dce (its Gather folded).
  EXPECT_EQ(count(g, "Mul"), 1);
  for (const char* op : {"Constant", "Gather", "CastLike", "Sqrt", "Div"}) EXPECT_EQ(count(g, op), 0) << op;
  const Node& mul = g.nodes.back();
  ASSERT_TRUE(g.initializers.count(mul.inputs[1]));
  const TensorData& s = g.initializers.at(mul.inputs[1]);
  EXPECT_EQ(s.dtype, DType::kFloat);
  EXPECT_EQ(s.dims, std::vector<int64_t>{1});
  EXPECT_FLOAT_EQ(static_cast<float>(s.as_doubles()[0]), 1.0f / std::sqrt(32.0f));
}

TEST(ConstantFolding, SymbolicDimPickedFromAShapeStays) {
  Graph g = attention_scale_graph(Dim::symbolic("D"));
  auto pass = make_constant_folding_pass();
  run_twice(*pass, g);  // only the Constant becomes an initializer
  EXPECT_EQ(count(g, "Constant"), 0);
  for (const char* op : {"Shape", "Gather", "CastLike", "Sqrt", "Div", "Mul"}) EXPECT_EQ(count(g, op), 1) << op;
}

TEST(ConstantFolding, SliceOfKnownDimsFoldsWhileOtherDimsAreSymbolic) {
  Graph g;
  ValueId x = g.add_value("x", DType::kFloat, Shape::of({Dim::symbolic("B"), Dim::known(4), Dim::known(32)}));
  g.inputs = {x};
  ValueId shape = g.add_value("shape", DType::kInt64, Shape::of({Dim::known(3)}));
  add_node(g, "Shape", {x}, {shape}, "/Shape");
  ValueId tail = out(g, "tail", DType::kInt64);
  add_node(g, "Slice", {shape, ints(g, "s", {1}), ints(g, "e", {INT64_MAX})}, {tail}, "/Slice");
  ValueId head = out(g, "head", DType::kInt64);
  add_node(g, "Slice", {shape, ints(g, "s0", {0}), ints(g, "e0", {1})}, {head}, "/SliceB");
  ValueId cat = out(g, "cat", DType::kInt64);
  add_node(g, "Concat", {ints(g, "m1", {-1}), tail}, {cat}, "/Concat").attrs.set("axis", int64_t{0});
  ValueId y = out(g, "y");
  add_node(g, "Reshape", {x, cat}, {y}, "/Reshape");
  ValueId b = out(g, "b", DType::kInt64);
  add_node(g, "Identity", {head}, {b}, "/Identity");
  g.outputs = {y, b};
  auto pass = make_constant_folding_pass();
  run_twice(*pass, g);
  // [4, 32] and then [-1, 4, 32] fold; the slice of the symbolic batch dim (and its reader) stay.
  EXPECT_EQ(count(g, "Concat"), 0);
  EXPECT_EQ(count(g, "Slice"), 1);
  EXPECT_EQ(count(g, "Identity"), 1);
  const Node* reshape = &g.nodes.back();
  for (const Node& n : g.nodes)
    if (n.op_type == "Reshape") reshape = &n;
  ASSERT_TRUE(g.initializers.count(reshape->inputs[1]));
  EXPECT_EQ(g.initializers.at(reshape->inputs[1]).as_int64s(), (std::vector<int64_t>{-1, 4, 32}));
}

TEST(ConstantFolding, ArithmeticCastAndShapeOpsOnConstants) {
  Graph g;
  ValueId x = g.add_value("x", DType::kInt64, Shape::of({Dim::symbolic("n")}));
  g.inputs = {x};
  ValueId a = ints(g, "a", {6, 4}), b = ints(g, "b", {2});
  ValueId q = out(g, "q", DType::kInt64), m = out(g, "m", DType::kInt64), s = out(g, "s", DType::kInt64);
  add_node(g, "Div", {a, b}, {q}, "/Div");
  add_node(g, "Mul", {q, b}, {m}, "/Mul");
  add_node(g, "Sub", {m, b}, {s}, "/Sub");  // [4, 2]
  ValueId u = out(g, "u", DType::kInt64), sq = out(g, "sq", DType::kInt64), r = out(g, "r", DType::kInt64);
  add_node(g, "Unsqueeze", {s, ints(g, "ax0", {0})}, {u}, "/Unsqueeze");  // (1, 2)
  add_node(g, "Squeeze", {u, ints(g, "ax0b", {0})}, {sq}, "/Squeeze");    // (2)
  add_node(g, "Reshape", {sq, ints(g, "shape", {2, 1})}, {r}, "/Reshape");  // (2, 1)
  ValueId f = out(g, "f"), y = out(g, "y", DType::kInt64);
  add_node(g, "Cast", {r}, {f}, "/Cast").attrs.set("to", int64_t{1});
  ValueId c = out(g, "c", DType::kInt64);
  add_node(g, "Cast", {f}, {c}, "/CastBack").attrs.set("to", int64_t{7});
  ValueId z = out(g, "z", DType::kInt64);
  add_node(g, "Add", {x, c}, {z}, "/AddInput");  // reads the graph input: stays
  add_node(g, "Identity", {z}, {y}, "/Out");
  g.outputs = {y};
  auto pass = make_constant_folding_pass();
  run_twice(*pass, g);
  ASSERT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.nodes[0].op_type, "Add");
  const TensorData& folded = g.initializers.at(g.nodes[0].inputs[1]);
  EXPECT_EQ(folded.dims, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(folded.as_int64s(), (std::vector<int64_t>{4, 2}));
}

TEST(ConstantFolding, ExpandOfAConstantScalarFoldsAndItsCastToo) {
  // Hugging Face's attention mask: new_ones = Cast(Expand(1, [])) to bool, And-ed with a mask.
  Graph g;
  ValueId m = g.add_value("mask", DType::kBool, Shape::of({Dim::symbolic("T"), Dim::known(1)}));
  g.inputs = {m};
  ValueId one = g.add_value("one", DType::kInt64, Shape::of({}));
  g.initializers[one] = TensorData::from_int64s({1}, true);
  ValueId e = out(g, "e", DType::kInt64), b = out(g, "b", DType::kBool), y = out(g, "y", DType::kBool);
  add_node(g, "Expand", {one, ints(g, "shape", {2, 1})}, {e}, "/Expand");
  add_node(g, "Cast", {e}, {b}, "/Cast").attrs.set("to", int64_t{9});
  add_node(g, "And", {b, m}, {y}, "/And");
  g.outputs = {y};
  auto pass = make_constant_folding_pass();
  run_twice(*pass, g);
  ASSERT_EQ(g.nodes.size(), 1u);
  const TensorData& folded = g.initializers.at(g.nodes[0].inputs[0]);
  EXPECT_EQ(folded.dtype, DType::kBool);
  EXPECT_EQ(folded.dims, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(folded.raw, std::string("\x01\x01", 2));
}

TEST(ConstantFolding, NothingReadingAParameterOrGraphInputFolds) {
  Graph g;
  ValueId w = g.add_value("weight", DType::kFloat, Shape::of({Dim::known(2)}));  // a parameter: an input
  g.inputs = {w};
  ValueId root = out(g, "root"), y = out(g, "y");
  add_node(g, "Sqrt", {w}, {root}, "/Sqrt");
  add_node(g, "Identity", {root}, {y}, "/Identity");
  g.outputs = {y};
  auto pass = make_constant_folding_pass();
  run_twice(*pass, g, /*changes=*/false);
  EXPECT_EQ(g.nodes.size(), 2u);
  EXPECT_TRUE(g.initializers.empty());
}

TEST(ConstantFolding, LargeResultsAreNotBakedIn) {
  Graph g;
  ValueId x = g.add_value("x", DType::kFloat, Shape::of({Dim::known(1)}));
  g.inputs = {x};
  ValueId big = g.add_value("big", DType::kFloat, Shape::of({Dim::known(4096)}));
  TensorData t;
  t.dtype = DType::kFloat;
  t.dims = {4096};
  t.raw.assign(4096 * sizeof(float), '\0');
  g.initializers[big] = t;
  ValueId doubled = out(g, "doubled"), y = out(g, "y");
  add_node(g, "Add", {big, big}, {doubled}, "/Add");
  add_node(g, "Mul", {doubled, x}, {y}, "/Mul");
  g.outputs = {y};
  auto pass = make_constant_folding_pass();
  run_twice(*pass, g, /*changes=*/false);
  EXPECT_EQ(count(g, "Add"), 1);
}

// --- cse

TEST(Cse, DuplicateShapeArithmeticMergesAcrossEqualConstants) {
  Graph g;
  ValueId x = g.add_value("x", DType::kFloat, Shape::of({Dim::symbolic("B"), Dim::known(8)}));
  ValueId n = g.add_value("n", DType::kInt64, Shape::of({}));
  g.inputs = {x, n};
  std::vector<ValueId> ys;
  for (int layer = 0; layer < 3; ++layer) {  // each layer has its own copy of the [-1] constant
    const std::string l = std::to_string(layer);
    ValueId r = out(g, "r" + l, DType::kInt64), y = out(g, "y" + l), s = out(g, "s" + l);
    add_node(g, "Reshape", {n, ints(g, "minus1_" + l, {-1})}, {r}, "/Reshape" + l);
    add_node(g, "Concat", {r, ints(g, "eight_" + l, {8})}, {s}, "/Concat" + l).attrs.set("axis", int64_t{0});
    add_node(g, "Reshape", {x, s}, {y}, "/View" + l);
    ys.push_back(y);
  }
  ValueId sum = out(g, "sum");
  add_node(g, "Sum", ys, {sum}, "/Sum");
  g.outputs = {sum};
  auto pass = make_cse_pass();
  EXPECT_EQ(pass->name(), "cse");
  run_twice(*pass, g);
  EXPECT_EQ(count(g, "Reshape"), 2) << "one shape computation and one view remain";
  EXPECT_EQ(count(g, "Concat"), 1);
  EXPECT_EQ(g.initializers.size(), 2u) << "the equal constants collapsed to one each";
  const Node& s = g.nodes.back();
  ASSERT_EQ(s.op_type, "Sum");
  EXPECT_EQ(s.inputs[0], s.inputs[1]);
  EXPECT_EQ(s.inputs[1], s.inputs[2]);
}

TEST(Cse, CommutativeOperandsMergeButDifferentAttributesDoNot) {
  Graph g;
  ValueId a = testing::fvalue(g, "a"), b = testing::fvalue(g, "b");
  g.inputs = {a, b};
  ValueId s1 = out(g, "s1"), s2 = out(g, "s2"), t1 = out(g, "t1"), t2 = out(g, "t2"), d1 = out(g, "d1"), d2 = out(g, "d2");
  add_node(g, "Add", {a, b}, {s1}, "/add1");
  add_node(g, "Add", {b, a}, {s2}, "/add2");  // commutes: same value
  add_node(g, "Sub", {a, b}, {d1}, "/sub1");
  add_node(g, "Sub", {b, a}, {d2}, "/sub2");  // does not commute
  add_node(g, "Softmax", {s1}, {t1}, "/sm1").attrs.set("axis", int64_t{0});
  add_node(g, "Softmax", {s2}, {t2}, "/sm2").attrs.set("axis", int64_t{1});  // another axis
  ValueId y = out(g, "y");
  add_node(g, "Sum", {t1, t2, d1, d2}, {y}, "/sum");
  g.outputs = {y};
  auto pass = make_cse_pass();
  run_twice(*pass, g);
  EXPECT_EQ(count(g, "Add"), 1);
  EXPECT_EQ(count(g, "Sub"), 2);
  EXPECT_EQ(count(g, "Softmax"), 2);
}

TEST(Cse, RandomAndOpaqueOpsAndGraphOutputsAreNeverMerged) {
  Graph g;
  ValueId x = testing::fvalue(g, "x");
  ValueId ratio = g.add_value("ratio", DType::kFloat, Shape::of({}));
  g.initializers[ratio] = TensorData::scalar_float(DType::kFloat, 0.1);
  ValueId train = g.add_value("train", DType::kBool, Shape::of({}));
  g.inputs = {x, train};
  std::vector<ValueId> outs;
  for (int i = 0; i < 2; ++i) {
    ValueId d = out(g, "drop" + std::to_string(i)), p = out(g, "py" + std::to_string(i)), r = out(g, "rnd" + std::to_string(i));
    add_node(g, "Dropout", {x, ratio, train}, {d}, "/dropout" + std::to_string(i));
    add_node(g, "PythonOp", {x}, {p}, "/python" + std::to_string(i), kOurDomain).attrs.set("func_name", std::string("F"));
    add_node(g, "RandomNormalLike", {x}, {r}, "/randn" + std::to_string(i));
    outs.insert(outs.end(), {d, p, r});
  }
  ValueId e1 = out(g, "e1"), e2 = out(g, "e2");  // equal, but both are graph outputs
  add_node(g, "Exp", {x}, {e1}, "/exp1");
  add_node(g, "Exp", {x}, {e2}, "/exp2");
  g.outputs = outs;
  g.outputs.push_back(e1);
  g.outputs.push_back(e2);
  auto pass = make_cse_pass();
  run_twice(*pass, g, /*changes=*/false);
  EXPECT_EQ(g.nodes.size(), 8u);
}

// "Random" is the op's trait (ops/random.cc), not a name pattern: BiasDropout draws and is kept
// twice; DropoutGrad replays the mask it is given, so two equal ones are one.
TEST(Cse, RandomIsATraitNotANamePattern) {
  Graph g;
  ValueId x = testing::fvalue(g, "x"), dy = testing::fvalue(g, "dy");
  ValueId mask = g.add_value("mask", DType::kBool, g.value(x).shape);
  ValueId train = g.add_value("train", DType::kBool, Shape::of({}));
  g.inputs = {x, dy, mask, train};
  ValueId b1 = out(g, "b1"), b2 = out(g, "b2"), g1 = out(g, "g1"), g2 = out(g, "g2"), y = out(g, "y");
  add_node(g, "BiasDropout", {x, kNoValue, kNoValue, kNoValue, train}, {b1}, "/bd1", kOurDomain);
  add_node(g, "BiasDropout", {x, kNoValue, kNoValue, kNoValue, train}, {b2}, "/bd2", kOurDomain);
  add_node(g, "DropoutGrad", {dy, mask, kNoValue, train}, {g1}, "/dg1", kOurDomain);
  add_node(g, "DropoutGrad", {dy, mask, kNoValue, train}, {g2}, "/dg2", kOurDomain);
  add_node(g, "Sum", {b1, b2, g1, g2}, {y}, "/sum");
  g.outputs = {y};
  auto pass = make_cse_pass();
  run_twice(*pass, g);
  EXPECT_EQ(count(g, "BiasDropout"), 2);
  EXPECT_EQ(count(g, "DropoutGrad"), 1);
}

TEST(Cse, TrainingGraphKeepsTheEarlierNodeAndItsPhase) {
  // Forward Transpose(w) and a backward copy of it: the backward reader now reads the forward one.
  Graph g;
  ValueId w = g.add_value("w", DType::kFloat, Shape::of({Dim::known(3), Dim::known(4)}));
  ValueId dy = g.add_value("dy", DType::kFloat, Shape::of({Dim::known(2), Dim::known(3)}));
  g.inputs = {w, dy};
  ValueId t1 = out(g, "t1"), t2 = out(g, "t2"), dx = out(g, "dx");
  add_node(g, "Transpose", {w}, {t1}, "/fwd/T").attrs.set("perm", std::vector<int64_t>{1, 0});
  add_node(g, "Transpose", {w}, {t2}, "/bwd/T").attrs.set("perm", std::vector<int64_t>{1, 0});
  g.nodes.back().in_backward = true;
  add_node(g, "MatMul", {dy, t2}, {dx}, "/bwd/MatMul").in_backward = true;
  g.outputs = {t1, dx};
  auto pass = make_cse_pass();
  run_twice(*pass, g);
  ASSERT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.nodes[0].name, "/fwd/T");
  EXPECT_FALSE(g.nodes[0].in_backward);
  EXPECT_EQ(g.nodes[1].inputs[1], t1);
  EXPECT_TRUE(g.nodes[1].in_backward);
}

}  // namespace
}  // namespace torch_ort
