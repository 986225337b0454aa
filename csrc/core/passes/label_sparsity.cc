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
#include <optional>

#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"

namespace torch_ort {
namespace {

using namespace pattern;

struct Site {
  NodeId loss, product;
  std::optional<NodeId> cast;
  ValueId x;        // the product's rows: (..., H)
  int64_t classes;  // V
  bool full_kept;   // something besides the loss reads the full product (returned logits)
};

// The product (MatMul or our FusedMatMul without transA, a 2-D weight) whose (-1, V) reshape, through
// an optional Cast, is the loss's scores.
std::optional<Site> match(const Graph& g, const GraphIndex& idx, NodeId at) {
  const Node& loss = g.nodes[at];
  const bool sce = is_onnx(loss, "SoftmaxCrossEntropyLoss") || is_ours(loss, "CrossEntropyLoss");
  if (!sce || !loss.attrs.has("ignore_index") || !has_input(loss, 0) || !has_input(loss, 1)) return std::nullopt;
  if (rank_of(g, loss.inputs[0]) != 2 || rank_of(g, loss.inputs[1]) != 1) return std::nullopt;
  const Node* reshape = producer(g, idx, loss.inputs[0]);
  if (!reshape || !is_onnx(*reshape, "Reshape") || !has_input(*reshape, 1)) return std::nullopt;
  Site s{at, -1, std::nullopt, kNoValue, 0, false};
  ValueId scores = reshape->inputs[0];
  const Node* p = producer(g, idx, scores);
  if (p && is_onnx(*p, "Cast")) {
    s.cast = idx.producer[scores];
    scores = p->inputs[0];
    p = producer(g, idx, scores);
  }
  if (!p || p->inputs.size() < 2 || !has_input(*p, 0) || !has_input(*p, 1)) return std::nullopt;
  const bool matmul = is_onnx(*p, "MatMul") && p->inputs.size() == 2;
  const bool fused = is_ours(*p, "FusedMatMul") && p->attrs.get_int("transA", 0) == 0;
  if (!matmul && !fused) return std::nullopt;
  if (rank_of(g, p->inputs[1]) != 2 || rank_of(g, p->inputs[0]) < 2) return std::nullopt;
  // The bias, if any, must vary along the classes only ((V) or (1, V)): it is the same for every row.
  if (fused && has_input(*p, 2)) {
    const Shape& b = g.value(p->inputs[2]).shape;
    if (!b.rank_known || b.rank() > 2 || (b.rank() == 2 && !(b.dims[0].is_known() && b.dims[0].value == 1)))
      return std::nullopt;
  }
  const Shape& y = g.value(scores).shape;
  if (!y.rank_known || y.rank() < 2 || !y.dims.back().is_known()) return std::nullopt;
  s.classes = y.dims.back().value;
  if (s.classes < kLmHeadMinClasses) return std::nullopt;
  // The reshape flattens every leading dim: its target is (-1, V) or (N, V).
  const auto target = constant_ints(g, idx, reshape->inputs[1]);
  if (!target || target->size() != 2 || (*target)[1] != s.classes) return std::nullopt;
  s.product = idx.producer[scores];
  s.x = p->inputs[0];
  // Read by anything but the chain to this loss: the full product is computed anyway.
  const ValueId via = s.cast ? g.nodes[*s.cast].outputs[0] : scores;
  s.full_kept = !only_read_by(g, idx, via, idx.producer[loss.inputs[0]]) ||
                (s.cast && !only_read_by(g, idx, scores, *s.cast));
  return s;
}

class LabelSparsity final : public Pass {
 public:
  std::string_view name() const override { return "label_sparsity"; }
  bool run(Graph& g) override {
    return rewrite_one_at_a_time(g, [&](const GraphIndex& idx, NodeId at) {
      const std::optional<Site> s = match(g, idx, at);
      if (!s) return false;
      rewrite(g, *s);
      return true;
    });
  }

 private:
  static void rewrite(Graph& g, const Site& s) {
    const Node loss = g.nodes[s.loss];
    const Node product = g.nodes[s.product];
    const std::string base = loss.name + "/label_sparsity";
    const ValueId labels = loss.inputs[1];
    const Value x = g.value(s.x);
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
    const ValueId kept = node(kOurDomain, "LabelRows", {labels},
                              g.new_value(base + "/rows", DType::kInt64, Shape::of({rows})), ignore);
    Attributes last;
    last.set("axis", int64_t{x.shape.rank() - 1});
    const ValueId flat = node("", "Flatten", {s.x}, g.new_value(base + "/flat", x.dtype, Shape::of({Dim{}, h})), last);
    Attributes first;
    first.set("axis", int64_t{0});
    const ValueId xv = node("", "Gather", {flat, kept}, g.new_value(base + "/x", x.dtype, Shape::of({rows, h})), first);
    const ValueId lv = node("", "Gather", {labels, kept},
                            g.new_value(base + "/labels", g.value(labels).dtype, Shape::of({rows})), first);
    const Value& y = g.value(product.outputs[0]);
    const Dim v = Dim::known(s.classes);
    std::vector<ValueId> ins = product.inputs;
    ins[0] = xv;
    ValueId scores = g.new_value(base + "/scores", y.dtype, Shape::of({rows, v}));
    if (s.full_kept) {  // the rows of the product computed anyway; the gradient as the product's
      ins.resize(3, kNoValue);
      ins.push_back(product.outputs[0]);
      ins.push_back(kept);
      added.push_back(Node{kOurDomain, "ProductRows", g.unique_node_name(base + "/ProductRows"), std::move(ins),
                           {scores}, product.attrs});
    } else {
      added.push_back(Node{product.domain, product.op_type, g.unique_node_name(base + "/" + product.op_type),
                           std::move(ins), {scores}, product.attrs});
    }
    if (s.cast) {
      const Node& cast = g.nodes[*s.cast];
      scores = node("", "Cast", {scores},
                    g.new_value(base + "/scores_cast", g.value(cast.outputs[0]).dtype, Shape::of({rows, v})),
                    cast.attrs);
    }
    Node rewritten = loss;
    rewritten.inputs[0] = scores;
    rewritten.inputs[1] = lv;
    for (Node& n : added) n.in_backward = loss.in_backward;
    replace_node(g.nodes[s.loss], std::move(rewritten));
    // Ahead of the loss: every input of the new nodes is defined before it.
    g.nodes.insert(g.nodes.begin() + s.loss, added.begin(), added.end());
  }
};

}  // namespace

std::unique_ptr<Pass> make_label_sparsity_pass() { return std::make_unique<LabelSparsity>(); }

}  // namespace torch_ort
