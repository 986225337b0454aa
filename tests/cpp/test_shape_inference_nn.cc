// Shape rules of MatMul/Gemm, reductions, softmax, losses, norms, Conv/Pool and our gradients.
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
using V = std::vector<std::string>;

TEST(ShapeLinalg, EinsumTakesEachOutputLabelsDimAndDetDropsTheMatrix) {
  using S = std::string;
  EXPECT_EQ(infer1("Einsum", {T("[batch,i,j]"), T("[batch,j,k]")}, A({{"equation", S("bij,bjk->bik")}})), "[batch,i,k]");
  EXPECT_EQ(infer1("Einsum", {T("[1,3,4]"), T("[batch,4,5]")}, A({{"equation", S("bij,bjk->bik")}})), "[batch,3,5]");
  EXPECT_EQ(infer1("Einsum", {T("[3,3]")}, A({{"equation", S("ii->")}})), "[]");
  EXPECT_EQ(infer1("Einsum", {T("[2,3,4]"), T("[4]")}, A({{"equation", S("...j,j->...")}})), "[?]");
  EXPECT_EQ(infer1("Det", {T("[batch,3,3]")}), "[batch]");
}

TEST(ShapeLinalg, MatMulBatchesBroadcastAndVectorsDropTheirDim) {
  EXPECT_EQ(infer1("MatMul", {T("[batch,784]"), T("[784,128]")}), "[batch,128]");
  EXPECT_EQ(infer1("MatMul", {T("[batch,seq,16]"), T("[16,48]")}), "[batch,seq,48]");
  EXPECT_EQ(infer1("MatMul", {T("[batch,h,seq,d]"), T("[batch,h,d,seq]")}), "[batch,h,seq,seq]");
  EXPECT_EQ(infer1("MatMul", {T("[2,1,3,4]"), T("[5,4,2]")}), "[2,5,3,2]");
  EXPECT_EQ(infer1("MatMul", {T("[4]"), T("[batch,4,3]")}), "[batch,3]");
  EXPECT_EQ(infer1("MatMul", {T("[batch,3,4]"), T("[4]")}), "[batch,3]");
  EXPECT_EQ(infer1("MatMul", {T("[4]"), T("[4]")}), "[]");
  EXPECT_EQ(infer1("MatMul", {T("[?]"), T("[4,3]")}), "[?]");
  EXPECT_THROW(infer1("MatMul", {T("[batch,3]"), T("[4,5]")}), VerifyError);
}

TEST(ShapeLinalg, GemmHonoursTransposeFlags) {
  EXPECT_EQ(infer1("Gemm", {T("[batch,12]"), T("[32,12]"), T("[32]")}, A({{"transB", int64_t{1}}})), "[batch,32]");
  EXPECT_EQ(infer1("Gemm", {T("[12,batch]"), T("[12,32]")}, A({{"transA", int64_t{1}}})), "[batch,32]");
  EXPECT_EQ(infer1("Gemm", {T("[batch,12]"), T("[12,32]"), Absent()}), "[batch,32]");
  EXPECT_THROW(infer1("Gemm", {T("[batch,12]"), T("[32,13]")}, A({{"transB", int64_t{1}}})), VerifyError);
}

TEST(ShapeReduce, AxesFromTheAttributeOrAConstantInput) {
  EXPECT_EQ(infer1("ReduceMean", {T("[batch,seq,16]"), C({-1})}), "[batch,seq,1]");
  EXPECT_EQ(infer1("ReduceSum", {T("[batch,seq,16]"), C({0, 1})}, A({{"keepdims", int64_t{0}}})), "[16]");
  EXPECT_EQ(infer1("ReduceMean", {T("[batch,seq,16]")}, A({{"axes", Ints{1}}}), "", 13), "[batch,1,16]");
  EXPECT_EQ(infer1("ReduceMean", {T("[batch,seq]")}, A({{"keepdims", int64_t{0}}})), "[]") << "no axes: all";
  EXPECT_EQ(infer1("ReduceSum", {T("[batch,seq]"), Absent()}, A({{"noop_with_empty_axes", int64_t{1}}})), "[batch,seq]");
  EXPECT_EQ(infer1("ReduceMax", {T("[batch,1,4]"), T("[1]", DType::kInt64)}), "[?,1,?]") << "axes at run time";
  EXPECT_EQ(infer1("ReduceMax", {T("[batch,4]"), T("[1]", DType::kInt64)}, A({{"keepdims", int64_t{0}}})), "[?]");
  EXPECT_THROW(infer1("ReduceSum", {T("[batch,4]"), C({2})}), VerifyError);
  EXPECT_EQ(infer1("ReduceSum", {T("[]"), C({0})}, A({{"keepdims", int64_t{0}}})), "[]") << "torch: x.sum(0) of a scalar";
  EXPECT_EQ(infer1("ArgMax", {T("[batch,10]")}, A({{"axis", int64_t{1}}})), "[batch,1]");
  EXPECT_EQ(infer1("ArgMin", {T("[batch,10]")}, A({{"keepdims", int64_t{0}}})), "[10]");
}

TEST(ShapeReduce, OurReduceGradientsTakeTheShapeInputsValues) {
  GraphBuilder b;
  ValueId x = b.input("x", "[batch,seq,16]");
  ValueId dy = b.input("dy", "[batch,seq,1]");
  ValueId shape = b.op("Shape", {x});
  ValueId dsum = b.node("ReduceSumGrad", {dy, shape}, A({{"axes", Ints{-1}}}), 1, kOurDomain)[0];
  ValueId dmean = b.node("ReduceMeanGrad", {dy, shape, b.ints({-1})}, {}, 1, kOurDomain)[0];
  ValueId bias_grad = b.node("SumToShape", {x, b.ints({16})}, {}, 1, kOurDomain)[0];
  ValueId dyn = b.node("SumToShape", {x, b.input("s", "[2]", DType::kInt64)}, {}, 1, kOurDomain)[0];
  infer_shapes(b.g);
  EXPECT_EQ(b.shape(dsum), "[batch,seq,16]");
  EXPECT_EQ(b.shape(dmean), "[batch,seq,16]");
  EXPECT_EQ(b.shape(bias_grad), "[16]");
  EXPECT_EQ(b.shape(dyn), "[?,?]") << "a run-time shape of known length: the rank";
}

TEST(ShapeNN, SoftmaxFamilyAndOurGradients) {
  EXPECT_EQ(infer1("Softmax", {T("[batch,h,seq,seq]")}, A({{"axis", int64_t{-1}}})), "[batch,h,seq,seq]");
  EXPECT_EQ(infer1("LogSoftmax", {T("[batch,5]")}), "[batch,5]");
  EXPECT_EQ(infer1("SoftmaxGrad", {T("[batch,5]"), T("[batch,5]")}, {}, kOurDomain), "[batch,5]");
  EXPECT_EQ(infer1("LogSoftmaxGrad", {T("[?]"), T("[batch,5]")}, {}, kOurDomain), "[?]");
}

TEST(ShapeNN, LossesAndTheirGradients) {
  EXPECT_EQ(infer_all("SoftmaxCrossEntropyLoss", {T("[batch,5]"), T("[batch]", DType::kInt64)}, {}, 2),
            (V{"[]", "[batch,5]"}));
  EXPECT_EQ(infer_all("SoftmaxCrossEntropyLoss", {T("[batch,5,seq]"), T("[batch,seq]", DType::kInt64)},
                      A({{"reduction", std::string("none")}}), 2),
            (V{"[batch,seq]", "[batch,5,seq]"}));
  EXPECT_EQ(infer1("NegativeLogLikelihoodLoss", {T("[batch,5]"), T("[batch]", DType::kInt64), T("[5]")},
                   A({{"reduction", std::string("sum")}})),
            "[]");
  EXPECT_EQ(infer1("NegativeLogLikelihoodLoss", {T("[batch,5]"), T("[?]", DType::kInt64)},
                   A({{"reduction", std::string("none")}})),
            "[batch]");
  EXPECT_EQ(infer1("SoftmaxCrossEntropyLossGrad", {T("[]"), T("[batch,5]"), T("[batch]", DType::kInt64)}, {}, kOurDomain),
            "[batch,5]");
  EXPECT_EQ(infer1("NegativeLogLikelihoodLossGrad", {T("[]"), T("[batch,5]"), T("[batch]", DType::kInt64)}, {},
                   kOurDomain),
            "[batch,5]");
}

TEST(ShapeNN, Normalizations) {
  EXPECT_EQ(infer_all("LayerNormalization", {T("[batch,seq,16]"), T("[16]"), T("[16]")}, {}, 3),
            (V{"[batch,seq,16]", "[batch,seq,1]", "[batch,seq,1]"}));
  EXPECT_EQ(infer_all("LayerNormalization", {T("[batch,seq,16]"), T("[seq,16]")}, A({{"axis", int64_t{1}}}), 3),
            (V{"[batch,seq,16]", "[batch,1,1]", "[batch,1,1]"}));
  EXPECT_EQ(infer_all("BatchNormalization", {T("[batch,8,h,w]"), T("[8]"), T("[8]"), T("[8]"), T("[8]")},
                      A({{"training_mode", int64_t{1}}}), 3),
            (V{"[batch,8,h,w]", "[8]", "[8]"}));
  EXPECT_EQ(infer1("InstanceNormalization", {T("[batch,8,h]"), T("[8]"), T("[8]")}), "[batch,8,h]");
}

TEST(ShapeNN, ConvWithPadsAndStridesOnKnownDims) {
  // (N, C, H, W) = (batch, 3, 32, 32), W (16, 3, 3, 3): pad 1 keeps 32; stride 2 halves it.
  EXPECT_EQ(infer1("Conv", {T("[batch,3,32,32]"), T("[16,3,3,3]"), T("[16]")}, A({{"pads", Ints{1, 1, 1, 1}}})),
            "[batch,16,32,32]");
  EXPECT_EQ(infer1("Conv", {T("[batch,3,32,32]"), T("[16,3,3,3]")},
                   A({{"pads", Ints{1, 1, 1, 1}}, {"strides", Ints{2, 2}}})),
            "[batch,16,16,16]");
  EXPECT_EQ(infer1("Conv", {T("[1,3,10]"), T("[4,3,3]")}, A({{"dilations", Ints{2}}})), "[1,4,6]");
  EXPECT_EQ(infer1("Conv", {T("[1,3,10]"), T("[4,3,3]")}, A({{"auto_pad", std::string("SAME_UPPER")}, {"strides", Ints{3}}})),
            "[1,4,4]");
  EXPECT_EQ(infer1("ConvTranspose", {T("[1,4,5]"), T("[4,2,3]")}, A({{"strides", Ints{2}}, {"group", int64_t{2}}})),
            "[1,4,11]");
}

TEST(ShapeNN, ConvOnSymbolicDimsIsAnExpressionOrUnknown) {
  EXPECT_EQ(infer1("Conv", {T("[batch,3,h,w]"), T("[16,3,3,3]")}), "[batch,16,h-2,w-2]") << "stride 1";
  EXPECT_EQ(infer1("Conv", {T("[batch,3,h]"), T("[16,3,3]")}, A({{"pads", Ints{1, 1}}})), "[batch,16,h]");
  EXPECT_EQ(infer1("Conv", {T("[batch,3,h]"), T("[16,3,3]")}, A({{"strides", Ints{2}}})),
            "[batch,16,((h-3)//2)+1]");
  EXPECT_EQ(infer1("ConvTranspose", {T("[1,4,h]"), T("[4,2,3]")}, A({{"strides", Ints{2}}})), "[1,2,2*h+1]");
  EXPECT_EQ(infer1("Conv", {T("[batch,3,h]"), T("[16,3,?]")}), "[batch,16,?]") << "kernel size unknown";
  EXPECT_EQ(infer1("MaxPool", {T("[batch,3,h]")}, A({{"kernel_shape", Ints{2}}, {"strides", Ints{2}}, {"ceil_mode", int64_t{1}}})),
            "[batch,3,?]");
}

TEST(ShapeNN, Pooling) {
  EXPECT_EQ(infer_all("MaxPool", {T("[batch,8,32,32]")}, A({{"kernel_shape", Ints{2, 2}}, {"strides", Ints{2, 2}}}), 2),
            (V{"[batch,8,16,16]", "[batch,8,16,16]"}));
  // ceil_mode: 5 with kernel 2 stride 2 gives 3 windows; the last must start inside the input.
  EXPECT_EQ(infer1("MaxPool", {T("[1,1,5]")}, A({{"kernel_shape", Ints{2}}, {"strides", Ints{2}}, {"ceil_mode", int64_t{1}}})),
            "[1,1,3]");
  EXPECT_EQ(infer1("AveragePool", {T("[1,1,5]")},
                   A({{"kernel_shape", Ints{3}}, {"strides", Ints{2}}, {"pads", Ints{1, 1}}, {"ceil_mode", int64_t{1}}})),
            "[1,1,3]");
  EXPECT_EQ(infer1("GlobalAveragePool", {T("[batch,8,h,w]")}), "[batch,8,1,1]");
}

}  // namespace
}  // namespace torch_ort
