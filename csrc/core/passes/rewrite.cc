#include "csrc/core/passes/rewrite.h"

#include <stdexcept>
#include <utility>

#include "csrc/core/ir/pattern.h"

namespace torch_ort::rewrite {

NodeId Match::node(const std::string& name) const {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) throw std::out_of_range("rewrite: no node captured as '" + name + "'");
  return it->second;
}

ValueId Match::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw std::out_of_range("rewrite: no value captured as '" + name + "'");
  return it->second;
}

NodePattern op(std::string op_type) {
  NodePattern p;
  p.accepts = [t = std::move(op_type)](const Graph&, const Node& n) { return pattern::is_onnx(n, t); };
  return p;
}

NodePattern ours(std::string op_type) {
  NodePattern p;
  p.accepts = [t = std::move(op_type)](const Graph&, const Node& n) { return pattern::is_ours(n, t); };
  return p;
}

NodePattern where(std::function<bool(const Graph&, const Node&)> accepts) {
  NodePattern p;
  p.accepts = std::move(accepts);
  return p;
}

Input val(std::string capture) { return Input{std::move(capture), false, nullptr}; }
Input opt(std::string capture) { return Input{std::move(capture), true, nullptr}; }
Input from(NodePattern p, std::string capture) {
  return Input{std::move(capture), false, std::make_shared<NodePattern>(std::move(p))};
}

// Backtracking over the choices a pattern leaves (the order of a commutative node's inputs): each
// step hands the rest of the match to a continuation, so a condition that fails for one choice
// makes the matcher try the next.
class Matcher {
 public:
  using Cont = std::function<bool(Match&)>;
  Matcher(const Graph& g, const GraphIndex& idx, const std::vector<char>& dropped)
      : g_(g), idx_(idx), dropped_(dropped) {}

  bool node(NodeId id, const NodePattern& p, Match& m, const Cont& k) const {
    const Node& n = g_.nodes[id];
    if (!p.accepts(g_, n)) return false;
    if (p.outputs >= 0 && static_cast<int>(n.outputs.size()) != p.outputs) return false;
    size_t required = 0;
    for (const Input& in : p.inputs) required += in.optional ? 0 : 1;
    if (n.inputs.size() < required || (!p.any_arity && n.inputs.size() > p.inputs.size())) return false;
    if (!bind(m.nodes_, p.capture, id)) return false;
    std::vector<std::vector<size_t>> orders{{}};
    for (size_t j = 0; j < p.inputs.size(); ++j) orders[0].push_back(j);
    if (p.swap && p.inputs.size() == 2) orders.push_back({1, 0});
    for (const std::vector<size_t>& order : orders) {
      Match saved = m;
      if (inputs(id, p, order, 0, m, k)) return true;
      m = std::move(saved);
    }
    return false;
  }

 private:
  template <typename T>
  static bool bind(std::map<std::string, T>& names, const std::string& name, T what) {
    if (name.empty()) return true;
    auto [it, inserted] = names.emplace(name, what);
    return inserted || it->second == what;
  }

  bool inputs(NodeId id, const NodePattern& p, const std::vector<size_t>& order, size_t j, Match& m,
              const Cont& k) const {
    if (j == p.inputs.size()) return k(m);
    const Node& n = g_.nodes[id];
    const Input& in = p.inputs[j];
    const size_t pos = order[j];
    const ValueId v = pos < n.inputs.size() ? n.inputs[pos] : kNoValue;
    if (v == kNoValue) {
      if (!in.optional || !bind(m.values_, in.capture, kNoValue)) return false;
      return inputs(id, p, order, j + 1, m, k);
    }
    if (!bind(m.values_, in.capture, v)) return false;
    if (!in.producer) return inputs(id, p, order, j + 1, m, k);
    const NodeId producer = idx_.producer[v];
    if (producer < 0 || dropped_[producer] || !pattern::only_read_by(g_, idx_, v, id)) return false;
    return node(producer, *in.producer, m, [&](Match& mm) {
      mm.interior_.push_back(producer);
      if (inputs(id, p, order, j + 1, mm, k)) return true;
      mm.interior_.pop_back();
      return false;
    });
  }

  const Graph& g_;
  const GraphIndex& idx_;
  const std::vector<char>& dropped_;
};

bool apply(Graph& g, const std::vector<Rule>& rules) {
  const GraphIndex idx(g);
  std::vector<char> drop(g.nodes.size(), 0);
  const Matcher matcher(g, idx, drop);
  bool changed = false;
  for (NodeId i = 0; i < static_cast<NodeId>(g.nodes.size()); ++i) {
    if (drop[i]) continue;
    for (const Rule& rule : rules) {
      Match m;
      const bool found = matcher.node(i, rule.root, m, [&](Match& mm) {
        return !rule.condition || rule.condition(g, mm);
      });
      if (!found) continue;
      Node& root = g.nodes[i];
      Node with = rule.build(g, m, root);
      if (with.name.empty()) with.name = root.name;
      pattern::replace_node(root, std::move(with));  // keeps the root's forward/backward half
      for (NodeId interior : m.interior()) drop[interior] = 1;
      changed = true;
      break;
    }
  }
  pattern::erase_nodes(g, drop);
  return changed;
}

}  // namespace torch_ort::rewrite
