// Padding elimination: the token-wise work of a transformer stack runs on the positions that
// count, not on the padding. The rows (b, t) of the embedding's ids whose attention_mask is not 0
// (and those whose label counts) are listed once per step (PaddingRows); every node that acts
// row by row on (B, T, ...) values — the embedding, the norms, the projections and the MLP, the
// residual adds — then runs on those K rows only (PackRows gathers what it reads from outside).
// Where something that is not row-wise reads a packed value (attention's reshape into heads, the
// loss's row gather) it reads it padded back (PadRows: zeros in the rows left out):
//
//   Embedding(W, ids) -> Norm -> MatMul -> Reshape(B, T, h, d) -> ... Attention ... -> MatMul ...
//     -> Embedding(W, PackRows(ids, rows)) -> Norm -> MatMul -> PadRows -> Reshape -> ...
//        Attention -> Reshape(B, T, H) -> PackRows -> MatMul ...
//
// Exact, by construction and one check per step. Every value read padded is followed, op by op,
// with the axes of its B and T tracked: only ops that keep each row apart (reshapes that keep B
// and T, transposes, slices along other axes, elementwise ops) may read it, up to an Attention,
// a PackRows back into the rows, or the loss's gather of rows whose label counts (those rows are
// kept by construction). An Attention's output row is exact when the query row counts and every
// key it may attend counts: its mask is checked at run time (PaddingMaskCheck), and a mask that
// lets a counted row see a dropped one is an error naming the switch. Anything else reading a
// padded value — a graph output (returned logits), a reduction over the sequence, an unknown op —
// and the pass leaves the graph alone. Off by default, as in ONNX Runtime
// (ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER=1 runs it).
#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "csrc/core/ir/op_traits.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/passes/rows.h"

namespace torch_ort {
namespace padding_elimination {

using namespace pattern;

// Where a value's rows lie. Packed: (K, ...), one row per counted (b, t). Padded: B and T at axes
// b and t (flat: one axis of B·T at b). Clean: computed without reading a packed or padded value.
enum class Layout : uint8_t { kClean, kPacked, kPadded };
struct Rows {
  Layout layout = Layout::kClean;
  int b = -1, t = -1;
  bool flat = false;
};

struct Plan {
  ValueId ids = kNoValue, mask = kNoValue, labels = kNoValue;
  int64_t ignore_index = -100;
  Dim batch, seq;
  std::vector<char> live;              // per node: some graph output reads it
  std::vector<char> packed;            // per node: runs on the counted rows
  std::vector<std::vector<int>> row_inputs;  // per packed node: the inputs it reads as rows
  std::vector<ValueId> checked_masks;  // Attention masks checked at run time
};

bool is_input(const Graph& g, ValueId v) { return std::find(g.inputs.begin(), g.inputs.end(), v) != g.inputs.end(); }

bool is_integer(DType d) {
  return d == DType::kInt64 || d == DType::kInt32 || d == DType::kInt16 || d == DType::kInt8 ||
         d == DType::kUInt8 || d == DType::kBool;
}

// The elementwise ops a padded value may pass through on its way to an Attention: the zeros of its
// dropped rows stay finite (Attention weighs those rows by 0, and 0·Inf is NaN).
bool finite_on_zeros(const Node& n) {
  return is_onnx(n, "Add") || is_onnx(n, "Sub") || is_onnx(n, "Mul") || is_onnx(n, "Neg") ||
         is_onnx(n, "Cast") || is_onnx(n, "Identity") || is_onnx(n, "Where");
}

class Analysis {
 public:
  Analysis(const Graph& g, Plan& plan) : g_(g), idx_(g), plan_(plan), rows_(g.num_values()) {}

  // Walks the graph once in order; false where some node reads a padded value it may mix.
  bool run() {
    plan_.packed.assign(g_.nodes.size(), 0);
    plan_.row_inputs.assign(g_.nodes.size(), {});
    // What no graph output reads is left out (dce removes it): the logits a model would return
    // beside its loss under ORTMODULE_SKIP_LOGITS, until then.
    plan_.live.assign(g_.nodes.size(), 0);
    std::vector<ValueId> stack(g_.outputs.begin(), g_.outputs.end());
    while (!stack.empty()) {
      const ValueId v = stack.back();
      stack.pop_back();
      const NodeId p = v == kNoValue ? -1 : idx_.producer[v];
      if (p < 0 || plan_.live[p]) continue;
      plan_.live[p] = 1;
      stack.insert(stack.end(), g_.nodes[p].inputs.begin(), g_.nodes[p].inputs.end());
    }
    for (NodeId i = 0; i < static_cast<NodeId>(g_.nodes.size()); ++i) {
      const Node& n = g_.nodes[i];
      if (!plan_.live[i]) continue;
      if (auto rows_at = row_inputs(n)) {
        plan_.packed[i] = 1;
        plan_.row_inputs[i] = std::move(*rows_at);
        for (ValueId v : n.outputs)
          if (v != kNoValue) rows_[v] = Rows{Layout::kPacked};
        continue;
      }
      bool reads_rows = false;
      for (ValueId v : n.inputs) reads_rows |= v != kNoValue && rows_[v].layout != Layout::kClean;
      if (reads_rows && !passes_padded(n)) return false;
    }
    for (ValueId v : g_.outputs)
      if (rows_[v].layout != Layout::kClean) return false;
    return std::any_of(plan_.packed.begin(), plan_.packed.end(), [](char c) { return c != 0; });
  }

 private:
  // (B, T, ...): a value whose leading dims are the ids'.
  bool leads_with_rows(ValueId v) const {
    const Shape& s = g_.value(v).shape;
    return s.rank_known && s.rank() >= 2 && s.dims[0].same_as(plan_.batch) && s.dims[1].same_as(plan_.seq);
  }
  // A value a packed node reads as its rows: packed, padded with B, T leading, or clean (B, T, ...).
  bool row_input(ValueId v) const {
    const Rows& r = rows_[v];
    if (r.layout == Layout::kPacked) return true;
    if (r.layout == Layout::kPadded) return !r.flat && r.b == 0 && r.t == 1 && leads_with_rows(v);
    return leads_with_rows(v);
  }

  // The inputs the node reads as rows, where it may run on the counted rows: row-wise (rows.h),
  // what it reads otherwise clean, and at least one row input already in rows (or the embedding
  // of the ids, where packing starts).
  std::optional<std::vector<int>> row_inputs(const Node& n) const {
    if (is_ours(n, "Embedding")) {
      // scale_grad_by_freq counts each id over every position: over the kept ones it would count fewer.
      if (n.inputs.size() != 2 || n.inputs[1] != plan_.ids || rows_[n.inputs[0]].layout != Layout::kClean ||
          n.outputs.empty() || !leads_with_rows(n.outputs[0]) || n.attrs.get_int("scale_grad_by_freq", 0) != 0)
        return std::nullopt;
      return std::vector<int>{1};
    }
    // Outputs are not placed yet (clean): row_input is leads_with_rows for them.
    auto in = torch_ort::row_inputs(g_, idx_, n, [this](ValueId v) { return row_input(v); });
    if (!in) return std::nullopt;
    bool starts = false;
    for (int k : in->rows) starts |= rows_[n.inputs[k]].layout != Layout::kClean;
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k] != kNoValue && !std::count(in->rows.begin(), in->rows.end(), static_cast<int>(k)) &&
          rows_[n.inputs[k]].layout != Layout::kClean)
        return std::nullopt;
    if (!starts) return std::nullopt;
    return std::move(in->rows);
  }

  void set(ValueId v, Rows r) {
    if (v != kNoValue) rows_[v] = r;
  }
  // The rows of input k as a non-packed reader sees them: a packed value is read padded back.
  Rows seen(ValueId v) const {
    Rows r = rows_[v];
    if (r.layout == Layout::kPacked) r = Rows{Layout::kPadded, 0, 1, false};
    return r;
  }

  // A node that does not run on rows but reads some: where each padded row goes, or false.
  bool passes_padded(const Node& n) {
    std::vector<Rows> in;
    for (ValueId v : n.inputs) in.push_back(v == kNoValue ? Rows{} : seen(v));
    const auto padded = [&](size_t k) { return k < in.size() && in[k].layout == Layout::kPadded; };
    const ValueId out = n.outputs.empty() ? kNoValue : n.outputs[0];
    const int64_t out_rank = out == kNoValue ? -1 : rank_of(g_, out);
    const Rows& x = in.empty() ? Rows{} : in[0];
    // Shape, Size: a padded value has its full (B, T, ...) shape.
    if (op_traits(n).reads_metadata_only) return true;
    if (is_ours(n, "Attention")) {
      // Q, K, V as (B, heads, T, d); the mask clean (it is checked); output rows exact where counted.
      if (!has_input(n, 3) || padded(3)) return false;
      for (size_t k = 0; k < 3; ++k)
        if (!padded(k) || in[k].flat || in[k].b != 0 || in[k].t != 2) return false;
      plan_.checked_masks.push_back(n.inputs[3]);
      for (ValueId v : n.outputs)
        if (v != kNoValue && at_rows(v, 0, 2)) set(v, Rows{Layout::kPadded, 0, 2, false});
      return true;
    }
    if (is_onnx(n, "Gather")) {
      // The loss's rows: LabelRows' positions, kept by construction (PaddingRows counts them).
      if (!x.flat || padded(1) || n.attrs.get_int("axis", 0) != 0 || !has_input(n, 1)) return false;
      const Node* rows = producer(g_, idx_, n.inputs[1]);
      if (!rows || !is_ours(*rows, "LabelRows")) return false;
      const int64_t ignore = rows->attrs.get_int("ignore_index", -100);
      if (plan_.labels != kNoValue && (plan_.labels != rows->inputs[0] || plan_.ignore_index != ignore)) return false;
      plan_.labels = rows->inputs[0];
      plan_.ignore_index = ignore;
      return true;  // clean
    }
    if (finite_on_zeros(n) || is_onnx(n, "Concat")) return spreads_rows(n, in, out_rank);
    // Every other reader takes its rows from input 0 alone, as (B, T, ...) with B and T apart.
    if (!padded(0) || x.flat || out == kNoValue) return false;
    for (size_t k = 1; k < in.size(); ++k)
      if (padded(k)) return false;
    if (is_onnx(n, "Split")) {  // along another axis: each part keeps the rows where they were
      int64_t axis = n.attrs.get_int("axis", 0);
      if (axis < 0) axis += rank_of(g_, n.inputs[0]);
      if (axis == x.b || axis == x.t) return false;
      for (ValueId v : n.outputs) {
        if (v == kNoValue) continue;
        if (!at_rows(v, x.b, x.t)) return false;
        set(v, x);
      }
      return true;
    }
    if (n.outputs.size() != 1) return false;
    if (is_onnx(n, "Flatten")) {
      if (x.b != 0 || x.t != 1 || n.attrs.get_int("axis", 1) != 2) return false;
      set(out, Rows{Layout::kPadded, 0, 0, true});
      return true;
    }
    if (is_onnx(n, "Reshape")) {
      // B stays first, T keeps its size, and what lies between is the same number of elements.
      const Shape& a = g_.value(n.inputs[0]).shape;
      const Shape& y = g_.value(out).shape;
      if (padded(1) || x.b != 0 || !y.rank_known || !a.rank_known) return false;
      int t = -1;
      for (int k = 1; k < y.rank(); ++k)
        if (y.dims[k].same_as(plan_.seq)) t = t < 0 ? k : -2;
      if (t < 0 || !at_rows(out, 0, t)) return false;
      const auto between = [](const Shape& s, int to) -> int64_t {
        int64_t p = 1;
        for (int k = 1; k < to; ++k) {
          if (!s.dims[k].is_known()) return -1;
          p *= s.dims[k].value;
        }
        return p;
      };
      if (between(a, x.t) < 0 || between(a, x.t) != between(y, t)) return false;
      set(out, Rows{Layout::kPadded, 0, t, false});
      return true;
    }
    if (is_onnx(n, "Transpose")) {
      const auto perm = n.attrs.get_ints("perm", {});
      int b = -1, t = -1;
      for (int k = 0; k < static_cast<int>(perm.size()); ++k) {
        if (perm[k] == x.b) b = k;
        if (perm[k] == x.t) t = k;
      }
      if (b < 0 || t < 0 || b > t) return false;
      set(out, Rows{Layout::kPadded, b, t, false});
      return at_rows(out, b, t);
    }
    if (is_onnx(n, "Unsqueeze") || is_onnx(n, "Expand")) {
      if (!has_input(n, 1) || padded(1) || out_rank < 0) return false;  // axes as an input (opset 13+)
      const int shift = static_cast<int>(out_rank - rank_of(g_, n.inputs[0]));
      if (is_onnx(n, "Expand")) {
        set(out, Rows{Layout::kPadded, x.b + shift, x.t + shift, false});
        return shift >= 0 && at_rows(out, x.b + shift, x.t + shift);
      }
      // Unsqueeze: B and T move right past each new axis before them.
      const auto axes = constant_ints(g_, idx_, n.inputs[1]);
      if (!axes) return false;
      std::vector<char> fresh(out_rank, 0);
      for (int64_t a : *axes) fresh[a < 0 ? a + out_rank : a] = 1;
      int b = -1, t = -1;
      for (int k = 0, src = 0; k < out_rank; ++k) {
        if (fresh[k]) continue;
        if (src == x.b) b = k;
        if (src == x.t) t = k;
        ++src;
      }
      set(out, Rows{Layout::kPadded, b, t, false});
      return at_rows(out, b, t);
    }
    if (is_onnx(n, "Squeeze")) {  // of other axes: B and T move left past each axis gone
      const auto axes = has_input(n, 1) ? constant_ints(g_, idx_, n.inputs[1]) : std::nullopt;
      if (!axes) return false;
      const int64_t r = rank_of(g_, n.inputs[0]);
      int b = x.b, t = x.t;
      for (int64_t a : *axes) {
        if (a < 0) a += r;
        if (a == x.b || a == x.t) return false;
        b -= a < x.b;
        t -= a < x.t;
      }
      set(out, Rows{Layout::kPadded, b, t, false});
      return at_rows(out, b, t);
    }
    if (is_onnx(n, "Slice")) {
      // Along B or T only the whole range (step 1); any slice along the other axes.
      for (size_t k = 1; k < n.inputs.size(); ++k)
        if (padded(k)) return false;
      if (!has_input(n, 1) || !has_input(n, 2)) return false;  // starts, ends as inputs (opset 10+)
      const auto starts = constant_ints(g_, idx_, n.inputs[1]);
      const auto ends = constant_ints(g_, idx_, n.inputs[2]);
      std::optional<std::vector<int64_t>> axes, steps;
      if (has_input(n, 3)) axes = constant_ints(g_, idx_, n.inputs[3]);
      if (has_input(n, 4)) steps = constant_ints(g_, idx_, n.inputs[4]);
      if (!starts || !ends || (has_input(n, 3) && !axes) || (has_input(n, 4) && !steps)) return false;
      const int64_t r = rank_of(g_, n.inputs[0]);
      for (size_t k = 0; k < starts->size(); ++k) {
        int64_t a = axes ? (*axes)[k] : static_cast<int64_t>(k);
        if (a < 0) a += r;
        if (a != x.b && a != x.t) continue;
        if ((*starts)[k] != 0 || (*ends)[k] < std::numeric_limits<int32_t>::max() || (steps && (*steps)[k] != 1))
          return false;
      }
      set(out, x);
      return at_rows(out, x.b, x.t);
    }
    return false;
  }

  // An elementwise op or a Concat: every padded operand's B and T land on the same axes of the
  // result (broadcasting aligns trailing dims), and a Concat joins along another axis.
  bool spreads_rows(const Node& n, const std::vector<Rows>& in, int64_t out_rank) {
    int b = -1, t = -1;
    for (size_t k = 0; k < in.size(); ++k) {
      if (in[k].layout != Layout::kPadded) continue;
      if (in[k].flat) return false;
      const int shift = static_cast<int>(out_rank - rank_of(g_, n.inputs[k]));
      if (b >= 0 && (b != in[k].b + shift || t != in[k].t + shift)) return false;
      b = in[k].b + shift;
      t = in[k].t + shift;
    }
    if (is_onnx(n, "Concat")) {
      int64_t axis = n.attrs.get_int("axis", 0);
      if (axis < 0) axis += out_rank;
      if (axis == b || axis == t) return false;
    }
    for (ValueId v : n.outputs) {
      if (v == kNoValue) continue;
      if (!at_rows(v, b, t)) return false;
      set(v, Rows{Layout::kPadded, b, t, false});
    }
    return true;
  }

  bool at_rows(ValueId v, int b, int t) const {
    const Shape& s = g_.value(v).shape;
    return s.rank_known && b >= 0 && t > b && t < s.rank() && s.dims[b].same_as(plan_.batch) &&
           s.dims[t].same_as(plan_.seq);
  }

  const Graph& g_;
  const GraphIndex idx_;
  Plan& plan_;
  std::vector<Rows> rows_;
};

// The ids (an integer (B, T) input an Embedding reads) and the attention mask (the other integer
// (B', T) input every Attention's mask is computed from).
bool find_inputs(const Graph& g, Plan& plan) {
  const GraphIndex idx(g);
  for (const Node& n : g.nodes)
    if (is_ours(n, "Embedding") && n.inputs.size() == 2 && is_input(g, n.inputs[1]) &&
        rank_of(g, n.inputs[1]) == 2 && is_integer(g.value(n.inputs[1]).dtype)) {
      if (plan.ids != kNoValue && plan.ids != n.inputs[1]) return false;
      plan.ids = n.inputs[1];
    }
  if (plan.ids == kNoValue) return false;
  plan.batch = g.value(plan.ids).shape.dims[0];
  plan.seq = g.value(plan.ids).shape.dims[1];
  if (!plan.batch.is_symbolic() && !plan.batch.is_known()) return false;
  std::vector<ValueId> masks;
  for (const Node& n : g.nodes)
    if (is_ours(n, "Attention")) {
      if (!has_input(n, 3)) return false;
      masks.push_back(n.inputs[3]);
    }
  if (masks.empty()) return false;
  // The graph inputs each mask is computed from.
  std::vector<ValueId> common;
  for (size_t m = 0; m < masks.size(); ++m) {
    std::vector<char> seen(g.num_values(), 0);
    std::vector<ValueId> stack{masks[m]}, found;
    while (!stack.empty()) {
      const ValueId v = stack.back();
      stack.pop_back();
      if (v == kNoValue || seen[v]) continue;
      seen[v] = 1;
      if (is_input(g, v) && v != plan.ids && rank_of(g, v) == 2 && is_integer(g.value(v).dtype) &&
          g.value(v).shape.dims[1].same_as(plan.seq))
        found.push_back(v);
      if (const Node* p = producer(g, idx, v))
        for (ValueId u : p->inputs) stack.push_back(u);
    }
    if (m == 0) {
      common = found;
    } else {
      std::erase_if(common, [&](ValueId v) { return std::find(found.begin(), found.end(), v) == found.end(); });
    }
  }
  if (common.size() != 1) return false;
  plan.mask = common[0];
  return true;
}

class PaddingElimination final : public Pass {
 public:
  std::string_view name() const override { return "padding_elimination"; }
  bool run(Graph& g) override {
    Plan plan;
    if (!find_inputs(g, plan)) return false;
    if (!Analysis(g, plan).run()) return false;
    rewrite(g, plan);
    return true;
  }

 private:
  static void rewrite(Graph& g, const Plan& plan) {
    const std::string base = "padding_elimination";
    std::vector<Node> out;
    auto emit = [&](const std::string& domain, const std::string& op, std::vector<ValueId> ins, ValueId result,
                    Attributes a = {}) {
      out.push_back(Node{domain, op, g.unique_node_name(base + "/" + op), std::move(ins), {result}, std::move(a)});
      return result;
    };
    // How many rows count is data; one symbol for it, so every packed value provably has as
    // many rows as the others (the fusions after this pass compare shapes).
    const Dim k = Dim::symbolic("padding_rows");
    const ValueId ids_shape = emit("", "Shape", {plan.ids}, g.new_value(base + "/ids_shape", DType::kInt64,
                                                                        Shape::of({Dim::known(2)})));
    std::vector<ValueId> row_ins{plan.mask, plan.ids};
    Attributes ignore;
    if (plan.labels != kNoValue) {
      row_ins.push_back(plan.labels);
      ignore.set("ignore_index", plan.ignore_index);
    }
    const ValueId rows = emit(kOurDomain, "PaddingRows", row_ins,
                              g.new_value(base + "/rows", DType::kInt64, Shape::of({k})), ignore);
    std::map<ValueId, ValueId> packed_of, padded_of, checked_of;  // gathered, spread, checked twins
    const auto packed_shape = [&](ValueId v) {
      Shape s = g.value(v).shape;
      s.dims.erase(s.dims.begin(), s.dims.begin() + 2);
      s.dims.insert(s.dims.begin(), k);
      return s;
    };
    // A value from outside read as rows, gathered once.
    const auto packed = [&](ValueId v) {
      if (auto it = packed_of.find(v); it != packed_of.end()) return it->second;
      const Value info = g.value(v);
      const ValueId p = emit(kOurDomain, "PackRows", {v, rows}, g.new_value(info.name + "/packed", info.dtype,
                                                                             packed_shape(v)));
      return packed_of[v] = p;
    };
    for (ValueId m : plan.checked_masks)
      if (!checked_of.count(m)) {
        const Value info = g.value(m);
        checked_of[m] = emit(kOurDomain, "PaddingMaskCheck", {m, rows, plan.ids},
                             g.new_value(info.name + "/checked", info.dtype, info.shape));
      }
    std::map<ValueId, ValueId> moved;  // a packed node's output -> its packed result
    for (NodeId i = 0; i < static_cast<NodeId>(g.nodes.size()); ++i) {
      if (!plan.live[i]) continue;
      Node n = g.nodes[i];
      if (plan.packed[i]) {
        for (int j : plan.row_inputs[i]) {
          const ValueId v = n.inputs[j];
          auto it = moved.find(v);
          n.inputs[j] = it != moved.end() ? it->second : packed(v);
        }
        for (ValueId& v : n.outputs) {
          if (v == kNoValue) continue;
          const Value info = g.value(v);
          v = moved[v] = g.new_value(info.name + "/packed", info.dtype, packed_shape(v));
        }
        n.name = g.unique_node_name(n.name + "/packed");
        out.push_back(std::move(n));
        continue;
      }
      for (size_t j = 0; j < n.inputs.size(); ++j) {
        ValueId& v = n.inputs[j];
        if (v == kNoValue) continue;
        if (auto c = checked_of.find(v); c != checked_of.end() && j == 3 && is_ours(n, "Attention")) {
          v = c->second;
          continue;
        }
        auto m = moved.find(v);
        if (m == moved.end()) continue;
        // Read padded: the packed node's rows spread back over (B, T), once per value.
        auto it = padded_of.find(v);
        if (it == padded_of.end()) {
          const Value info = g.value(v);
          it = padded_of.emplace(v, emit(kOurDomain, "PadRows", {m->second, rows, ids_shape},
                                         g.new_value(info.name + "/padded", info.dtype, info.shape))).first;
        }
        v = it->second;
      }
      out.push_back(std::move(n));
    }
    g.nodes = std::move(out);
    topological_sort(g);
  }
};

}  // namespace padding_elimination

std::unique_ptr<Pass> make_padding_elimination_pass() {
  return std::make_unique<padding_elimination::PaddingElimination>();
}

}  // namespace torch_ort
