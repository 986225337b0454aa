// Numeric gradient cases of the NN family (run by test_gradients.cc's GradCheck): LayerNormalization
// (with and without its statistics as outputs), Gelu, Erf, our Embedding and CrossEntropyLoss.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/cpp/grad_cases.h"
#include "tests/cpp/reference_eval.h"

namespace torch_ort::gradcheck {
namespace {

const std::string kOurs = std::string(kOurDomain) + "::";

// One node of our domain (add_node builds default-domain nodes).
Builder ours(const std::string& op, Attributes attrs, int num_outputs = 1) {
  return [op, attrs, num_outputs](Graph& g, const std::vector<ValueId>& in) {
    std::vector<ValueId> outs = add_node(g, op, in, attrs, num_outputs);
    g.nodes.back().domain = kOurDomain;
    return outs;
  };
}

Attributes ce(const std::string& reduction, int64_t ignore_index, float smoothing) {
  return A({{"reduction", reduction}, {"ignore_index", ignore_index}, {"label_smoothing", smoothing}});
}

const std::vector<int64_t> kLabels = {0, 3, 1, 3, 2};

REGISTER_GRAD_CASES({
    // LayerNormalization(X, Scale, [B]; axis, epsilon)
    {"LayerNorm_last_axis", "LayerNormalization", {G({3, 4}), G({4}), G({4})}},
    {"LayerNorm_axis1_3d", "LayerNormalization", {G({2, 3, 4}), G({3, 4}), G({3, 4})}, A({{"axis", I{1}}, {"epsilon", 1e-3f}})},
    {"LayerNorm_no_bias", "LayerNormalization", {G({2, 5}), G({5})}},
    {"LayerNorm_input_only", "LayerNormalization", {G({3, 4}), N({4}), N({4})}},
    {"LayerNorm_params_only", "LayerNormalization", {N({3, 4}), G({4}), G({4})}},
    {"LayerNorm_with_statistics", "LayerNormalization", {G({2, 3, 4}), G({4}), G({4})}, {}, 3},
    {"LayerNorm_statistics_only", "LayerNormalization", {G({3, 4}), G({4}), G({4})}, {}, 1,
     [](Graph& g, const std::vector<ValueId>& in) {
       std::vector<ValueId> o = add_node(g, "LayerNormalization", in, A({{"axis", I{-1}}}), 3);
       return std::vector<ValueId>{o[1], o[2]};  // Mean and InvStdDev only: dScale, dB are zero
     }},
    // Gelu / Erf
    {"Gelu_exact", "Gelu", {G({3, 4})}},
    {"Gelu_tanh", "Gelu", {G({3, 4})}, A({{"approximate", std::string("tanh")}})},
    {"Erf", "Erf", {G({3, 4})}},
    // ours Embedding(weight, indices): repeated indices sum. padding_idx (no gradient for its row)
    // and scale_grad_by_freq (divided by the index count) are conventions, not derivatives: finite
    // differences see them only where they change nothing (the row unused, each index once);
    // ReferenceEvalNn below and the Python parity rows check the conventions themselves.
    {"Embedding_repeats", kOurs + "Embedding", {G({6, 3}), L({2, 3}, {1, 4, 1, 0, 5, 4})}, {}, 1, ours("Embedding", {})},
    {"Embedding_padding_idx_unused", kOurs + "Embedding", {G({6, 3}), L({5}, {1, 4, 1, 0, 5})}, {}, 1,
     ours("Embedding", A({{"padding_idx", I{2}}}))},
    {"Embedding_scale_grad_by_freq_unique", kOurs + "Embedding", {G({6, 3}), L({4}, {2, 4, 5, 0})}, {}, 1,
     ours("Embedding", A({{"scale_grad_by_freq", I{1}}}))},
    // ours CrossEntropyLoss(scores, labels, [weights]; reduction, ignore_index, label_smoothing)
    {"CE_smooth_mean", kOurs + "CrossEntropyLoss", {G({5, 4}), L({5}, kLabels)}, {}, 1, ours("CrossEntropyLoss", ce(kMean, -100, 0.1f))},
    {"CE_smooth_mean_ignore", kOurs + "CrossEntropyLoss", {G({5, 4}), L({5}, kLabels)}, {}, 1,
     ours("CrossEntropyLoss", ce(kMean, 3, 0.2f))},
    {"CE_smooth_mean_weights_ignore", kOurs + "CrossEntropyLoss", {G({5, 4}), L({5}, kLabels), W({4})}, {}, 1,
     ours("CrossEntropyLoss", ce(kMean, 1, 0.3f))},
    {"CE_smooth_sum_weights", kOurs + "CrossEntropyLoss", {G({5, 4}), L({5}, kLabels), W({4})}, {}, 1,
     ours("CrossEntropyLoss", ce(kSum, -100, 0.1f))},
    {"CE_smooth_none_3d", kOurs + "CrossEntropyLoss", {G({2, 4, 3}), L({2, 3}, {0, 3, -1, 2, -1, 1})}, {}, 1,
     ours("CrossEntropyLoss", ce(kNone, -1, 0.1f))},
    {"CE_smooth_log_prob_output", kOurs + "CrossEntropyLoss", {G({5, 4}), L({5}, kLabels)}, {}, 1,
     [](Graph& g, const std::vector<ValueId>& in) {  // the model reads log_prob too
       std::vector<ValueId> o = ours("CrossEntropyLoss", ce(kMean, 3, 0.1f), 2)(g, in);
       return std::vector<ValueId>{o[0], add1(g, "Tanh", {o[1]})};
     }},
});

// The oracle against hand-computed values.
ref::Outs run(const std::string& op, std::vector<Tensor> ins, Attributes a, const std::string& domain) {
  ref::Ins p;
  for (auto& t : ins) p.push_back(&t);
  return ref::eval_node(Node{domain, op, "/t", {}, {}, std::move(a)}, p);
}

TEST(ReferenceEvalNn, CrossEntropyLabelSmoothing) {
  // Two classes, equal scores: log_prob = −log 2 everywhere, so NLL = l and S = 2·l (l = log 2).
  const Tensor x = Tensor::of_reals(DType::kDouble, {2, 2}, {0, 0, 1, 1}), y = ref::ints({0, 1});
  const double l = std::log(2.0);
  EXPECT_NEAR(run("CrossEntropyLoss", {x, y}, ce(kMean, -100, 0.5f), kOurDomain)[0].reals[0], l, 1e-12);
  // Ignoring sample 1 leaves sample 0; with weights (1, 3) the smoothing term is (1+3)·l/2.
  const Tensor w = Tensor::of_reals(DType::kDouble, {2}, {1, 3});
  const double want = 0.5 * l + 0.25 * 4 * l;  // (1−ε)·w_0·l + ε/C·Σw·l, divided by w_0 = 1
  EXPECT_NEAR(run("CrossEntropyLoss", {x, y, w}, ce(kMean, 1, 0.5f), kOurDomain)[0].reals[0], want, 1e-12);
}

TEST(ReferenceEvalNn, EmbeddingGradConventions) {
  const Tensor dy = Tensor::of_reals(DType::kDouble, {3, 1}, {1, 2, 4}), idx = ref::ints({0, 2, 0});
  auto dw = run("EmbeddingGrad", {dy, idx, ref::ints({3, 1})}, A({{"padding_idx", I{2}}}), kOurDomain);
  EXPECT_EQ(dw[0].reals, (std::vector<double>{5, 0, 0}));  // rows summed; padding row 2 gets nothing
  dw = run("EmbeddingGrad", {dy, idx, ref::ints({3, 1})}, A({{"scale_grad_by_freq", I{1}}}), kOurDomain);
  EXPECT_EQ(dw[0].reals, (std::vector<double>{2.5, 0, 2}));  // index 0 occurs twice
}

}  // namespace
}  // namespace torch_ort::gradcheck
