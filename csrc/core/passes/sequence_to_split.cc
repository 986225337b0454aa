// SplitToSequence + SequenceAt(constant positions) -> one Split whose outputs the SequenceAt
// results become. The exporter emits x.split(n, dim) (nanoGPT's q, k, v) this way; our IR has no
// sequence values, and Split has a kernel and a gradient rule.
#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "csrc/core/passes/pass.h"
#include "csrc/core/passes/pattern.h"

namespace torch_ort {
namespace {

// The int64 values of a constant (initializer or Constant node) and whether it is a scalar
// (from the constant's own dims: a Constant's output value may carry no shape); nullopt when the
// value is not a constant of integers.
struct ConstInts {
  std::vector<int64_t> values;
  bool scalar;
};
std::optional<ConstInts> const_ints(const Graph& g, const GraphIndex& idx, ValueId v) {
  try {
    if (auto it = g.initializers.find(v); it != g.initializers.end())
      return ConstInts{it->second.as_int64s(), it->second.dims.empty()};
    const NodeId p = idx.producer[v];
    if (p < 0 || g.nodes[p].op_type != "Constant" || !g.nodes[p].domain.empty()) return std::nullopt;
    const Attributes& a = g.nodes[p].attrs;
    if (const TensorData* t = a.get_tensor("value")) return ConstInts{t->as_int64s(), t->dims.empty()};
    if (a.has("value_ints")) return ConstInts{a.get_ints("value_ints", {}), false};
    if (a.has("value_int")) return ConstInts{{a.get_int("value_int", 0)}, true};
  } catch (const std::exception&) {  // a float constant: not a size or a position
  }
  return std::nullopt;
}

// Split sizes of SplitToSequence(x, split?) along `axis`, or nullopt when they are not static:
// a 1-D split lists them; a scalar split s (or none: s = 1) needs the dim to be known.
std::optional<std::vector<int64_t>> static_sizes(const Graph& g, const GraphIndex& idx, const Node& n,
                                                 int64_t axis) {
  const Shape& xs = g.value(n.inputs[0]).shape;
  const bool has_split = n.inputs.size() > 1 && n.inputs[1] != kNoValue;
  std::optional<ConstInts> s = has_split ? const_ints(g, idx, n.inputs[1]) : ConstInts{{1}, true};
  if (!s) return std::nullopt;
  if (!s->scalar) return s->values;
  const int64_t chunk = s->values.at(0);
  if (chunk <= 0 || !xs.dims[axis].is_known()) return std::nullopt;
  std::vector<int64_t> sizes;
  for (int64_t left = xs.dims[axis].value; left > 0; left -= chunk) sizes.push_back(std::min(left, chunk));
  return sizes;
}

class SequenceToSplit final : public Pass {
 public:
  std::string_view name() const override { return "sequence_to_split"; }
  bool can_disable() const override { return false; }  // no kernel or gradient takes sequences

  bool run(Graph& g) override {
    bool changed = false;
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (g.nodes[i].op_type == "SplitToSequence" && g.nodes[i].domain.empty()) changed |= rewrite(g, i);
    return changed;
  }

 private:
  // Rewrites nodes[at] and its SequenceAt readers in place; false (graph untouched) when any
  // reader is something else or any position or size is not static.
  bool rewrite(Graph& g, size_t at) {
    const GraphIndex idx(g);
    const Node seq = g.nodes[at];
    if (seq.inputs.empty() || seq.inputs[0] == kNoValue || seq.outputs.size() != 1) return false;
    const ValueId x = seq.inputs[0], s = seq.outputs[0];
    for (ValueId o : g.outputs)
      if (o == s) return false;
    const Shape xs = g.value(x).shape;
    if (!xs.rank_known) return false;
    int64_t axis = seq.attrs.get_int("axis", 0);
    if (axis < -xs.rank() || axis >= xs.rank()) return false;
    if (axis < 0) axis += xs.rank();
    const std::optional<std::vector<int64_t>> sizes = static_sizes(g, idx, seq, axis);
    if (!sizes || sizes->empty()) return false;
    const int64_t n = static_cast<int64_t>(sizes->size());
    // keepdims=0 drops the split axis, but only when no split input was given (chunks of 1).
    const bool squeeze =
        (seq.inputs.size() < 2 || seq.inputs[1] == kNoValue) && seq.attrs.get_int("keepdims", 1) == 0;

    std::map<NodeId, int64_t> picks;  // SequenceAt node -> the Split output it reads
    for (NodeId r : idx.consumers[s]) {
      const Node& rn = g.nodes[r];
      if (rn.op_type != "SequenceAt" || !rn.domain.empty() || rn.inputs.size() != 2 || rn.inputs[0] != s)
        return false;
      std::optional<ConstInts> p = const_ints(g, idx, rn.inputs[1]);
      if (!p || p->values.size() != 1 || p->values[0] < -n || p->values[0] >= n) return false;
      picks[r] = p->values[0] < 0 ? p->values[0] + n : p->values[0];
    }

    // Split output k is the first plain pick's own value (so that pick disappears), otherwise a
    // fresh value typed from x with the axis sized per chunk.
    std::vector<ValueId> outs(n, kNoValue);
    if (!squeeze)
      for (const auto& [r, k] : picks)
        if (outs[k] == kNoValue) outs[k] = g.nodes[r].outputs[0];
    for (int64_t k = 0; k < n; ++k) {
      if (outs[k] != kNoValue) continue;
      Shape os = xs;
      os.dims[axis] = Dim::known((*sizes)[k]);
      outs[k] = g.new_value(g.value(s).name + "/split_" + std::to_string(k), g.value(x).dtype, os);
    }
    ValueId split = g.new_value(g.value(s).name + "/sizes", DType::kInt64, Shape::of({Dim::known(n)}));
    g.initializers[split] = TensorData::from_int64s(*sizes);
    Attributes sa;
    sa.set("axis", axis);
    g.nodes[at] = Node{"", "Split", seq.name, {x, split}, outs, std::move(sa)};
    std::vector<char> drop(g.nodes.size(), 0);
    for (const auto& [r, k] : picks) {
      Node& rn = g.nodes[r];
      if (squeeze) {  // keepdims=0: the pick is x's chunk without the split axis
        ValueId axes = g.new_value(rn.name + "/axes", DType::kInt64, Shape::of({Dim::known(1)}));
        g.initializers[axes] = TensorData::from_int64s({axis});
        rn = Node{"", "Squeeze", rn.name, {outs[k], axes}, rn.outputs, {}};
      } else if (rn.outputs[0] == outs[k]) {
        drop[r] = 1;  // Split now produces this value
      } else {  // a second pick of the same chunk keeps its own value
        rn = Node{"", "Identity", rn.name, {outs[k]}, rn.outputs, {}};
      }
    }
    pattern::erase_nodes(g, drop);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_sequence_to_split_pass() { return std::make_unique<SequenceToSplit>(); }

}  // namespace torch_ort
