// Label sparsity: a classification loss with an ignore_index (SoftmaxCrossEntropyLoss, or our
// CrossEntropyLoss with label smoothing) over the rows of a product X·W, the LM head of a causal
// LM, is computed over the rows whose label counts only. The valid rows of X are gathered before
// the product, so the head's GEMM, the loss and both their gradients run on K rows instead of N:
//
//   loss(Reshape([Cast](X·W), (-1, V)), labels)
//     -> idx = LabelRows(labels); loss([Cast](Gather(Flatten(X), idx)·W), Gather(labels, idx))
//
// Exact: an ignored row adds nothing to the loss, its count or its weights, and the product and
// the cast act row by row. Where something else reads the full product (a model that returns its
// logits) it is computed anyway: the loss then takes its valid rows (ProductRows: a row copy, no
// second GEMM) and differentiates them as the product of the gathered rows, so the head's
// backward GEMMs still run on K rows; the gradient of the returned logits, absent when nobody
// differentiates them, makes the full product's own GEMMs skip (kernels: absent gradients).
// How many rows are valid is data (one host read per step). Fires only where the classes are many
// (kLmHeadMinClasses: an LM head), where the gathers' O(N·H) is nothing beside the head's O(N·H·V).
//
// Then the gather moves back as far as is exact: past every node that acts row by row (rows.h:
// the final norm, the last layer's MLP and residual adds, its attention's output projection)
// whose results nothing else reads, so that those run on the valid rows too. Where a value such a
// node reads is also read elsewhere (the residual stream entering the last layer, attention's
// output before its projection), that value's valid rows are gathered instead. Where the full
// product is computed anyway (returned logits) its input is read whole and nothing moves.
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/passes/rewrite.h"
#include "csrc/core/passes/rows.h"

namespace torch_ort {
namespace {

using namespace pattern;

bool lm_head_product(const Graph& g, const Node& p) {
  const bool matmul = is_onnx(p, "MatMul") && p.inputs.size() == 2;
  const bool fused = is_ours(p, "FusedMatMul") && p.attrs.get_int("transA", 0) == 0;
  return (matmul || fused) && p.inputs.size() >= 2 && has_input(p, 0) && has_input(p, 1) &&
         rank_of(g, p.inputs[1]) == 2 && rank_of(g, p.inputs[0]) >= 2;
}

// The loss's scores: Reshape([Cast](X·W), (-1, V)), each step only looked at (the full product may
// be read elsewhere: returned logits).
rewrite::Input loss_scores() {
  using namespace rewrite;
  const Input product = sees(where(lm_head_product).as("product").at_least_these_inputs().in({val("x"), val("w")}),
                             "logits");
  return sees(op("Reshape").as("reshape").in({one_of({sees(op("Cast").as("cast").in({product}), "cast_out"), product}),
                                               val("target")}));
}

// The product's classes V when the rule applies (see the header comment), else nullopt.
std::optional<int64_t> classes(const Graph& g, const rewrite::Match& m) {
  const Node& loss = g.nodes[m.node("loss")];
  if (!loss.attrs.has("ignore_index") || rank_of(g, loss.inputs[0]) != 2 || rank_of(g, loss.inputs[1]) != 1)
    return std::nullopt;
  const Node& p = g.nodes[m.node("product")];
  // The bias, if any, must vary along the classes only ((V) or (1, V)): it is the same for every row.
  if (is_ours(p, "FusedMatMul") && has_input(p, 2)) {
    const Shape& b = g.value(p.inputs[2]).shape;
    if (!b.rank_known || b.rank() > 2 || (b.rank() == 2 && !(b.dims[0].is_known() && b.dims[0].value == 1)))
      return std::nullopt;
  }
  const Shape& y = g.value(m.value("logits")).shape;
  if (!y.rank_known || y.rank() < 2 || !y.dims.back().is_known() || y.dims.back().value < kLmHeadMinClasses)
    return std::nullopt;
  // The reshape flattens every leading dim: its target is (-1, V) or (N, V).
  const auto target = constant_ints(g, m.index(), m.value("target"));
  if (!target || target->size() != 2 || (*target)[1] != y.dims.back().value) return std::nullopt;
  return y.dims.back().value;
}

// Read by anything but the chain to this loss: the full product is computed anyway.
bool full_kept(const Graph& g, const rewrite::Match& m) {
  const bool cast = m.has("cast");
  const ValueId via = cast ? m.value("cast_out") : m.value("logits");
  return !only_read_by(g, m, via, m.node("reshape")) ||
         (cast && !only_read_by(g, m, m.value("logits"), m.node("cast")));
}

rewrite::Replacement gather_rows(Graph& g, const rewrite::Match& m, const Node& loss) {
  const Node& product = g.nodes[m.node("product")];
  const std::string base = loss.name + "/label_sparsity";
  const ValueId labels = loss.inputs[1], x_id = m.value("x");
  const Value x = g.value(x_id);
  const Dim rows{};  // how many labels count: data
  const Dim h = x.shape.dims.back();
  std::vector<Node> added;
  auto node = [&](const std::string& domain, const std::string& op, std::vector<ValueId> ins, ValueId out,
                  Attributes a = {}) {
    added.push_back(Node{domain, op, g.unique_node_name(base + "/" + op), std::move(ins), {out}, std::move(a)});
    return out;
  };
  Attributes ignore;
  ignore.set("ignore_index", loss.attrs.get_int("ignore_index", -100));
  const ValueId kept =
      node(kOurDomain, "LabelRows", {labels}, g.new_value(base + "/rows", DType::kInt64, Shape::of({rows})), ignore);
  Attributes last;
  last.set("axis", int64_t{x.shape.rank() - 1});
  const ValueId flat = node("", "Flatten", {x_id}, g.new_value(base + "/flat", x.dtype, Shape::of({Dim{}, h})), last);
  Attributes first;
  first.set("axis", int64_t{0});
  const ValueId xv = node("", "Gather", {flat, kept}, g.new_value(base + "/x", x.dtype, Shape::of({rows, h})), first);
  const ValueId lv = node("", "Gather", {labels, kept},
                          g.new_value(base + "/labels", g.value(labels).dtype, Shape::of({rows})), first);
  const Value& y = g.value(product.outputs[0]);
  const Dim v = Dim::known(*classes(g, m));
  std::vector<ValueId> ins = product.inputs;
  ins[0] = xv;
  ValueId scores = g.new_value(base + "/scores", y.dtype, Shape::of({rows, v}));
  if (full_kept(g, m)) {  // the rows of the product computed anyway; the gradient as the product's
    ins.resize(3, kNoValue);
    ins.push_back(product.outputs[0]);
    ins.push_back(kept);
    added.push_back(Node{kOurDomain, "ProductRows", g.unique_node_name(base + "/ProductRows"), std::move(ins),
                         {scores}, product.attrs});
  } else {
    added.push_back(Node{product.domain, product.op_type, g.unique_node_name(base + "/" + product.op_type),
                         std::move(ins), {scores}, product.attrs});
  }
  if (m.has("cast")) {
    const Node& cast = g.nodes[m.node("cast")];
    scores = node("", "Cast", {scores},
                  g.new_value(base + "/scores_cast", g.value(cast.outputs[0]).dtype, Shape::of({rows, v})), cast.attrs);
  }
  Node rewritten = loss;
  rewritten.inputs[0] = scores;
  rewritten.inputs[1] = lv;
  return {std::move(rewritten), std::move(added)};  // the new nodes run just before the loss
}

// A Slice that keeps every element (the exporter's `logits[:, -0:]`, logits_to_keep = 0).
bool keeps_everything(const Graph& g, const GraphIndex& idx, const Node& n) {
  if (!is_onnx(n, "Slice") || !has_input(n, 1) || !has_input(n, 2)) return false;
  const auto starts = constant_ints(g, idx, n.inputs[1]);
  const auto ends = constant_ints(g, idx, n.inputs[2]);
  const auto steps = has_input(n, 4) ? constant_ints(g, idx, n.inputs[4]) : std::vector<int64_t>{};
  if (!starts || !ends || !steps || (has_input(n, 3) && !constant_ints(g, idx, n.inputs[3]))) return false;
  for (int64_t v : *starts)
    if (v != 0) return false;
  for (int64_t v : *ends)
    if (v < std::numeric_limits<int32_t>::max()) return false;
  for (int64_t v : *steps)
    if (v != 1) return false;
  return g.value(n.inputs[0]).shape.same_as(g.value(n.outputs[0]).shape);
}

// Moves the gather of Flatten(X)'s rows (X: (B, T, c)) back past the row-wise nodes that make X
// and whose results only they and the gather read; true when some moved. Those nodes are taken
// from X backwards (a node joins once every reader of its results has), then run again on the
// gathered rows of what they read from outside, (K, c) where they made (B, T, c); the nodes they
// replace are left to dce.
bool move_gather_back(Graph& g, NodeId at) {
  const GraphIndex idx(g);
  const Node& gather = g.nodes[at];
  const NodeId flat_id = idx.producer[gather.inputs[0]];
  if (flat_id < 0 || !is_onnx(g.nodes[flat_id], "Flatten") || !only_read_by(g, idx, gather.inputs[0], at))
    return false;
  const Node& flat = g.nodes[flat_id];
  const ValueId x = flat.inputs[0];
  const Shape& xs = g.value(x).shape;
  if (!xs.rank_known || xs.rank() != 3 || flat.attrs.get_int("axis", 1) != 2 || !only_read_by(g, idx, x, flat_id))
    return false;
  const Dim b = xs.dims[0], t = xs.dims[1];
  const auto is_rows = [&](ValueId v) {
    const Shape& s = g.value(v).shape;
    return s.rank_known && s.rank() == 3 && s.dims[0].same_as(b) && s.dims[1].same_as(t);
  };
  std::map<NodeId, std::vector<int>> moved;  // node -> the inputs it reads row by row
  std::set<NodeId, std::greater<>> todo;      // readers first: every reader is decided before
  if (idx.producer[x] >= 0) todo.insert(idx.producer[x]);
  while (!todo.empty()) {
    const NodeId i = *todo.begin();
    todo.erase(todo.begin());
    const Node& n = g.nodes[i];
    bool only_moved_read = true;
    for (ValueId v : n.outputs) {
      if (v == kNoValue) continue;
      only_moved_read &= !is_graph_output(g, v);
      for (NodeId c : idx.consumers[v]) only_moved_read &= moved.count(c) || c == flat_id;
    }
    if (!only_moved_read) continue;
    std::vector<int> rows;
    if (keeps_everything(g, idx, n) && is_rows(n.outputs[0])) {
      rows = {0};
    } else if (auto in = row_inputs(g, idx, n, is_rows)) {
      rows = std::move(in->rows);
    } else {
      continue;
    }
    for (int k : rows)
      if (idx.producer[n.inputs[k]] >= 0) todo.insert(idx.producer[n.inputs[k]]);
    moved.emplace(i, std::move(rows));
  }
  if (moved.empty()) return false;

  const ValueId kept = gather.inputs[1];
  // One count of rows for every moved value and the rows themselves (an identifier: a symbol is
  // kept as it is spelled; the memory estimate bounds it by the labels' count).
  const Dim k = Dim::symbolic("label_rows_" + std::to_string(kept));
  g.value(kept).shape = Shape::of({k});
  const std::string base = gather.name;
  std::vector<Node> added;
  std::map<ValueId, ValueId> rows_of;  // a (B, T, c) value -> its gathered rows (K, c)
  const auto gathered = [&](ValueId v) {
    if (auto it = rows_of.find(v); it != rows_of.end()) return it->second;
    const Value info = g.value(v);
    const Dim c = info.shape.dims[2];
    Attributes last;
    last.set("axis", int64_t{2});
    const ValueId f = g.new_value(info.name + "/flat", info.dtype, Shape::of({Dim{}, c}));
    added.push_back(Node{"", "Flatten", g.unique_node_name(base + "/Flatten"), {v}, {f}, last});
    Attributes first;
    first.set("axis", int64_t{0});
    const ValueId r = g.new_value(info.name + "/label_rows", info.dtype, Shape::of({k, c}));
    added.push_back(Node{"", "Gather", g.unique_node_name(base + "/Gather"), {f, kept}, {r}, first});
    return rows_of[v] = r;
  };
  for (const auto& [i, rows] : moved) {  // in the graph's order
    Node n = g.nodes[i];
    if (is_onnx(n, "Slice")) {  // keeps everything: its rows are its input's
      rows_of[n.outputs[0]] = gathered(n.inputs[0]);
      continue;
    }
    for (int r : rows) n.inputs[r] = gathered(n.inputs[r]);
    for (ValueId& v : n.outputs) {
      if (v == kNoValue) continue;
      const Value info = g.value(v);
      v = rows_of[v] = g.new_value(info.name + "/label_rows", info.dtype, Shape::of({k, info.shape.dims[2]}));
    }
    n.name = g.unique_node_name(n.name + "/label_rows");
    added.push_back(std::move(n));
  }
  const ValueId from = gather.outputs[0], to = gathered(x);
  for (Node& n : g.nodes)
    for (ValueId& v : n.inputs)
      if (v == from) v = to;
  for (ValueId& v : g.outputs)
    if (v == from) v = to;
  g.nodes.insert(g.nodes.begin() + at, std::make_move_iterator(added.begin()), std::make_move_iterator(added.end()));
  return true;
}

// The row gathers label_sparsity made (Gather(Flatten(X), LabelRows)), moved back where they can.
bool move_gathers_back(Graph& g) {
  make_dce_pass()->run(g);  // the product the loss no longer reads still reads X
  bool changed = false;
  for (bool again = true; again;) {
    again = false;
    const GraphIndex idx(g);
    for (NodeId i = 0; i < static_cast<NodeId>(g.nodes.size()) && !again; ++i) {
      const Node& n = g.nodes[i];
      const Node* rows = is_onnx(n, "Gather") && n.attrs.get_int("axis", 0) == 0 && has_input(n, 1)
                             ? producer(g, idx, n.inputs[1]) : nullptr;
      if (rows && is_ours(*rows, "LabelRows") && move_gather_back(g, i)) again = changed = true;
    }
    if (again) make_dce_pass()->run(g);  // the nodes moved, as they were
  }
  return changed;
}

class LabelSparsity final : public Pass {
 public:
  std::string_view name() const override { return "label_sparsity"; }
  bool run(Graph& g) override {
    using namespace rewrite;
    auto cross_entropy = [](const Graph&, const Node& n) { return is_cross_entropy(n); };
    static const Rule kRule{"cross-entropy(rows of X·W) -> the same over the rows whose label counts",
                            where(cross_entropy).as("loss").at_least_these_inputs().in({loss_scores(), val("labels")}),
                            [](const Graph& g, const Match& m) { return classes(g, m).has_value(); }, gather_rows};
    if (!rewrite::apply(g, {kRule})) return false;
    move_gathers_back(g);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_label_sparsity_pass() { return std::make_unique<LabelSparsity>(); }

}  // namespace torch_ort
