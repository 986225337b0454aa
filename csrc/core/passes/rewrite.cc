#include "csrc/core/passes/rewrite.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <stdexcept>
#include <utility>

#include "csrc/core/ir/pattern.h"

namespace torch_ort::rewrite {

namespace {
template <typename Map>
auto lookup(const Map& names, const std::string& name, const char* what) {
  auto it = names.find(name);
  if (it == names.end()) throw std::out_of_range(std::string("rewrite: no ") + what + " captured as '" + name + "'");
  return it->second;
}
}  // namespace

NodeId Match::node(const std::string& name) const { return lookup(nodes_, name, "node"); }
ValueId Match::value(const std::string& name) const { return lookup(values_, name, "value"); }
const std::vector<NodeId>& Match::readers(ValueId v) const { return index_->consumers.at(static_cast<size_t>(v)); }
bool Match::has(const std::string& name) const { return nodes_.count(name) || values_.count(name); }

bool only_read_by(const Graph& g, const Match& m, ValueId v, NodeId reader) {
  return pattern::only_read_by(g, m.index(), v, reader);
}

NodePattern op(std::string op_type) {
  return where([t = std::move(op_type)](const Graph&, const Node& n) { return pattern::is_onnx(n, t); });
}

NodePattern ours(std::string op_type) {
  return where([t = std::move(op_type)](const Graph&, const Node& n) { return pattern::is_ours(n, t); });
}

NodePattern where(std::function<bool(const Graph&, const Node&)> accepts) {
  NodePattern p;
  p.accepts = std::move(accepts);
  return p;
}

NodePattern product(std::vector<Input> factors, double constant, double rtol) {
  NodePattern p = op("Mul").in(std::move(factors));
  p.product = true;
  p.constant = constant;
  p.rtol = rtol;
  return p;
}

namespace {
Input input(Input::Kind kind, std::string capture, std::shared_ptr<NodePattern> producer = nullptr) {
  Input in;
  in.kind = kind;
  in.capture = std::move(capture);
  in.producer = std::move(producer);
  return in;
}
bool near(double x, double value, double rtol) { return std::abs(x - value) <= rtol * std::abs(value); }
}  // namespace

NodePattern tree(std::function<bool(const Graph&, const Node& member, const Node& root)> member, size_t max_nodes) {
  NodePattern p = where([member](const Graph& g, const Node& n) { return member(g, n, n); });
  p.member = std::move(member);
  p.max_nodes = max_nodes;
  return p;
}

Input val(std::string capture) { return input(Input::Kind::kValue, std::move(capture)); }
Input opt(std::string capture) {
  Input in = val(std::move(capture));
  in.optional = true;
  return in;
}
Input from(NodePattern p, std::string capture) {
  return input(Input::Kind::kProducer, std::move(capture), std::make_shared<NodePattern>(std::move(p)));
}
Input inside(NodePattern p, std::string capture) {
  return input(Input::Kind::kInside, std::move(capture), std::make_shared<NodePattern>(std::move(p)));
}
Input sees(NodePattern p, std::string capture) {
  return input(Input::Kind::kSees, std::move(capture), std::make_shared<NodePattern>(std::move(p)));
}
Input num(double value, double rtol) {
  Input in = input(Input::Kind::kNumber, "");
  in.number = value;
  in.rtol = rtol;
  return in;
}
Input one_of(std::vector<Input> alternatives, std::string capture) {
  Input in = input(Input::Kind::kOneOf, std::move(capture));
  in.alternatives = std::move(alternatives);
  return in;
}

// Backtracking over the choices a pattern leaves (the order of a commutative node's inputs, the
// order of a product's factors, the alternatives of one_of): each step hands the rest of the
// match to a continuation, so a condition that fails for one choice makes the matcher try the next.
class Matcher {
 public:
  using Cont = std::function<bool(Match&)>;
  Matcher(const Graph& g, const GraphIndex& idx, const std::vector<char>& dropped)
      : g_(g), idx_(idx), dropped_(dropped) {}

  Match start() const {
    Match m;
    m.index_ = &idx_;
    return m;
  }

  // `look`: the node is only looked at (a `sees` input): nothing below it goes with the match.
  bool node(NodeId id, const NodePattern& p, Match& m, const Cont& k, bool look = false) const {
    const Node& n = g_.nodes[id];
    if (!p.accepts(g_, n)) return false;
    if (p.outputs >= 0 && static_cast<int>(n.outputs.size()) != p.outputs) return false;
    if (p.product) return product(id, p, m, k, look);
    if (p.member) return tree(id, p, m, k, look);
    size_t required = 0;
    for (const Input& in : p.inputs) required += in.optional ? 0 : 1;
    if (n.inputs.size() < required || (!p.any_arity && n.inputs.size() > p.inputs.size())) return false;
    if (!bind(m.nodes_, p.capture, id)) return false;
    std::vector<std::vector<size_t>> orders{{}};
    for (size_t j = 0; j < p.inputs.size(); ++j) orders[0].push_back(j);
    if (p.swap && p.inputs.size() == 2) orders.push_back({1, 0});
    for (const std::vector<size_t>& order : orders) {
      std::vector<Slot> slots;
      for (size_t j = 0; j < p.inputs.size(); ++j)
        slots.push_back({&p.inputs[j], order[j] < n.inputs.size() ? n.inputs[order[j]] : kNoValue, id});
      Match saved = m;
      if (each(slots, 0, m, k, look)) return true;
      m = std::move(saved);
    }
    return false;
  }

  // A node reading output 0 of the root (every node, for read_by_all), matched by the rule's
  // reader pattern.
  bool reader(NodeId root, const NodePattern& p, Match& m, const Cont& k) const {
    const ValueId out = g_.nodes[root].outputs.empty() ? kNoValue : g_.nodes[root].outputs[0];
    if (out == kNoValue || !bind(m.values_, p.root_output, out)) return false;
    if (p.all_readers) {
      const std::vector<NodeId>& all = idx_.consumers[out];
      if (all.empty() || pattern::is_graph_output(g_, out)) return false;
      return every_reader(root, all, 0, *p.reader, m, k);
    }
    for (NodeId r : idx_.consumers[out]) {
      if (dropped_[r] || r <= root) continue;
      Match saved = m;
      if (node(r, *p.reader, m, removing(r, false, k))) return true;
      m = std::move(saved);
    }
    return false;
  }

  bool every_reader(NodeId root, const std::vector<NodeId>& all, size_t j, const NodePattern& p, Match& m,
                    const Cont& k) const {
    if (j == all.size()) return k(m);
    const NodeId r = all[j];
    if (dropped_[r] || r <= root) return false;
    return node(r, p, m, removing(r, false, [&](Match& mm) { return every_reader(root, all, j + 1, p, mm, k); }));
  }

  // Every value taken in with `inside` is read by matched nodes only.
  static bool readers_inside(const GraphIndex& idx, const Match& m, NodeId root) {
    for (ValueId v : m.inside_)
      for (NodeId r : idx.consumers[v])
        if (r != root && std::find(m.interior_.begin(), m.interior_.end(), r) == m.interior_.end()) return false;
    return true;
  }

 private:
  struct Slot {
    const Input* in;
    ValueId v;
    NodeId reader;
  };

  // Adds `id` to the nodes the rewrite removes for the rest of the match (unless only looked at).
  Cont removing(NodeId id, bool look, const Cont& k) const {
    if (look) return k;
    return [id, &k](Match& mm) {
      mm.interior_.push_back(id);
      if (k(mm)) return true;
      mm.interior_.pop_back();
      return false;
    };
  }

  template <typename T>
  static bool bind(std::map<std::string, T>& names, const std::string& name, T what) {
    if (name.empty()) return true;
    auto [it, inserted] = names.emplace(name, what);
    return inserted || it->second == what;
  }

  NodeId producer_of(ValueId v) const {
    if (v < 0 || v >= static_cast<ValueId>(idx_.producer.size())) return -1;
    const NodeId p = idx_.producer[v];
    return p >= 0 && !dropped_[p] ? p : -1;
  }

  bool each(const std::vector<Slot>& slots, size_t j, Match& m, const Cont& k, bool look) const {
    if (j == slots.size()) return k(m);
    return one(*slots[j].in, slots[j].v, slots[j].reader, m, [&](Match& mm) { return each(slots, j + 1, mm, k, look); },
               look);
  }

  bool one(const Input& in, ValueId v, NodeId reader, Match& m, const Cont& k, bool look) const {
    if (in.kind == Input::Kind::kOneOf) {
      if (!bind(m.values_, in.capture, v)) return false;
      for (const Input& alternative : in.alternatives) {
        Match saved = m;
        if (one(alternative, v, reader, m, k, look)) return true;
        m = std::move(saved);
      }
      return false;
    }
    if (v == kNoValue) return in.optional && bind(m.values_, in.capture, kNoValue) && k(m);
    if (in.kind == Input::Kind::kNumber) {
      const std::optional<double> c = pattern::scalar_float(g_, idx_, v);
      return c && near(*c, in.number, in.rtol) && k(m);
    }
    if (!bind(m.values_, in.capture, v)) return false;
    if (in.kind == Input::Kind::kValue) return k(m);
    const NodeId p = producer_of(v);
    if (p < 0) return false;
    look |= in.kind == Input::Kind::kSees;
    if (!look && in.kind == Input::Kind::kProducer && !pattern::only_read_by(g_, idx_, v, reader)) return false;
    if (!look && in.kind == Input::Kind::kInside) {
      if (pattern::is_graph_output(g_, v)) return false;
      m.inside_.push_back(v);
    }
    return node(p, *in.producer, m, removing(p, look, k), look);
  }

  // The Muls below `n` that only the tree reads, and its leaves (constants multiplied into c).
  void tree(NodeId n, std::vector<NodeId>& nodes, std::vector<std::pair<ValueId, NodeId>>& leaves, double& c) const {
    for (ValueId v : g_.nodes[n].inputs) {
      const NodeId p = producer_of(v);
      if (p >= 0 && pattern::is_onnx(g_.nodes[p], "Mul") && g_.nodes[p].inputs.size() == 2 &&
          pattern::only_read_by(g_, idx_, v, n)) {
        nodes.push_back(p);
        tree(p, nodes, leaves, c);
      } else if (std::optional<double> s = pattern::scalar_float(g_, idx_, v)) {
        c *= *s;
      } else {
        leaves.emplace_back(v, n);
      }
    }
  }

  bool tree(NodeId root, const NodePattern& p, Match& m, const Cont& k, bool look) const {
    if (!bind(m.nodes_, p.capture, root)) return false;
    std::vector<NodeId> members{root};
    for (size_t j = 0; j < members.size() && members.size() < p.max_nodes; ++j)
      for (ValueId v : g_.nodes[members[j]].inputs) {
        const NodeId q = producer_of(v);
        if (q < 0 || members.size() >= p.max_nodes || std::find(members.begin(), members.end(), q) != members.end())
          continue;
        if (idx_.consumers[v].size() != 1 || pattern::is_graph_output(g_, v)) continue;
        if (p.member(g_, g_.nodes[q], g_.nodes[root])) members.push_back(q);
      }
    if (!look) m.interior_.insert(m.interior_.end(), members.begin() + 1, members.end());
    return k(m);
  }

  bool product(NodeId id, const NodePattern& p, Match& m, const Cont& k, bool look) const {
    if (g_.nodes[id].inputs.size() != 2 || !bind(m.nodes_, p.capture, id)) return false;
    std::vector<NodeId> nodes;
    std::vector<std::pair<ValueId, NodeId>> leaves;
    double c = 1.0;
    tree(id, nodes, leaves, c);
    if (leaves.size() != p.inputs.size() || !near(c, p.constant, p.rtol)) return false;
    if (!look) m.interior_.insert(m.interior_.end(), nodes.begin(), nodes.end());
    std::vector<size_t> order(leaves.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::set<std::vector<ValueId>> tried;  // equal leaves (x·x·x) give equal orders
    do {
      std::vector<ValueId> values;
      for (size_t j : order) values.push_back(leaves[j].first);
      if (!tried.insert(values).second) continue;
      std::vector<Slot> slots;
      for (size_t j = 0; j < order.size(); ++j) slots.push_back({&p.inputs[j], leaves[order[j]].first, leaves[order[j]].second});
      Match saved = m;
      if (each(slots, 0, m, k, look)) return true;
      m = std::move(saved);
    } while (std::next_permutation(order.begin(), order.end()));
    return false;
  }

  const Graph& g_;
  const GraphIndex& idx_;
  const std::vector<char>& dropped_;
};

namespace {

// The rewrite keeps the graph whole (see the header comment).
bool keeps_graph_whole(const Graph& g, const GraphIndex& idx, NodeId at, const Match& m, const Replacement& r) {
  std::set<NodeId> matched(m.interior().begin(), m.interior().end());
  matched.insert(at);
  std::set<ValueId> made(r.node.outputs.begin(), r.node.outputs.end());
  for (const Node& n : r.after) made.insert(n.outputs.begin(), n.outputs.end());
  for (NodeId n : matched)
    for (ValueId v : g.nodes[n].outputs) {
      if (v == kNoValue || made.count(v)) continue;
      if (v >= static_cast<ValueId>(idx.consumers.size())) return false;  // made in this scan: not known here
      if (pattern::is_graph_output(g, v)) return false;
      for (NodeId r : idx.consumers[v])
        if (!matched.count(r)) return false;
    }
  std::vector<ValueId> read = r.node.inputs;
  for (const Node& n : r.before) read.insert(read.end(), n.inputs.begin(), n.inputs.end());
  for (const Node& n : r.after)
    for (ValueId v : n.inputs)
      if (!made.count(v)) read.push_back(v);  // the new nodes' outputs exist by then
  for (ValueId v : read) {
    if (v == kNoValue || v >= static_cast<ValueId>(idx.producer.size())) continue;  // new: made before
    const NodeId p = idx.producer[v];
    if (p >= at || (p >= 0 && matched.count(p))) return false;  // made later, or by a node that goes
  }
  for (ValueId v : made)
    if (v != kNoValue && v < static_cast<ValueId>(idx.consumers.size()))
      for (NodeId reader : idx.consumers[v])
        if (reader <= at && !matched.count(reader)) return false;
  return true;
}

}  // namespace

bool apply(Graph& g, const std::vector<Rule>& rules, Scan order) {
  const GraphIndex idx(g);
  std::vector<char> drop(g.nodes.size(), 0);
  const Matcher matcher(g, idx, drop);
  std::vector<std::vector<Node>> before(g.nodes.size()), after(g.nodes.size());  // around node i
  bool changed = false;
  const NodeId n_nodes = static_cast<NodeId>(g.nodes.size());
  for (NodeId step = 0; step < n_nodes; ++step) {
    const NodeId i = order == Scan::kFirstToLast ? step : n_nodes - 1 - step;
    if (drop[i]) continue;
    for (const Rule& rule : rules) {
      Match m = matcher.start();
      const Matcher::Cont whole = [&](Match& mm) {
        return Matcher::readers_inside(idx, mm, i) && (!rule.condition || rule.condition(g, mm));
      };
      const bool found = matcher.node(i, rule.root, m, [&](Match& mm) {
        return rule.root.reader ? matcher.reader(i, rule.root, mm, whole) : whole(mm);
      });
      if (!found) continue;
      Replacement with = rule.build(g, m, g.nodes[i]);
      if (!keeps_graph_whole(g, idx, i, m, with)) continue;
      Node& root = g.nodes[i];
      if (with.node.name.empty()) with.node.name = root.name;
      for (Node& n : with.before) n.in_backward = root.in_backward;
      for (Node& n : with.after) n.in_backward = root.in_backward;
      before[i] = std::move(with.before);
      after[i] = std::move(with.after);
      pattern::replace_node(root, std::move(with.node));  // keeps the root's forward/backward half
      for (NodeId interior : m.interior()) drop[interior] = 1;
      changed = true;
      break;
    }
  }
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (Node& n : before[i]) nodes.push_back(std::move(n));
    if (!drop[i]) nodes.push_back(std::move(g.nodes[i]));
    for (Node& n : after[i]) nodes.push_back(std::move(n));
  }
  g.nodes = std::move(nodes);
  return changed;
}

}  // namespace torch_ort::rewrite
