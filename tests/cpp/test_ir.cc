// Tests of the IR building blocks: dtypes, shapes, constant tensors, attributes, Graph, GraphIndex.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>

#include "csrc/core/ir/graph.h"
#include "ir_builders.h"

namespace torch_ort {
namespace {

using ::testing::HasSubstr;
using testing::add_node;
using testing::fvalue;

TEST(DType, TablesFollowOnnxNumbering) {
  EXPECT_EQ(dtype_name(DType::kFloat), "float32");
  EXPECT_EQ(dtype_name(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(dtype_size(DType::kInt64), 8);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2);
  EXPECT_EQ(dtype_size(DType::kComplex128), 16);
  EXPECT_EQ(dtype_size(DType::kString), 0);
  EXPECT_TRUE(is_floating(DType::kBFloat16));
  EXPECT_TRUE(is_floating(DType::kDouble));
  EXPECT_FALSE(is_floating(DType::kInt64));
  EXPECT_FALSE(is_floating(DType::kComplex64));
  EXPECT_TRUE(is_valid_dtype(1));
  EXPECT_TRUE(is_valid_dtype(16));
  EXPECT_FALSE(is_valid_dtype(0));
  EXPECT_FALSE(is_valid_dtype(17));  // float8: not supported
  EXPECT_FALSE(is_valid_dtype(-3));
}

TEST(Shape, SameAsNeedsProof) {
  const Shape a = Shape::of({Dim::symbolic("batch"), Dim::known(784)});
  EXPECT_TRUE(a.same_as(Shape::of({Dim::symbolic("batch"), Dim::known(784)})));
  EXPECT_FALSE(a.same_as(Shape::of({Dim::symbolic("seq"), Dim::known(784)})));
  EXPECT_FALSE(a.same_as(Shape::of({Dim::symbolic("batch")})));
  // Unknown dims and unknown ranks prove nothing, not even equality with themselves.
  EXPECT_FALSE(Shape::of({Dim{}}).same_as(Shape::of({Dim{}})));
  EXPECT_FALSE(Shape::unknown().same_as(Shape::unknown()));
  EXPECT_TRUE(Shape::of({}).same_as(Shape::of({})));  // scalars
}

TEST(Shape, ToString) {
  EXPECT_EQ(Shape::of({Dim::symbolic("batch"), Dim::known(784)}).to_string(), "[batch,784]");
  EXPECT_EQ(Shape::of({Dim{}, Dim::known(2)}).to_string(), "[?,2]");
  EXPECT_EQ(Shape::unknown().to_string(), "[?]");
  EXPECT_EQ(Shape::of({}).to_string(), "[]");
}

TEST(TensorData, Int64RoundTripAndScalar) {
  const TensorData t = TensorData::from_int64s({3, -1, 7});
  EXPECT_EQ(t.dtype, DType::kInt64);
  EXPECT_EQ(t.dims, std::vector<int64_t>{3});
  EXPECT_EQ(t.raw.size(), 24u);
  EXPECT_EQ(t.as_int64s(), (std::vector<int64_t>{3, -1, 7}));
  const TensorData s = TensorData::from_int64s({5}, /*scalar=*/true);
  EXPECT_TRUE(s.dims.empty());
  EXPECT_EQ(s.numel(), 1);
  EXPECT_THROW(TensorData::from_int64s({1, 2}, /*scalar=*/true), std::invalid_argument);
}

TEST(TensorData, Int32WidensAndFloatIsRejected) {
  TensorData t;
  t.dtype = DType::kInt32;
  t.dims = {2};
  const int32_t v[] = {-4, 9};
  t.raw.assign(reinterpret_cast<const char*>(v), sizeof(v));
  EXPECT_EQ(t.as_int64s(), (std::vector<int64_t>{-4, 9}));
  const TensorData f = TensorData::scalar_float(DType::kFloat, 1.5);
  try {
    f.as_int64s();
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("float32"));
  }
}

TEST(TensorData, ScalarFloatEncodings) {
  auto bits16 = [](const TensorData& t) {
    uint16_t b;
    std::memcpy(&b, t.raw.data(), 2);
    return b;
  };
  EXPECT_EQ(bits16(TensorData::scalar_float(DType::kFloat16, 1.0)), 0x3c00);
  EXPECT_EQ(bits16(TensorData::scalar_float(DType::kFloat16, -2.0)), 0xc000);
  EXPECT_EQ(bits16(TensorData::scalar_float(DType::kFloat16, 65520.0)), 0x7c00);  // rounds to inf
  EXPECT_EQ(bits16(TensorData::scalar_float(DType::kFloat16, 5.960464477539063e-08)), 0x0001);
  EXPECT_EQ(bits16(TensorData::scalar_float(DType::kBFloat16, 1.0)), 0x3f80);
  EXPECT_EQ(TensorData::scalar_float(DType::kDouble, 0.1).as_doubles(), std::vector<double>{0.1});
  EXPECT_EQ(TensorData::scalar_float(DType::kFloat16, 0.5).as_doubles(), std::vector<double>{0.5});
  EXPECT_EQ(TensorData::scalar_float(DType::kBFloat16, -3.0).as_doubles(), std::vector<double>{-3.0});
  EXPECT_TRUE(TensorData::scalar_float(DType::kFloat, 2.0).dims.empty());
  EXPECT_THROW(TensorData::scalar_float(DType::kInt64, 1.0), std::invalid_argument);
}

TEST(Attributes, TypedGettersAndDefaults) {
  Attributes a;
  a.set("axis", int64_t{-1});
  a.set("alpha", 0.5f);
  a.set("mode", std::string("constant"));
  a.set("perm", std::vector<int64_t>{1, 0});
  a.set("scales", std::vector<float>{2.f});
  a.set("names", std::vector<std::string>{"a", "b"});
  a.set("value", TensorData::from_int64s({1}));
  EXPECT_EQ(a.get_int("axis", 0), -1);
  EXPECT_EQ(a.get_int("keepdims", 1), 1);  // absent -> default
  EXPECT_FLOAT_EQ(a.get_float("alpha", 1.f), 0.5f);
  EXPECT_EQ(a.get_string("mode", ""), "constant");
  EXPECT_EQ(a.get_ints("perm", {}), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(a.get_floats("scales", {}), std::vector<float>{2.f});
  EXPECT_EQ(a.get_strings("names", {}), (std::vector<std::string>{"a", "b"}));
  ASSERT_NE(a.get_tensor("value"), nullptr);
  EXPECT_EQ(a.get_tensor("missing"), nullptr);
  EXPECT_EQ(attribute_kind_name(a.all().at("perm")), std::string("ints"));
  a.erase("axis");
  EXPECT_FALSE(a.has("axis"));
}

TEST(Attributes, WrongKindThrowsNamingTheAttribute) {
  Attributes a;
  a.set("alpha", 0.5f);
  try {
    a.get_int("alpha", 0);
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'alpha'"));
    EXPECT_THAT(e.what(), HasSubstr("float"));
    EXPECT_THAT(e.what(), HasSubstr("expected int"));
  }
  EXPECT_THROW(a.get_tensor("alpha"), std::invalid_argument);
  EXPECT_THROW(a.get_ints("alpha", {}), std::invalid_argument);
}

TEST(Graph, ValueNamesAreUnique) {
  Graph g;
  const ValueId x = fvalue(g, "x");
  EXPECT_EQ(g.find("x"), x);
  EXPECT_EQ(g.find("nope"), std::nullopt);
  EXPECT_THROW(fvalue(g, "x"), std::invalid_argument);
  EXPECT_THROW(g.add_value("", DType::kFloat, {}), std::invalid_argument);
  const ValueId x2 = g.new_value("x", DType::kFloat, {});
  const ValueId x3 = g.new_value("x", DType::kFloat, {});
  EXPECT_NE(g.value(x2).name, "x");
  EXPECT_NE(g.value(x2).name, g.value(x3).name);
  EXPECT_EQ(g.value(g.new_value("fresh", DType::kInt64, {})).name, "fresh");
  EXPECT_EQ(g.num_values(), 4);
}

TEST(Graph, UniqueNodeNamesAvoidExistingNodes) {
  Graph g;
  const ValueId x = fvalue(g, "x"), y = fvalue(g, "y");
  add_node(g, "Relu", {x}, {y}, "relu");
  const std::string a = g.unique_node_name("relu");
  EXPECT_NE(a, "relu");
  add_node(g, "Relu", {y}, {g.new_value("z", DType::kFloat, {})}, a);
  const std::string b = g.unique_node_name("relu");
  EXPECT_NE(b, "relu");
  EXPECT_NE(b, a);
  EXPECT_EQ(g.unique_node_name("grad"), "grad");
  EXPECT_NE(g.unique_node_name("grad"), "grad");  // a name handed out is taken
}

TEST(Node, DescribeNamesOpAndNode) {
  Node n;
  n.op_type = "Gemm";
  n.name = "/fc1/Gemm";
  EXPECT_EQ(n.describe(), "Gemm (node /fc1/Gemm)");
  n.domain = kOurDomain;
  EXPECT_EQ(n.describe(), "com.torch_ort::Gemm (node /fc1/Gemm)");  // non-default domains shown
  n.name.clear();
  EXPECT_THAT(n.describe(), HasSubstr("unnamed"));
}

TEST(GraphIndex, ProducersAndConsumers) {
  Graph g;
  const ValueId x = fvalue(g, "x"), y = fvalue(g, "y"), z = fvalue(g, "z");
  g.inputs = {x};
  add_node(g, "Mul", {x, x}, {y}, "square");  // reads x twice: one consumer entry
  add_node(g, "Add", {y, x}, {z}, "add");
  const GraphIndex idx(g);
  EXPECT_EQ(idx.producer[x], -1);
  EXPECT_EQ(idx.producer[y], 0);
  EXPECT_EQ(idx.producer[z], 1);
  EXPECT_EQ(idx.consumers[x], (std::vector<NodeId>{0, 1}));
  EXPECT_EQ(idx.consumers[y], std::vector<NodeId>{1});
  EXPECT_TRUE(idx.consumers[z].empty());
}

}  // namespace
}  // namespace torch_ort
