// split_grad_join (training graph): a SplitGrad along the last axis whose pieces are all
// gradients of one FusedElementwiseGrad, read by nothing else, goes; that FusedElementwiseGrad
// writes them side by side into the SplitGrad's output itself (attribute `join`: its input
// positions, in the order of the pieces), so the pieces are never concatenated.
//
//   FusedElementwiseGrad(dY, gate, up) -> (dgate, dup);  SplitGrad(shape, split, dgate, dup) -> dX
//     -> FusedElementwiseGrad<join = [1, 2]>(dY, gate, up) -> (dX, -)
//
// The backward of a fused gate/up projection split in two halves feeding one elementwise chain
// (SwiGLU of the experts of Mixtral and Qwen2-MoE, Phi-3's MLP). Each piece must have the chain's
// own shape (dY's; not a gradient summed down from a broadcast input): the pass proves it from the
// shapes, and the kernel checks it.
#include <algorithm>
#include <optional>
#include <utility>

#include "csrc/core/ir/pattern.h"
#include "csrc/core/passes/pass.h"

namespace torch_ort {
namespace {

using namespace pattern;

// The FusedElementwiseGrad node and the outputs (output k: the gradient of forward input k) that
// are the pieces of SplitGrad `s`, in order, when each is read by `s` alone; nullopt otherwise.
std::optional<std::pair<NodeId, std::vector<int64_t>>> pieces_of(const Graph& g, const GraphIndex& idx,
                                                                 const Node& s, NodeId s_id) {
  if (s.inputs.size() < 4) return std::nullopt;  // shape, split, two pieces or more
  NodeId feg = -1;
  std::vector<int64_t> positions;
  for (size_t i = 2; i < s.inputs.size(); ++i) {
    const ValueId piece = s.inputs[i];
    if (piece == kNoValue || !only_read_by(g, idx, piece, s_id)) return std::nullopt;
    const NodeId p = idx.producer[piece];
    if (p < 0 || (feg >= 0 && p != feg) || !is_ours(g.nodes[p], "FusedElementwiseGrad")) return std::nullopt;
    feg = p;
    const std::vector<ValueId>& outs = g.nodes[p].outputs;
    const int64_t k = std::find(outs.begin(), outs.end(), piece) - outs.begin();
    if (std::find(positions.begin(), positions.end(), k) != positions.end()) return std::nullopt;
    positions.push_back(k);
  }
  // Every piece of the chain's own shape (dY's): no broadcast input, whose gradient is summed down.
  const Node& f = g.nodes[feg];
  if (f.attrs.has("join") || !has_input(f, 0)) return std::nullopt;
  const Shape& full = g.value(f.inputs[0]).shape;
  for (int64_t k : positions) {
    const Shape& piece = g.value(f.outputs[static_cast<size_t>(k)]).shape;
    if (!full.rank_known || !piece.rank_known || piece.rank() != full.rank()) return std::nullopt;
    for (int64_t d = 0; d < full.rank(); ++d)
      if (!piece.dims[d].same_as(full.dims[d])) return std::nullopt;
  }
  return std::make_pair(feg, positions);
}

class SplitGradJoin final : public Pass {
 public:
  std::string_view name() const override { return "split_grad_join"; }
  bool run(Graph& g) override {
    const GraphIndex idx(g);
    std::vector<char> drop(g.nodes.size(), 0);
    bool changed = false;
    for (NodeId s_id = 0; s_id < static_cast<NodeId>(g.nodes.size()); ++s_id) {
      const Node& s = g.nodes[s_id];
      if (!is_ours(s, "SplitGrad") || s.outputs.empty() || s.outputs[0] == kNoValue) continue;
      const Shape& out = g.value(s.outputs[0]).shape;
      if (!out.rank_known || out.rank() == 0) continue;
      int64_t axis = s.attrs.get_int("axis", 0);
      if (axis < 0) axis += out.rank();
      if (axis != out.rank() - 1) continue;
      const auto found = pieces_of(g, idx, s, s_id);
      if (!found) continue;
      const auto& [feg, join] = *found;
      Node& f = g.nodes[feg];
      f.attrs.set("join", join);
      f.outputs[join[0]] = s.outputs[0];
      for (size_t q = 1; q < join.size(); ++q) f.outputs[join[q]] = kNoValue;
      drop[s_id] = 1;
      changed = true;
    }
    if (changed) erase_nodes(g, drop);
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> make_split_grad_join_pass() { return std::make_unique<SplitGradJoin>(); }

}  // namespace torch_ort
