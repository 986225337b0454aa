// Applying the recompute plans (recompute.h): which occurrences the level and the config turn on,
// and the clones that rebuild them in backward just before their first reader.
#include "csrc/core/planner/recompute.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <unordered_map>

namespace torch_ort {
namespace {

std::string valid_ids(const RecomputeResult& r) {
  if (r.opportunities.empty()) return "none";
  std::string s;
  for (const RecomputeOpportunity& o : r.opportunities)
    s += (s.empty() ? "" : ", ") + o.cluster + " (strategy " + std::to_string(o.strategy) + ", " +
         std::to_string(o.occurrences.size()) + " occurrences)";
  return s;
}

void validate(const RecomputeResult& r, int level, const std::vector<RecomputeRequest>& requests) {
  const std::string where = "ORTMODULE_MEMORY_OPT_CONFIG: ";
  if (level < 0 || level > 2)
    throw std::invalid_argument("ORTMODULE_MEMORY_OPT_LEVEL must be 0, 1 or 2, got " + std::to_string(level));
  for (const RecomputeRequest& q : requests) {
    if (q.strategy < 0 || q.strategy > 2)
      throw std::invalid_argument(where + "strategy of cluster '" + q.cluster + "' must be 0 (off), 1 (recompute) "
                                  "or 2 (recompute with compromise), got " + std::to_string(q.strategy));
    if (q.count < -1)
      throw std::invalid_argument(where + "count of cluster '" + q.cluster + "' must be -1 (all) or >= 0, got " +
                                  std::to_string(q.count));
    const auto named = [&](const RecomputeOpportunity& o) {
      return o.cluster == q.cluster && (q.strategy == 0 || o.strategy == q.strategy);
    };
    if (std::none_of(r.opportunities.begin(), r.opportunities.end(), named))
      throw std::invalid_argument(where + "no recompute cluster '" + q.cluster + "'" +
                                  (q.strategy ? " with strategy " + std::to_string(q.strategy) : "") +
                                  " in this model; valid cluster ids: " + valid_ids(r));
  }
}

// One plan per activation: recomputing it in full wins over the compromise.
void one_plan_per_activation(RecomputeResult& r) {
  std::set<ValueId> full;
  for (const RecomputeOpportunity& o : r.opportunities)
    for (const RecomputeOccurrence& occ : o.occurrences)
      if (occ.enabled && o.strategy == 1) full.insert(occ.activation);
  for (RecomputeOpportunity& o : r.opportunities)
    for (RecomputeOccurrence& occ : o.occurrences)
      if (o.strategy == 2 && full.count(occ.activation)) occ.enabled = false;
}

// A level recomputes one layer at a time. A subgraph reading an activation that another layer
// drops would chain: a pre-LN SkipLayerNorm's normalised output needs the previous branch's
// output, whose recompute needs the layer before, and so on — every layer's clones alive at once
// when backward starts. Such an occurrence stays off; its activation stays saved and is where its
// layer's recompute starts from. Forward order: whatever an occurrence reads is decided before it.
void keep_layers_apart(RecomputeResult& r, const Graph& g) {
  const GraphIndex idx(g);
  std::vector<RecomputeOccurrence*> on;
  for (RecomputeOpportunity& o : r.opportunities)
    for (RecomputeOccurrence& occ : o.occurrences)
      if (occ.enabled) on.push_back(&occ);
  std::sort(on.begin(), on.end(), [](const RecomputeOccurrence* a, const RecomputeOccurrence* b) {
    return a->subgraph.back() < b->subgraph.back();
  });
  std::map<ValueId, int> dropped_in;  // activation -> layer of the enabled occurrence dropping it
  for (RecomputeOccurrence* occ : on) {
    for (NodeId n : occ->subgraph)
      for (ValueId u : g.nodes[n].inputs) {
        if (u == kNoValue || std::binary_search(occ->subgraph.begin(), occ->subgraph.end(), idx.producer[u]))
          continue;
        auto it = dropped_in.find(u);
        if (it != dropped_in.end() && it->second != occ->layer) occ->enabled = false;
      }
    // A standalone clone reads only inputs, constants and outputs: no chain through it.
    if (!occ->enabled || occ->standalone) continue;
    dropped_in[occ->activation] = occ->layer;
    for (ValueId v : occ->more_activations) dropped_in[v] = occ->layer;
  }
}

// Marks the occurrences `level` and `requests` turn on (see recompute.h).
void select(RecomputeResult& r, const Graph& g, int level, const std::vector<RecomputeRequest>& requests) {
  validate(r, level, requests);
  for (RecomputeOpportunity& o : r.opportunities)
    for (RecomputeOccurrence& occ : o.occurrences)
      occ.enabled = o.strategy <= level && (occ.layer >= 0 || occ.standalone);
  one_plan_per_activation(r);
  keep_layers_apart(r, g);
  // A request decides its cluster alone: off first, then its first `count` occurrences on.
  for (const RecomputeRequest& q : requests)
    for (RecomputeOpportunity& o : r.opportunities)
      if (o.cluster == q.cluster)
        for (RecomputeOccurrence& occ : o.occurrences) occ.enabled = false;
  for (const RecomputeRequest& q : requests)
    for (RecomputeOpportunity& o : r.opportunities)
      if (o.cluster == q.cluster && o.strategy == q.strategy)
        for (size_t k = 0; k < o.occurrences.size(); ++k)
          o.occurrences[k].enabled |= q.count < 0 || static_cast<int64_t>(k) < q.count;
  one_plan_per_activation(r);
}

// Rebuilds the backward half with the clones: walking backward nodes in order, the first reader
// of a dropped activation gets the clones of its subgraph placed just before it. A clone reads
// the clone of a value produced inside its subgraph or dropped by another enabled occurrence
// (recomputation chains within a layer), and the forward value otherwise (kept by the planner).
class Rewriter {
 public:
  Rewriter(TrainingGraph& tg, const RecomputeResult& r) : tg_(tg), g_(tg.graph), idx_(tg.graph) {
    for (const RecomputeOpportunity& o : r.opportunities)
      for (const RecomputeOccurrence& occ : o.occurrences) {
        if (!occ.enabled) continue;
        dropped_[occ.activation] = &occ;
        for (ValueId v : occ.more_activations) dropped_[v] = &occ;
      }
  }

  int64_t run() {
    if (dropped_.empty()) return 0;
    const size_t nf = tg_.num_forward_nodes;
    std::vector<Node> backward(g_.nodes.begin() + static_cast<std::ptrdiff_t>(nf), g_.nodes.end());
    for (Node& n : backward) {
      for (ValueId& v : n.inputs)
        if (v != kNoValue && dropped_.count(v)) v = materialize(v);
      out_.push_back(std::move(n));
    }
    const int64_t cloned = static_cast<int64_t>(out_.size() - backward.size());
    g_.nodes.resize(nf);
    for (Node& n : out_) g_.nodes.push_back(std::move(n));
    return cloned;
  }

 private:
  ValueId materialize(ValueId v) {
    if (auto it = clone_of_.find(v); it != clone_of_.end()) return it->second;
    const RecomputeOccurrence& occ = *dropped_.at(v);
    const std::set<NodeId> inside(occ.subgraph.begin(), occ.subgraph.end());
    for (NodeId n : occ.subgraph) clone(n, inside);
    return clone_of_.at(v);
  }

  void clone(NodeId n, const std::set<NodeId>& inside) {
    if (!cloned_.insert(n).second) return;
    Node c = g_.nodes[n];
    for (ValueId& u : c.inputs) {
      if (u == kNoValue) continue;
      if (inside.count(idx_.producer[u])) u = clone_of_.at(u);  // cloned earlier: forward order
      else if (dropped_.count(u)) u = materialize(u);
    }
    c.name = g_.unique_node_name(g_.nodes[n].name + "/recompute");
    c.in_backward = true;
    for (ValueId& o : c.outputs) {
      if (o == kNoValue) continue;
      const Value& val = g_.value(o);
      const ValueId copy = g_.new_value(val.name + "/recompute", val.dtype, val.shape);
      clone_of_[o] = copy;
      o = copy;
    }
    out_.push_back(std::move(c));
  }

  TrainingGraph& tg_;
  Graph& g_;
  const GraphIndex idx_;  // of the graph before the rewrite (forward nodes keep their ids)
  std::map<ValueId, const RecomputeOccurrence*> dropped_;  // enabled activation -> its plan
  std::unordered_map<ValueId, ValueId> clone_of_;           // forward value -> recomputed value
  std::set<NodeId> cloned_;                                 // forward nodes cloned so far
  std::vector<Node> out_;                                   // the new backward half
};

}  // namespace

RecomputeResult apply_recompute(TrainingGraph& tg, int level, const std::vector<RecomputeRequest>& requests) {
  RecomputeResult r = analyze_recompute(tg);
  select(r, tg.graph, level, requests);
  r.nodes_cloned = Rewriter(tg, r).run();
  return r;
}

}  // namespace torch_ort
