// Common-subexpression elimination: two nodes of the same op (domain, type), attributes and
// inputs compute the same values, so the later one goes and its readers read the earlier one's
// outputs. Equal small constants (initializers) count as one value first, so the per-layer copies
// of the exporter's shape arithmetic collapse. Never merged: ops that draw random numbers and
// opaque ops (PythonOp, ATenOp), whose calls may have effects (their traits: ops/random.cc,
// ops/aten.cc).
//
// Works on any graph, the forward+backward training graph included: it only removes nodes (the
// survivor is always the earlier node), so every remaining node keeps its half.
#include <algorithm>
#include <bit>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>

#include "csrc/core/ir/op_traits.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"

namespace torch_ort {
namespace {

using namespace pattern;

constexpr size_t kMaxConstantBytes = 4096;  // larger initializers are not compared byte by byte

// Random ops draw anew on every call, opaque ones may have effects (and ATenOpGrad consumes the
// autograd history its ATenOp/PythonOp recorded, once): never merged (ir/op_traits.h).
bool mergeable(const Node& n) {
  if (is_random(n) || is_opaque(n)) return false;
  for (ValueId o : n.outputs)
    if (o != kNoValue) return true;
  return false;
}

void append_tensor(std::string& k, const TensorData& t) {
  k += std::to_string(static_cast<int>(t.dtype)) + "[";
  for (int64_t d : t.dims) k += std::to_string(d) + ",";
  k += ']';
  k += std::to_string(t.raw.size());
  k += ':';
  k += t.raw;
}

// A byte string equal for two nodes exactly when they compute the same values; nullopt when the
// node carries a constant too large to compare cheaply.
std::optional<std::string> key_of(const Node& n) {
  std::string k = n.domain + "\x1f" + n.op_type + "\x1f";
  std::vector<ValueId> ins = n.inputs;
  if (op_traits(n).commutative) std::sort(ins.begin(), ins.end());
  for (ValueId v : ins) k += std::to_string(v) + ",";
  k += '\x1f';
  k += std::to_string(n.outputs.size());
  k += '\x1f';
  for (const auto& [name, a] : n.attrs.all()) {
    k += name + "=" + std::to_string(a.index()) + ":";
    if (const auto* i = std::get_if<int64_t>(&a)) k += std::to_string(*i);
    else if (const auto* f = std::get_if<float>(&a)) k += std::to_string(std::bit_cast<uint32_t>(*f));
    else if (const auto* s = std::get_if<std::string>(&a)) k += std::to_string(s->size()) + ":" + *s;
    else if (const auto* t = std::get_if<TensorData>(&a)) {
      if (t->raw.size() > kMaxConstantBytes) return std::nullopt;
      append_tensor(k, *t);
    } else if (const auto* is = std::get_if<std::vector<int64_t>>(&a)) {
      for (int64_t x : *is) k += std::to_string(x) + ",";
    } else if (const auto* fs = std::get_if<std::vector<float>>(&a)) {
      for (float x : *fs) k += std::to_string(std::bit_cast<uint32_t>(x)) + ",";
    } else if (const auto* ss = std::get_if<std::vector<std::string>>(&a)) {
      for (const std::string& x : *ss) k += std::to_string(x.size()) + ":" + x + ",";
    }
    k += "\x1e";
  }
  return k;
}

class CommonSubexpressionElimination final : public Pass {
 public:
  std::string_view name() const override { return "cse"; }

  bool run(Graph& g) override {
    std::vector<ValueId> rep(g.num_values());  // value -> the value that stands for it
    for (ValueId v = 0; v < g.num_values(); ++v) rep[v] = v;
    std::vector<char> protect(g.num_values(), 0);  // graph outputs keep their own producer
    for (ValueId o : g.outputs) protect[o] = 1;
    for (ValueId i : g.inputs) protect[i] = 1;  // (never an initializer, but be explicit)
    bool changed = false;

    // Equal small initializers: the first (lowest id) stands for the rest, which then go.
    std::map<std::string, ValueId> first_const;
    std::vector<ValueId> dup_consts;
    for (const auto& [v, t] : g.initializers) {
      if (t.raw.size() > kMaxConstantBytes || protect[v]) continue;
      std::string k;
      append_tensor(k, t);
      auto [it, fresh] = first_const.emplace(std::move(k), v);
      if (!fresh) {
        rep[v] = it->second;
        dup_consts.push_back(v);
      }
    }

    std::unordered_map<std::string, NodeId> first_node;
    std::vector<char> drop(g.nodes.size(), 0);
    for (NodeId i = 0; i < static_cast<NodeId>(g.nodes.size()); ++i) {
      Node& n = g.nodes[i];
      for (ValueId& v : n.inputs) {
        if (v != kNoValue && rep[v] != v) {
          v = rep[v];
          changed = true;
        }
      }
      if (!mergeable(n)) continue;
      const std::optional<std::string> k = key_of(n);
      if (!k) continue;
      auto [it, fresh] = first_node.emplace(*k, i);
      if (fresh) continue;
      const Node& keep = g.nodes[it->second];
      bool ok = true;  // every output of n has a counterpart, and none is a graph output
      for (size_t o = 0; o < n.outputs.size(); ++o)
        if (n.outputs[o] != kNoValue && (keep.outputs[o] == kNoValue || protect[n.outputs[o]])) ok = false;
      if (!ok) continue;
      for (size_t o = 0; o < n.outputs.size(); ++o)
        if (n.outputs[o] != kNoValue) rep[n.outputs[o]] = keep.outputs[o];
      drop[i] = 1;
      changed = true;
    }
    erase_nodes(g, drop);
    for (ValueId v : dup_consts) {
      g.initializers.erase(v);
      changed = true;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> make_cse_pass() { return std::make_unique<CommonSubexpressionElimination>(); }

}  // namespace torch_ort
