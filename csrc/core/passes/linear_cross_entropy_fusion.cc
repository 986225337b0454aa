// LM head + loss fusion: a cross-entropy (SoftmaxCrossEntropyLoss, or our CrossEntropyLoss with
// label smoothing; mean or sum, no class weights) over the rows of a product X·W with many
// classes becomes one LinearCrossEntropy, which computes the head, the loss and their gradients
// in chunks of rows and never holds more than one chunk × V of logits:
//
//   loss([Reshape(-1, V)]([Cast to float](X·W [+ b])), labels)
//     -> LinearCrossEntropy(Flatten(X), W, [b], labels)
//
// After label_sparsity the product is over the valid rows already (X is the gathered rows), or a
// ProductRows (the logits are returned): then the chunks copy their rows out of that product
// instead of a GEMM, LinearCrossEntropy(Xv, W, [b], labels, Full, rows). Without label sparsity a
// product also returned is read the same way, row by row in order. Either way no second V-wide
// tensor of logits, log-probabilities or their gradient exists.
// Gemma's final-logit soft-capping between the head and the loss, c·tanh(X·W / c), goes into the
// op too (its `softcap` attribute; a returned Full is then the capped logits).
// Declines (the loss stays as it was): scores in another dtype than float (the loss would round
// differently), class weights, reduction 'none', the log-probabilities read, few classes
// (kLmHeadMinClasses: not an LM head), and anything else between the product and the loss but a Cast
// and the flattening Reshape (a slice of the logits).
#include <cmath>
#include <optional>
#include <utility>

#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/passes/rewrite.h"

namespace torch_ort {
namespace {

using namespace pattern;

// The logits of one chunk, in float: 256 MiB is 523 rows of a 128k vocabulary. A small hidden
// size (512) needs that many rows for the three GEMMs to near a CPU's peak, and dW's accumulation
// is re-read once per chunk (docs/performance.md: 128 MiB chunks cost the SFT step ~10 %).
constexpr int64_t kChunkBytes = int64_t{256} << 20;

bool unread(const Graph& g, const rewrite::Match& m, const Node& n, size_t k) {
  return k >= n.outputs.size() || n.outputs[k] == kNoValue || (m.readers(n.outputs[k]).empty() && !is_graph_output(g, n.outputs[k]));
}

bool head_product(const Graph&, const Node& p) {
  const bool matmul = is_onnx(p, "MatMul") && p.inputs.size() == 2;
  const bool fused = (is_ours(p, "FusedMatMul") || is_ours(p, "ProductRows")) && p.attrs.get_int("transA", 0) == 0;
  return (matmul || fused) && p.inputs.size() >= 2 && has_input(p, 0) && has_input(p, 1);
}

// The scores from the product: [Reshape to (-1, V)]([Cast]([Gemma's c·tanh(P / c)](P))). Every
// step is only looked at: the loss alone is replaced, and dce removes what no one else reads.
rewrite::Input head_scores() {
  using namespace rewrite;
  const Input product = sees(where(head_product).as("product").at_least_these_inputs().in({val("x"), val("w")}), "logits");
  const Input tanh = sees(op("Tanh").as("tanh").in({sees(op("Div").as("div").in({product, val("divisor")}))}));
  const Input capped = one_of({sees(op("Mul").as("cap").commutative().in({tanh, val("c")}), "capped"), product});
  const Input cast = one_of({sees(op("Cast").as("cast").in({capped}), "cast_out"), capped});
  return one_of({sees(op("Reshape").as("reshape").in({cast, val("target")}), "scores"), cast}, "scores");
}

// The conditions of the header comment, on what the pattern matched. Sets the softcap and whether
// the logits (or the capped ones) are also read elsewhere: then the op copies its rows from them.
bool fusable(const Graph& g, const rewrite::Match& m, double& softcap, bool& full_kept) {
  const Node& loss = g.nodes[m.node("loss")];
  if (m.value("weights") != kNoValue || !unread(g, m, loss, 1)) return false;
  const std::string reduction = loss.attrs.get_string("reduction", "mean");
  if ((reduction != "mean" && reduction != "sum") || rank_of(g, loss.inputs[0]) != 2 || rank_of(g, loss.inputs[1]) != 1 ||
      g.value(loss.inputs[0]).dtype != DType::kFloat)
    return false;
  // Each step read by the next only; `reader` walks from the loss back to the product.
  NodeId reader = m.node("loss");
  const bool reshaped = m.has("reshape");
  if (reshaped) {
    const Node& r = g.nodes[m.node("reshape")];
    const auto target = constant_ints(g, m.index(), m.value("target"));
    const Shape& y = g.value(r.inputs[0]).shape;
    if (!only_read_by(g, m, m.value("scores"), reader) || !target || target->size() != 2 || !y.rank_known ||
        y.rank() < 2 || !y.dims.back().is_known() || (*target)[1] != y.dims.back().value)
      return false;
    reader = m.node("reshape");
  }
  if (m.has("cast")) {
    if (!only_read_by(g, m, m.value("cast_out"), reader)) return false;
    reader = m.node("cast");
  }
  const ValueId logits = m.value("logits");
  softcap = 0;
  bool capped_kept = false;
  if (m.has("cap")) {  // Mul(Tanh(Div(P, c)), c): c·tanh(P / c), each step read by the next only
    const std::optional<double> c = scalar_float(g, m.index(), m.value("c"));
    const std::optional<double> d = scalar_float(g, m.index(), m.value("divisor"));
    const Node &tanh = g.nodes[m.node("tanh")], &div = g.nodes[m.node("div")];
    if (!c || !(*c > 0) || !d || std::abs(*d - *c) > 1e-6 * *c ||
        !only_read_by(g, m, tanh.outputs[0], m.node("cap")) || !only_read_by(g, m, div.outputs[0], m.node("tanh")) ||
        !only_read_by(g, m, logits, m.node("div")))
      return false;
    softcap = *c;
    capped_kept = !only_read_by(g, m, m.value("capped"), reader);  // the capped logits are returned
  }
  const Node& p = g.nodes[m.node("product")];
  const bool rows = is_ours(p, "ProductRows");
  if (rank_of(g, p.inputs[1]) != 2 || rank_of(g, p.inputs[0]) < 2 || (!reshaped && rank_of(g, p.inputs[0]) != 2))
    return false;
  const DType dt = g.value(logits).dtype;
  if ((dt != DType::kFloat && dt != DType::kBFloat16 && dt != DType::kFloat16) || g.value(p.inputs[0]).dtype != dt ||
      g.value(p.inputs[1]).dtype != dt)
    return false;
  const Shape& y = g.value(logits).shape;
  if (!y.rank_known || y.rank() < 2 || !y.dims.back().is_known() || y.dims.back().value < kLmHeadMinClasses)
    return false;
  // A bias varying along the classes only ((V) or (1, V)), of the product's dtype.
  if (!is_onnx(p, "MatMul") && has_input(p, 2)) {
    const Value& b = g.value(p.inputs[2]);
    if (b.dtype != dt || !b.shape.rank_known || b.shape.rank() > 2 ||
        (b.shape.rank() == 2 && !(b.shape.dims[0].is_known() && b.shape.dims[0].value == 1)))
      return false;
  }
  full_kept = softcap ? capped_kept : !only_read_by(g, m, logits, reader);
  // A ProductRows was made by label_sparsity for this loss alone, of the product's rows (not capped).
  return !(rows && (full_kept || softcap));
}

rewrite::Replacement linear_cross_entropy(Graph& g, const rewrite::Match& m, const Node& loss) {
  double softcap = 0;
  bool full_kept = false;
  fusable(g, m, softcap, full_kept);
  const Node& product = g.nodes[m.node("product")];
  const std::string base = loss.name + "/linear_cross_entropy";
  const Value x = g.value(product.inputs[0]);
  ValueId rows = product.inputs[0];
  std::vector<Node> before;
  if (x.shape.rank() != 2) {
    Attributes last;
    last.set("axis", int64_t{x.shape.rank() - 1});
    rows = g.new_value(base + "/rows", x.dtype, Shape::of({Dim{}, x.shape.dims.back()}));
    before.push_back(Node{"", "Flatten", g.unique_node_name(base + "/Flatten"), {product.inputs[0]}, {rows}, last});
  }
  std::vector<ValueId> ins{rows, product.inputs[1], has_input(product, 2) ? product.inputs[2] : kNoValue, loss.inputs[1]};
  if (is_ours(product, "ProductRows")) {
    ins.push_back(product.inputs[3]);
    ins.push_back(product.inputs[4]);
  } else if (full_kept) {
    ins.push_back(softcap ? m.value("capped") : product.outputs[0]);
  }
  Attributes a;
  a.set("transB", product.attrs.get_int("transB", 0));
  a.set("alpha", product.attrs.get_float("alpha", 1.0f));
  a.set("reduction", loss.attrs.get_string("reduction", "mean"));
  if (loss.attrs.has("ignore_index")) a.set("ignore_index", loss.attrs.get_int("ignore_index", -100));
  a.set("label_smoothing", loss.attrs.get_float("label_smoothing", 0.0f));
  a.set("chunk_bytes", kChunkBytes);
  if (softcap) a.set("softcap", static_cast<float>(softcap));
  return {Node{kOurDomain, "LinearCrossEntropy", g.unique_node_name(base), std::move(ins), {loss.outputs[0]},
               std::move(a)},
          std::move(before)};
}

class LinearCrossEntropyFusion final : public Pass {
 public:
  std::string_view name() const override { return "linear_cross_entropy_fusion"; }
  bool run(Graph& g) override {
    using namespace rewrite;
    auto cross_entropy = [](const Graph&, const Node& n) { return is_cross_entropy(n); };
    static const Rule kRule{"cross-entropy(rows of X·W over many classes) -> LinearCrossEntropy",
                            where(cross_entropy).as("loss").in({head_scores(), val("labels"), opt("weights")}),
                            [](const Graph& g, const Match& m) {
                              double softcap = 0;
                              bool full_kept = false;
                              return fusable(g, m, softcap, full_kept);
                            },
                            linear_cross_entropy};
    return rewrite::apply(g, {kRule});
  }
};

}  // namespace

std::unique_ptr<Pass> make_linear_cross_entropy_fusion_pass() { return std::make_unique<LinearCrossEntropyFusion>(); }

}  // namespace torch_ort
