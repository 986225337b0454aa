// Placement (csrc/core/planner/placement.h): shape arithmetic computes on the host, shape inputs
// are read there, and every crossing is an explicit ToHost/ToDevice node in the right phase.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "csrc/core/ir/aten_op.h"
#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/planner/placement.h"
#include "csrc/core/shapes/infer_shapes.h"

namespace torch_ort {
namespace {

Shape dims(std::vector<Dim> d) { return Shape::of(std::move(d)); }
const Dim kB = Dim::symbolic("batch");

ValueId i64s(Graph& g, const std::string& name, std::vector<int64_t> v) {
  const ValueId id = g.add_value(name, DType::kInt64, dims({Dim::known(static_cast<int64_t>(v.size()))}));
  g.initializers[id] = TensorData::from_int64s(v);
  return id;
}

Node node(const std::string& op, std::vector<ValueId> in, std::vector<ValueId> out, const std::string& name,
          Attributes a = {}) {
  return Node{"", op, name, std::move(in), std::move(out), std::move(a)};
}

int count_op(const Graph& g, const char* op) {
  return static_cast<int>(std::count_if(g.nodes.begin(), g.nodes.end(),
                                        [&](const Node& n) { return n.op_type == op; }));
}

const Node& only(const Graph& g, const std::string& op) {
  auto it = std::find_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return n.op_type == op; });
  EXPECT_NE(it, g.nodes.end()) << op;
  return *it;
}
NodeId index_of(const Graph& g, const std::string& op) {
  return static_cast<NodeId>(&only(g, op) - g.nodes.data());
}

// y = Reshape(x, Concat(Gather(Shape(x), 0), [-1])): the nanoGPT/GPT-2 pattern.
Graph flatten_by_shape() {
  Graph g;
  const ValueId x = g.add_value("x", DType::kFloat, dims({kB, Dim::known(3), Dim::known(4)}));
  const ValueId s = g.add_value("s", DType::kInt64, dims({Dim::known(3)}));
  const ValueId zero = g.add_value("zero", DType::kInt64, dims({}));
  g.initializers[zero] = TensorData::from_int64s({0}, /*scalar=*/true);
  const ValueId b = g.add_value("b", DType::kInt64, dims({}));
  const ValueId axes = i64s(g, "axes", {0});
  const ValueId b1 = g.add_value("b1", DType::kInt64, dims({Dim::known(1)}));
  const ValueId minus1 = i64s(g, "minus1", {-1});
  const ValueId shape = g.add_value("shape", DType::kInt64, dims({Dim::known(2)}));
  const ValueId y = g.add_value("y", DType::kFloat, dims({kB, Dim::known(12)}));
  g.inputs = {x};
  Attributes cat;
  cat.set("axis", int64_t{0});
  g.nodes = {node("Shape", {x}, {s}, "shape"), node("Gather", {s, zero}, {b}, "gather"),
             node("Unsqueeze", {b, axes}, {b1}, "unsqueeze"), node("Concat", {b1, minus1}, {shape}, "concat", cat),
             node("Reshape", {x, shape}, {y}, "reshape")};
  g.outputs = {y};
  return g;
}

TEST(Placement, ShapeArithmeticComputesOnTheHostWithoutTransfers) {
  Graph g = flatten_by_shape();
  const Placement p = place_host_values(g);
  verify(g);
  EXPECT_EQ(p.to_host, 0);
  EXPECT_EQ(p.to_device, 0);
  for (const char* op : {"Shape", "Gather", "Unsqueeze", "Concat"})
    EXPECT_TRUE(p.computes_on_host(index_of(g, op))) << op;
  EXPECT_FALSE(p.computes_on_host(index_of(g, "Reshape")));
  EXPECT_TRUE(p.on_host(only(g, "Reshape").inputs[1]));   // the shape Reshape reads
  EXPECT_FALSE(p.on_host(only(g, "Reshape").inputs[0]));  // the data it reshapes
  EXPECT_FALSE(p.on_host(g.outputs[0]));
  EXPECT_EQ(p.host_nodes, 4);
  for (ValueId c : {*g.find("zero"), *g.find("axes"), *g.find("minus1")}) EXPECT_TRUE(p.on_host(c));
}

TEST(Placement, ADeviceValueReadAsAShapeGetsOneToHost) {
  Graph g;
  const ValueId x = g.add_value("x", DType::kFloat, dims({kB, Dim::known(6)}));
  const ValueId s = g.add_value("s", DType::kInt64, dims({Dim::known(2)}));  // the caller's tensor
  const ValueId y = g.add_value("y", DType::kFloat, dims({Dim{}, Dim{}}));
  const ValueId z = g.add_value("z", DType::kFloat, dims({Dim{}, Dim{}}));
  g.inputs = {x, s};
  g.nodes = {node("Reshape", {x, s}, {y}, "r1"), node("Reshape", {y, s}, {z}, "r2")};
  g.outputs = {z};
  const Placement p = place_host_values(g);
  verify(g);
  ASSERT_EQ(p.to_host, 1);  // one read serves both readers of the phase
  ASSERT_EQ(g.nodes.size(), 3u);
  const Node& t = g.nodes[0];
  EXPECT_EQ(t.op_type, kToHost);
  EXPECT_EQ(t.domain, kOurDomain);
  EXPECT_EQ(t.inputs[0], s);
  EXPECT_TRUE(p.on_host(t.outputs[0]));
  EXPECT_EQ(g.nodes[1].inputs[1], t.outputs[0]);
  EXPECT_EQ(g.nodes[2].inputs[1], t.outputs[0]);
  EXPECT_FALSE(p.computes_on_host(0));  // the copy runs where the value is
}

TEST(Placement, AHostValueReadAsDataGetsOneCachedUpload) {
  // y = x * Cast(Size(x)): the count is a host scalar that Mul reads as data.
  Graph g;
  const ValueId x = g.add_value("x", DType::kFloat, dims({kB, Dim::known(4)}));
  const ValueId n = g.add_value("n", DType::kInt64, dims({}));
  const ValueId nf = g.add_value("nf", DType::kFloat, dims({}));
  const ValueId y = g.add_value("y", DType::kFloat, dims({kB, Dim::known(4)}));
  g.inputs = {x};
  Attributes to_float;
  to_float.set("to", static_cast<int64_t>(DType::kFloat));
  g.nodes = {node("Size", {x}, {n}, "size"), node("Cast", {n}, {nf}, "cast", to_float),
             node("Mul", {x, nf}, {y}, "mul")};
  g.outputs = {y};
  const Placement p = place_host_values(g);
  verify(g);
  EXPECT_EQ(p.to_host, 0);
  ASSERT_EQ(p.to_device, 1);
  EXPECT_TRUE(p.computes_on_host(index_of(g, "Cast")));
  const Node& up = only(g, kToDevice);
  EXPECT_EQ(up.inputs[0], nf);
  EXPECT_TRUE(p.is_upload(up.outputs[0]));
  EXPECT_FALSE(p.on_host(up.outputs[0]));
  EXPECT_EQ(only(g, "Mul").inputs[1], up.outputs[0]);
  EXPECT_LT(index_of(g, kToDevice), index_of(g, "Mul"));
}

TEST(Placement, AConstantReadOnBothSidesIsDuplicatedNotTransferred) {
  // c = [2, -1] is Reshape's shape (host) and an addend of int data (device).
  Graph g;
  const ValueId x = g.add_value("x", DType::kFloat, dims({kB, Dim::known(4)}));
  const ValueId k = g.add_value("k", DType::kInt64, dims({Dim::known(2)}));
  const ValueId c = i64s(g, "c", {2, -1});
  const ValueId y = g.add_value("y", DType::kFloat, dims({Dim::known(2), Dim{}}));
  const ValueId kc = g.add_value("kc", DType::kInt64, dims({Dim::known(2)}));
  g.inputs = {x, k};
  g.nodes = {node("Reshape", {x, c}, {y}, "reshape"), node("Add", {k, c}, {kc}, "add")};
  g.outputs = {y, kc};
  const Placement p = place_host_values(g);
  verify(g);
  EXPECT_EQ(p.to_host + p.to_device, 0);
  const ValueId host_c = only(g, "Reshape").inputs[1];
  EXPECT_NE(host_c, c);
  EXPECT_TRUE(p.on_host(host_c));
  EXPECT_EQ(only(g, "Add").inputs[1], c);
  EXPECT_FALSE(p.on_host(c));
  ASSERT_TRUE(g.initializers.count(host_c));
  EXPECT_EQ(g.initializers.at(host_c), g.initializers.at(c));
}

TEST(Placement, DataSizedResultsStayOnTheDeviceWithHostBounds) {
  // positions = Range(0, Gather(Shape(x), 1), 1): the bounds are host values, the positions
  // (as many as the sequence is long) are made on the device.
  Graph g;
  const ValueId x = g.add_value("x", DType::kInt64, dims({kB, Dim::symbolic("seq")}));
  const ValueId s = g.add_value("s", DType::kInt64, dims({Dim::known(2)}));
  const ValueId one = g.add_value("one", DType::kInt64, dims({}));
  g.initializers[one] = TensorData::from_int64s({1}, /*scalar=*/true);
  const ValueId zero = g.add_value("zero", DType::kInt64, dims({}));
  g.initializers[zero] = TensorData::from_int64s({0}, /*scalar=*/true);
  const ValueId t = g.add_value("t", DType::kInt64, dims({}));
  const ValueId pos = g.add_value("pos", DType::kInt64, dims({Dim::symbolic("seq")}));
  g.inputs = {x};
  g.nodes = {node("Shape", {x}, {s}, "shape"), node("Gather", {s, one}, {t}, "gather"),
             node("Range", {zero, t, one}, {pos}, "range")};
  g.outputs = {pos};
  const Placement p = place_host_values(g);
  verify(g);
  EXPECT_EQ(p.to_host + p.to_device, 0);
  EXPECT_FALSE(p.computes_on_host(index_of(g, "Range")));
  EXPECT_FALSE(p.on_host(pos));
  for (ValueId v : only(g, "Range").inputs) EXPECT_TRUE(p.on_host(v)) << g.value(v).name;
}

TEST(Placement, DropoutsRatioAndTrainingFlagAreHostConstants) {
  Graph g;
  const ValueId x = g.add_value("x", DType::kFloat, dims({kB, Dim::known(4)}));
  const ValueId ratio = g.add_value("ratio", DType::kFloat, dims({}));
  g.initializers[ratio] = TensorData::scalar_float(DType::kFloat, 0.1);
  const ValueId training = g.add_value("training", DType::kBool, dims({}));
  g.initializers[training] = TensorData{DType::kBool, {}, std::string(1, '\1')};
  const ValueId y = g.add_value("y", DType::kFloat, dims({kB, Dim::known(4)}));
  const ValueId mask = g.add_value("mask", DType::kBool, dims({kB, Dim::known(4)}));
  g.inputs = {x};
  g.nodes = {node("Dropout", {x, ratio, training}, {y, mask}, "dropout")};
  g.outputs = {y, mask};
  const Placement p = place_host_values(g);
  verify(g);
  EXPECT_EQ(p.to_host + p.to_device, 0);
  EXPECT_TRUE(p.on_host(ratio));
  EXPECT_TRUE(p.on_host(training));
  EXPECT_FALSE(p.on_host(y));
}

TEST(Placement, AHostGraphOutputEndsOnTheDevice) {
  Graph g;
  const ValueId x = g.add_value("x", DType::kFloat, dims({kB, Dim::known(4)}));
  const ValueId s = g.add_value("s", DType::kInt64, dims({Dim::known(2)}));
  g.inputs = {x};
  g.nodes = {node("Shape", {x}, {s}, "shape")};
  g.outputs = {s};
  const Placement p = place_host_values(g);
  verify(g);
  ASSERT_EQ(p.to_device, 1);
  EXPECT_EQ(g.nodes.back().op_type, kToDevice);
  EXPECT_EQ(g.outputs[0], g.nodes.back().outputs[0]);
  EXPECT_FALSE(p.on_host(g.outputs[0]));
}

TEST(Placement, TrainingGraphCrossingsStayInTheirPhase) {
  // y = Reshape(x, s) with s the caller's tensor: forward reads s once; backward reshapes dY back
  // with Shape(x), a host value, so it reads nothing.
  Graph f;
  const ValueId x = f.add_value("x", DType::kFloat, dims({Dim::known(2), Dim::known(6)}));
  const ValueId s = f.add_value("s", DType::kInt64, dims({Dim::known(2)}));
  const ValueId y = f.add_value("y", DType::kFloat, dims({Dim::known(3), Dim::known(4)}));
  const ValueId loss = f.add_value("loss", DType::kFloat, dims({}));
  f.inputs = {x, s};
  Attributes keep;
  keep.set("keepdims", int64_t{0});
  f.nodes = {node("Reshape", {x, s}, {y}, "reshape"), node("ReduceSum", {y}, {loss}, "sum", keep)};
  f.outputs = {loss};
  infer_shapes(f);
  TrainingGraph tg = build_training_graph(f, {true, false});
  const Placement p = place_host_values(tg.graph, &tg.input_grads);
  verify(as_exportable_graph(tg));
  const Graph& g = tg.graph;
  // Phases stay contiguous: every forward node before every backward node.
  const auto first_backward =
      std::find_if(g.nodes.begin(), g.nodes.end(), [](const Node& n) { return n.in_backward; });
  EXPECT_TRUE(std::none_of(first_backward, g.nodes.end(), [](const Node& n) { return !n.in_backward; }));
  EXPECT_EQ(p.to_host, 1);
  EXPECT_FALSE(only(g, kToHost).in_backward);
  for (const Node& n : g.nodes)
    if (n.in_backward)
      for (int i : host_inputs(n)) EXPECT_TRUE(p.on_host(n.inputs[i])) << n.describe() << " input " << i;
  ASSERT_NE(tg.input_grads[0], kNoValue);
  EXPECT_FALSE(p.on_host(tg.input_grads[0]));
}

TEST(Placement, HostInputsOfATenOpComeFromItsArgumentKinds) {
  Graph g;
  const ValueId a = g.add_value("a", DType::kFloat, dims({kB}));
  const ValueId b = g.add_value("b", DType::kInt64, dims({}));
  const ValueId c = g.add_value("c", DType::kInt64, dims({}));
  const ValueId y = g.add_value("y", DType::kFloat, dims({kB}));
  Attributes at;
  at.set("arg_kinds", std::vector<std::string>{"tensor", "item", "ints"});
  at.set("arg0", int64_t{0});
  at.set("arg1", int64_t{1});
  at.set("arg2", std::vector<int64_t>{4, 0});
  at.set("arg2_inputs", std::vector<int64_t>{-1, 2});
  const Node n{kOurDomain, kAtenOp, "aten", {a, b, c}, {y}, at};
  EXPECT_EQ(host_inputs(n), (std::vector<int>{1, 2}));
  Node slice = node("Slice", {a, b, c, b, c}, {y}, "slice");
  EXPECT_EQ(host_inputs(slice), (std::vector<int>{1, 2, 3, 4}));
  slice.inputs.resize(3);  // axes and steps omitted
  EXPECT_EQ(host_inputs(slice), (std::vector<int>{1, 2}));
  EXPECT_TRUE(host_inputs(node("Add", {a, a}, {y}, "add")).empty());
}

}  // namespace
}  // namespace torch_ort
