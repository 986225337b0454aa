// Shape rules of layout and data ops, including the exporter's Shape -> Concat -> Reshape chains.
#include <gtest/gtest.h>

#include "csrc/core/ir/errors.h"
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
using Ints = std::vector<int64_t>;

TEST(ShapeReshape, ConstantTargetsResolveMinusOneAndZeroSymbolically) {
  EXPECT_EQ(infer1("Reshape", {T("[batch,seq,768]"), C({-1, 768})}), "[batch*seq,768]");
  EXPECT_EQ(infer1("Reshape", {T("[batch,seq,768]"), C({0, -1})}), "[batch,768*seq]");
  EXPECT_EQ(infer1("Reshape", {T("[batch,seq,768]"), C({0, 0, 12, 64})}), "[batch,seq,12,64]");
  EXPECT_EQ(infer1("Reshape", {T("[batch*seq,768]"), C({-1, 12, 64})}), "[batch*seq,12,64]");
  EXPECT_EQ(infer1("Reshape", {T("[2,3,4]"), C({4, -1})}), "[4,6]");
  EXPECT_EQ(infer1("Reshape", {T("[2,0,4]"), C({0, 8})}, A({{"allowzero", int64_t{1}}})), "[0,8]");
  EXPECT_EQ(infer1("Reshape", {T("[batch,seq,7]"), C({-1, 2})}), "[?,2]") << "7·batch·seq / 2 is not exact";
  EXPECT_EQ(infer1("Reshape", {T("[?]"), C({-1, 4})}), "[?,4]");
  EXPECT_EQ(infer1("Reshape", {T("[batch,4]"), T("[3]", DType::kInt64)}), "[?,?,?]") << "target computed at run time";
}

TEST(ShapeReshape, ImpossibleTargetsAreErrors) {
  EXPECT_THROW(infer1("Reshape", {T("[2,3]"), C({-1, -1})}), VerifyError);
  EXPECT_THROW(infer1("Reshape", {T("[2,3]"), C({4, -1})}), VerifyError);
  EXPECT_THROW(infer1("Reshape", {T("[2,3]"), C({5})}), VerifyError);
}

// The dynamo exporter's x.view(B, T, H, C // H): every size comes out of Shape(x).
TEST(ShapeReshape, TargetComputedByAShapeChainOfTheExporter) {
  GraphBuilder b;
  ValueId x = b.input("x", "[s48,s24,s20]");
  auto dim = [&](int64_t i) {
    ValueId s = b.op("Shape", {x}, A({{"start", i}, {"end", i + 1}}));
    return b.op("Squeeze", {s});
  };
  ValueId batch = dim(0), seq = dim(1), c = dim(2);
  ValueId head = b.op("Div", {c, b.ints({2}, true)});
  ValueId flat = b.ints({-1});
  ValueId target = b.op("Concat", {b.op("Reshape", {batch, flat}), b.op("Reshape", {seq, flat}), b.ints({2}),
                                   b.op("Reshape", {head, flat})},
                        A({{"axis", int64_t{0}}}));
  ValueId view = b.node("Reshape", {x, target}, A({{"allowzero", int64_t{1}}}), 1, "", {"[s48,s24,2,(s20//2)]"})[0];
  ValueId back = b.op("Reshape", {b.op("Transpose", {view}, A({{"perm", Ints{0, 2, 1, 3}}})), b.ints({0, 0, -1})});
  EXPECT_NO_THROW(infer_shapes(b.g)) << "agrees with the exporter's own '(s20//2)'";
  EXPECT_EQ(b.shape(target), "[4]");
  EXPECT_EQ(b.shape(back), "[s48,2,(s20//2)*s24]");
}

TEST(ShapeLayout, FlattenTransposeSqueezeUnsqueeze) {
  EXPECT_EQ(infer1("Flatten", {T("[batch,3,4]")}), "[batch,12]");
  EXPECT_EQ(infer1("Flatten", {T("[batch,seq,4]")}, A({{"axis", int64_t{-1}}})), "[batch*seq,4]");
  EXPECT_EQ(infer1("Flatten", {T("[batch,3]")}, A({{"axis", int64_t{0}}})), "[1,3*batch]");
  EXPECT_EQ(infer1("Transpose", {T("[batch,seq,4]")}), "[4,seq,batch]");
  EXPECT_EQ(infer1("Transpose", {T("[b,h,s,d]")}, A({{"perm", Ints{0, 2, 1, 3}}})), "[b,s,h,d]");
  EXPECT_THROW(infer1("Transpose", {T("[b,h,s]")}, A({{"perm", Ints{1, 0}}})), VerifyError);
  EXPECT_EQ(infer1("Squeeze", {T("[1,batch,1,4]"), C({0, -2})}), "[batch,4]");
  EXPECT_EQ(infer1("Squeeze", {T("[1,3,1,2]")}), "[3,2]") << "no axes: every size-1 dim";
  EXPECT_EQ(infer1("Squeeze", {T("[1,batch]")}), "[?]") << "batch might be 1";
  EXPECT_EQ(infer1("Squeeze", {T("[batch,1]")}, A({{"axes", Ints{1}}}), "", 11), "[batch]") << "opset 11 attribute";
  EXPECT_EQ(infer1("Squeeze", {T("[3,1]"), C({0})}), "[?]") << "ONNX rejects it, ATen keeps the dim";
  EXPECT_EQ(infer1("Unsqueeze", {T("[batch,4]"), C({0, -1})}), "[1,batch,4,1]");
  EXPECT_EQ(infer1("Unsqueeze", {T("[batch,4]"), C({1})}), "[batch,1,4]");
  EXPECT_EQ(infer1("Unsqueeze", {T("[]"), C({0})}), "[1]");
  EXPECT_EQ(infer1("Unsqueeze", {T("[batch]"), T("[1]", DType::kInt64)}), "[?]") << "axes at run time";
}

TEST(ShapeLayout, ExpandTilePad) {
  EXPECT_EQ(infer1("Expand", {T("[3,1]"), C({2, 1, 5})}), "[2,3,5]");
  EXPECT_EQ(infer1("Expand", {T("[batch,1]"), C({1, 4})}), "[batch,4]");
  EXPECT_EQ(infer1("Expand", {T("[batch,1]"), T("[3]", DType::kInt64)}), "[?,?,?]");
  EXPECT_THROW(infer1("Expand", {T("[3,2]"), C({3, 4})}), VerifyError);
  EXPECT_EQ(infer1("Tile", {T("[batch,3]"), C({2, 2})}), "[2*batch,6]");
  EXPECT_EQ(infer1("Pad", {T("[batch,3,h]"), C({0, 0, 1, 0, 0, 2})}), "[batch,3,h+3]");
  EXPECT_EQ(infer1("Pad", {T("[batch,3,h]"), C({1, 1}), Absent(), C({-1})}), "[batch,3,h+2]");
}

TEST(ShapeData, ConcatAddsAlongTheAxisAndChecksTheRest) {
  EXPECT_EQ(infer1("Concat", {T("[batch,past,64]"), T("[batch,seq,64]")}, A({{"axis", int64_t{1}}})),
            "[batch,past+seq,64]");
  EXPECT_EQ(infer1("Concat", {T("[batch,seq]"), T("[batch,seq]")}, A({{"axis", int64_t{-1}}})), "[batch,2*seq]");
  EXPECT_EQ(infer1("Concat", {T("[2,1]"), T("[?,3]")}, A({{"axis", int64_t{1}}})), "[2,4]");
  EXPECT_EQ(infer1("Concat", {T("[?]"), T("[batch,3]")}, A({{"axis", int64_t{1}}})), "[batch,?]");
  EXPECT_THROW(infer1("Concat", {T("[2,1]"), T("[3,1]")}, A({{"axis", int64_t{1}}})), VerifyError);
  EXPECT_THROW(infer1("Concat", {T("[2,1]"), T("[2]")}, A({{"axis", int64_t{0}}})), VerifyError);
}

TEST(ShapeData, SliceWithConstantParameters) {
  EXPECT_EQ(infer1("Slice", {T("[10,20]"), C({2}), C({-3}), C({1})}), "[10,15]");
  EXPECT_EQ(infer1("Slice", {T("[10,20]"), C({0, 1}), C({100, 20}), Absent(), C({3, 2})}), "[4,10]");
  EXPECT_EQ(infer1("Slice", {T("[10]"), C({-1}), C({-100}), C({0}), C({-1})}), "[10]") << "reversed";
  EXPECT_EQ(infer1("Slice", {T("[batch,seq]"), C({1}), C({INT64_MAX}), C({1})}), "[batch,seq-1]");
  EXPECT_EQ(infer1("Slice", {T("[batch,seq]"), C({0}), C({-1}), C({1})}), "[batch,seq-1]");
  EXPECT_EQ(infer1("Slice", {T("[batch,seq]"), C({0}), C({3}), C({1})}), "[batch,?]") << "3 only if seq >= 3";
  EXPECT_EQ(infer1("Slice", {T("[batch,seq]"), T("[1]", DType::kInt64), C({3}), C({1})}), "[batch,?]");
  EXPECT_EQ(infer1("Slice", {T("[batch,seq]"), T("[1]", DType::kInt64), C({3})}), "[?,?]");
  EXPECT_EQ(infer1("Slice", {T("[8,6]")}, A({{"starts", Ints{1}}, {"ends", Ints{5}}, {"axes", Ints{1}}}), "", 9),
            "[8,4]") << "opset 9 attributes";
}

TEST(ShapeData, SplitBySizesOrEqually) {
  using V = std::vector<std::string>;
  EXPECT_EQ(infer_all("Split", {T("[batch,10]"), C({3, 7})}, A({{"axis", int64_t{1}}}), 2), (V{"[batch,3]", "[batch,7]"}));
  EXPECT_EQ(infer_all("Split", {T("[batch,10]")}, A({{"axis", int64_t{1}}, {"split", Ints{4, 6}}}), 2, "", 11),
            (V{"[batch,4]", "[batch,6]"}));
  EXPECT_EQ(infer_all("Split", {T("[batch,48]")}, A({{"axis", int64_t{-1}}}), 3), (V{"[batch,16]", "[batch,16]", "[batch,16]"}));
  EXPECT_EQ(infer_all("Split", {T("[7]")}, {}, 3), (V{"[3]", "[3]", "[1]"})) << "opset 18: smaller last chunk";
  EXPECT_EQ(infer_all("Split", {T("[2*h]")}, {}, 2), (V{"[h]", "[h]"}));
  EXPECT_EQ(infer_all("Split", {T("[h]")}, {}, 2), (V{"[?]", "[?]"}));
}

TEST(ShapeData, GatherShapesAndPicksShapeValues) {
  EXPECT_EQ(infer1("Gather", {T("[vocab,64]"), T("[batch,seq]", DType::kInt64)}), "[batch,seq,64]");
  EXPECT_EQ(infer1("Gather", {T("[batch,seq,64]"), C({-1}, true)}, A({{"axis", int64_t{1}}})), "[batch,64]");
  EXPECT_EQ(infer1("GatherElements", {T("[batch,5]"), T("[batch,1]", DType::kInt64)}), "[batch,1]");
  EXPECT_EQ(infer1("ScatterND", {T("[batch,5]"), T("[3,2]", DType::kInt64), T("[3]")}), "[batch,5]");
  EXPECT_EQ(infer1("NonZero", {T("[batch,5]")}), "[2,?]");
  EXPECT_EQ(infer1("OneHot", {T("[batch]", DType::kInt64), C({10}, true), T("[2]")}), "[batch,10]");
  GraphBuilder b;
  ValueId x = b.input("x", "[batch,seq,64]");
  ValueId last2 = b.op("Gather", {b.op("Shape", {x}), b.ints({-2, -1})});
  ValueId y = b.op("ConstantOfShape", {last2});
  infer_shapes(b.g);
  EXPECT_EQ(b.shape(y), "[seq,64]");
  EXPECT_THROW(infer1("Gather", {C({1, 2}), C({5}, true)}), VerifyError);
}

TEST(ShapeData, ShapeSizeConstantsAndRange) {
  EXPECT_EQ(infer1("Shape", {T("[batch,seq,4]")}), "[3]");
  EXPECT_EQ(infer1("Shape", {T("[batch,seq,4]")}, A({{"start", int64_t{-2}}})), "[2]");
  EXPECT_EQ(infer1("Shape", {T("[?]")}), "[?]");
  EXPECT_EQ(infer1("Size", {T("[batch,4]")}), "[]");
  EXPECT_EQ(infer1("Constant", {}, A({{"value", TensorData::from_int64s({1, 2, 3})}})), "[3]");
  EXPECT_EQ(infer1("Constant", {}, A({{"value_float", 1.0f}})), "[]");
  EXPECT_EQ(infer1("Constant", {}, A({{"value_ints", Ints{1, 2}}})), "[2]");
  EXPECT_EQ(infer1("ConstantOfShape", {C({2, 5})}), "[2,5]");
  EXPECT_EQ(infer1("Range", {C({0}, true), C({10}, true), C({3}, true)}), "[4]");
  EXPECT_EQ(infer1("Range", {C({5}, true), C({1}, true), C({-2}, true)}), "[2]");
  GraphBuilder b;
  ValueId x = b.input("x", "[batch,seq]");
  ValueId seq = b.op("Squeeze", {b.op("Shape", {x}, A({{"start", int64_t{1}}})), b.ints({0})});
  ValueId positions = b.op("Range", {b.ints({0}, true), seq, b.ints({1}, true)});
  ValueId n = b.op("Size", {x});
  ValueId flat = b.op("Reshape", {x, b.op("Unsqueeze", {n, b.ints({0})})});
  infer_shapes(b.g);
  EXPECT_EQ(b.shape(positions), "[seq]");
  EXPECT_EQ(b.shape(flat), "[batch*seq]");
}

}  // namespace
}  // namespace torch_ort
