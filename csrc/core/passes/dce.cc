// Dead-code elimination: drops nodes none of whose outputs reach a graph output, and constants
// nothing reads. Graph inputs are never removed (they are bound by position). An output that an
// op of ours declares optional (OpArity::optional_outputs) and nothing reads becomes absent, so
// its kernel does not compute it (LinearCrossEntropy's gradient of a frozen weight).
#include <vector>

#include "csrc/core/ir/op_traits.h"
#include "csrc/core/passes/pass.h"

namespace torch_ort {
namespace {

class DeadCodeElimination final : public Pass {
 public:
  std::string_view name() const override { return "dce"; }

  bool run(Graph& g) override {
    std::vector<char> live(g.num_values(), 0);
    for (ValueId v : g.outputs) live[v] = 1;
    std::vector<char> keep(g.nodes.size(), 0);
    bool changed = false;
    for (size_t i = g.nodes.size(); i-- > 0;) {
      Node& n = g.nodes[i];
      for (ValueId o : n.outputs) keep[i] |= o != kNoValue && live[o];
      if (!keep[i]) continue;
      if (const auto& arity = op_traits(n).arity; arity && arity->optional_outputs)
        for (size_t k = 0; k < n.outputs.size() && k < 32; ++k)
          if ((arity->optional_outputs >> k & 1u) && n.outputs[k] != kNoValue && !live[n.outputs[k]]) {
            n.outputs[k] = kNoValue;
            changed = true;
          }
      for (ValueId in : n.inputs)
        if (in != kNoValue) live[in] = 1;
    }
    std::vector<Node> kept;
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (keep[i]) kept.push_back(std::move(g.nodes[i]));
    changed |= kept.size() != g.nodes.size();
    g.nodes = std::move(kept);
    for (auto it = g.initializers.begin(); it != g.initializers.end();) {
      if (live[it->first]) { ++it; continue; }
      it = g.initializers.erase(it);
      changed = true;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> make_dce_pass() { return std::make_unique<DeadCodeElimination>(); }

}  // namespace torch_ort
