// bias_gelu_fusion: Add(x, bias) -> GELU becomes one com.torch_ort::BiasGelu(x, bias) (one pass over
// memory forward and backward). GELU is matched as the ONNX Gelu op (approximate none / tanh) and as
// the two decomposed forms exporters emit:
//   tanh (HF gelu_new):  0.5·x · (1 + tanh(√(2/π)·(x + 0.044715·x³)))
//   erf  (BERT, older):  0.5·x · (1 + erf(x / √2))
// Products are matched as trees of Mul (any association and operand order), so 0.5·(x·(1+t)) and
// (x·0.5)·(1+t) both match. A GELU without a foldable bias becomes BiasGelu(x) without one.
#include <cmath>
#include <optional>
#include <set>
#include <vector>

#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"

namespace torch_ort {
namespace {

using pattern::constant_of;
using pattern::is_onnx;
using pattern::producer;

std::optional<double> scalar_const(const Graph& g, const GraphIndex& idx, ValueId v) {
  return pattern::scalar_float(g, idx, v);
}

bool near(double a, double b) { return std::abs(a - b) <= 1e-5 * std::abs(b); }

// What one GELU match consumes: the nodes it replaces (all but `root` vanish) and its input x.
struct Match {
  NodeId root = -1;
  ValueId x = kNoValue;
  std::string approximate;
  std::set<NodeId> nodes;  // every matched node, root included
};

class Matcher {
 public:
  Matcher(const Graph& g, const GraphIndex& idx) : g_(g), idx_(idx) {}

  // v is produced by a node only `reader` reads (and no graph output): it may be absorbed.
  const Node* absorbable(ValueId v, NodeId reader, NodeId* id) const {
    const Node* p = producer(g_, idx_, v);
    if (!p || !pattern::only_read_by(g_, idx_, v, reader)) return nullptr;
    *id = idx_.producer[v];
    return p;
  }

  // Leaves of the Mul tree rooted at node `n`: descends into Mul inputs read only by the tree.
  void mul_leaves(NodeId n, std::vector<ValueId>& leaves, std::set<NodeId>& seen) const {
    seen.insert(n);
    for (ValueId v : g_.nodes[n].inputs) {
      NodeId p = -1;
      const Node* pn = absorbable(v, n, &p);
      if (pn && is_onnx(*pn, "Mul") && pn->inputs.size() == 2) {
        mul_leaves(p, leaves, seen);
      } else {
        leaves.push_back(v);
      }
    }
  }

  // Splits Mul-tree leaves into (product of scalar constants, the non-constant leaves).
  double split_consts(const std::vector<ValueId>& leaves, std::vector<ValueId>& rest) const {
    double c = 1.0;
    for (ValueId v : leaves) {
      if (std::optional<double> s = scalar_const(g_, idx_, v)) {
        c *= *s;
      } else {
        rest.push_back(v);
      }
    }
    return c;
  }

  // Add(1, f(u)) or Add(f(u), 1) with f = op, absorbed into `m`; returns u or kNoValue.
  ValueId one_plus(ValueId v, NodeId reader, const char* op, std::set<NodeId>& m, NodeId* fnode) const {
    NodeId a = -1, f = -1;
    const Node* an = absorbable(v, reader, &a);
    if (!an || !is_onnx(*an, "Add") || an->inputs.size() != 2) return kNoValue;
    for (int k = 0; k < 2; ++k) {
      std::optional<double> one = scalar_const(g_, idx_, an->inputs[k]);
      if (!one || !near(*one, 1.0)) continue;
      const Node* fn = absorbable(an->inputs[1 - k], a, &f);
      if (!fn || !is_onnx(*fn, op) || fn->inputs.size() != 1) return kNoValue;
      m.insert(a);
      m.insert(f);
      *fnode = f;
      return fn->inputs[0];
    }
    return kNoValue;
  }

  // x³ as Pow(x, 3) or a Mul tree of three x; absorbed into `m`.
  bool is_cube(ValueId v, ValueId x, NodeId reader, std::set<NodeId>& m) const {
    NodeId p = -1;
    const Node* pn = absorbable(v, reader, &p);
    if (!pn) return false;
    if (is_onnx(*pn, "Pow") && pn->inputs.size() == 2 && pn->inputs[0] == x) {
      std::optional<double> e = scalar_const(g_, idx_, pn->inputs[1]);
      if (!e || *e != 3.0) return false;
      m.insert(p);
      return true;
    }
    if (!is_onnx(*pn, "Mul")) return false;
    std::vector<ValueId> leaves;
    std::set<NodeId> t;
    mul_leaves(p, leaves, t);
    if (leaves.size() != 3) return false;
    for (ValueId l : leaves)
      if (l != x) return false;
    m.insert(t.begin(), t.end());
    return true;
  }

  // tanh argument: √(2/π)·(x + 0.044715·x³), with the constants anywhere in the Mul trees.
  bool tanh_arg(ValueId u, NodeId tanh_node, ValueId x, std::set<NodeId>& m) const {
    NodeId p = -1;
    const Node* pn = absorbable(u, tanh_node, &p);
    if (!pn || !is_onnx(*pn, "Mul")) return false;
    std::vector<ValueId> leaves, rest;
    std::set<NodeId> t;
    mul_leaves(p, leaves, t);
    if (!near(split_consts(leaves, rest), std::sqrt(2.0 / M_PI)) || rest.size() != 1) return false;
    // rest[0] = Add(x, 0.044715·x³), read by the innermost Mul of the tree.
    NodeId reader = -1;
    for (NodeId n : t)
      for (ValueId v : g_.nodes[n].inputs)
        if (v == rest[0]) reader = n;
    NodeId a = -1;
    const Node* an = absorbable(rest[0], reader, &a);
    if (!an || !is_onnx(*an, "Add") || an->inputs.size() != 2) return false;
    for (int k = 0; k < 2; ++k) {
      if (an->inputs[k] != x) continue;
      NodeId c = -1;
      const Node* cn = absorbable(an->inputs[1 - k], a, &c);
      if (!cn || !is_onnx(*cn, "Mul")) continue;
      std::vector<ValueId> cl, crest;
      std::set<NodeId> ct;
      mul_leaves(c, cl, ct);
      if (!near(split_consts(cl, crest), 0.044715)) continue;
      std::set<NodeId> cube;
      if (crest.size() == 1) {
        // The reader of the cube is the Mul of `ct` that takes it.
        NodeId cr = -1;
        for (NodeId n : ct)
          for (ValueId v : g_.nodes[n].inputs)
            if (v == crest[0]) cr = n;
        if (!is_cube(crest[0], x, cr, cube)) continue;
      } else if (crest.size() != 3 || crest[0] != x || crest[1] != x || crest[2] != x) {
        continue;
      }
      m.insert(t.begin(), t.end());
      m.insert(a);
      m.insert(ct.begin(), ct.end());
      m.insert(cube.begin(), cube.end());
      return true;
    }
    return false;
  }

  // erf argument: x / √2 or x · (1/√2).
  bool erf_arg(ValueId u, NodeId erf_node, ValueId x, std::set<NodeId>& m) const {
    NodeId p = -1;
    const Node* pn = absorbable(u, erf_node, &p);
    if (!pn || pn->inputs.size() != 2) return false;
    if (is_onnx(*pn, "Div")) {
      std::optional<double> s = scalar_const(g_, idx_, pn->inputs[1]);
      if (pn->inputs[0] != x || !s || !near(*s, std::sqrt(2.0))) return false;
    } else if (is_onnx(*pn, "Mul")) {
      const int k = pn->inputs[0] == x ? 1 : 0;
      std::optional<double> s = scalar_const(g_, idx_, pn->inputs[k]);
      if (pn->inputs[1 - k] != x || !s || !near(*s, std::sqrt(0.5))) return false;
    } else {
      return false;
    }
    m.insert(p);
    return true;
  }

  // A decomposed GELU whose final Mul is node `n`.
  std::optional<Match> decomposed(NodeId n) const {
    std::vector<ValueId> leaves, rest;
    std::set<NodeId> tree;
    mul_leaves(n, leaves, tree);
    if (!near(split_consts(leaves, rest), 0.5) || rest.size() != 2) return std::nullopt;
    for (int k = 0; k < 2; ++k) {
      const ValueId x = rest[k], s = rest[1 - k];
      NodeId reader = -1;
      for (NodeId t : tree)
        for (ValueId v : g_.nodes[t].inputs)
          if (v == s) reader = t;
      for (const char* op : {"Tanh", "Erf"}) {
        std::set<NodeId> m = tree;
        NodeId fnode = -1;
        const ValueId u = one_plus(s, reader, op, m, &fnode);
        if (u == kNoValue) continue;
        const bool ok = std::string(op) == "Tanh" ? tanh_arg(u, fnode, x, m) : erf_arg(u, fnode, x, m);
        if (!ok) continue;
        return Match{n, x, std::string(op) == "Tanh" ? "tanh" : "none", std::move(m)};
      }
    }
    return std::nullopt;
  }

 private:
  const Graph& g_;
  const GraphIndex& idx_;
};

class BiasGeluFusion final : public Pass {
 public:
  std::string_view name() const override { return "bias_gelu_fusion"; }

  bool run(Graph& g) override {
    // Each rewrite removes one GELU (op or decomposed).
    return pattern::rewrite_one_at_a_time(g, [&](const GraphIndex& idx, NodeId n) {
      const Matcher mt(g, idx);
      const Node& node = g.nodes[n];
      std::optional<Match> m;
      if (is_onnx(node, "Gelu") && node.inputs.size() == 1 && node.outputs.size() == 1) {
        std::string approx;
        try {
          approx = node.attrs.get_string("approximate", "none");
        } catch (const std::exception&) {
          return false;  // a malformed attribute: the Gelu kernel names it
        }
        if (approx != "none" && approx != "tanh") return false;
        m = Match{n, node.inputs[0], approx, {n}};
      } else if (is_onnx(node, "Mul") && node.inputs.size() == 2 && node.outputs.size() == 1) {
        m = mt.decomposed(n);
      }
      if (!m || !is_floating(g.value(m->x).dtype)) return false;
      return rewrite(g, idx, *m);
    });
  }

 private:
  // x = Add(z, b), with b a 1-D bias of x's last dim and z of x's shape, read only by the match.
  static std::optional<std::pair<ValueId, ValueId>> bias_add(const Graph& g, const GraphIndex& idx,
                                                             const Match& m) {
    const Node* a = producer(g, idx, m.x);
    if (!a || !is_onnx(*a, "Add") || a->inputs.size() != 2 || pattern::is_graph_output(g, m.x))
      return std::nullopt;
    for (NodeId c : idx.consumers[m.x])
      if (!m.nodes.count(c)) return std::nullopt;
    const Shape& xs = g.value(m.x).shape;
    if (!xs.rank_known || xs.rank() < 1) return std::nullopt;
    for (int k = 0; k < 2; ++k) {
      const ValueId z = a->inputs[k], b = a->inputs[1 - k];
      const Shape& zs = g.value(z).shape;
      const Shape& bs = g.value(b).shape;
      if (g.value(z).dtype != g.value(m.x).dtype || g.value(b).dtype != g.value(m.x).dtype) continue;
      if (!zs.same_as(xs) || bs.rank() != 1 || !bs.dims[0].same_as(xs.dims.back())) continue;
      return std::make_pair(z, b);
    }
    return std::nullopt;
  }

  static bool rewrite(Graph& g, const GraphIndex& idx, const Match& m) {
    for (NodeId n : m.nodes)
      if (n != m.root)
        for (ValueId o : g.nodes[n].outputs)
          if (pattern::is_graph_output(g, o)) return false;
    std::vector<ValueId> inputs{m.x};
    std::vector<char> drop(g.nodes.size(), 0);
    for (NodeId n : m.nodes) drop[n] = 1;
    if (auto zb = bias_add(g, idx, m)) {
      inputs = {zb->first, zb->second};
      drop[idx.producer[m.x]] = 1;
    }
    Node& root = g.nodes[m.root];
    Attributes a;
    a.set("approximate", m.approximate);
    // Edited in place (not replaced): the node keeps its name and any flags it carries.
    root.domain = kOurDomain;
    root.op_type = "BiasGelu";
    root.inputs = std::move(inputs);
    root.outputs.resize(1);
    root.attrs = std::move(a);
    drop[m.root] = 0;
    pattern::erase_nodes(g, drop);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_bias_gelu_fusion_pass() { return std::make_unique<BiasGeluFusion>(); }

}  // namespace torch_ort
