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

namespace torch_ort {
namespace {

using namespace pattern;

// The logits of one chunk, in float: 128 MiB is 261 rows of a 128k vocabulary, GEMMs large
// enough to run at full speed, and dW's accumulation re-read a few times per step at most.
constexpr int64_t kChunkBytes = int64_t{128} << 20;

struct Site {
  NodeId loss, product;
  ValueId x;  // the product's rows: (..., H)
  bool full_kept;
  double softcap = 0;            // Gemma's final-logit soft-capping c: c·tanh(X·W / c); 0: none
  ValueId capped = kNoValue;     // the capped logits, when something else reads them (returned)
};

// Gemma's soft-capping of the logits, Mul(Tanh(Div(P, c)), c) with c a scalar constant, at the
// Mul whose output is `v`: c and P, each step read by the next only (the capped logits may be
// read elsewhere too).
std::optional<std::pair<double, ValueId>> softcap_of(const Graph& g, const GraphIndex& idx, ValueId v) {
  const Node* mul = producer(g, idx, v);
  if (!mul || !is_onnx(*mul, "Mul") || mul->inputs.size() != 2) return std::nullopt;
  for (int side : {0, 1}) {
    const std::optional<double> c = scalar_float(g, idx, mul->inputs[1 - side]);
    const Node* tanh = producer(g, idx, mul->inputs[side]);
    if (!c || !(*c > 0) || !tanh || !is_onnx(*tanh, "Tanh") ||
        !only_read_by(g, idx, mul->inputs[side], idx.producer[v]))
      continue;
    const Node* div = producer(g, idx, tanh->inputs[0]);
    if (!div || !is_onnx(*div, "Div") || div->inputs.size() != 2 ||
        !only_read_by(g, idx, tanh->inputs[0], idx.producer[mul->inputs[side]]))
      continue;
    const std::optional<double> d = scalar_float(g, idx, div->inputs[1]);
    if (!d || std::abs(*d - *c) > 1e-6 * *c || !only_read_by(g, idx, div->inputs[0], idx.producer[tanh->inputs[0]]))
      continue;
    return std::make_pair(*c, div->inputs[0]);
  }
  return std::nullopt;
}

bool unread(const Graph& g, const GraphIndex& idx, const Node& n, size_t k) {
  return k >= n.outputs.size() || n.outputs[k] == kNoValue ||
         (idx.consumers[n.outputs[k]].empty() && !is_graph_output(g, n.outputs[k]));
}

std::optional<Site> match(const Graph& g, const GraphIndex& idx, NodeId at) {
  const Node& loss = g.nodes[at];
  const bool sce = is_onnx(loss, "SoftmaxCrossEntropyLoss") || is_ours(loss, "CrossEntropyLoss");
  if (!sce || !has_input(loss, 0) || !has_input(loss, 1) || has_input(loss, 2) || !unread(g, idx, loss, 1))
    return std::nullopt;
  const std::string reduction = loss.attrs.get_string("reduction", "mean");
  if (reduction != "mean" && reduction != "sum") return std::nullopt;
  if (rank_of(g, loss.inputs[0]) != 2 || rank_of(g, loss.inputs[1]) != 1) return std::nullopt;
  if (g.value(loss.inputs[0]).dtype != DType::kFloat) return std::nullopt;
  // Back from the scores: an optional Reshape to (-1, V), an optional Cast, the product; each
  // read by the next step only.
  NodeId reader = at;
  ValueId scores = loss.inputs[0];
  const Node* p = producer(g, idx, scores);
  bool reshaped = false;
  if (p && is_onnx(*p, "Reshape")) {
    if (!has_input(*p, 1) || !only_read_by(g, idx, scores, reader)) return std::nullopt;
    const auto target = constant_ints(g, idx, p->inputs[1]);
    const Shape& y = g.value(p->inputs[0]).shape;
    if (!target || target->size() != 2 || !y.rank_known || y.rank() < 2 || !y.dims.back().is_known() ||
        (*target)[1] != y.dims.back().value)
      return std::nullopt;
    reshaped = true;
    reader = idx.producer[scores];
    scores = p->inputs[0];
    p = producer(g, idx, scores);
  }
  if (p && is_onnx(*p, "Cast")) {
    if (!only_read_by(g, idx, scores, reader)) return std::nullopt;
    reader = idx.producer[scores];
    scores = p->inputs[0];
    p = producer(g, idx, scores);
  }
  double softcap = 0;
  ValueId capped = kNoValue;
  if (const auto cap = softcap_of(g, idx, scores)) {
    softcap = cap->first;
    if (!only_read_by(g, idx, scores, reader)) capped = scores;  // the capped logits are returned
    scores = cap->second;
    reader = -1;  // the Div: softcap_of checked that it alone reads the product
    p = producer(g, idx, scores);
  }
  if (!p || p->inputs.size() < 2 || !has_input(*p, 0) || !has_input(*p, 1)) return std::nullopt;
  const bool matmul = is_onnx(*p, "MatMul") && p->inputs.size() == 2;
  const bool fused = is_ours(*p, "FusedMatMul") && p->attrs.get_int("transA", 0) == 0;
  const bool rows = is_ours(*p, "ProductRows") && p->attrs.get_int("transA", 0) == 0;
  if (!matmul && !fused && !rows) return std::nullopt;
  if (rank_of(g, p->inputs[1]) != 2 || rank_of(g, p->inputs[0]) < 2) return std::nullopt;
  if (!reshaped && rank_of(g, p->inputs[0]) != 2) return std::nullopt;
  const DType dt = g.value(scores).dtype;
  if (dt != DType::kFloat && dt != DType::kBFloat16 && dt != DType::kFloat16) return std::nullopt;
  if (g.value(p->inputs[0]).dtype != dt || g.value(p->inputs[1]).dtype != dt) return std::nullopt;
  const Shape& y = g.value(scores).shape;
  if (!y.rank_known || y.rank() < 2 || !y.dims.back().is_known() || y.dims.back().value < kLmHeadMinClasses)
    return std::nullopt;
  // A bias varying along the classes only ((V) or (1, V)), of the product's dtype.
  if (!matmul && has_input(*p, 2)) {
    const Value& b = g.value(p->inputs[2]);
    if (b.dtype != dt || !b.shape.rank_known || b.shape.rank() > 2 ||
        (b.shape.rank() == 2 && !(b.shape.dims[0].is_known() && b.shape.dims[0].value == 1)))
      return std::nullopt;
  }
  Site s{at, idx.producer[scores], p->inputs[0], false, softcap, capped};
  s.full_kept = softcap ? capped != kNoValue : !only_read_by(g, idx, scores, reader);
  if (rows && s.full_kept) return std::nullopt;  // label_sparsity made it for this loss alone
  if (rows && softcap) return std::nullopt;  // ProductRows' rows are of the product, not capped
  return s;
}

class LinearCrossEntropyFusion final : public Pass {
 public:
  std::string_view name() const override { return "linear_cross_entropy_fusion"; }
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
    const std::string base = loss.name + "/linear_cross_entropy";
    const Value x = g.value(s.x);
    ValueId rows = s.x;
    std::vector<Node> added;
    if (x.shape.rank() != 2) {
      Attributes last;
      last.set("axis", int64_t{x.shape.rank() - 1});
      rows = g.new_value(base + "/rows", x.dtype, Shape::of({Dim{}, x.shape.dims.back()}));
      added.push_back(Node{"", "Flatten", g.unique_node_name(base + "/Flatten"), {s.x}, {rows}, last});
    }
    const bool from_rows = is_ours(product, "ProductRows");
    std::vector<ValueId> ins{rows, product.inputs[1], has_input(product, 2) ? product.inputs[2] : kNoValue,
                             loss.inputs[1]};
    if (from_rows) {
      ins.push_back(product.inputs[3]);
      ins.push_back(product.inputs[4]);
    } else if (s.full_kept) {
      ins.push_back(s.softcap ? s.capped : product.outputs[0]);
    }
    Attributes a;
    a.set("transB", product.attrs.get_int("transB", 0));
    a.set("alpha", product.attrs.get_float("alpha", 1.0f));
    a.set("reduction", loss.attrs.get_string("reduction", "mean"));
    if (loss.attrs.has("ignore_index")) a.set("ignore_index", loss.attrs.get_int("ignore_index", -100));
    a.set("label_smoothing", loss.attrs.get_float("label_smoothing", 0.0f));
    a.set("chunk_bytes", kChunkBytes);
    if (s.softcap) a.set("softcap", static_cast<float>(s.softcap));
    Node fused{kOurDomain, "LinearCrossEntropy", g.unique_node_name(base), std::move(ins), {loss.outputs[0]},
               std::move(a)};
    fused.in_backward = loss.in_backward;
    for (Node& n : added) n.in_backward = loss.in_backward;
    replace_node(g.nodes[s.loss], std::move(fused));
    g.nodes.insert(g.nodes.begin() + s.loss, added.begin(), added.end());
  }
};

}  // namespace

std::unique_ptr<Pass> make_linear_cross_entropy_fusion_pass() { return std::make_unique<LinearCrossEntropyFusion>(); }

}  // namespace torch_ort
