// LogSoftmax(x, class axis) -> NegativeLogLikelihoodLoss becomes one SoftmaxCrossEntropyLoss,
// whose kernel computes the loss from the logits in one pass and whose gradient is the fused
// softmax − onehot (kernels/nn_loss.cc, ops/nn.cc) instead of NLL's scatter followed by
// LogSoftmax's backward. F.nll_loss(F.log_softmax(x, 1), y) exports this pair (F.cross_entropy
// already exports SoftmaxCrossEntropyLoss). Fires only when the log-probabilities feed nothing
// else and are normalised along the class axis (1); otherwise the pair stays.
#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/passes/rewrite.h"

namespace torch_ort {
namespace {

using namespace pattern;

// The log-probabilities normalised along the class axis (1) of logits of rank >= 2.
bool over_classes(const Graph& g, const Node& log_softmax) {
  const int64_t r = rank_of(g, log_softmax.inputs[0]);
  const int64_t axis = log_softmax.attrs.get_int("axis", -1);
  return r >= 2 && axis >= -r && axis < r && (axis < 0 ? axis + r : axis) == 1;
}

bool opset_at_least_13(const Graph& g) {  // SoftmaxCrossEntropyLoss is an opset-13 op
  auto it = g.opset_imports.find("");
  return (it == g.opset_imports.end() ? 20 : it->second) >= 13;
}

const rewrite::Rule kRule{
    "NegativeLogLikelihoodLoss(LogSoftmax(x, axis 1), target, [weight]) -> SoftmaxCrossEntropyLoss",
    rewrite::op("NegativeLogLikelihoodLoss").in({
        rewrite::from(rewrite::op("LogSoftmax").as("log_softmax").in({rewrite::val("x")})),
        rewrite::val("target"), rewrite::opt("weight")}),
    [](const Graph& g, const rewrite::Match& m) {
      return opset_at_least_13(g) && over_classes(g, g.nodes[m.node("log_softmax")]);
    },
    [](const Graph&, const rewrite::Match& m, const Node& nll) {
      std::vector<ValueId> ins{m.value("x"), m.value("target")};
      if (m.value("weight") != kNoValue) ins.push_back(m.value("weight"));
      // In place of the loss (its target and weight are defined by then); the LogSoftmax goes.
      return Node{"", "SoftmaxCrossEntropyLoss", nll.name, std::move(ins), nll.outputs, nll.attrs};
    }};

class SoftmaxCrossEntropyFusion final : public Pass {
 public:
  std::string_view name() const override { return "softmax_cross_entropy_fusion"; }
  bool run(Graph& g) override { return rewrite::apply(g, {kRule}); }
};

}  // namespace

std::unique_ptr<Pass> make_softmax_cross_entropy_fusion_pass() {
  return std::make_unique<SoftmaxCrossEntropyFusion>();
}

}  // namespace torch_ort
