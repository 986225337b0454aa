// LogSoftmax(x, class axis) -> NegativeLogLikelihoodLoss becomes one SoftmaxCrossEntropyLoss,
// whose kernel computes the loss from the logits in one pass and whose gradient is the fused
// softmax − onehot (kernels/loss.cc, rules_nn.cc) instead of NLL's scatter followed by
// LogSoftmax's backward. F.nll_loss(F.log_softmax(x, 1), y) exports this pair (F.cross_entropy
// already exports SoftmaxCrossEntropyLoss). Fires only when the log-probabilities feed nothing
// else and are normalised along the class axis (1); otherwise the pair stays.
#include "csrc/core/passes/pass.h"
#include "csrc/core/passes/pattern.h"

namespace torch_ort {
namespace {

using namespace pattern;

class SoftmaxCrossEntropyFusion final : public Pass {
 public:
  std::string_view name() const override { return "softmax_cross_entropy_fusion"; }

  bool run(Graph& g) override {
    const GraphIndex idx(g);
    auto it = g.opset_imports.find("");
    const int64_t opset = it == g.opset_imports.end() ? 20 : it->second;
    if (opset < 13) return false;  // SoftmaxCrossEntropyLoss is an opset-13 op
    std::vector<char> drop(g.nodes.size(), 0);
    bool changed = false;
    for (NodeId i = 0; i < static_cast<NodeId>(g.nodes.size()); ++i) {
      Node& nll = g.nodes[i];
      if (!is_onnx(nll, "NegativeLogLikelihoodLoss") || !has_input(nll, 0) || !has_input(nll, 1)) continue;
      const NodeId p = idx.producer[nll.inputs[0]];
      if (p < 0 || drop[p] || !is_onnx(g.nodes[p], "LogSoftmax") || !only_read_by(g, idx, nll.inputs[0], i))
        continue;
      const Node& ls = g.nodes[p];
      if (!has_input(ls, 0)) continue;
      const int64_t r = rank_of(g, ls.inputs[0]);
      int64_t axis = ls.attrs.get_int("axis", -1);
      if (r < 2 || axis < -r || axis >= r || (axis < 0 ? axis + r : axis) != 1) continue;
      std::vector<ValueId> ins{ls.inputs[0], nll.inputs[1]};
      if (has_input(nll, 2)) ins.push_back(nll.inputs[2]);
      // In place of the loss (its target and weight are defined by then); the LogSoftmax goes.
      replace_node(nll, Node{"", "SoftmaxCrossEntropyLoss", nll.name, std::move(ins), nll.outputs, nll.attrs});
      drop[p] = 1;
      changed = true;
    }
    erase_nodes(g, drop);
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> make_softmax_cross_entropy_fusion_pass() {
  return std::make_unique<SoftmaxCrossEntropyFusion>();
}

}  // namespace torch_ort
