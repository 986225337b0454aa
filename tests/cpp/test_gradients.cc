// Numeric gradient checks: every op with a gradient rule, central finite differences in double.
// One table of cases; each runs with static shapes and with symbolic (not provably equal) shapes.
// Reproduce a failure with TORCH_ORT_GRAD_SEED=<base seed printed in the failure>.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <set>
#include <sstream>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/verifier.h"
#include "tests/cpp/grad_cases.h"
#include "tests/cpp/reference_eval.h"

namespace torch_ort {
namespace gradcheck {
std::vector<Case>& registered_cases() {
  static std::vector<Case> cases;
  return cases;
}
}  // namespace gradcheck
namespace {

using namespace gradcheck;  // NOLINT: the case vocabulary (G, N, P, Case, add1, ...)

std::vector<Case> cases() {
  std::vector<Case> c = {
      {"Add_same", "Add", {G({3, 4}), G({3, 4})}}, {"Add_row", "Add", {G({3, 4}), G({4})}},
      {"Add_outer", "Add", {G({3, 1}), G({1, 4})}}, {"Add_scalar", "Add", {G({2, 3}), G({})}},
      {"Add_one_grad", "Add", {N({3, 4}), G({4})}}, {"Sub_row", "Sub", {G({3, 4}), G({4})}},
      {"Sub_outer", "Sub", {G({3, 1}), G({1, 4})}}, {"Sub_scalar_minus_tensor", "Sub", {G({}), G({3, 4})}},
      {"Div_by_scalar", "Div", {G({3, 4}), G({})}}, {"Pow_int64_exponent", "Pow", {G({3, 4}), K({3})}}, {"Mul_same", "Mul", {G({3, 4}), G({3, 4})}},
      {"Mul_3d", "Mul", {G({2, 3, 4}), G({3, 1})}}, {"Div_both", "Div", {G({3, 4}), G({3, 4})}},
      {"Div_row", "Div", {G({3, 4}), G({1, 4})}}, {"Div_denominator_only", "Div", {N({3, 4}), G({4})}},
      {"Neg", "Neg", {G({3, 4})}}, {"Identity", "Identity", {G({3, 4})}},
      {"Cast_to_float", "Cast", {G({3, 4})}, A({{"to", kF}})}, {"Cast_same", "Cast", {G({3, 4})}, A({{"to", kD}})},
      {"Sum_three", "Sum", {G({3, 4}), G({4}), G({3, 1})}}, {"Sum_one", "Sum", {G({3, 4})}},
      {"Pow_square", "Pow", {G({3, 4}), S(2.0)}}, {"Pow_cube", "Pow", {G({3, 4}), S(3.0)}},
      {"Pow_tensor_exponent", "Pow", {P({3, 4}), N({4})}}, {"Sqrt", "Sqrt", {P({3, 4})}},
      {"Exp", "Exp", {G({3, 4})}}, {"Log", "Log", {P({3, 4})}},
      {"Where_row", "Where", {B({3, 4}), G({3, 4}), G({4})}}, {"Where_outer", "Where", {B({3, 1}), G({1, 4}), G({3, 4})}},
      {"Relu", "Relu", {G({3, 4})}}, {"Relu_3d", "Relu", {G({2, 3, 4})}},
      {"Sigmoid", "Sigmoid", {G({3, 4})}}, {"Tanh", "Tanh", {G({3, 4})}},
      {"Sin", "Sin", {G({3, 4})}}, {"Cos", "Cos", {G({3, 4})}}, {"Softplus", "Softplus", {G({3, 4})}},
      {"LeakyRelu", "LeakyRelu", {G({3, 4})}, A({{"alpha", 0.2f}})},
      // linear algebra
      {"MatMul_2d", "MatMul", {G({3, 4}), G({4, 5})}}, {"MatMul_3d_2d", "MatMul", {G({2, 3, 4}), G({4, 5})}},
      {"MatMul_A_only", "MatMul", {G({3, 4}), N({4, 5})}}, {"MatMul_B_only", "MatMul", {N({2, 3, 4}), G({4, 5})}},
      {"MatMul_batch_broadcast", "MatMul", {G({2, 1, 3, 4}), G({3, 4, 2})}},
      {"Gemm_bias_N", "Gemm", {G({3, 4}), G({4, 5}), G({5})}},
      {"Gemm_transA_bias_1", "Gemm", {G({4, 3}), G({4, 5}), G({1})}, A({{"transA", I{1}}, {"alpha", 0.5f}, {"beta", 2.0f}})},
      {"Gemm_transB_full_C", "Gemm", {G({3, 4}), G({5, 4}), G({3, 5})}, A({{"transB", I{1}}})},
      {"Gemm_transAB_row_C", "Gemm", {G({4, 3}), G({5, 4}), G({1, 5})}, A({{"transA", I{1}}, {"transB", I{1}}, {"alpha", 1.5f}})},
      {"Gemm_col_C_beta", "Gemm", {G({3, 4}), G({4, 5}), G({3, 1})}, A({{"beta", 0.5f}})},
      {"Gemm_alpha_beta_transB", "Gemm", {G({3, 4}), G({5, 4}), G({5})}, A({{"transB", I{1}}, {"alpha", 0.7f}, {"beta", 1.3f}})},
      {"Gemm_no_C", "Gemm", {G({3, 4}), G({4, 5})}}, {"Gemm_weights_only", "Gemm", {N({3, 4}), G({5, 4}), N({5})}, A({{"transB", I{1}}})},
      // softmax family
      {"Softmax_axis0", "Softmax", {G({3, 4})}, A({{"axis", I{0}}})}, {"Softmax_axis1", "Softmax", {G({3, 4})}, A({{"axis", I{1}}})},
      {"Softmax_default", "Softmax", {G({3, 4})}}, {"Softmax_3d_axis1", "Softmax", {G({2, 3, 4})}, A({{"axis", I{1}}})},
      {"LogSoftmax_axis0", "LogSoftmax", {G({3, 4})}, A({{"axis", I{0}}})},
      {"LogSoftmax_axis1", "LogSoftmax", {G({3, 4})}, A({{"axis", I{1}}})},
      {"LogSoftmax_axis_neg1", "LogSoftmax", {G({2, 3, 4})}, A({{"axis", I{-1}}})},
      // losses: scores (N, C) or (N, C, d); labels int64, some equal to ignore_index
      {"SCE_mean", "SoftmaxCrossEntropyLoss", {G({5, 4}), L({5}, {0, 3, 1, 2, 3})}, A({{"reduction", kMean}})},
      {"SCE_sum", "SoftmaxCrossEntropyLoss", {G({5, 4}), L({5}, {0, 3, 1, 2, 3})}, A({{"reduction", kSum}})},
      {"SCE_none", "SoftmaxCrossEntropyLoss", {G({5, 4}), L({5}, {0, 3, 1, 2, 3})}, A({{"reduction", kNone}})},
      {"SCE_mean_ignore", "SoftmaxCrossEntropyLoss", {G({5, 4}), L({5}, {0, 1, 3, 1, 2})}, A({{"reduction", kMean}, {"ignore_index", I{1}}})},
      {"SCE_none_ignore_neg", "SoftmaxCrossEntropyLoss", {G({5, 4}), L({5}, {0, -1, 3, -1, 2})}, A({{"reduction", kNone}, {"ignore_index", I{-1}}})},
      {"SCE_mean_weights_ignore", "SoftmaxCrossEntropyLoss", {G({5, 4}), L({5}, {0, 2, 3, 2, 1}), W({4})}, A({{"ignore_index", I{2}}})},
      {"SCE_sum_weights", "SoftmaxCrossEntropyLoss", {G({5, 4}), L({5}, {0, 2, 3, 2, 1}), W({4})}, A({{"reduction", kSum}})},
      {"SCE_3d_mean", "SoftmaxCrossEntropyLoss", {G({2, 3, 4}), L({2, 4}, {0, 1, 2, 1, 2, 2, 0, 1})}},
      {"NLL_mean", "NegativeLogLikelihoodLoss", {G({5, 4}), L({5}, {0, 3, 1, 2, 3})}},
      {"NLL_sum_weights", "NegativeLogLikelihoodLoss", {G({5, 4}), L({5}, {0, 3, 1, 2, 3}), W({4})}, A({{"reduction", kSum}})},
      {"NLL_none_ignore", "NegativeLogLikelihoodLoss", {G({5, 4}), L({5}, {0, 3, 1, 3, 2})}, A({{"reduction", kNone}, {"ignore_index", I{3}}})},
      {"NLL_mean_weights_ignore", "NegativeLogLikelihoodLoss", {G({5, 4}), L({5}, {0, 3, 1, 3, 2}), W({4})}, A({{"ignore_index", I{3}}})},
      // shape ops and reductions
      {"Reshape_infer", "Reshape", {G({2, 3, 4}), K({4, -1})}}, {"Reshape_zero", "Reshape", {G({2, 3, 4}), K({0, 12})}},
      {"Flatten_axis1", "Flatten", {G({2, 3, 4})}}, {"Flatten_axis0", "Flatten", {G({2, 3, 4})}, A({{"axis", I{0}}})},
      {"Flatten_axis_neg1", "Flatten", {G({2, 3, 4})}, A({{"axis", I{-1}}})},
      {"Squeeze_axes", "Squeeze", {G({3, 1, 4}), K({1})}}, {"Squeeze_all", "Squeeze", {G({1, 3, 1})}},
      {"Unsqueeze_axes", "Unsqueeze", {G({3, 4}), K({0, -1})}},
      {"Transpose_perm", "Transpose", {G({2, 3, 4})}, A({{"perm", Dims{2, 0, 1}}})}, {"Transpose_default", "Transpose", {G({2, 3, 4})}},
      {"Expand_rank_up", "Expand", {G({3, 1}), K({2, 3, 4})}}, {"Expand_same_rank", "Expand", {G({1, 4}), K({3, 4})}},
      {"ReduceSum_keepdims", "ReduceSum", {G({3, 4}), K({1})}}, {"ReduceSum_drop", "ReduceSum", {G({3, 4}), K({1})}, A({{"keepdims", I{0}}})},
      {"ReduceSum_two_axes_drop", "ReduceSum", {G({2, 3, 4}), K({0, -1})}, A({{"keepdims", I{0}}})},
      {"ReduceSum_all", "ReduceSum", {G({2, 3, 4})}, A({{"keepdims", I{0}}})},
      {"ReduceSum_noop", "ReduceSum", {G({3, 4})}, A({{"noop_with_empty_axes", I{1}}})},
      {"ReduceMean_keepdims", "ReduceMean", {G({3, 4}), K({0})}}, {"ReduceMean_drop", "ReduceMean", {G({3, 4}), K({-1})}, A({{"keepdims", I{0}}})},
      {"ReduceMean_two_axes", "ReduceMean", {G({2, 3, 4}), K({0, 2})}},
      {"ReduceMean_all", "ReduceMean", {G({2, 3, 4}), Omit()}, A({{"keepdims", I{0}}})},
      {"ReduceMean_noop", "ReduceMean", {G({3, 4})}, A({{"noop_with_empty_axes", I{1}}})},
  };
  // Small graphs: fan-out, non-differentiable edges inside a path, an MLP.
  c.push_back({"FanOut_x_times_x_plus_x", "Mul", {G({3, 4})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{add1(g, "Add", {add1(g, "Mul", {in[0], in[0]}), in[0]})};
  }});
  c.push_back({"FanOut_broadcast_both", "Add", {N({3, 4}), G({4})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{add1(g, "Mul", {add1(g, "Add", {in[0], in[1]}), in[1]})};  // (A + x) * x
  }});
  c.push_back({"Output_is_input_and_twice", "Relu", {G({3, 4})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    ValueId r = add1(g, "Relu", {in[0]});
    return std::vector<ValueId>{in[0], r, r};
  }});
  c.push_back({"FanOut_two_outputs", "Tanh", {G({3, 4})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    ValueId t = add1(g, "Tanh", {in[0]});
    return std::vector<ValueId>{add1(g, "Relu", {t}), add1(g, "Mul", {t, in[0]})};
  }});
  c.push_back({"Reshape_to_shape_of_other", "Shape", {G({2, 6}), N({3, 4})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{add1(g, "Mul", {add1(g, "Reshape", {in[0], add1(g, "Shape", {in[1]})}), in[1]})};
  }});
  c.push_back({"SCE_log_prob_not_an_output", "SoftmaxCrossEntropyLoss", {G({5, 4}), L({5}, {0, 3, 1, 2, 3})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) {
                 return std::vector<ValueId>{add_node(g, "SoftmaxCrossEntropyLoss", {in[0], in[1]}, {}, 2)[0]};
               }});
  c.push_back({"ReduceSum_axes_from_Constant", "ReduceSum", {G({2, 3, 4})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    ValueId axes = add1(g, "Constant", {}, A({{"value", TensorData::from_int64s({1})}}));
    return std::vector<ValueId>{add1(g, "ReduceSum", {in[0], axes}, A({{"keepdims", I{0}}}))};
  }});
  // Dropout: (data, ratio, training_mode=true) uses the forward's mask; without training_mode it
  // is an identity. The oracle's mask is a fixed hash, so finite differences see one mask.
  for (const bool with_ratio : {true, false}) {
    c.push_back({with_ratio ? "Dropout_training" : "Dropout_training_default_ratio", "Dropout", {G({3, 4})}, {}, 1,
                 [with_ratio](Graph& g, const std::vector<ValueId>& in) {
                   ValueId ratio = kNoValue;
                   if (with_ratio) {
                     ratio = g.new_value("ratio", DType::kDouble, Shape::of({}));
                     g.initializers[ratio] = TensorData::scalar_float(DType::kDouble, 0.3);
                   }
                   ValueId train = g.new_value("training_mode", DType::kBool, Shape::of({}));
                   g.initializers[train] = TensorData{DType::kBool, {}, std::string(1, '\1')};
                   return std::vector<ValueId>{add1(g, "Dropout", {in[0], ratio, train})};
                 }});
  }
  c.push_back({"Dropout_inference_identity", "Dropout", {G({3, 4})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{add1(g, "Dropout", {in[0]})};
  }});
  c.push_back({"Cast_roundtrip", "Cast", {G({3, 4})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
    ValueId f = add1(g, "Cast", {in[0]}, A({{"to", kF}}));
    return std::vector<ValueId>{add1(g, "Cast", {add1(g, "Sigmoid", {f})}, A({{"to", kD}}))};
  }});
  c.push_back({"MLP_classifier", "Gemm", {N({4, 3}), G({5, 3}), G({5}), G({5, 2}), G({2}), L({4}, {0, 1, 1, 0})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) {
                 ValueId h = add1(g, "Relu", {add1(g, "Gemm", {in[0], in[1], in[2]}, A({{"transB", I{1}}}))});
                 ValueId logits = add1(g, "Add", {add1(g, "MatMul", {h, in[3]}), in[4]});
                 return std::vector<ValueId>{add1(g, "SoftmaxCrossEntropyLoss", {logits, in[5]})};
               }});
  c.push_back({"MLP_regression_mse", "ReduceMean", {N({4, 3}), G({3, 2}), G({2}), N({4, 2})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) {
                 ValueId y = add1(g, "Tanh", {add1(g, "Add", {add1(g, "MatMul", {in[0], in[1]}), in[2]})});
                 ValueId d = add1(g, "Sub", {y, in[3]});
                 ValueId two = add1(g, "Constant", {}, A({{"value", TensorData::scalar_float(DType::kDouble, 2.0)}}));
                 return std::vector<ValueId>{add1(g, "ReduceMean", {add1(g, "Pow", {d, two})}, A({{"keepdims", I{0}}}))};
               }});
  for (const Case& extra : registered_cases()) c.push_back(extra);
  return c;
}

// ----- the oracle itself, against hand-computed values ---------------------------------------
ref::Outs run(const std::string& op, std::vector<Tensor> ins, Attributes a = {}, const std::string& domain = "") {
  ref::Ins p;
  for (auto& t : ins) p.push_back(&t);
  return ref::eval_node(Node{domain, op, "/t", {}, {}, std::move(a)}, p);
}
Tensor T(Dims s, std::vector<double> d) { return Tensor::of_reals(DType::kDouble, std::move(s), std::move(d)); }

TEST(ReferenceEval, CrossEntropyWeightsAndIgnoreIndex) {
  Tensor scores = T({2, 3}, {0, 0, 0, 1, 2, 3}), labels = ref::ints({0, 2}), w = T({3}, {1, 2, 3});
  const double l0 = std::log(3.0), l1 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  EXPECT_NEAR(run("SoftmaxCrossEntropyLoss", {scores, labels, w})[0].reals[0], (l0 + 3 * l1) / 4, 1e-12);
  EXPECT_NEAR(run("SoftmaxCrossEntropyLoss", {scores, labels, w}, A({{"reduction", kSum}}))[0].reals[0], l0 + 3 * l1, 1e-12);
  EXPECT_NEAR(run("SoftmaxCrossEntropyLoss", {scores, labels}, A({{"ignore_index", I{2}}}))[0].reals[0], l0, 1e-12);
  auto none = run("NegativeLogLikelihoodLoss", {scores, labels, w}, A({{"reduction", kNone}}));
  EXPECT_EQ(none[0].reals, (std::vector<double>{-0.0, -9.0}));
}

TEST(ReferenceEval, ShapesAndLinearAlgebra) {
  auto z = [](Dims s) { return ref::zeros(DType::kDouble, s); };
  EXPECT_EQ(run("MatMul", {z({2, 1, 3, 4}), z({3, 4, 2})})[0].shape, (Dims{2, 3, 3, 2}));
  EXPECT_EQ(run("MatMul", {z({4}), z({4, 5})})[0].shape, (Dims{5}));
  EXPECT_EQ(run("MatMul", {z({2, 3, 4}), z({4})})[0].shape, (Dims{2, 3}));
  EXPECT_EQ(run("Reshape", {z({2, 3, 4}), ref::ints({0, -1})})[0].shape, (Dims{2, 12}));
  EXPECT_EQ(run("Gemm", {T({1, 2}, {1, 2}), T({1, 2}, {3, 4}), T({1}, {1})}, A({{"transA", I{1}}, {"alpha", 2.0f}}))[0].reals,
            (std::vector<double>{7, 9, 13, 17}));
  EXPECT_EQ(run("SumToShape", {T({2, 3}, {1, 2, 3, 4, 5, 6}), ref::ints({1, 3})}, {}, kOurDomain)[0].reals,
            (std::vector<double>{5, 7, 9}));
  auto rg = run("ReduceMeanGrad", {T({2}, {6, 9}), ref::ints({2, 3})}, A({{"axes", Dims{1}}, {"keepdims", I{0}}}), kOurDomain);
  EXPECT_EQ(rg[0].reals, (std::vector<double>{2, 2, 2, 3, 3, 3}));
  EXPECT_THROW(run("Einsum", {z({2})}), std::runtime_error);
}

// ----- building and checking one case -------------------------------------------------------
struct Built {
  Graph g;
  std::vector<bool> requires_grad;        // per g.inputs
  std::map<ValueId, Tensor> feeds;     // per g.inputs
};

Tensor random_tensor(Kind k, DType dt, const Dims& shape, std::mt19937_64& rng) {
  Tensor t = ref::zeros(dt, shape);
  std::uniform_real_distribution<double> mag(0.3, 1.3), pos(0.5, 2.0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (k == Kind::kBool) ref::set(t, i, double(rng() % 2));
    else if (k == Kind::kPositive || k == Kind::kPositiveNoGrad) ref::set(t, i, pos(rng));
    else ref::set(t, i, (rng() % 2 ? 1 : -1) * mag(rng));  // away from 0: Relu kink, Div denominators
  }
  return t;
}

Built build_case(const Case& c, bool dynamic, std::mt19937_64& rng) {
  Built b;
  Graph& g = b.g;
  std::vector<ValueId> ins;
  for (size_t i = 0; i < c.ins.size(); ++i) {
    const In& in = c.ins[i];
    const std::string name = "in" + std::to_string(i);
    if (in.kind == Kind::kOmitted) { ins.push_back(kNoValue); continue; }
    if (in.kind == Kind::kConstInts || in.kind == Kind::kConstScalar) {
      TensorData t = in.kind == Kind::kConstInts ? TensorData::from_int64s(in.ints)
                                                 : TensorData::scalar_float(DType::kDouble, in.scalar);
      std::vector<Dim> dims;
      for (int64_t d : t.dims) dims.push_back(Dim::known(d));
      ins.push_back(g.add_value(name, t.dtype, Shape::of(dims)));
      g.initializers[ins.back()] = t;
      continue;
    }
    DType dt = in.kind == Kind::kLabels ? DType::kInt64 : in.kind == Kind::kBool ? DType::kBool : DType::kDouble;
    std::vector<Dim> dims;
    for (size_t d = 0; d < in.shape.size(); ++d)
      dims.push_back(dynamic ? Dim::symbolic(name + "_d" + std::to_string(d)) : Dim::known(in.shape[d]));
    ins.push_back(g.add_value(name, dt, Shape::of(dims)));
    g.inputs.push_back(ins.back());
    b.requires_grad.push_back(wants_grad(in.kind));
    b.feeds[ins.back()] = in.kind == Kind::kLabels
        ? Tensor::of_ints(DType::kInt64, in.shape, in.ints)
        : random_tensor(in.kind, dt, in.shape, rng);
  }
  g.outputs = c.build ? c.build(g, ins) : add_node(g, c.op, ins, c.attrs, c.num_outputs);
  // Type the node outputs from a reference run, as the importer would from ONNX shape inference.
  auto env = ref::evaluate(g, b.feeds);
  for (const Node& n : g.nodes)
    for (ValueId v : n.outputs) {
      const Tensor& t = env.at(v);
      std::vector<Dim> dims;
      for (int64_t d : t.shape) dims.push_back(dynamic ? Dim{} : Dim::known(d));
      g.value(v).dtype = t.dtype;
      g.value(v).shape = Shape::of(dims);
    }
  return b;
}

double objective(const Graph& g, const std::map<ValueId, Tensor>& feeds,
                 const std::vector<std::pair<ValueId, Tensor>>& grad_of) {  // sum(output * grad_output)
  auto env = ref::evaluate(g, feeds);
  double s = 0;
  for (const auto& [v, go] : grad_of)
    for (int64_t j = 0; j < go.numel(); ++j) s += env.at(v).at(j) * go.at(j);
  return s;
}

// Returns one message per problem found (empty: the gradients are right).
std::vector<std::string> check_gradients(const Built& b, const TrainingGraph& tg, std::mt19937_64& rng) {
  std::vector<std::string> errs;
  const Graph& g = b.g;
  if (tg.input_grads.size() != g.inputs.size() || tg.grad_of_outputs.size() != g.outputs.size())
    return {"input_grads / grad_of_outputs sizes do not match the graph's inputs / outputs"};
  auto fwd = ref::evaluate(g, b.feeds);
  std::map<ValueId, Tensor> feeds = b.feeds;
  std::vector<std::pair<ValueId, Tensor>> grad_of;  // (forward output, its gradient); outputs may repeat
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    if (tg.grad_of_outputs[k] == kNoValue) continue;
    const Tensor& y = fwd.at(g.outputs[k]);
    grad_of.emplace_back(g.outputs[k], random_tensor(Kind::kGrad, y.dtype, y.shape, rng));
    feeds[tg.grad_of_outputs[k]] = grad_of.back().second;
  }
  std::map<ValueId, Tensor> env;
  try {
    ref::evaluate(tg.graph, b.feeds, tg.num_forward_nodes);  // forward must not read backward values
    env = ref::evaluate(tg.graph, feeds);
  } catch (const std::exception& e) {
    return {std::string("evaluating the training graph: ") + e.what()};
  }
  for (ValueId y : g.outputs)
    if (env.at(y).reals != fwd.at(y).reals || env.at(y).ints != fwd.at(y).ints)
      errs.push_back("forward output '" + g.value(y).name + "' changed");
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const ValueId x = g.inputs[i], gx = tg.input_grads[i];
    const std::string who = "input " + std::to_string(i) + " ('" + g.value(x).name + "')";
    if (!b.requires_grad[i] || gx == kNoValue) {
      if (b.requires_grad[i] != (gx != kNoValue)) errs.push_back(who + ": gradient presence is wrong");
      continue;
    }
    const Tensor &xv = b.feeds.at(x), &ga = env.at(gx);
    const Value& decl = tg.graph.value(gx);
    if (ga.shape != xv.shape || ga.dtype != xv.dtype || decl.dtype != xv.dtype ||
        (decl.shape.rank_known && decl.shape.rank() != int64_t(xv.shape.size())))
      { errs.push_back(who + ": gradient dtype/shape differs from the input's"); continue; }
    int reported = 0;
    for (size_t j = 0; j < xv.reals.size(); ++j) {
      auto f = [&](double d) { auto p = b.feeds; p[x].reals[j] += d; return objective(g, p, grad_of); };
      const double num = (f(kEps) - f(-kEps)) / (2 * kEps), ana = ga.reals[j];
      if (!(std::abs(ana - num) <= kAtol + kRtol * std::abs(num)) && reported++ < 3) {
        std::ostringstream os;
        os.precision(10);
        os << who << " element " << j << ": analytic " << ana << " vs numeric " << num;
        errs.push_back(os.str());
      }
    }
  }
  return errs;
}

uint64_t base_seed() {
  const char* s = std::getenv("TORCH_ORT_GRAD_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20240601;
}

class GradCheck : public ::testing::TestWithParam<std::tuple<Case, bool>> {};

TEST_P(GradCheck, MatchesFiniteDifferences) {
  const auto& [c, dynamic] = GetParam();
  const uint64_t seed = base_seed() ^ std::hash<std::string>{}(c.name + (dynamic ? "/dyn" : "/static"));
  SCOPED_TRACE("case " + c.name + (dynamic ? " (symbolic shapes)" : " (static shapes)") + ", seed " +
               std::to_string(seed) + " (TORCH_ORT_GRAD_SEED=" + std::to_string(base_seed()) + ")");
  std::mt19937_64 rng(seed);
  Built b = build_case(c, dynamic, rng);
  TrainingGraph tg;
  try {
    tg = build_training_graph(b.g, b.requires_grad);
  } catch (const std::exception& e) {
    FAIL() << "build_training_graph threw: " << e.what();
  }
  EXPECT_NO_THROW(verify(as_exportable_graph(tg)));
  std::vector<std::string> errs = check_gradients(b, tg, rng);
  std::string all;
  for (const auto& e : errs) all += "\n  " + e;
  EXPECT_TRUE(errs.empty()) << all;
}

INSTANTIATE_TEST_SUITE_P(Ops, GradCheck, ::testing::Combine(::testing::ValuesIn(cases()), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + (std::get<1>(info.param) ? "_symbolic" : "_static");
                         });

// Every case above checks a rule that exists (a case for a removed or renamed rule would pass
// vacuously). Not every rule needs a case here: every differentiable op's gradient is checked
// against torch.autograd by its parity row (tests/python/test_op_gradients.py, which fails for an
// op without one); these torch-free checks are a second oracle that also runs under the
// sanitizers, kept for the rules written before that and for ops of ours no eager op matches.
TEST(GradCheckCoverage, EveryCaseChecksAnExistingRule) {
  const auto& reg = GradientRegistry::instance();
  ASSERT_FALSE(reg.ops().empty()) << "no gradient rules registered (static registration dropped by the linker?)";
  size_t rules = 0;
  for (const std::string& key : reg.ops()) {
    const size_t sep = key.find("::");
    const GradientEntry* e = reg.find(key.substr(0, sep), key.substr(sep + 2));
    ASSERT_NE(e, nullptr) << key;
    rules += e->rule ? 1 : 0;
  }
  std::set<std::string> covered;
  for (const Case& c : cases()) {  // "Op" (ONNX domain) or "domain::Op"
    const size_t sep = c.op.find("::");
    const std::string domain = sep == std::string::npos ? "" : c.op.substr(0, sep);
    const std::string op = sep == std::string::npos ? c.op : c.op.substr(sep + 2);
    const GradientEntry* e = reg.find(domain, op);
    EXPECT_NE(e, nullptr) << "case " << c.name << " names " << c.op << ", which has no gradient entry";
    covered.insert(domain + "::" + op);
  }
  EXPECT_GE(covered.size() + 2, rules * 9 / 10) << "most rules keep a torch-free numeric case";
}

// The checker itself must be able to fail: a wrong backward node is caught.
TEST(GradCheckSelfTest, DetectsAWrongRule) {
  std::mt19937_64 rng(7);
  Built b = build_case({"Mul_same", "Mul", {G({3, 4}), G({3, 4})}}, false, rng);
  TrainingGraph tg = build_training_graph(b.g, b.requires_grad);
  ASSERT_GT(tg.graph.nodes.size(), tg.num_forward_nodes);
  tg.graph.nodes.back().op_type = "Add";  // dA = dY + B instead of dY * B (or vice versa)
  EXPECT_FALSE(check_gradients(b, tg, rng).empty());
}

}  // namespace
}  // namespace torch_ort
