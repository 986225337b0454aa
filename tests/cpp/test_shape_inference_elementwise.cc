// Elementwise shape rules, and infer_shapes' contract: fill, never overwrite, check, skip unknowns.
#include <gtest/gtest.h>

#include "csrc/core/ir/errors.h"
#include "csrc/core/shapes/shape_rules.h"
#include "tests/cpp/shape_builders.h"

namespace torch_ort {
namespace {

using testing::A;
using testing::Absent;
using testing::C;
using testing::GraphBuilder;
using testing::infer1;
using testing::infer_all;
using testing::T;

TEST(ShapeElementwise, UnaryOpsKeepTheInputShape) {
  for (const char* op : {"Relu", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Neg", "Abs", "Erf", "Gelu",
                         "Not", "Identity", "Trilu", "Clip", "Softplus", "LeakyRelu", "IsNaN"})
    EXPECT_EQ(infer1(op, {T("[batch,seq,4]")}), "[batch,seq,4]") << op;
  EXPECT_EQ(infer1("Relu", {T("[?]")}), "[?]");
}

TEST(ShapeElementwise, NumpyBroadcasting) {
  EXPECT_EQ(infer1("Add", {T("[batch,1,4]"), T("[3,1]")}), "[batch,3,4]");
  EXPECT_EQ(infer1("Mul", {T("[batch,4]"), T("[]")}), "[batch,4]");
  EXPECT_EQ(infer1("Sub", {T("[1,seq]"), T("[batch,1]")}), "[batch,seq]");
  EXPECT_EQ(infer1("Div", {T("[batch,seq]"), T("[batch,seq]")}), "[batch,seq]");
  // A size > 1 wins over a symbol (the symbol is that size or 1); two symbols stay open.
  EXPECT_EQ(infer1("Add", {T("[n]"), T("[5]")}), "[5]");
  EXPECT_EQ(infer1("Add", {T("[n]"), T("[m]")}), "[?]");
  EXPECT_EQ(infer1("Add", {T("[n,?]"), T("[1,3]")}), "[n,3]");
  EXPECT_EQ(infer1("Add", {T("[?]"), T("[3]")}), "[?]") << "unknown rank: nothing is provable";
  EXPECT_EQ(infer1("Pow", {T("[batch,4]"), T("[]", DType::kInt64)}), "[batch,4]");
}

TEST(ShapeElementwise, VariadicWhereAndComparisons) {
  EXPECT_EQ(infer1("Sum", {T("[2,3]"), T("[3]"), T("[1,1]")}), "[2,3]");
  EXPECT_EQ(infer1("Max", {T("[batch,1]"), T("[1,7]"), T("[7]")}), "[batch,7]");
  EXPECT_EQ(infer1("Where", {T("[seq,seq]", DType::kBool), T("[batch,1,seq,seq]"), T("[]")}), "[batch,1,seq,seq]");
  EXPECT_EQ(infer1("Equal", {T("[batch,seq]", DType::kInt64), T("[]", DType::kInt64)}), "[batch,seq]");
  EXPECT_EQ(infer1("Less", {T("[batch,1]"), T("[4]")}), "[batch,4]");
}

TEST(ShapeElementwise, BroadcastingTwoDifferentKnownSizesIsAnErrorNamingTheNode) {
  try {
    infer1("Add", {T("[batch,3]"), T("[4]")});
    FAIL() << "expected VerifyError";
  } catch (const VerifyError& e) {
    EXPECT_NE(std::string(e.what()).find("Add (node /Add)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[batch,3]"), std::string::npos) << e.what();
  }
}

TEST(ShapeElementwise, CastsDropoutAndOurGradients) {
  EXPECT_EQ(infer1("Cast", {T("[batch,4]")}, A({{"to", int64_t{7}}})), "[batch,4]");
  EXPECT_EQ(infer1("CastLike", {T("[batch,4]"), T("[]", DType::kFloat16)}), "[batch,4]");
  EXPECT_EQ(infer_all("Dropout", {T("[batch,4]"), Absent(), Absent()}, {}, 2),
            (std::vector<std::string>{"[batch,4]", "[batch,4]"}))
      << "the mask has the data's shape";
  for (const char* op : {"ReluGrad", "SigmoidGrad", "TanhGrad"})
    EXPECT_EQ(infer1(op, {T("[batch,8]"), T("[batch,8]")}, {}, kOurDomain), "[batch,8]") << op;
  EXPECT_EQ(infer1("DropoutGrad", {T("[batch,8]"), T("[batch,8]", DType::kBool), T("[]"), T("[]", DType::kBool)},
                   {}, kOurDomain),
            "[batch,8]");
}

TEST(ShapeElementwise, IntegerArithmeticOnShapeValuesStaysSymbolic) {
  // size = Shape(x)[1] * Shape(x)[2]; half = size / 2; the values feed a Reshape target.
  GraphBuilder b;
  ValueId x = b.input("x", "[batch,seq,heads]");
  ValueId shape = b.op("Shape", {x});
  ValueId seq = b.op("Gather", {shape, b.ints({1}, true)});
  ValueId heads = b.op("Gather", {shape, b.ints({2}, true)});
  ValueId prod = b.op("Mul", {seq, heads});
  ValueId half = b.op("Div", {heads, b.ints({2}, true)});
  ValueId sum = b.op("Add", {seq, b.ints({1}, true)});
  ValueId target = b.op("Concat", {b.op("Unsqueeze", {prod, b.ints({0})}), b.op("Unsqueeze", {half, b.ints({0})}),
                                   b.op("Unsqueeze", {sum, b.ints({0})})},
                        A({{"axis", int64_t{0}}}));
  ValueId y = b.op("ConstantOfShape", {target});
  infer_shapes(b.g);
  EXPECT_EQ(b.shape(prod), "[]");
  EXPECT_EQ(b.shape(y), "[heads*seq,(heads//2),seq+1]");
}

TEST(ShapeInference, FillsUnknownShapesAndUnknownDimsButNeverOverwrites) {
  GraphBuilder b;
  ValueId x = b.input("x", "[batch,4]");
  ValueId a = b.node("Relu", {x}, {}, 1, "", {"[?]"})[0];
  ValueId c = b.node("Relu", {x}, {}, 1, "", {"[?,4]"})[0];
  ValueId d = b.node("Relu", {x}, {}, 1, "", {"[n,4]"})[0];  // the exporter's own name is kept
  infer_shapes(b.g);
  EXPECT_EQ(b.shape(a), "[batch,4]");
  EXPECT_EQ(b.shape(c), "[batch,4]");
  EXPECT_EQ(b.shape(d), "[n,4]");
}

TEST(ShapeInference, AContradictionWithTheGraphNamesTheValueAndTheNode) {
  for (const char* held : {"[batch,5]", "[batch,4,1]"}) {
    GraphBuilder b;
    ValueId x = b.input("x", "[batch,4]");
    b.node("Tanh", {x}, {}, 1, "", {held});
    try {
      infer_shapes(b.g);
      FAIL() << "expected VerifyError for " << held;
    } catch (const VerifyError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'Tanh_out'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("Tanh (node /Tanh)"), std::string::npos) << msg;
      EXPECT_NE(msg.find(held), std::string::npos) << msg;
      EXPECT_NE(msg.find("[batch,4]"), std::string::npos) << msg;
    }
  }
}

TEST(ShapeInference, OpsWithoutARuleLeaveTheirOutputsUnknownWithoutError) {
  GraphBuilder b;
  ValueId x = b.input("x", "[batch,4]");
  ValueId u = b.node("NoSuchOp", {x})[0];
  ValueId o = b.node("SomeFusedGrad", {x}, {}, 1, kOurDomain)[0];
  ValueId m = b.node("Relu", {x}, {}, 1, "com.other")[0];
  ValueId after = b.op("Relu", {u});
  ShapeCoverage cov = infer_shapes(b.g);
  EXPECT_EQ(b.shape(u), "[?]");
  EXPECT_EQ(b.shape(o), "[?]");
  EXPECT_EQ(b.shape(m), "[?]") << "a rule is per domain";
  EXPECT_EQ(b.shape(after), "[?]");
  EXPECT_EQ(cov.num_values, 5);
  EXPECT_EQ(cov.num_rank_known, 1);
  EXPECT_EQ(cov.rank_unknown.size(), 4u);
}

TEST(ShapeInference, AMalformedAttributeMeansUnknownNotACrash) {
  EXPECT_EQ(infer1("Transpose", {T("[2,3]")}, A({{"perm", std::string("oops")}})), "[?]");
  EXPECT_EQ(infer1("Cast", {T("[2,3]")}, A({{"to", 1.5f}})), "[?]");
}

TEST(ShapeRegistry, OneRulePerOpAndDomain) {
  auto& reg = ShapeRegistry::instance();
  EXPECT_NE(reg.find("", "MatMul"), nullptr);
  EXPECT_NE(reg.find(kOurDomain, "SumToShape"), nullptr);
  EXPECT_EQ(reg.find("", "SumToShape"), nullptr);
  EXPECT_THROW(reg.add("", "MatMul", [](ShapeCtx&) {}), std::logic_error);
}

}  // namespace
}  // namespace torch_ort
