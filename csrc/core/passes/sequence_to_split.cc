// SplitToSequence + SequenceAt(constant positions) -> one Split whose outputs the SequenceAt
// results become, or, when the piece sizes are known only at run time, one Slice per SequenceAt.
// The exporter emits x.split(n, dim), x.chunk(k, dim) and x.unbind(dim) this way (nanoGPT's
// q, k, v; a chunk along a dynamic dim, whose chunk size is shape arithmetic). Our IR has no
// sequence values; Split and Slice have kernels and gradient rules, and the start/end arithmetic
// of a Slice stays on the host (placement). Anything else is an error naming the op and why.
#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/passes/rewrite.h"

namespace torch_ort {
namespace {

using pattern::has_input;

// The int64 values of a constant (initializer or Constant node) and whether it is a scalar
// (from the constant's own dims: a Constant's output value may carry no shape); nullopt when the
// value is not a constant of integers.
struct ConstInts {
  std::vector<int64_t> values;
  bool scalar;
};
std::optional<ConstInts> const_ints(const Graph& g, const GraphIndex& idx, ValueId v) {
  std::optional<TensorData> t = pattern::constant_of(g, idx, v);
  if (!t || (t->dtype != DType::kInt64 && t->dtype != DType::kInt32)) return std::nullopt;
  try {
    return ConstInts{t->as_int64s(), t->dims.empty()};
  } catch (const std::exception&) {  // raw bytes that do not match the dims
    return std::nullopt;
  }
}

[[noreturn]] void cannot_lower(const Node& n, const std::string& why) {
  throw UnsupportedOpError("Unsupported op '" + n.op_type + "' (node " + n.name + "): " + why +
                           " — sequences lower to Split/Slice only when every reader is SequenceAt at "
                           "a constant position (no kernel or gradient rule takes a sequence); set "
                           "ORTMODULE_FALLBACK_POLICY to run the module in PyTorch instead, or open an issue",
                           {{n.name, n.domain, n.op_type, "kernel"}});
}

// A SplitToSequence checked lowerable: x split along `axis` into pieces of `split`.
struct SeqSplit {
  ValueId x;                    // the tensor split
  ValueId split;                // the `split` input; kNoValue: pieces of 1
  std::optional<ConstInts> c;   // `split`'s constant values, when it is a constant
  bool list;                    // `split` is 1-D: it lists the piece sizes (else one size)
  int64_t axis;                 // in [0, rank)
  bool squeeze;                 // keepdims=0 without `split`: pieces lose the axis
  std::map<NodeId, int64_t> picks;  // SequenceAt node -> the position it reads (may be negative)
};

// Reads nodes[at] and its readers; throws (naming the op and why) when they cannot be lowered.
SeqSplit read(const Graph& g, const GraphIndex& idx, NodeId at) {
  const Node& n = g.nodes[at];
  if (!has_input(n, 0) || n.outputs.size() != 1) cannot_lower(n, "it needs an input and one output");
  SeqSplit sp{n.inputs[0], has_input(n, 1) ? n.inputs[1] : kNoValue, std::nullopt, false, 0, false, {}};
  const ValueId seq = n.outputs[0];
  if (pattern::is_graph_output(g, seq)) cannot_lower(n, "its sequence '" + g.value(seq).name + "' is a graph output");
  const Shape& xs = g.value(sp.x).shape;
  if (!xs.rank_known) cannot_lower(n, "the rank of its input '" + g.value(sp.x).name + "' is unknown");
  sp.axis = n.attrs.get_int("axis", 0);
  if (sp.axis < -xs.rank() || sp.axis >= xs.rank())
    cannot_lower(n, "axis " + std::to_string(sp.axis) + " is out of range for rank " + std::to_string(xs.rank()));
  if (sp.axis < 0) sp.axis += xs.rank();
  if (sp.split != kNoValue) {
    const Value& sv = g.value(sp.split);
    sp.c = const_ints(g, idx, sp.split);
    if (!sp.c && sv.dtype != DType::kInt64 && sv.dtype != DType::kInt32)
      cannot_lower(n, "its split '" + sv.name + "' is not an integer tensor");
    if (!sp.c && sv.shape.rank() != 0 && sv.shape.rank() != 1)
      cannot_lower(n, "its split '" + sv.name + "' is computed at run time and not known to be a scalar or 1-D");
    sp.list = sp.c ? !sp.c->scalar : sv.shape.rank() == 1;
    if (sp.c)
      for (int64_t s : sp.c->values)
        if (s < 0 || (!sp.list && s == 0))
          cannot_lower(n, "its split '" + sv.name + "' holds the piece size " + std::to_string(s));
  }
  sp.squeeze = sp.split == kNoValue && n.attrs.get_int("keepdims", 1) == 0;
  for (NodeId r : idx.consumers[seq]) {
    const Node& rn = g.nodes[r];
    if (!pattern::is_onnx(rn, "SequenceAt") || rn.inputs.size() != 2 || rn.inputs[0] != seq ||
        rn.outputs.size() != 1 || rn.outputs[0] == kNoValue)
      cannot_lower(n, "its sequence '" + g.value(seq).name + "' is read by " + rn.describe());
    const std::optional<ConstInts> p = const_ints(g, idx, rn.inputs[1]);
    if (!p || p->values.size() != 1)
      cannot_lower(n, rn.describe() + " reads its sequence at a position computed at run time");
    sp.picks[r] = p->values[0];
  }
  return sp;
}

// The piece sizes when their count is static: a 1-D split's length, or a constant scalar split of
// a known dim; nullopt otherwise (the Slice lowering). Entries are -1 where only run time knows.
std::optional<std::vector<int64_t>> static_sizes(const Graph& g, const SeqSplit& sp) {
  const Dim& d = g.value(sp.x).shape.dims[sp.axis];
  if (sp.list) {
    if (sp.c) return sp.c->values;
    const Shape& ss = g.value(sp.split).shape;
    if (!ss.dims[0].is_known()) return std::nullopt;
    return std::vector<int64_t>(static_cast<size_t>(ss.dims[0].value), -1);
  }
  const int64_t chunk = sp.split == kNoValue ? 1 : sp.c ? sp.c->values.at(0) : 0;
  if (chunk <= 0 || !d.is_known()) return std::nullopt;
  std::vector<int64_t> sizes;
  for (int64_t left = d.value; left > 0; left -= chunk) sizes.push_back(std::min(left, chunk));
  return sizes;
}

// The nodes a lowering adds, in order, typed int64 of shape [1] unless said otherwise.
struct Emitter {
  Graph& g;
  std::string base;  // names of new values and nodes start with it
  std::vector<Node> nodes;

  ValueId konst(int64_t v) {
    const ValueId id = g.new_value(base + "/const", DType::kInt64, Shape::of({Dim::known(1)}));
    g.initializers[id] = TensorData::from_int64s({v});
    return id;
  }
  void emit(const std::string& op, std::vector<ValueId> ins, std::vector<ValueId> outs, Attributes a = {}) {
    nodes.push_back(Node{"", op, g.unique_node_name(base + "/" + op), std::move(ins), std::move(outs), std::move(a)});
  }
  ValueId op(const std::string& op, std::vector<ValueId> ins, Attributes a = {}, DType t = DType::kInt64) {
    const ValueId y = g.new_value(base + "/" + op, t, Shape::of({Dim::known(1)}));
    emit(op, std::move(ins), {y}, std::move(a));
    return y;
  }
};

int64_t saturating_mul(int64_t a, int64_t b) {  // a, b >= 0; Slice clamps anything past the dim
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}

// One Split in place of `seq`, the readers' values its outputs (a Squeeze or an Identity after it
// where a reader's value cannot be one).
rewrite::Replacement lower_to_split(Graph& g, const Node& seq, const SeqSplit& sp, const std::vector<int64_t>& sizes) {
  const int64_t n = static_cast<int64_t>(sizes.size());
  const Shape xs = g.value(sp.x).shape;
  std::map<NodeId, int64_t> picks;  // SequenceAt node -> the Split output it reads
  for (const auto& [r, p] : sp.picks) {
    if (p < -n || p >= n)
      cannot_lower(seq, g.nodes[r].describe() + " reads position " + std::to_string(p) + " of " +
                            std::to_string(n) + " pieces");
    picks[r] = p < 0 ? p + n : p;
  }
  // Split output k is the first plain pick's own value, otherwise a fresh value typed from x with
  // the axis sized per piece.
  std::vector<ValueId> outs(n, kNoValue);
  if (!sp.squeeze)
    for (const auto& [r, k] : picks)
      if (outs[k] == kNoValue) outs[k] = g.nodes[r].outputs[0];
  for (int64_t k = 0; k < n; ++k) {
    if (outs[k] != kNoValue) continue;
    Shape os = xs;
    os.dims[sp.axis] = sizes[k] >= 0 ? Dim::known(sizes[k]) : Dim{};
    outs[k] = g.new_value(g.value(seq.outputs[0]).name + "/split_" + std::to_string(k), g.value(sp.x).dtype, os);
  }
  ValueId split = sp.split;
  if (sp.c || sp.split == kNoValue) {  // sizes derived from a constant: one int64 list
    split = g.new_value(g.value(seq.outputs[0]).name + "/sizes", DType::kInt64, Shape::of({Dim::known(n)}));
    g.initializers[split] = TensorData::from_int64s(sizes);
  }
  Attributes sa;
  sa.set("axis", sp.axis);
  std::vector<Node> after;
  for (const auto& [r, k] : picks) {
    const Node& rn = g.nodes[r];
    if (sp.squeeze) {  // keepdims=0: the pick is x's piece without the split axis
      ValueId axes = g.new_value(rn.name + "/axes", DType::kInt64, Shape::of({Dim::known(1)}));
      g.initializers[axes] = TensorData::from_int64s({sp.axis});
      after.push_back(Node{"", "Squeeze", rn.name, {outs[k], axes}, rn.outputs, {}});
    } else if (rn.outputs[0] != outs[k]) {  // a second pick of the same piece keeps its own value
      after.push_back(Node{"", "Identity", rn.name, {outs[k]}, rn.outputs, {}});
    }
  }
  return {Node{"", "Split", "", {sp.x, split}, outs, std::move(sa)}, {}, std::move(after)};
}

// The shape arithmetic the readers share, then each SequenceAt as Slice(x, start, end, [axis])
// (+ Squeeze for keepdims=0), all in place of `seq`. With a piece size s, piece k >= 0 is
// [k·s, (k+1)·s) (Slice clamps the ragged last one); piece p < 0 is piece n + p of the
// n = ceil(D / s) pieces of D = x.shape[axis], clamped at 0 so a missing piece is empty.
rewrite::Replacement lower_to_slices(Graph& g, const Node& seq, const SeqSplit& sp) {
  Emitter e{g, seq.name, {}};
  const int64_t c = sp.split == kNoValue ? 1 : sp.c ? sp.c->values[0] : 0;  // 0: known at run time
  ValueId s = kNoValue, n = kNoValue, zero = kNoValue;
  if (c == 0) {  // s = the scalar split as [1] int64, for the Slice arithmetic
    s = e.op("Reshape", {sp.split, e.konst(1)}, {}, g.value(sp.split).dtype);
    if (g.value(s).dtype != DType::kInt64) {
      Attributes to;
      to.set("to", static_cast<int64_t>(DType::kInt64));
      s = e.op("Cast", {s}, std::move(to));
    }
  }
  const bool any_negative = std::any_of(sp.picks.begin(), sp.picks.end(), [](const auto& rp) { return rp.second < 0; });
  if (any_negative && c != 1) {  // n = (D + s - 1) / s
    Attributes range;
    range.set("start", sp.axis);
    range.set("end", sp.axis + 1);
    const ValueId d = e.op("Shape", {sp.x}, std::move(range));
    const ValueId s_minus_1 = c ? e.konst(c - 1) : e.op("Sub", {s, e.konst(1)});
    n = e.op("Div", {e.op("Add", {d, s_minus_1}), c ? e.konst(c) : s});
    zero = e.konst(0);
    if (c) s = e.konst(c);
  }
  for (const auto& [r, p] : sp.picks) {
    const Node& rn = g.nodes[r];
    ValueId start, end;
    if (p >= 0 && c) {
      start = e.konst(saturating_mul(p, c));
      end = e.konst(saturating_mul(p + 1, c));
    } else if (p >= 0) {
      auto times_s = [&](int64_t k) { return k == 0 ? e.konst(0) : k == 1 ? s : e.op("Mul", {s, e.konst(k)}); };
      start = times_s(p);
      end = times_s(p + 1);
    } else if (c == 1) {  // pieces of 1: Slice's own negative indices count from the end
      start = e.konst(p);
      end = e.konst(p == -1 ? std::numeric_limits<int64_t>::max() : p + 1);
    } else {
      const ValueId first = e.op("Mul", {e.op("Add", {n, e.konst(p)}), s});
      start = e.op("Max", {first, zero});
      end = e.op("Max", {e.op("Add", {first, s}), zero});
    }
    const ValueId y = rn.outputs[0];
    ValueId piece = y;
    if (sp.squeeze) {
      Shape ps = g.value(sp.x).shape;
      ps.dims[sp.axis] = Dim::known(1);
      piece = g.new_value(g.value(y).name + "/piece", g.value(sp.x).dtype, ps);
    }
    if (!g.value(y).shape.rank_known) {  // the exporter's shape, else x's with the axis unknown/gone
      Shape ys = g.value(sp.x).shape;
      ys.dims[sp.axis] = Dim{};
      if (sp.squeeze) ys.dims.erase(ys.dims.begin() + sp.axis);
      g.value(y).shape = std::move(ys);
    }
    e.emit("Slice", {sp.x, start, end, e.konst(sp.axis)}, {piece});
    if (sp.squeeze) e.emit("Squeeze", {piece, e.konst(sp.axis)}, {y});
  }

  Node first = std::move(e.nodes.front());
  e.nodes.erase(e.nodes.begin());
  return {std::move(first), {}, std::move(e.nodes)};
}

rewrite::NodePattern any_node() {
  return rewrite::where([](const Graph&, const Node&) { return true; }).at_least_these_inputs();
}

rewrite::Replacement lower(Graph& g, const rewrite::Match& m, const Node& seq) {
  const SeqSplit sp = read(g, m.index(), m.node("sequence"));
  if (const std::optional<std::vector<int64_t>> sizes = static_sizes(g, sp)) return lower_to_split(g, seq, sp, *sizes);
  if (sp.list) cannot_lower(seq, "its split list '" + g.value(sp.split).name + "' has a length known only at run time");
  return lower_to_slices(g, seq, sp);
}

class SequenceToSplit final : public Pass {
 public:
  std::string_view name() const override { return "sequence_to_split"; }
  bool can_disable() const override { return false; }  // no kernel or gradient takes sequences

  // Every SplitToSequence goes, with its readers, or the pass throws naming why. The rule takes
  // any readers; lower() checks them (read) and throws for those it cannot lower.
  bool run(Graph& g) override {
    bool changed = drop_unread(g);
    changed |= rewrite::apply(g, {rewrite::Rule{
        "SplitToSequence + SequenceAt -> Split or Slice",
        rewrite::op("SplitToSequence").as("sequence").at_least_these_inputs().read_by_all("pieces", any_node()),
        nullptr, lower}});
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (pattern::is_onnx(g.nodes[i], "SplitToSequence")) {  // what the rule could not take: say why
        read(g, GraphIndex(g), static_cast<NodeId>(i));
        cannot_lower(g.nodes[i], "its readers could not be replaced with it");
      }
    return changed;
  }

 private:
  static bool drop_unread(Graph& g) {  // a SplitToSequence nothing reads
    const GraphIndex idx(g);
    std::vector<char> drop(g.nodes.size(), 0);
    bool any = false;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (!pattern::is_onnx(g.nodes[i], "SplitToSequence")) continue;
      const ValueId out = g.nodes[i].outputs.empty() ? kNoValue : g.nodes[i].outputs[0];
      if (out == kNoValue || (idx.consumers[out].empty() && !pattern::is_graph_output(g, out))) drop[i] = any = true;
    }
    if (any) pattern::erase_nodes(g, drop);
    return any;
  }
};

}  // namespace

std::unique_ptr<Pass> make_sequence_to_split_pass() { return std::make_unique<SequenceToSplit>(); }

}  // namespace torch_ort
