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
#include "csrc/core/passes/rewrite.h"

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

class LabelSparsity final : public Pass {
 public:
  std::string_view name() const override { return "label_sparsity"; }
  bool run(Graph& g) override {
    using namespace rewrite;
    auto cross_entropy = [](const Graph&, const Node& n) { return is_cross_entropy(n); };
    static const Rule kRule{"cross-entropy(rows of X·W) -> the same over the rows whose label counts",
                            where(cross_entropy).as("loss").at_least_these_inputs().in({loss_scores(), val("labels")}),
                            [](const Graph& g, const Match& m) { return classes(g, m).has_value(); }, gather_rows};
    return rewrite::apply(g, {kRule});
  }
};

}  // namespace

std::unique_ptr<Pass> make_label_sparsity_pass() { return std::make_unique<LabelSparsity>(); }

}  // namespace torch_ort
