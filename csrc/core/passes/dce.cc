// Dead-code elimination: drops nodes none of whose outputs reach a graph output, and constants
// nothing reads. Graph inputs are never removed (they are bound by position).
#include <vector>

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
    for (size_t i = g.nodes.size(); i-- > 0;) {
      const Node& n = g.nodes[i];
      for (ValueId o : n.outputs) keep[i] |= o != kNoValue && live[o];
      if (!keep[i]) continue;
      for (ValueId in : n.inputs)
        if (in != kNoValue) live[in] = 1;
    }
    std::vector<Node> kept;
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (keep[i]) kept.push_back(std::move(g.nodes[i]));
    bool changed = kept.size() != g.nodes.size();
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
