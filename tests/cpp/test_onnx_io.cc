// ONNX import/export tests: a hand-built IR round trip, and ModelProto bytes built in C++ through
// the generated classes (typed tensor fields, IR<4 inputs, symbolic dims), plus bad inputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/onnx_io.h"
#include "csrc/core/ir/verifier.h"
#include "ir_builders.h"
#include "onnx_test_models.h"

namespace torch_ort {
namespace {

using ::testing::HasSubstr;
using testing::add_node;
namespace pb = ::torch_ort_onnx;

TensorData floats(std::vector<int64_t> dims, const std::vector<float>& v) {
  TensorData t{DType::kFloat, std::move(dims), {}};
  t.raw.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return t;
}

// x[batch,4] -> Gemm -> Clip(min omitted) -> Reshape(Constant shape) -> com.torch_ort op -> out.
// Covers symbolic and unknown dims, an unknown rank, initializers of 5 dtypes and every attribute
// kind. Valid for onnx.checker (checked by hand: see the report of the IR work).
Graph sample_graph() {
  Graph g;
  g.name = "sample";
  const ValueId x = g.add_value("x", DType::kFloat, Shape::of({Dim::symbolic("batch"), Dim::known(4)}));
  const ValueId mask = g.add_value("mask", DType::kBool, Shape::of({Dim::symbolic("batch"), Dim{}}));
  g.inputs = {x, mask};
  auto init = [&](const std::string& name, TensorData d) {
    std::vector<Dim> dims;
    for (int64_t s : d.dims) dims.push_back(Dim::known(s));
    const ValueId v = g.add_value(name, d.dtype, Shape::of(dims));
    g.initializers[v] = std::move(d);
    return v;
  };
  const ValueId w = init("fc.weight", floats({3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  const ValueId b = init("fc.bias", floats({3}, {0.5f, -0.5f, 0.f}));
  const ValueId mx = init("clip_max", TensorData::scalar_float(DType::kFloat, 6.0));
  const ValueId half = init("half_scale", TensorData::scalar_float(DType::kFloat16, 0.25));
  const ValueId dbl = init("dbl", TensorData{DType::kDouble, {1}, std::string(8, '\0')});
  TensorData idx{DType::kInt32, {2}, {}};
  const int32_t idx_v[] = {0, 2};
  idx.raw.assign(reinterpret_cast<const char*>(idx_v), sizeof(idx_v));
  const ValueId i32 = init("idx", idx);

  const Shape bx3 = Shape::of({Dim::symbolic("batch"), Dim::known(3)});
  const ValueId h = g.add_value("h", DType::kFloat, bx3);
  Node& gemm = add_node(g, "Gemm", {x, w, b}, {h}, "/fc1/Gemm");
  gemm.attrs.set("alpha", 1.0f);
  gemm.attrs.set("transB", int64_t{1});
  const ValueId c = g.add_value("c", DType::kFloat, Shape::unknown());  // rank unknown
  add_node(g, "Clip", {h, kNoValue, mx}, {c}, "/clip");
  const ValueId shp = g.add_value("shape", DType::kInt64, Shape::of({Dim::known(2)}));
  add_node(g, "Constant", {}, {shp}, "/shape").attrs.set("value", TensorData::from_int64s({-1, 3}));
  // onnx.checker wants a shape (a rank) on graph inputs/outputs; dims may still be unknown.
  const ValueId r = g.add_value("r", DType::kFloat, Shape::of({Dim{}, Dim::known(3)}));
  add_node(g, "Reshape", {c, shp}, {r}, "/reshape");
  const ValueId out = g.add_value("out", DType::kFloat, bx3);
  Node& f = add_node(g, "FusedThing", {r, i32, half, dbl, mask}, {out}, "/fused", kOurDomain);
  f.attrs.set("mode", std::string("fast"));
  f.attrs.set("axes", std::vector<int64_t>{0, -1});
  f.attrs.set("scales", std::vector<float>{0.5f, 2.f});
  f.attrs.set("names", std::vector<std::string>{"a", "b"});
  f.attrs.set("eps", 1e-5f);
  g.outputs = {out, r};
  return g;
}

// Structural equality by value name (ids may differ after a round trip).
void expect_same_graph(const Graph& a, const Graph& b) {
  auto names = [](const Graph& g, const std::vector<ValueId>& ids) {
    std::vector<std::string> out;
    for (ValueId v : ids) out.push_back(v == kNoValue ? "<none>" : g.value(v).name);
    return out;
  };
  auto same_value = [&](ValueId va, ValueId vb) {
    const Value &x = a.value(va), &y = b.value(vb);
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype) << x.name;
    EXPECT_EQ(x.shape.rank_known, y.shape.rank_known) << x.name;
    EXPECT_EQ(x.shape.dims, y.shape.dims) << x.name << " " << x.shape.to_string() << " vs "
                                          << y.shape.to_string();
  };
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.opset_imports, b.opset_imports);
  EXPECT_EQ(names(a, a.inputs), names(b, b.inputs));
  EXPECT_EQ(names(a, a.outputs), names(b, b.outputs));
  ASSERT_EQ(a.initializers.size(), b.initializers.size());
  for (const auto& [va, data] : a.initializers) {
    const auto vb = b.find(a.value(va).name);
    ASSERT_TRUE(vb.has_value()) << a.value(va).name;
    ASSERT_TRUE(b.initializers.count(*vb)) << a.value(va).name;
    EXPECT_EQ(data, b.initializers.at(*vb)) << a.value(va).name;
    same_value(va, *vb);
  }
  ASSERT_EQ(a.nodes.size(), b.nodes.size());
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const Node &x = a.nodes[i], &y = b.nodes[i];
    EXPECT_EQ(x.describe(), y.describe());
    EXPECT_EQ(x.domain, y.domain);
    EXPECT_EQ(names(a, x.inputs), names(b, y.inputs)) << x.describe();
    EXPECT_EQ(names(a, x.outputs), names(b, y.outputs)) << x.describe();
    EXPECT_TRUE(x.attrs == y.attrs) << x.describe();
    for (size_t k = 0; k < x.outputs.size(); ++k) same_value(x.outputs[k], y.outputs[k]);
  }
  for (size_t k = 0; k < a.inputs.size(); ++k) same_value(a.inputs[k], b.inputs[k]);
}

TEST(OnnxIo, RoundTripKeepsStructure) {
  const Graph g = sample_graph();
  verify(g);
  const std::string bytes = export_onnx(g);
  const Graph back = import_onnx(bytes);
  verify(back);
  expect_same_graph(g, back);
  EXPECT_EQ(back.nodes[1].inputs[1], kNoValue);  // Clip's omitted min
  EXPECT_EQ(export_onnx(back), bytes);            // export is deterministic
}

TEST(OnnxIo, ExportWritesIrVersionOpsetsAndValueInfo) {
  pb::ModelProto m;
  ASSERT_TRUE(m.ParseFromString(export_onnx(sample_graph())));
  EXPECT_EQ(m.ir_version(), 10);
  std::map<std::string, int64_t> opsets;
  for (const auto& o : m.opset_import()) opsets[o.domain()] = o.version();
  EXPECT_EQ(opsets.at(""), 20);
  EXPECT_EQ(opsets.at(kOurDomain), 1);
  EXPECT_EQ(m.graph().input_size(), 2);  // initializers are not repeated as inputs (IR >= 4)
  EXPECT_EQ(m.graph().initializer_size(), 6);
  for (const auto& t : m.graph().initializer()) EXPECT_TRUE(t.has_raw_data()) << t.name();
  std::set<std::string> vi;
  for (const auto& v : m.graph().value_info()) vi.insert(v.name());
  EXPECT_EQ(vi, (std::set<std::string>{"h", "c", "shape"}));  // outputs are typed in graph.output
  const auto& x = m.graph().input(0).type().tensor_type();
  EXPECT_EQ(x.shape().dim(0).dim_param(), "batch");
  EXPECT_EQ(x.shape().dim(1).dim_value(), 4);
  const auto& mask_dim = m.graph().input(1).type().tensor_type().shape().dim(1);
  EXPECT_FALSE(mask_dim.has_dim_value() || mask_dim.has_dim_param());
}

TEST(OnnxIo, ExportAddsOpsetForEveryUsedDomain) {
  Graph g;
  g.opset_imports = {{"", 18}};
  const ValueId x = testing::fvalue(g, "x"), y = testing::fvalue(g, "y");
  g.inputs = {x};
  g.outputs = {y};
  add_node(g, "Mine", {x}, {y}, "n", "org.example");
  const Graph back = import_onnx(export_onnx(g));
  EXPECT_EQ(back.opset_imports, (std::map<std::string, int64_t>{{"", 18}, {"org.example", 1}}));
}

TEST(OnnxIo, ImportsTypedFieldsAndIrV3Inputs) {
  const Graph g = import_onnx(testmodels::typed_fields_model().SerializeAsString());
  verify(g);
  EXPECT_EQ(g.opset_imports, (std::map<std::string, int64_t>{{"", 13}}));  // "ai.onnx" -> ""
  ASSERT_EQ(g.inputs.size(), 1u);  // "w" is listed as input AND initializer: a constant
  const Value& x = g.value(g.inputs[0]);
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.shape.dims, (std::vector<Dim>{Dim::symbolic("N"), Dim::known(2), Dim{}}));
  auto data = [&](const std::string& n) { return g.initializers.at(*g.find(n)); };
  EXPECT_EQ(data("w").as_doubles(), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(data("shape").as_int64s(), (std::vector<int64_t>{-1, 4}));
  EXPECT_EQ(data("i32").as_int64s(), (std::vector<int64_t>{7, -8}));
  EXPECT_EQ(data("d").as_doubles(), (std::vector<double>{0.25}));
  EXPECT_EQ(data("h").as_doubles(), (std::vector<double>{1.0, -2.0}));  // float16 in int32_data
  EXPECT_EQ(data("u8").as_doubles(), (std::vector<double>{0, 255}));
  EXPECT_EQ(g.value(*g.find("w")).shape.dims, (std::vector<Dim>{Dim::known(2), Dim::known(2)}));
  ASSERT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.nodes[1].inputs, (std::vector<ValueId>{*g.find("y"), kNoValue, kNoValue}));
  EXPECT_EQ(g.value(*g.find("y")).shape.to_string(), "[N,2]");  // from value_info
  EXPECT_FALSE(g.value(*g.find("z")).shape.rank_known);         // output without a shape
  EXPECT_EQ(g.nodes[0].attrs.get_int("legacy", 0), 3);          // untyped attribute: inferred
}

TEST(OnnxIo, ImportSortsNodesListedOutOfOrder) {
  pb::ModelProto m = testmodels::typed_fields_model();
  m.mutable_graph()->mutable_node()->SwapElements(0, 1);
  const Graph g = import_onnx(m.SerializeAsString());
  EXPECT_EQ(g.nodes[0].op_type, "MatMul");
  verify(g);
}

// --- bad input: each error names the problem.
std::string import_error(const std::string& bytes) {
  try {
    import_onnx(bytes);
  } catch (const OnnxImportError& e) {
    return e.what();
  }
  ADD_FAILURE() << "import_onnx did not throw";
  return "";
}

std::string import_error(const pb::ModelProto& m) { return import_error(m.SerializeAsString()); }

TEST(OnnxIoErrors, MalformedBytes) {
  EXPECT_THAT(import_error("garbage"), HasSubstr("not a valid ONNX ModelProto"));
  const std::string bytes = export_onnx(sample_graph());
  EXPECT_THAT(import_error(bytes.substr(0, bytes.size() / 2)), HasSubstr("not a valid ONNX ModelProto"));
  EXPECT_THAT(import_error(""), HasSubstr("no graph"));
}

TEST(OnnxIoErrors, NodeReadsUndefinedValue) {
  pb::ModelProto m = testmodels::typed_fields_model();
  m.mutable_graph()->mutable_node(0)->set_input(1, "nowhere");
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("/mm"));
  EXPECT_THAT(e, HasSubstr("'nowhere'"));
}

TEST(OnnxIoErrors, GraphAttributeIsRejectedNamingNodeAndAttribute) {
  pb::ModelProto m = testmodels::typed_fields_model();
  pb::AttributeProto* a = m.mutable_graph()->mutable_node(1)->add_attribute();
  a->set_name("then_branch");
  a->set_type(pb::AttributeProto_AttributeType_GRAPH);
  a->mutable_g()->set_name("sub");
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("/clip"));
  EXPECT_THAT(e, HasSubstr("'then_branch'"));
  EXPECT_THAT(e, HasSubstr("GRAPH"));
}

TEST(OnnxIoErrors, ExternalDataAndBadSizes) {
  pb::ModelProto m = testmodels::typed_fields_model();
  pb::TensorProto* w = m.mutable_graph()->mutable_initializer(0);
  w->set_data_location(pb::TensorProto_DataLocation_EXTERNAL);
  EXPECT_THAT(import_error(m), HasSubstr("initializer 'w' stores its data externally"));
  w->set_data_location(pb::TensorProto_DataLocation_DEFAULT);
  w->add_float_data(5.f);  // 5 values for a [2,2] tensor
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("initializer 'w'"));
  EXPECT_THAT(e, HasSubstr("5 values in float_data, expected 4"));
}

TEST(OnnxIoErrors, ModelLocalFunctions) {
  pb::ModelProto m = testmodels::typed_fields_model();
  m.add_functions()->set_name("MyGelu");
  EXPECT_THAT(import_error(m), HasSubstr("model-local functions are not supported"));
}

TEST(OnnxIoErrors, UndefinedGraphOutputAndDoubleDefinition) {
  pb::ModelProto m = testmodels::typed_fields_model();
  m.mutable_graph()->mutable_output(0)->set_name("ghost");
  EXPECT_THAT(import_error(m), HasSubstr("graph output 'ghost'"));
  m = testmodels::typed_fields_model();
  m.mutable_graph()->mutable_node(1)->set_output(0, "y");
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("/clip"));
  EXPECT_THAT(e, HasSubstr("'y'"));
}

TEST(OnnxIoErrors, CycleIsReported) {
  pb::ModelProto m = testmodels::typed_fields_model();
  m.mutable_graph()->mutable_node(0)->set_input(0, "z");  // MatMul reads Clip's output
  EXPECT_THAT(import_error(m), HasSubstr("cycle"));
}

}  // namespace
}  // namespace torch_ort
