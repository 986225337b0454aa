// The op-traits registry (csrc/core/ir/op_traits.h): each trait holds exactly the ops the stages
// relied on when they kept their own lists (cse, elementwise_chain_fusion, recompute, placement,
// memory planning, type inference, autodiff), and every entry names an op the core knows.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/op_traits.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

std::pair<std::string, std::string> split_key(const std::string& key) {
  const size_t sep = key.find("::");
  return {key.substr(0, sep), key.substr(sep + 2)};
}

// "domain::op" of every entry whose traits satisfy `pred`.
template <typename Pred>
std::set<std::string> ops_where(Pred pred) {
  std::set<std::string> out;
  for (const std::string& key : op_traits_ops()) {
    const auto [domain, op] = split_key(key);
    if (pred(*find_op(domain, op))) out.insert(key);
  }
  return out;
}

std::set<std::string> onnx(std::initializer_list<const char*> ops) {
  std::set<std::string> out;
  for (const char* op : ops) out.insert(std::string("::") + op);
  return out;
}
std::set<std::string> ours(std::initializer_list<const char*> ops) {
  std::set<std::string> out;
  for (const char* op : ops) out.insert(std::string(kOurDomain) + "::" + op);
  return out;
}
std::set<std::string> both(std::set<std::string> a, const std::set<std::string>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

Node node(const std::string& domain, const std::string& op) { return Node{domain, op, "n", {}, {}, {}}; }

TEST(OpTraits, LookupByDomainAndOp) {
  ASSERT_NE(find_op("", "Add"), nullptr);
  EXPECT_EQ(find_op("", "NoSuchOp"), nullptr);
  EXPECT_EQ(find_op(kOurDomain, "Add"), nullptr);    // our domain has no Add
  EXPECT_EQ(find_op("", "BiasDropout"), nullptr);    // ...and ONNX no BiasDropout
  EXPECT_NE(find_op(kOurDomain, "BiasDropout"), nullptr);
  // A node of an op without an entry has no traits: every stage takes its conservative path.
  const OpTraits& none = op_traits(node("", "NoSuchOp"));
  EXPECT_FALSE(none.random || none.opaque || none.recomputable || none.commutative || none.host_computable);
  EXPECT_EQ(none.view, ViewRule::kNever);
  EXPECT_EQ(none.fused, FusedInstr::kNone);
}

// cse must never merge two draws, and recompute must never clone one. DropoutGrad replays a
// mask: not random.
TEST(OpTraits, RandomOpsAreExactlyTheOnesThatDraw) {
  EXPECT_EQ(ops_where([](const OpTraits& t) { return t.random; }),
            both(onnx({"Bernoulli", "Dropout", "Multinomial", "RandomNormal", "RandomNormalLike",
                       "RandomUniform", "RandomUniformLike"}),
                 ours({"BiasDropout"})));
  EXPECT_TRUE(is_random(node("", "Dropout")));
  EXPECT_TRUE(is_random(node(kOurDomain, "BiasDropout")));
  EXPECT_FALSE(is_random(node(kOurDomain, "DropoutGrad")));
  EXPECT_FALSE(is_random(node("", "Add")));
}

// Attention draws only with a dropout rate: then cse and recompute leave it alone, as a Dropout.
TEST(OpTraits, AttentionIsRandomOnlyWithDropout) {
  Node plain = node(kOurDomain, "Attention");
  EXPECT_FALSE(is_random(plain));
  EXPECT_TRUE(is_recomputable(plain));
  Node dropping = plain;
  dropping.attrs.set("dropout", 0.1f);
  EXPECT_TRUE(is_random(dropping));
  EXPECT_FALSE(is_recomputable(dropping));
  dropping.attrs.set("dropout", 0.0f);
  EXPECT_FALSE(is_random(dropping));
}

TEST(OpTraits, OpaqueOpsRunCodeWeDoNotControl) {
  EXPECT_EQ(ops_where([](const OpTraits& t) { return t.opaque; }),
            both(ours({"ATenOp", "ATenOpGrad", "PythonOp"}), {"org.pytorch.aten::ATen"}));
}

// planner/memory.cc bounds their row counts by their input 0's elements.
TEST(OpTraits, OpsThatSelectRowsByData) {
  EXPECT_EQ(ops_where([](const OpTraits& t) { return t.selects_rows; }), ours({"LabelRows", "PaddingRows"}));
}

TEST(OpTraits, NothingRandomIsRecomputable) {
  EXPECT_TRUE(ops_where([](const OpTraits& t) { return t.random && t.recomputable; }).empty());
}

// elementwise_chain_fusion emits these; kernels/fused_elementwise.cc runs exactly these.
TEST(OpTraits, FusedElementwiseInstructions) {
  EXPECT_EQ(ops_where([](const OpTraits& t) { return t.fused == FusedInstr::kUnary; }),
            onnx({"Erf", "Exp", "Log", "Neg", "Reciprocal", "Relu", "Sigmoid", "Sqrt", "Tanh"}));
  EXPECT_EQ(ops_where([](const OpTraits& t) { return t.fused == FusedInstr::kBinary; }),
            onnx({"Add", "Div", "Mul", "Pow", "Sub"}));
}

TEST(OpTraits, CommutativeOps) {
  EXPECT_EQ(ops_where([](const OpTraits& t) { return t.commutative; }),
            onnx({"Add", "And", "Equal", "Max", "Mean", "Min", "Mul", "Or", "Sum", "Xor"}));
  EXPECT_FALSE(op_traits(node("", "Sub")).commutative);
}

TEST(OpTraits, RecomputableOps) {
  EXPECT_EQ(ops_where([](const OpTraits& t) { return t.recomputable; }),
            both(onnx({"Abs", "Add", "And", "Cast", "Concat", "ConstantOfShape", "Div", "Equal", "Erf",
                       "Exp", "Expand", "Flatten", "Gather", "Gelu", "Gemm", "Greater", "GreaterOrEqual",
                       "Identity", "LayerNormalization", "Less", "LessOrEqual", "Log", "LogSoftmax",
                       "MatMul", "Max", "Min", "Mul", "Neg", "Not", "Or", "Pow", "Range", "Reciprocal",
                       "Relu", "Reshape", "Sigmoid", "Slice", "Softmax", "SoftmaxCrossEntropyLoss",
                       "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Transpose", "Unsqueeze", "Where"}),
                 ours({"Attention", "BiasGelu", "FusedElementwise", "FusedMatMul", "SkipLayerNorm"})));
}

TEST(OpTraits, HostPlacement) {
  EXPECT_EQ(ops_where([](const OpTraits& t) { return t.host_computable; }),
            both(onnx({"Abs", "Add", "And", "Cast", "CastLike", "Concat", "ConstantOfShape", "Div",
                       "Equal", "Exp", "Expand", "Flatten", "Gather", "Greater", "GreaterOrEqual",
                       "Identity", "Less", "LessOrEqual", "Log", "Max", "Min", "Mul", "Neg", "Not", "Or",
                       "Pow", "Range", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum",
                       "Reshape", "Slice", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tile", "Transpose",
                       "Unsqueeze", "Where", "Xor"}),
                 ours({"FusedElementwise"})));
  EXPECT_EQ(ops_where([](const OpTraits& t) { return t.reads_metadata_only; }), onnx({"Shape", "Size"}));
  // The inputs kernels read as numbers (KernelCtx::input_ints / input_scalar / input_flag), as
  // placement had them before the traits: each must stay. A new op adds its own line to its
  // family file (a parity row catches a missing one: the runtime refuses an undeclared host read).
  const std::map<std::string, std::vector<int>> host_inputs = {
      {"::ConstantOfShape", {0}}, {"::Dropout", {1, 2}}, {"::Expand", {1}}, {"::Pad", {1, 2, 3}},
      {"::Range", {0, 1, 2}}, {"::ReduceMax", {1}}, {"::ReduceMean", {1}}, {"::ReduceMin", {1}},
      {"::ReduceProd", {1}}, {"::ReduceSum", {1}}, {"::Reshape", {1}}, {"::Slice", {1, 2, 3, 4}},
      {"::Split", {1}}, {"::Squeeze", {1}}, {"::Tile", {1, 2}}, {"::Trilu", {1}}, {"::Unsqueeze", {1}},
      {"com.torch_ort::AttentionGrad", {8}}, {"com.torch_ort::AveragePoolGrad", {1}},
      {"com.torch_ort::BiasDropout", {3, 4}}, {"com.torch_ort::DropoutGrad", {2, 3}},
      {"com.torch_ort::EmbeddingGrad", {2}}, {"com.torch_ort::GatherElementsGrad", {1}},
      {"com.torch_ort::GatherGrad", {1}}, {"com.torch_ort::GatherNDGrad", {1}},
      {"com.torch_ort::GroupedMatMul", {2}}, {"com.torch_ort::GroupedMatMulGrad", {3}},
      {"com.torch_ort::MaxPoolGrad", {2}}, {"com.torch_ort::ReduceMeanGrad", {1, 2}},
      {"com.torch_ort::ReduceSumGrad", {1, 2}}, {"com.torch_ort::SliceGrad", {1, 2, 3, 4, 5}},
      {"com.torch_ort::SplitGrad", {0, 1}}, {"com.torch_ort::SumToShape", {1}},
      {"com.torch_ort::TileGrad", {1}}};
  std::map<std::string, std::vector<int>> registered;
  for (const std::string& key : op_traits_ops()) {
    const auto [domain, op] = split_key(key);
    if (!find_op(domain, op)->host_inputs.empty()) registered[key] = find_op(domain, op)->host_inputs;
  }
  for (const auto& [key, inputs] : host_inputs) EXPECT_EQ(registered[key], inputs) << key;
}

TEST(OpTraits, InplaceOperands) {
  EXPECT_EQ(find_op("", "Add")->inplace_inputs, (std::vector<int>{0, 1}));
  EXPECT_EQ(find_op("", "Mul")->inplace_inputs, (std::vector<int>{0, 1}));
  EXPECT_EQ(find_op("", "Sub")->inplace_inputs, (std::vector<int>{0}));
  EXPECT_EQ(find_op("", "Div")->inplace_inputs, (std::vector<int>{0}));
  EXPECT_EQ(find_op("", "Sum")->inplace_inputs, (std::vector<int>{0}));
  EXPECT_EQ(find_op(kOurDomain, "GatherGrad")->inplace_inputs, (std::vector<int>{3}));  // the accumulator
  EXPECT_EQ(ops_where([](const OpTraits& t) { return !t.inplace_inputs.empty(); }),
            both(onnx({"Add", "Div", "Mul", "Sub", "Sum"}), ours({"EmbeddingGrad", "GatherGrad"})));
}

TEST(OpTraits, ViewRules) {
  EXPECT_EQ(ops_where([](const OpTraits& t) { return t.view != ViewRule::kNever; }),
            both(onnx({"Cast", "CastLike", "Dropout", "Expand", "Flatten", "Identity", "ReduceMean",
                       "ReduceSum", "Reshape", "Slice", "Split", "Squeeze", "Sum", "Transpose", "Unsqueeze"}),
                 ours({"ATenOp", "BiasDropout", "ConcatGrad", "DecisionCheck", "DropoutGrad", "PaddingMaskCheck", "PythonOp", "ReduceSumGrad",
                       "SumToShape"})));
  EXPECT_EQ(find_op("", "Flatten")->view, ViewRule::kReshape);
  EXPECT_EQ(find_op(kOurDomain, "ConcatGrad")->view, ViewRule::kSplit);
}

TEST(OpTraits, FixedOutputDtypes) {
  auto fixed = [](DType d) {
    return ops_where([d](const OpTraits& t) {
      return std::find(t.output_dtypes.begin(), t.output_dtypes.end(), d) != t.output_dtypes.end();
    });
  };
  EXPECT_EQ(fixed(DType::kBool), onnx({"And", "Dropout", "Equal", "Greater", "GreaterOrEqual", "IsInf",
                                       "IsNaN", "Less", "LessOrEqual", "Not", "Or", "Xor"}));
  std::set<std::string> int64 = onnx({"ArgMax", "ArgMin", "MaxPool", "NonZero", "Shape", "Size"});
  int64.merge(ours({"LabelRows", "PaddingRows"}));
  EXPECT_EQ(fixed(DType::kInt64), int64);
  EXPECT_EQ(find_op("", "Dropout")->output_dtypes, (std::vector<DType>{DType::kUndefined, DType::kBool}));
}

TEST(OpTraits, GradientsThatNeedOptionalForwardOutputs) {
  EXPECT_EQ(ops_where([](const OpTraits& t) { return t.add_outputs_for_gradient != nullptr; }),
            both(onnx({"Dropout", "LayerNormalization", "MaxPool", "SoftmaxCrossEntropyLoss"}),
                 ours({"CrossEntropyLoss", "LinearCrossEntropy"})));
}

// An entry names an op the core knows (a shape rule or a gradient decision), which catches a
// misspelt name: the real op would silently lose its traits. The exceptions are ops we only
// name to keep away from cse: ONNX's random generators and torch.onnx's ATen fallback.
TEST(OpTraits, EveryEntryIsAnOpTheCoreKnows) {
  const std::set<std::string> named_only = both(
      onnx({"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike"}),
      {"org.pytorch.aten::ATen"});
  std::vector<std::string> unknown;
  for (const std::string& key : op_traits_ops()) {
    const auto [domain, op] = split_key(key);
    if (!ShapeRegistry::instance().find(domain, op) && !GradientRegistry::instance().find(domain, op) &&
        !named_only.count(key))
      unknown.push_back(key);
  }
  EXPECT_TRUE(unknown.empty()) << ::testing::PrintToString(unknown);
}

}  // namespace
}  // namespace torch_ort
