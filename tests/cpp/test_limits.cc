// Limits on model input (csrc/core/ir/limits.h) and overflow-checked shape arithmetic: one test
// per limit and per overflow path, each building a small hostile model or graph and asserting the
// error type and that the message names the limit (or that the arithmetic did not wrap).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <cstdint>
#include <string>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/limits.h"
#include "csrc/core/ir/onnx_io.h"
#include "csrc/core/ir/onnx_prescan.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/planner/memory.h"
#include "csrc/core/shapes/sym_dim.h"
#include "onnx_test_models.h"
#include "shape_builders.h"

namespace torch_ort {
namespace {

using ::testing::HasSubstr;
using testing::A;
using testing::C;
using testing::GraphBuilder;
using testing::infer1;
using testing::T;
namespace pb = ::torch_ort_onnx;

// --- Hostile ModelProtos -------------------------------------------------------------------------

// y = Identity(x), x: float [2]. Valid; each test spoils one thing.
pb::ModelProto tiny_model() {
  pb::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  pb::GraphProto* g = m.mutable_graph();
  g->set_name("tiny");
  pb::ValueInfoProto* x = g->add_input();
  testmodels::set_tensor_type(x, "x", pb::TensorProto_DataType_FLOAT);
  x->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(2);
  pb::NodeProto* n = g->add_node();
  n->set_name("/id");
  n->set_op_type("Identity");
  n->add_input("x");
  n->add_output("y");
  testmodels::set_tensor_type(g->add_output(), "y", pb::TensorProto_DataType_FLOAT);
  return m;
}

std::string import_error(std::string_view bytes) {
  try {
    import_onnx(bytes);
  } catch (const OnnxImportError& e) {
    return e.what();
  }
  ADD_FAILURE() << "import_onnx accepted the model";
  return {};
}
std::string import_error(const pb::ModelProto& m) { return import_error(m.SerializeAsString()); }

// Wire format by hand: a huge repeated field costs bytes here, not a builder loop. A repeated
// embedded message that appears again is merged by the parser, so appending
// `field(7, <graph fields>)` to a serialized model adds to its graph.
std::string varint(uint64_t v) {
  std::string out;
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
  out.push_back(static_cast<char>(v));
  return out;
}
std::string field(int number, const std::string& payload) {
  return varint((static_cast<uint64_t>(number) << 3) | 2) + varint(payload.size()) + payload;
}
std::string repeated_empty(int number, int64_t count) {
  const std::string one = field(number, "");
  std::string out;
  out.reserve(one.size() * static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out += one;
  return out;
}
constexpr int kModelGraph = 7, kGraphNode = 1, kGraphValueInfo = 13, kNodeOutput = 2;

TEST(LimitsImport, ModelBytes) {
  // A view claiming one byte more than the limit over a small buffer: the size check must come
  // before any byte is read (without it, the parser would read past the buffer).
  const std::string small = tiny_model().SerializeAsString();
  const std::string e =
      import_error(std::string_view(small.data(), static_cast<size_t>(limits::kMaxModelBytes) + 1));
  EXPECT_THAT(e, HasSubstr("kMaxModelBytes"));
  EXPECT_THAT(e, HasSubstr(std::to_string(limits::kMaxModelBytes + 1)));
}


TEST(LimitsImport, NodeCount) {
  const std::string bytes = tiny_model().SerializeAsString() +
                            field(kModelGraph, repeated_empty(kGraphNode, limits::kMaxNodes + 1));
  const std::string e = import_error(bytes);
  EXPECT_THAT(e, HasSubstr("kMaxNodes"));
  EXPECT_THAT(e, HasSubstr(std::to_string(limits::kMaxNodes + 2)));  // the tiny model's one too
}

// --- The wire scan (csrc/core/ir/onnx_prescan.cc): counts taken before the parser allocates -----

// Peak resident memory of this process so far, in bytes. A test that asserts its own delta stays
// small can fail only if it would lift the peak: each hostile case below would, by far more than
// every test before it (the largest parse an earlier test leaves to protobuf is ~0.5 GB).
int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux: KiB
}
constexpr int64_t kScanMemorySlack = 100 << 20;

TEST(LimitsWireScan, ManyEmptyNodesAreRefusedBeforeParsing) {
  // 5M empty NodeProtos: 10 MB of bytes, ~1 GB once parsed.
  const std::string bytes = tiny_model().SerializeAsString() +
                            field(kModelGraph, repeated_empty(kGraphNode, 5'000'000));
  const int64_t before = peak_rss_bytes();
  const auto start = std::chrono::steady_clock::now();
  const std::string e = import_error(bytes);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(e, HasSubstr("5000001, over the limit kMaxNodes"));
  EXPECT_LT(peak_rss_bytes() - before, kScanMemorySlack);
  RecordProperty("seconds", std::to_string(seconds));
}

TEST(LimitsWireScan, TruncatedAfterManyNodesIsRefusedBeforeParsing) {
  // Under kMaxNodes but cut off inside the last field: the parser would build every node first.
  std::string bytes = tiny_model().SerializeAsString() +
                      field(kModelGraph, repeated_empty(kGraphNode, 900'000) + field(kGraphNode, "xy"));
  bytes.resize(bytes.size() - 1);
  const int64_t before = peak_rss_bytes();
  const std::string e = import_error(bytes);
  EXPECT_THAT(e, HasSubstr("failed to parse"));
  EXPECT_THAT(e, HasSubstr("length past the end"));
  EXPECT_LT(peak_rss_bytes() - before, kScanMemorySlack);
}

TEST(LimitsWireScan, ManyEmptyAttributesBreakParsedBytes) {
  // One node with more empty AttributeProtos than fit in kMaxParsedBytes once parsed (about
  // 21M with protobuf 35's 216-byte class): 2 bytes each on the wire, over 4 GB parsed.
  const int64_t count = limits::kMaxParsedBytes / static_cast<int64_t>(sizeof(pb::AttributeProto)) + (1 << 20);
  const std::string node = field(4, "Identity") + repeated_empty(5, count);
  const std::string bytes = tiny_model().SerializeAsString() + field(kModelGraph, field(kGraphNode, node));
  const int64_t before = peak_rss_bytes();
  const std::string e = import_error(bytes);
  EXPECT_THAT(e, HasSubstr("kMaxParsedBytes"));
  EXPECT_LT(peak_rss_bytes() - before, kScanMemorySlack);
}

TEST(LimitsWireScan, PackedIntsCountAsParsedMemory) {
  // A packed int64 list costs 8 bytes per 1-byte element once parsed (twice that while it grows).
  const std::string ints = field(8, std::string(size_t{1} << 20, '\x01'));  // AttributeProto.ints
  const std::string bytes = tiny_model().SerializeAsString() +
                            field(kModelGraph, field(kGraphNode, field(5, ints)));
  EXPECT_GE(prescan_model(bytes).parsed_bytes, int64_t{8} << 20);
}

TEST(LimitsWireScan, DeepNestingIsRefused) {
  // Subgraph attributes inside each other: AttributeProto.g -> GraphProto.node -> NodeProto.attribute.
  std::string graph;
  for (int i = 0; i < 200; ++i) graph = field(kGraphNode, field(5, field(6, graph)));
  const std::string e = import_error(tiny_model().SerializeAsString() + field(kModelGraph, graph));
  EXPECT_THAT(e, HasSubstr("nests messages more than 100 deep"));
  // Sequence types inside each other, in a graph input's type: TypeProto.sequence_type.elem_type.
  std::string type;
  for (int i = 0; i < 2000; ++i) type = field(4, field(1, type));
  const std::string input = field(1, "seq") + field(2, type);  // ValueInfoProto
  const std::string e2 =
      import_error(tiny_model().SerializeAsString() + field(kModelGraph, field(11, input)));
  EXPECT_THAT(e2, HasSubstr("nests messages more than 100 deep"));
}

TEST(LimitsWireScan, RealModelsPassAndTheEstimateIsClose) {
  // The estimate is of the same order as what parsing builds: for 100k empty nodes, their sizes.
  const std::string bytes = tiny_model().SerializeAsString() +
                            field(kModelGraph, repeated_empty(kGraphNode, 100'000));
  const WireScan scan = prescan_model(bytes);
  EXPECT_EQ(scan.graph_nodes, 100'001);
  EXPECT_GE(scan.parsed_bytes, 100'000 * static_cast<int64_t>(sizeof(pb::NodeProto)));
  EXPECT_LT(scan.parsed_bytes, 100'000 * 2 * static_cast<int64_t>(sizeof(pb::NodeProto)));
  EXPECT_NO_THROW(import_onnx(tiny_model().SerializeAsString()));
}

// The scan refuses exactly what protobuf's parser refuses (so it never costs a model that would
// load), over mutants of the fuzz seeds: flipped bytes, cuts, and inserted fields of any number
// and wire type (groups and mismatched wire types included).
TEST(LimitsWireScan, AgreesWithTheParserOnMutatedSeeds) {
  namespace fs = std::filesystem;
  std::mt19937 rng(20261123);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  int mutants = 0, refused = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(TORCH_ORT_SOURCE_DIR) / "tests/fuzz/corpus")) {
    std::ifstream f(entry.path(), std::ios::binary);
    const std::string seed((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (seed.empty()) continue;
    for (int i = 0; i < 1000; ++i, ++mutants) {
      std::string b = seed;
      for (int k = 1 + static_cast<int>(pick(3)); k > 0; --k) {
        const size_t at = pick(b.size() + 1);
        switch (pick(4)) {
          case 0: if (at < b.size()) b[at] = static_cast<char>(rng()); break;
          case 1: b.resize(at); break;
          case 2: b.insert(at, varint((uint64_t{1} + pick(40)) << 3 | pick(8)) + varint(pick(300))); break;
          default: b.insert(at, b.substr(pick(b.size() + 1), pick(16))); break;
        }
      }
      bool scan_ok = true;
      try {
        prescan_model(b);
      } catch (const OnnxImportError&) {
        scan_ok = false;
      }
      pb::ModelProto m;
      const bool parse_ok = m.ParseFromArray(b.data(), static_cast<int>(b.size()));
      refused += !scan_ok;
      ASSERT_EQ(scan_ok, parse_ok) << entry.path().filename() << " mutant " << i;
    }
  }
  EXPECT_GT(refused, mutants / 10);  // the mutations do reach the malformed paths
}

TEST(LimitsImport, ValueInfoCount) {
  const std::string bytes = tiny_model().SerializeAsString() +
                            field(kModelGraph, repeated_empty(kGraphValueInfo, limits::kMaxValues + 1));
  const std::string e = import_error(bytes);
  EXPECT_THAT(e, HasSubstr("kMaxValues"));
  EXPECT_THAT(e, HasSubstr("value_info entries"));
}

TEST(LimitsImport, NodeOutputsCountAsValues) {
  // One node with more outputs than the graph may have values: refused before any is created.
  const std::string node = field(3, "/wide") + field(4, "Split") +
                           repeated_empty(kNodeOutput, limits::kMaxValues + 1);
  const std::string bytes = tiny_model().SerializeAsString() + field(kModelGraph, field(kGraphNode, node));
  const std::string e = import_error(bytes);
  EXPECT_THAT(e, HasSubstr("kMaxValues"));
  EXPECT_THAT(e, HasSubstr("/wide"));
}

pb::TensorShapeProto* input_shape(pb::ModelProto& m) {
  return m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
}

TEST(LimitsImport, ValueRank) {
  pb::ModelProto m = tiny_model();
  for (int i = 0; i < limits::kMaxRank; ++i) input_shape(m)->add_dim()->set_dim_value(1);  // 65 in all
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("value 'x' has rank 65"));
  EXPECT_THAT(e, HasSubstr("kMaxRank"));
}

TEST(LimitsImport, ValueDim) {
  pb::ModelProto m = tiny_model();
  input_shape(m)->mutable_dim(0)->set_dim_value(limits::kMaxDim + 1);
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("value 'x'"));
  EXPECT_THAT(e, HasSubstr("kMaxDim"));
}

TEST(LimitsImport, ValueElementCount) {
  pb::ModelProto m = tiny_model();
  input_shape(m)->mutable_dim(0)->set_dim_value(int64_t{1} << 30);
  input_shape(m)->add_dim()->set_dim_param("batch");  // symbolic dims are not counted
  input_shape(m)->add_dim()->set_dim_value(int64_t{1} << 30);
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("value 'x'"));
  EXPECT_THAT(e, HasSubstr("kMaxElements"));
}

TEST(LimitsImport, ValueElementCountOverflowingInt64) {
  pb::ModelProto m = tiny_model();
  for (int i = 0; i < 3; ++i) input_shape(m)->add_dim()->set_dim_value(int64_t{1} << 40);  // 2^121
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("kMaxElements"));
}

TEST(LimitsImport, SymbolBytes) {
  // Deeply nested parentheses (the dim parser recurses on them): over kMaxSymbolBytes the dim is
  // unknown and never parsed, and the model still imports; at the limit it stays a symbol.
  pb::ModelProto m = tiny_model();
  input_shape(m)->mutable_dim(0)->set_dim_param(std::string(limits::kMaxSymbolBytes / 2 + 1, '(') +
                                                std::string(limits::kMaxSymbolBytes / 2 + 1, ')'));
  input_shape(m)->add_dim()->set_dim_param(std::string(limits::kMaxSymbolBytes, 's'));
  const Graph g = import_onnx(m.SerializeAsString());
  const Shape& x = g.value(g.inputs.at(0)).shape;
  ASSERT_EQ(x.dims.size(), 2u);
  EXPECT_FALSE(x.dims[0].is_known());
  EXPECT_FALSE(x.dims[0].is_symbolic());
  EXPECT_TRUE(x.dims[1].is_symbolic());
}

pb::TensorProto* add_initializer(pb::ModelProto& m, const char* name, int32_t dtype) {
  pb::TensorProto* t = m.mutable_graph()->add_initializer();
  t->set_name(name);
  t->set_data_type(dtype);
  return t;
}

TEST(LimitsImport, InitializerRank) {
  pb::ModelProto m = tiny_model();
  pb::TensorProto* t = add_initializer(m, "w", pb::TensorProto_DataType_FLOAT);
  for (int i = 0; i <= limits::kMaxRank; ++i) t->add_dims(1);
  t->add_float_data(1.f);
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("initializer 'w' has rank 65"));
  EXPECT_THAT(e, HasSubstr("kMaxRank"));
}

TEST(LimitsImport, InitializerDimsWhoseProductWraps) {
  // 2^32 x 2^32 wraps to 0 in int64: an empty raw_data would have "matched".
  pb::ModelProto m = tiny_model();
  pb::TensorProto* t = add_initializer(m, "w", pb::TensorProto_DataType_FLOAT);
  t->add_dims(int64_t{1} << 32), t->add_dims(int64_t{1} << 32);
  t->set_raw_data("");
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("initializer 'w'"));
  EXPECT_THAT(e, HasSubstr("kMaxElements"));
}

TEST(LimitsImport, InitializerDim) {
  pb::ModelProto m = tiny_model();
  pb::TensorProto* t = add_initializer(m, "w", pb::TensorProto_DataType_FLOAT);
  t->add_dims(0), t->add_dims(limits::kMaxDim + 1);  // no data needed: 0 elements
  t->set_raw_data("");
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("initializer 'w'"));
  EXPECT_THAT(e, HasSubstr("kMaxDim"));
}

TEST(LimitsImport, ConstantBytes) {
  // Declared 2^28 + 1 int64 (2 GiB + 8 bytes): refused by the dims, before any data is read or packed.
  pb::ModelProto m = tiny_model();
  pb::TensorProto* t = add_initializer(m, "big", pb::TensorProto_DataType_INT64);
  t->add_dims((int64_t{1} << 28) + 1);
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("initializer 'big' holds 2147483656 bytes"));
  EXPECT_THAT(e, HasSubstr("kMaxConstantBytes"));
}

TEST(LimitsImport, RawDataLength) {
  pb::ModelProto m = tiny_model();
  pb::TensorProto* t = add_initializer(m, "w", pb::TensorProto_DataType_FLOAT);
  t->add_dims(2);
  t->set_raw_data(std::string(7, '\0'));
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("initializer 'w' has 7 bytes of raw_data, expected 8 for float32 [2]"));
}

TEST(LimitsImport, TypedFieldCount) {
  pb::ModelProto m = tiny_model();
  pb::TensorProto* t = add_initializer(m, "w", pb::TensorProto_DataType_INT64);
  t->add_dims(2);
  for (int i = 0; i < 3; ++i) t->add_int64_data(i);
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("initializer 'w' has 3 values in int64_data, expected 2 for int64 [2]"));
}

TEST(LimitsImport, RawDataAndTypedField) {
  pb::ModelProto m = tiny_model();
  pb::TensorProto* t = add_initializer(m, "w", pb::TensorProto_DataType_FLOAT);
  t->add_dims(1);
  t->set_raw_data(std::string(4, '\0'));
  t->add_float_data(1.f);
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("initializer 'w' has both raw_data and 1 values in float_data"));
}

pb::AttributeProto* add_attribute(pb::ModelProto& m, const char* name, pb::AttributeProto_AttributeType type) {
  pb::AttributeProto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
  a->set_name(name);
  a->set_type(type);
  return a;
}

TEST(LimitsImport, AttributeListLength) {
  pb::ModelProto m = tiny_model();
  pb::AttributeProto* a = add_attribute(m, "value_ints", pb::AttributeProto_AttributeType_INTS);
  a->mutable_ints()->Resize(static_cast<int>(limits::kMaxAttributeElements + 1), 0);
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("attribute 'value_ints' of node Identity (node /id)"));
  EXPECT_THAT(e, HasSubstr("kMaxAttributeElements"));
}

TEST(LimitsImport, PerAxisAttributeLength) {
  pb::ModelProto m = tiny_model();
  m.mutable_graph()->mutable_node(0)->set_op_type("Transpose");
  pb::AttributeProto* a = add_attribute(m, "perm", pb::AttributeProto_AttributeType_INTS);
  for (int64_t i = 0; i <= limits::kMaxShapeAttributeElements; ++i) a->add_ints(i);
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("attribute 'perm' of node Transpose (node /id)"));
  EXPECT_THAT(e, HasSubstr("kMaxShapeAttributeElements"));
  // Outside the ONNX domain the name means nothing standard: only the general list limit applies.
  m.mutable_graph()->mutable_node(0)->set_domain("com.example");
  EXPECT_NO_THROW(import_onnx(m.SerializeAsString()));
}

TEST(LimitsImport, AttributeStringBytes) {
  pb::ModelProto m = tiny_model();
  pb::AttributeProto* a = add_attribute(m, "mode", pb::AttributeProto_AttributeType_STRING);
  a->set_s(std::string(limits::kMaxAttributeStringBytes + 1, 'x'));
  std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("attribute 'mode'"));
  EXPECT_THAT(e, HasSubstr("kMaxAttributeStringBytes"));
  a->set_type(pb::AttributeProto_AttributeType_STRINGS);  // one entry of a strings list
  a->add_strings(a->s());
  a->clear_s();
  e = import_error(m);
  EXPECT_THAT(e, HasSubstr("kMaxAttributeStringBytes"));
}

TEST(LimitsImport, TensorAttributeDims) {
  // A Constant's tensor value is held to the same limits as an initializer.
  pb::ModelProto m = tiny_model();
  pb::AttributeProto* a = add_attribute(m, "value", pb::AttributeProto_AttributeType_TENSOR);
  a->mutable_t()->set_data_type(pb::TensorProto_DataType_FLOAT);
  a->mutable_t()->add_dims(int64_t{1} << 32), a->mutable_t()->add_dims(int64_t{1} << 32);
  const std::string e = import_error(m);
  EXPECT_THAT(e, HasSubstr("attribute 'value' of node Identity (node /id)"));
  EXPECT_THAT(e, HasSubstr("kMaxElements"));
}

TEST(LimitsImport, WithinTheLimitsStillLoads) {
  pb::ModelProto m = tiny_model();
  input_shape(m)->mutable_dim(0)->set_dim_value(limits::kMaxDim);  // at the limit: fine
  for (int i = 1; i < limits::kMaxRank; ++i) input_shape(m)->add_dim()->set_dim_value(1);
  EXPECT_NO_THROW(verify(import_onnx(m.SerializeAsString())));
}

// --- Shape inference: shapes computed from constants are held to the same limits -----------------

std::string infer_error(const std::string& op, const std::vector<testing::In>& ins, Attributes attrs = {}) {
  try {
    infer1(op, ins, std::move(attrs));
  } catch (const VerifyError& e) {
    return e.what();
  }
  ADD_FAILURE() << op << ": shape inference accepted it";
  return {};
}

TEST(LimitsShapes, ExpandToTooManyElements) {
  const std::string e = infer_error("Expand", {T("[1]"), C({int64_t{1} << 40, int64_t{1} << 40})});
  EXPECT_THAT(e, HasSubstr("Expand"));
  EXPECT_THAT(e, HasSubstr("kMaxElements"));
}

TEST(LimitsShapes, ConstantOfShapeDim) {
  const std::string e = infer_error("ConstantOfShape", {C({limits::kMaxDim + 1})});
  EXPECT_THAT(e, HasSubstr("ConstantOfShape"));
  EXPECT_THAT(e, HasSubstr("kMaxDim"));
}

TEST(LimitsShapes, ShapeVectorLengthIsARank) {
  // A shape input of static length 10^6: the output's rank, bounded before it sizes anything.
  const std::string e = infer_error("ConstantOfShape", {T("[1000000]", DType::kInt64)});
  EXPECT_THAT(e, HasSubstr("kMaxRank"));
}

TEST(LimitsShapes, RangeLength) {
  const std::string e =
      infer_error("Range", {C({0}, true), C({int64_t{1} << 50}, true), C({1}, true)});
  EXPECT_THAT(e, HasSubstr("Range"));
  EXPECT_THAT(e, HasSubstr("kMaxDim"));
}

TEST(LimitsShapes, TileElements) {
  const std::string e = infer_error("Tile", {T("[16777216,16777216]"), C({int64_t{1} << 20, int64_t{1} << 20})});
  EXPECT_THAT(e, HasSubstr("kMaxElements"));
}

TEST(LimitsShapes, ReshapeTargetWhoseProductWraps) {
  // (2^62+1)·4 wraps to 4 in int64, which would "divide" 8 elements; the target's dim is too big.
  const std::string e =
      infer_error("Reshape", {T("[8]"), C({(int64_t{1} << 62) + 1, 4, -1})});
  EXPECT_THAT(e, HasSubstr("Reshape"));
  EXPECT_THAT(e, HasSubstr("kMaxDim"));
}

// --- Shape arithmetic overflow: unknown (symbolic algebra), never a wrapped size -----------------

TEST(LimitsOverflow, RangeLengthOverflowIsUnknown) {
  EXPECT_EQ(infer1("Range", {C({INT64_MIN}, true), C({INT64_MAX}, true), C({1}, true)}), "[?]");
}

TEST(LimitsOverflow, SliceHugeStep) {
  // 1, 1 + INT64_MAX, ...: one element, not a wrapped index or length.
  EXPECT_EQ(infer1("Slice", {T("[3]"), C({1}), C({INT64_MAX}), C({0}), C({INT64_MAX})}), "[1]");
  GraphBuilder b;  // the values of a shape vector, sliced with the same step
  const ValueId shape = b.op("Shape", {b.input("x", "[2,3,4]")});
  const ValueId picked = b.op("Slice", {shape, b.ints({1}), b.ints({INT64_MAX}), b.ints({0}), b.ints({INT64_MAX})});
  const ValueId out = b.op("ConstantOfShape", {picked});
  infer_shapes(b.g);
  EXPECT_EQ(b.shape(out), "[3]");
}

TEST(LimitsOverflow, PadSumIsUnknown) {
  // INT64_MAX + INT64_MAX wraps to -2: the dim would have read 4 - 2 = 2.
  EXPECT_EQ(infer1("Pad", {T("[4]"), C({INT64_MAX, INT64_MAX})}), "[?]");
}

TEST(LimitsOverflow, ConvTransposeAttributesAreUnknown) {
  Attributes a = A({{"output_padding", std::vector<int64_t>{INT64_MAX}},
                    {"pads", std::vector<int64_t>{INT64_MAX, 0}},
                    {"kernel_shape", std::vector<int64_t>{1}}});
  EXPECT_EQ(infer1("ConvTranspose", {T("[1,2,4]"), T("[2,3,1]")}, a), "[?]");
}

TEST(LimitsOverflow, GatherNDNegativeBatchDims) {
  EXPECT_EQ(infer1("GatherND", {T("[2,3]"), T("[4,1]", DType::kInt64)},
                   A({{"batch_dims", int64_t{-5}}})),
            "[?]");
}

TEST(LimitsOverflow, IntegerDivMinByMinusOne) {
  // INT64_MIN / -1 traps (SIGFPE) in C++; the value is left unknown.
  GraphBuilder b;
  const ValueId q = b.op("Div", {b.ints({INT64_MIN}), b.ints({-1})});
  const ValueId out = b.op("ConstantOfShape", {q});
  EXPECT_NO_THROW(infer_shapes(b.g));
  EXPECT_EQ(b.shape(out), "[?]");
}

TEST(LimitsOverflow, SymExprArithmeticThrows) {
  EXPECT_THROW(SymExpr::constant(INT64_MAX) + SymExpr::constant(1), std::overflow_error);
  EXPECT_THROW(SymExpr::constant(INT64_MIN) - SymExpr::constant(1), std::overflow_error);
  EXPECT_THROW(SymExpr::symbol("s") * SymExpr::constant(int64_t{1} << 62) * SymExpr::constant(4),
               std::overflow_error);
}

TEST(LimitsOverflow, DimArithmeticOverflowIsUnknown) {
  const Dim big = Dim::known(int64_t{1} << 62);
  const Dim m = dim_mul(big, Dim::known(4));  // wraps to 0
  EXPECT_FALSE(m.is_known() || m.is_symbolic());
  const Dim sm = dim_mul(Dim::symbolic("s"), big);  // "4611686018427387904*s"
  ASSERT_TRUE(sm.is_symbolic());
  const Dim smm = dim_mul(sm, Dim::known(4));
  EXPECT_FALSE(smm.is_known() || smm.is_symbolic());
  const Dim a = dim_add(dim_add(Dim::symbolic("s"), big), big);  // s + 2^63
  EXPECT_FALSE(a.is_known() || a.is_symbolic());
  const Dim p = dim_product({Dim::known(int64_t{1} << 32), Dim::known(int64_t{1} << 32), Dim::symbolic("s")});
  EXPECT_FALSE(p.is_known() || p.is_symbolic());  // not "0"
}

TEST(LimitsOverflow, EvaluateAtRunTimeThrowsNamingTheBindings) {
  const SymExpr e = SymExpr::parse("s0*s1");
  try {
    e.evaluate({{"s0", int64_t{1} << 32}, {"s1", int64_t{1} << 32}});
    ADD_FAILURE() << "2^32 * 2^32 evaluated";
  } catch (const std::overflow_error& err) {
    EXPECT_THAT(err.what(), HasSubstr("s0*s1"));
    EXPECT_THAT(err.what(), HasSubstr("s0=4294967296"));
  }
  EXPECT_EQ(*e.evaluate({{"s0", 3}, {"s1", 5}}), 15);
}

TEST(LimitsOverflow, EvaluateFloorDivOfMostNegative) {
  EXPECT_EQ(*SymExpr::parse("(s0//2)").evaluate({{"s0", INT64_MIN}}), INT64_MIN / 2);
  EXPECT_EQ(*SymExpr::parse("(s0//2)").evaluate({{"s0", -3}}), -2);  // floor, not truncation
}

TEST(LimitsOverflow, PrintsMostNegativeCoefficient) {
  EXPECT_EQ(SymExpr::constant(INT64_MIN).to_string(), "-9223372036854775808");
}

TEST(LimitsOverflow, TensorDataNumel) {
  TensorData t{DType::kFloat, {int64_t{1} << 32, int64_t{1} << 32}, {}};
  EXPECT_THROW(t.numel(), std::overflow_error);
}

TEST(LimitsOverflow, VerifierRejectsOversizedShape) {
  GraphBuilder b;
  const ValueId x = b.input("x", "[" + std::to_string(limits::kMaxDim + 1) + "]");
  b.g.outputs.push_back(x);
  try {
    verify(b.g);
    ADD_FAILURE() << "verified";
  } catch (const VerifyError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'x'"));
    EXPECT_THAT(e.what(), HasSubstr("kMaxDim"));
  }
}

// --- Constant folding: a hostile target shape never folds into a wrapped tensor -----------------

// Runs constant folding on b.g and returns the initializer now holding `v`, or nullptr.
const TensorData* fold(GraphBuilder& b, ValueId v) {
  b.g.outputs.push_back(b.op("Identity", {v}));  // the folded value must not be a graph output
  make_constant_folding_pass()->run(b.g);
  auto it = b.g.initializers.find(v);
  return it == b.g.initializers.end() ? nullptr : &it->second;
}

TEST(LimitsFolding, ExpandTargetWhoseCountWraps) {
  GraphBuilder b;
  const ValueId out = b.op("Expand", {b.ints({7}), b.ints({int64_t{1} << 32, int64_t{1} << 32})});
  EXPECT_EQ(fold(b, out), nullptr);  // 2^64 elements wrap to 0: once folded into an empty tensor
}

TEST(LimitsFolding, ExpandTargetWithHugeDimBesideZero) {
  GraphBuilder b;
  const ValueId out = b.op("Expand", {b.ints({7}), b.ints({0, int64_t{1} << 62})});
  EXPECT_EQ(fold(b, out), nullptr);  // 0 elements, but a dim over kMaxDim
}

TEST(LimitsFolding, ReshapeTargetWhoseProductWraps) {
  GraphBuilder b;
  const ValueId out = b.op("Reshape", {b.ints({1, 2, 3, 4, 5, 6, 7, 8}), b.ints({(int64_t{1} << 62) + 1, 4, -1})});
  EXPECT_EQ(fold(b, out), nullptr);
}

TEST(LimitsFolding, SliceHugeStep) {
  GraphBuilder b;
  const ValueId out = b.op("Slice", {b.ints({10, 20, 30}), b.ints({1}), b.ints({INT64_MAX}), b.ints({0}),
                                     b.ints({INT64_MAX})});
  const TensorData* t = fold(b, out);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->as_int64s(), std::vector<int64_t>{20});
}

// --- The memory estimate ---------------------------------------------------------------------

// `n` Neg nodes with outputs of [s, 2^48] float64 (2^51·s bytes each), all graph outputs: all
// live at the last step.
Graph wide_graph(int n) {
  GraphBuilder b;
  const std::string shape = "[s," + std::to_string(int64_t{1} << 48) + "]";
  const ValueId x = b.input("x", shape, DType::kDouble);
  for (int i = 0; i < n; ++i) b.g.outputs.push_back(b.node("Neg", {x}, {}, 1, "", {shape})[0]);
  return b.g;
}

TEST(LimitsPlanner, LiveBytesOverflow) {
  const Graph g = wide_graph(4096);  // 4096 · 2^51 = 2^63
  try {
    memory_timeline(g, plan_inference(g), nullptr);
    ADD_FAILURE() << "the live bytes summed without overflow";
  } catch (const VerifyError& e) {
    EXPECT_THAT(e.what(), HasSubstr("memory estimate"));
    EXPECT_THAT(e.what(), HasSubstr("overflow"));
  }
}

TEST(LimitsPlanner, EvaluatePeakOverflow) {
  const Graph g = wide_graph(1);
  const MemoryTimeline t = memory_timeline(g, plan_inference(g), nullptr);
  EXPECT_EQ(evaluate_peak(t, {{"s", 2}}).peak, int64_t{1} << 52);
  EXPECT_THROW(evaluate_peak(t, {{"s", int64_t{1} << 13}}), std::overflow_error);  // 2^64 bytes
}

}  // namespace
}  // namespace torch_ort
