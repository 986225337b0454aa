// Recompute analysis (recompute.h): which saved activations a small forward subgraph can rebuild
// in backward, clustered by the subgraph's ops, and the transformer layers they lie in.
// recompute_apply.cc selects among them and rewrites the graph.
#include "csrc/core/planner/recompute.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <stdexcept>
#include <tuple>

#include "csrc/core/ir/op_traits.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/planner/memory.h"
#include "csrc/core/planner/plan.h"

namespace torch_ort {
namespace {

using pattern::is_onnx;
using pattern::is_ours;

constexpr size_t kMaxSubgraphNodes = 15;
constexpr int64_t kMaxMetadataElements = 64;  // integer/bool tensors this small are shapes, not activations

// Symbols of a byte formula, opaque atoms ("(s1*s2)//s3") included: every identifier in them.
std::set<std::string> identifiers(const SymExpr& e) {
  std::set<std::string> out;
  for (const std::string& atom : e.atoms())
    for (size_t i = 0; i < atom.size();) {
      if (!std::isalpha(static_cast<unsigned char>(atom[i])) && atom[i] != '_') { ++i; continue; }
      size_t j = i;
      while (j < atom.size() && (std::isalnum(static_cast<unsigned char>(atom[j])) || atom[j] == '_')) ++j;
      out.insert(atom.substr(i, j - i));
      i = j;
    }
  return out;
}

// e with every symbol bound to n (nullopt when it cannot be evaluated, overflow included: this
// only ranks heuristics, and an expression that overflows at n = 1024 is no sensible candidate).
std::optional<int64_t> at_uniform(const SymExpr& e, int64_t n) {
  std::map<std::string, int64_t> env;
  for (const std::string& s : identifiers(e)) env[s] = n;
  try {
    return e.evaluate(env);
  } catch (const std::overflow_error&) {
    return std::nullopt;
  }
}

// What the analysis knows about the training graph.
struct Facts {
  const Graph& g;
  size_t num_forward;
  GraphIndex idx;
  std::vector<char> saved;     // plan_training's saved set
  std::vector<char> cheap;     // kept at no activation cost: inputs, constants, outputs, shapes
  std::vector<char> boundary;  // residual-stream values (see find_boundaries)
  std::vector<ValueLayout> layout;  // which buffer each value lives in (views share one)

  explicit Facts(const TrainingGraph& tg)
      : g(tg.graph), num_forward(tg.num_forward_nodes), idx(tg.graph),
        saved(g.num_values(), 0), cheap(g.num_values(), 0), boundary(g.num_values(), 0),
        layout(value_layouts(tg.graph)) {
    for (ValueId v : plan_training(tg).saved) saved[v] = 1;
    for (ValueId v : g.inputs) cheap[v] = 1;
    for (ValueId v : g.outputs) cheap[v] = 1;  // held by the caller through backward anyway
    for (const auto& [v, data] : g.initializers) cheap[v] = 1;
    for (ValueId v = 0; v < g.num_values(); ++v) {
      const NodeId p = idx.producer[v];
      if (p >= 0 && is_constant(g.nodes[p])) cheap[v] = 1;
      if (is_metadata(v)) cheap[v] = 1;
    }
  }

  // A small integer or bool tensor of known size (a shape, an index): not worth a clone.
  bool is_metadata(ValueId v) const {
    const Value& val = g.value(v);
    if (is_floating(val.dtype) || !val.shape.rank_known) return false;
    int64_t n = 1;
    for (const Dim& d : val.shape.dims) {
      if (d.value < 0) return false;
      n *= d.value;
    }
    return n <= kMaxMetadataElements;
  }

  // Backward can read u without a clone, the values in `dropping` being dropped.
  bool kept(ValueId u, const std::vector<ValueId>& dropping) const {
    if (u == kNoValue || cheap[u]) return true;
    return saved[u] && std::find(dropping.begin(), dropping.end(), u) == dropping.end();
  }

  // Forward nodes reading v's data (a Shape or Size reads its metadata only).
  std::vector<NodeId> forward_readers(ValueId v) const {
    std::vector<NodeId> out;
    for (NodeId c : idx.consumers[v])
      if (static_cast<size_t>(c) < num_forward && !op_traits(g.nodes[c]).reads_metadata_only)
        out.push_back(c);
    return out;
  }

  // A view of a buffer that stays kept anyway: dropping it frees nothing.
  bool views_kept(ValueId v) const {
    const ValueId base = layout[v].base;
    return base != v && base != kNoValue && kept(base, {});
  }
};

// The residual stream (layer boundaries). A residual add is an Add whose sum a layer norm reads
// (LayerNormalization input 0, or a SkipLayerNorm input), or a SkipLayerNorm (it normalises its
// own sum): every transformer block ends in one, pre-LN and post-LN alike. Its sum (SkipLayerNorm:
// output 3 when present) is a boundary, and so is a summand that other nodes read too — the stream
// forking into the block's branch and the skip connection. Adds inside a block (a GELU's x + c·x³,
// the attention mask) feed no layer norm; biases are read once.
void find_boundaries(Facts& f) {
  const Graph& g = f.g;
  const auto normalised = [&](ValueId v) {
    for (NodeId c : f.forward_readers(v)) {
      const Node& n = g.nodes[c];
      if (is_onnx(n, "LayerNormalization") && n.inputs[0] == v) return true;
      if (is_ours(n, "SkipLayerNorm") && (n.inputs[0] == v || n.inputs[1] == v)) return true;
    }
    return false;
  };
  for (size_t i = 0; i < f.num_forward; ++i) {
    const Node& n = g.nodes[i];
    const bool sln = is_ours(n, "SkipLayerNorm") && n.inputs.size() >= 2;
    if (!sln && !(is_onnx(n, "Add") && n.inputs.size() == 2 && normalised(n.outputs[0]))) continue;
    const ValueId sum = sln ? (n.outputs.size() > 3 ? n.outputs[3] : kNoValue) : n.outputs[0];
    if (sum != kNoValue) f.boundary[sum] = 1;
    for (size_t k = 0; k < 2; ++k) {
      const ValueId s = n.inputs[k];
      if (s != kNoValue && !g.initializers.count(s) && f.forward_readers(s).size() > 1) f.boundary[s] = 1;
    }
  }
}

// A subgraph grown backward from a root node: every value it reads is kept, produced inside it,
// or on the frontier: not kept, and its producer not recomputable, over the node limit, or an
// integer/bool value. Those are masks and indices — often built once from the inputs by a long
// chain and read by every layer, and 1 to 8 bytes per element: a compromise keeps them instead.
struct Walk {
  std::vector<NodeId> nodes;      // forward order, the root last
  std::vector<ValueId> frontier;  // what it would have to keep besides (strategy 2)
};

Walk walk_from(const Facts& f, NodeId root, const std::vector<ValueId>& dropping, size_t max_nodes) {
  std::set<NodeId> in{root};
  std::priority_queue<NodeId> todo;  // latest node first: its inputs are all produced earlier
  todo.push(root);
  Walk w;
  while (!todo.empty()) {
    const NodeId n = todo.top();
    todo.pop();
    for (ValueId u : f.g.nodes[n].inputs) {
      if (f.kept(u, dropping)) continue;
      const NodeId p = f.idx.producer[u];
      if (in.count(p)) continue;
      if (is_recomputable(f.g.nodes[p]) && is_floating(f.g.value(u).dtype) && in.size() < max_nodes) {
        in.insert(p);
        todo.push(p);
      } else if (std::find(w.frontier.begin(), w.frontier.end(), u) == w.frontier.end()) {
        w.frontier.push_back(u);
      }
    }
  }
  w.nodes.assign(in.begin(), in.end());
  return w;
}

std::optional<SymExpr> total_bytes(const Graph& g, const std::vector<ValueId>& vs) {
  SymExpr sum = SymExpr::constant(0);
  for (ValueId v : vs) {
    SymExpr b;
    if (!value_bytes(g, v, &b)) return std::nullopt;
    sum = sum + b;
  }
  return sum;
}

// A compromise is worth offering when it provably saves at least half of what it drops — checked
// with every symbol at 1, 16 and 1024 (a [B, T, T] mask kept for a [B, T, C] activation fails at
// long sequences). Smaller savings (a LayerNorm's statistics) are not worth the recompute.
bool worth_it(const SymExpr& dropped, const SymExpr& saving) {
  for (int64_t n : {1, 16, 1024}) {
    const auto d = at_uniform(dropped, n), s = at_uniform(saving, n);
    if (!d || !s || *s <= 0 || (*d > 0 && *s < *d - *s)) return false;  // 2s < d, no overflow
  }
  return true;
}

// The cluster id: op types in a topological order that does not depend on where nodes shared by
// several layers (an attention mask) sit in the forward — farthest from the root first, ties by op
// type — so that every layer's occurrence gets the same id.
std::string cluster_of(const Graph& g, const GraphIndex& idx, const std::vector<NodeId>& nodes) {
  std::map<NodeId, int> depth;  // longest path to the root
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it)
    for (ValueId u : g.nodes[*it].inputs)
      if (u != kNoValue && std::binary_search(nodes.begin(), nodes.end(), idx.producer[u]))
        depth[idx.producer[u]] = std::max(depth[idx.producer[u]], depth[*it] + 1);
  std::vector<std::pair<int, std::string>> order;
  for (NodeId n : nodes) order.emplace_back(-depth[n], g.nodes[n].op_type);
  std::sort(order.begin(), order.end());
  std::string id;
  for (const auto& [d, op] : order) id += op + "+";
  return id;
}

// Layer of the node at `pos`: k when boundary position k <= pos < boundary position k + 1 (a node
// that writes a boundary — a SkipLayerNorm's sum — starts the next layer with its other outputs).
int layer_at(const std::vector<int64_t>& boundary_pos, int64_t pos) {
  auto it = std::upper_bound(boundary_pos.begin(), boundary_pos.end(), pos);
  if (it == boundary_pos.begin() || it == boundary_pos.end()) return -1;
  return static_cast<int>(it - boundary_pos.begin()) - 1;
}

// The layer of the values a node produces: its own, unless forward nodes of other layers read
// them (an attention mask built once for every layer) — then none. A reader writing a boundary
// (the residual add) ends the layer before it.
int layer_of(const Facts& f, const std::vector<int64_t>& boundary_pos, NodeId root,
             const std::vector<ValueId>& values) {
  const int layer = layer_at(boundary_pos, root);
  for (ValueId v : values)
    for (NodeId c : f.forward_readers(v))
      if (layer_at(boundary_pos, c - 1) != layer) return -1;
  return layer;
}

// Every value `nodes` read from outside them is an input, constant or graph output, or a view
// of one (the targets reshaped for the loss).
bool reads_only_cheap(const Facts& f, const std::vector<NodeId>& nodes) {
  for (NodeId n : nodes)
    for (ValueId u : f.g.nodes[n].inputs) {
      if (u == kNoValue || std::binary_search(nodes.begin(), nodes.end(), f.idx.producer[u])) continue;
      const ValueId base = f.layout[u].base;
      if (!f.cheap[u] && (base == kNoValue || !f.cheap[base])) return false;
    }
  return true;
}

}  // namespace

int64_t RecomputeOpportunity::enabled_count() const {
  return std::count_if(occurrences.begin(), occurrences.end(),
                       [](const RecomputeOccurrence& o) { return o.enabled; });
}

RecomputeResult analyze_recompute(const TrainingGraph& tg) {
  Facts f(tg);
  const Graph& g = f.g;
  find_boundaries(f);
  RecomputeResult r;
  std::vector<int64_t> boundary_pos;
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (f.boundary[v]) {
      r.layer_boundaries.push_back(v);
      boundary_pos.push_back(f.idx.producer[v]);  // -1: a graph input starts the stream
    }
  std::sort(boundary_pos.begin(), boundary_pos.end());
  boundary_pos.erase(std::unique(boundary_pos.begin(), boundary_pos.end()), boundary_pos.end());
  r.num_layers = std::max(0, static_cast<int>(boundary_pos.size()) - 1);

  std::vector<char> input_grad(g.num_values(), 0);
  for (ValueId v : tg.input_grads)
    if (v != kNoValue) input_grad[v] = 1;
  std::map<std::pair<std::string, int>, size_t> by_cluster;  // (cluster, strategy) -> opportunity
  const auto add = [&](const Walk& w, int strategy, std::vector<ValueId> dropping, const SymExpr& saving,
                       int layer) {
    const std::string id = cluster_of(g, f.idx, w.nodes);
    auto [it, fresh] = by_cluster.emplace(std::make_pair(id, strategy), r.opportunities.size());
    if (fresh) r.opportunities.push_back(RecomputeOpportunity{id, strategy, {}, saving});
    RecomputeOccurrence occ;
    occ.activation = dropping.front();
    occ.more_activations.assign(dropping.begin() + 1, dropping.end());
    occ.subgraph = w.nodes;
    occ.new_saved = w.frontier;
    occ.layer = layer;
    occ.standalone = layer < 0 && strategy == 1 && reads_only_cheap(f, w.nodes);
    r.opportunities[it->second].occurrences.push_back(std::move(occ));
  };

  for (size_t i = 0; i < f.num_forward; ++i) {
    const NodeId root = static_cast<NodeId>(i);
    if (!is_recomputable(g.nodes[root])) continue;
    std::vector<ValueId> dropping;  // the root's saved outputs that are activations
    for (ValueId v : g.nodes[root].outputs)
      if (v != kNoValue && f.saved[v] && !f.cheap[v] && !f.boundary[v] && !input_grad[v] && !f.views_kept(v))
        dropping.push_back(v);
    const std::optional<SymExpr> dropped = total_bytes(g, dropping);
    if (dropping.empty() || !dropped) continue;
    const int layer = layer_of(f, boundary_pos, root, dropping);

    const Walk full = walk_from(f, root, dropping, kMaxSubgraphNodes);
    if (full.frontier.empty()) add(full, 1, dropping, *dropped, layer);
    // The compromise, cheapest recompute first: the root alone, keeping its inputs (v = Cast(u:
    // fp16 -> fp32) keeps u), else the full walk keeping what it had to stop at.
    std::vector<Walk> compromises;
    if (full.nodes.size() > 1) compromises.push_back(walk_from(f, root, dropping, 1));
    if (!full.frontier.empty()) compromises.push_back(full);
    for (const Walk& w : compromises) {
      const std::optional<SymExpr> kept = total_bytes(g, w.frontier);
      if (w.frontier.empty() || !kept || !worth_it(*dropped, *dropped - *kept)) continue;
      add(w, 2, dropping, *dropped - *kept, layer);
      break;
    }
  }

  // Largest total saving first (every symbol at 1024), then by cluster id for a stable order.
  const auto total = [](const RecomputeOpportunity& o) {
    int64_t t;  // saturates: only orders the list
    return __builtin_mul_overflow(at_uniform(o.bytes_saved_each, 1024).value_or(0),
                                  static_cast<int64_t>(o.occurrences.size()), &t)
               ? std::numeric_limits<int64_t>::max() : t;
  };
  std::stable_sort(r.opportunities.begin(), r.opportunities.end(),
                   [&](const RecomputeOpportunity& a, const RecomputeOpportunity& b) {
                     const int64_t ta = total(a), tb = total(b);
                     if (ta != tb) return ta > tb;
                     return std::tie(a.cluster, a.strategy) < std::tie(b.cluster, b.strategy);
                   });
  return r;
}

}  // namespace torch_ort
