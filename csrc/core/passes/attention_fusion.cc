// attention_fusion: scaled-dot-product attention written as ops -> one com.torch_ort::Attention
// (Q, K, V, [mask]; causal, scale, dropout) whose kernel is ATen's fused SDPA (flash attention on
// CPU; with dropout, the backend eager SDPA picks for it: on the CPU the math path).
//
// Rule (the exporter's F.scaled_dot_product_attention, hand-written HF/nanoGPT attention):
//   Y = MatMul(P, V),  P = [Cast to itself | Identity | Dropout | Where(IsNaN(P'), 0, P')]* Softmax(X, -1)
//   X = S | Add(S, M) | Add(M, S),   S = [Mul|Div by a scalar] MatMul([Mul(Q, c)], [Mul(Kᵀ, c)])
//   Kᵀ = Transpose(K, [0,1,3,2]) | Reshape(Transpose(Reshape(K, (BH,S,D)), [0,2,1]), (B,H,D,S))
// Conditions: Q, K, V of rank 4; every scale factor a scalar the core evaluator computes from
// constants and shapes: a constant, or in all exactly 1/√D of a dynamic head size D, read from
// Shape(Q) (then no scale attribute: the kernel's default); every intermediate read only by the
// next node of the chain; the mask of rank <= 4 and of Q's dtype, computed from nothing that can
// carry a gradient (Attention gives the mask none). A Dropout whose mask nothing reads is taken
// when it is the identity (ratio 0, no training_mode, or training_mode a constant false), or when
// it drops: training_mode a constant true and the ratio a constant in (0, 1) (absent: ONNX's
// 0.5), which becomes the `dropout` attribute (one such Dropout per chain). A ratio or training
// flag known only at run time is not fused.
// Action: the output MatMul becomes Attention (same Y, plus a LogSumExp its gradient reads, the
// backend the kernel chose and, with dropout, the random state the backward replays the mask
// from: see ops/attention.cc); the chain's other nodes go. The exporter's causal mask
// (Where(Trilu(ones(L, S)) == 0, -big, 0)) becomes causal=1. The NaN guard (IsNaN -> 0) is
// absorbed: the kernel yields 0 for a fully masked row, as the guard does.
// Grouped-query attention: where K and V are both Hugging Face's repeat_kv of fewer heads
//   Reshape(Expand(Unsqueeze(X, 2) [-> Slice that keeps every element], (B, h, n, S, D))
//           [-> Identity], (B, h·n, S, D))
// with h·n Q's heads, Attention reads each X itself (the kernel runs grouped K and V: flash
// attention natively, other backends on a repeat of its own), so the (B, H, S, D) copies are never
// made and their gradients never summed back; the repeats, read by nothing else, go.
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "csrc/core/eval/expression.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/passes/rewrite.h"

namespace torch_ort {
namespace {

using namespace rewrite;

constexpr int kChain = 6;  // the most value-preserving nodes between the Softmax and the MatMul

// The exporter's is_causal mask, folded into an initializer: 0 on and below the diagonal.
bool causal_values(const TensorData& t, const Shape& qs, const Shape& ks) try {
  if (t.dims.size() != 2 || !qs.dims[2].is_known() || !ks.dims[2].is_known() || t.dims[0] != qs.dims[2].value ||
      t.dims[1] != ks.dims[2].value)
    return false;
  const std::vector<double> v = t.as_doubles();
  for (int64_t i = 0; i < t.dims[0]; ++i)
    for (int64_t j = 0; j < t.dims[1]; ++j)
      if (const double x = v[i * t.dims[1] + j]; j <= i ? x != 0.0 : !(x <= -1e30)) return false;
  return true;
} catch (const std::exception&) {  // data we cannot read as numbers
  return false;
}

// True when no gradient can reach the mask: every float value it is computed from is a
// constant (integer and bool values, Shape results among them, carry no gradient).
bool gradient_free(const Graph& g, const Match& m, ValueId v, std::set<ValueId>& seen) {
  if (!seen.insert(v).second || !is_floating(g.value(v).dtype) || g.initializers.count(v)) return true;
  const NodeId p = v < static_cast<ValueId>(m.index().producer.size()) ? m.index().producer[v] : -1;
  if (p < 0) return false;  // a float graph input: a parameter or a user tensor
  for (ValueId in : g.nodes[p].inputs)
    if (in != kNoValue && !gradient_free(g, m, in, seen)) return false;
  return true;
}

bool perm_is(const Node& n, std::vector<int64_t> perm) {
  return pattern::is_onnx(n, "Transpose") && n.attrs.get_ints("perm", {}) == perm;
}

// --- the rule's pattern ------------------------------------------------------------------------
Input made_by(NodePattern p, bool shared) { return shared ? inside(std::move(p), "") : from(std::move(p)); }

// x, or Mul(x, c) in either order with c captured as a scale factor to check.
Input scaled(Input x, const std::string& factor) {
  return one_of({from(op("Mul").commutative().in({x, val(factor)})), x});
}

Input attention_scores() {
  const Input kt = one_of({from(where([](const Graph&, const Node& n) { return perm_is(n, {0, 1, 3, 2}); })
                                    .in({val("k")})),
                           from(op("Reshape").as("k_back").in(
                               {from(where([](const Graph&, const Node& n) { return perm_is(n, {0, 2, 1}); })
                                         .in({from(op("Reshape").as("k_flat").in({val("k"), val("")}))})),
                                val("")}))});
  const NodePattern qk = op("MatMul").in({scaled(val("q"), "q_scale"), scaled(kt, "k_scale")});
  return one_of({from(op("Div").in({from(qk), val("s_div")})), scaled(from(qk), "s_mul")});
}

Input causal_mask() {
  const NodePattern tril =
      where([](const Graph&, const Node& n) { return pattern::is_onnx(n, "Trilu") && !n.attrs.get_int("upper", 1); })
          .in({sees(op("Expand").in({val("ones_fill"), val("")}), "ones"), opt("tril_k")});
  const Input zero_at = sees(op("Equal").in({sees(tril), val("eq_zero")}));
  return sees(op("Where").as("causal").in({zero_at, val("neg"), val("zero")}));
}

// P: the softmax output through up to `depth` nodes that leave its values unchanged (or drop them).
Input probabilities(int depth, bool shared) {
  const NodePattern softmax = op("Softmax").as("softmax").in(
      {one_of({from(op("Add").commutative().in({attention_scores(), one_of({causal_mask(), val("")}, "mask")})),
               attention_scores()})});
  std::vector<Input> alternatives{made_by(softmax, shared)};
  if (depth > 0) {
    const std::string d = std::to_string(depth);
    const Input inner = probabilities(depth - 1, false);
    Input guarded = probabilities(depth - 1, true);
    guarded.capture = "guarded" + d;
    auto same_type_cast = [](const Graph& g, const Node& n) {
      return pattern::is_onnx(n, "Cast") && g.value(n.outputs[0]).dtype == g.value(n.inputs[0]).dtype;
    };
    alternatives.push_back(made_by(where(same_type_cast).in({inner}), shared));
    alternatives.push_back(made_by(op("Identity").in({inner}), shared));
    alternatives.push_back(made_by(op("Dropout").as("dropout" + d).in({inner, opt(""), opt("")}), shared));
    alternatives.push_back(
        made_by(op("Where").in({from(op("IsNaN").in({val("guarded" + d)})), num(0.0), guarded}), shared));
  }
  return one_of(std::move(alternatives));
}

// --- the rule's condition ------------------------------------------------------------------------
struct Found {
  ValueId mask = kNoValue;
  bool causal = false;
  eval::Monomial scale;         // of the scores: constant, or the default 1/√D
  bool default_scale = false;  // the kernel computes 1/√D from Q at run time (no attribute)
  double dropout = 0.0;        // the rate of a training-mode Dropout of P, 0 for none
};

std::optional<Found> check(const Graph& g, const Match& m) {
  auto scalar = [&](ValueId v) { return eval::scalar(g, m.index(), v); };
  Found f;
  const Node& sm = g.nodes[m.node("softmax")];
  auto opset = g.opset_imports.find("");
  const int64_t axis = sm.attrs.get_int("axis", -1);
  if ((opset != g.opset_imports.end() && opset->second < 13) ||
      !(axis == -1 || (axis == 3 && g.value(sm.inputs[0]).shape.rank() == 4)))
    return std::nullopt;
  for (int d = kChain; d >= 1; --d) {  // the Dropouts, from the MatMul backwards
    if (!m.has("dropout" + std::to_string(d))) continue;
    const Node& n = g.nodes[m.node("dropout" + std::to_string(d))];
    if (n.outputs.size() > 1 && n.outputs[1] != kNoValue &&
        (!m.readers(n.outputs[1]).empty() || pattern::is_graph_output(g, n.outputs[1])))
      return std::nullopt;
    auto input = [&](size_t i) { return i < n.inputs.size() ? n.inputs[i] : kNoValue; };
    if (scalar(input(1)) == 0.0 || input(2) == kNoValue || scalar(input(2)) == 0.0) continue;  // the identity
    const std::optional<double> ratio = input(1) == kNoValue ? std::optional<double>(0.5) : scalar(input(1));
    const std::optional<double> training = scalar(input(2));
    if (f.dropout != 0.0 || !ratio || !(*ratio > 0.0 && *ratio < 1.0) || !training || *training == 0.0)
      return std::nullopt;
    f.dropout = *ratio;
  }
  for (const std::string name : {"q_scale", "k_scale", "s_mul", "s_div"}) {  // coef · D^power each
    if (!m.has(name)) continue;
    const std::optional<eval::Monomial> c = eval::monomial(g, m.index(), m.value(name));
    if (!c || c->coef == 0.0) return std::nullopt;
    f.scale.coef *= name == "s_div" ? 1.0 / c->coef : c->coef;
    f.scale.power += name == "s_div" ? -c->power : c->power;
    f.scale.dim_of.insert(f.scale.dim_of.end(), c->dim_of.begin(), c->dim_of.end());
  }
  const ValueId q = m.value("q"), k = m.value("k"), v = m.value("v");
  const Shape &qs = g.value(q).shape, &ks = g.value(k).shape, &vs = g.value(v).shape;
  if (m.has("k_flat")) {  // row-major reshapes keep the element order: the shapes alone prove Kᵀ
    const Shape& flat = g.value(g.nodes[m.node("k_flat")].outputs[0]).shape;
    const Shape& out = g.value(g.nodes[m.node("k_back")].outputs[0]).shape;
    if (ks.rank() != 4 || flat.rank() != 3 || out.rank() != 4 || !flat.dims[1].same_as(ks.dims[2]) ||
        !flat.dims[2].same_as(ks.dims[3]) || !out.dims[0].same_as(ks.dims[0]) || !out.dims[1].same_as(ks.dims[1]) ||
        !out.dims[2].same_as(ks.dims[3]) || !out.dims[3].same_as(ks.dims[2]))
      return std::nullopt;
  }
  const DType dt = g.value(q).dtype;
  if (qs.rank() != 4 || ks.rank() != 4 || vs.rank() != 4 || !is_floating(dt) || g.value(k).dtype != dt ||
      g.value(v).dtype != dt || !std::isfinite(f.scale.coef))
    return std::nullopt;
  // A factor that read a dynamic head size must read Q's: then only 1/√D (SDPA's default) is taken.
  if (f.scale.power != 0.0) {
    for (ValueId x : f.scale.dim_of) {
      const Shape& xs = g.value(x).shape;
      if (x != q && !(xs.rank() == 4 && xs.dims[3].same_as(qs.dims[3]))) return std::nullopt;
    }
    if (f.scale.power != -0.5 || std::abs(f.scale.coef - 1.0) > 1e-6) return std::nullopt;
    f.default_scale = true;
  }
  // The exporter spreads 1/√D over Q and Kᵀ as two rounded square roots (and folding may round
  // them in float): snap back to the exact 1/√D eager SDPA computes.
  if (qs.dims[3].is_known()) {
    const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(qs.dims[3].value));
    if (std::abs(f.scale.coef / inv_sqrt_d - 1.0) < 1e-6) f.scale.coef = inv_sqrt_d;
  }
  if (!m.has("mask")) return f;
  f.mask = m.value("mask");
  if (m.has("causal")) {  // the exporter's Where(Trilu(ones(L, S)) == 0, -big, 0) of (L, S)
    const std::optional<double> neg = scalar(m.value("neg")), fill = scalar(m.value("ones_fill"));
    const Shape& s = g.value(m.value("ones")).shape;
    f.causal = scalar(m.value("zero")) == 0.0 && neg && *neg <= -1e30 && scalar(m.value("eq_zero")) == 0.0 &&
               (m.value("tril_k") == kNoValue || scalar(m.value("tril_k")) == 0.0) && fill && *fill != 0.0 &&
               s.rank() == 2 && s.dims[0].same_as(qs.dims[2]) && s.dims[1].same_as(ks.dims[2]);
    if (!f.causal) return std::nullopt;  // then the plain-mask alternative
  } else if (auto it = g.initializers.find(f.mask); it != g.initializers.end() && causal_values(it->second, qs, ks)) {
    f.causal = true;
  }
  if (f.causal) return f.mask = kNoValue, f;
  const Value& mv = g.value(f.mask);
  std::set<ValueId> seen;
  if (mv.dtype != dt || !mv.shape.rank_known || mv.shape.rank() > 4 || !gradient_free(g, m, f.mask, seen))
    return std::nullopt;
  return f;
}

// --- grouped K and V --------------------------------------------------------------------------------
// A Slice that keeps every element: each dim provably unchanged, every step a positive constant
// (a same-length slice with a positive step starts at 0 and takes each element once).
bool keeps_all(const Graph& g, const GraphIndex& idx, const Node& n) {
  if (!pattern::is_onnx(n, "Slice") || !pattern::has_input(n, 0)) return false;
  const Shape &in = g.value(n.inputs[0]).shape, &out = g.value(n.outputs[0]).shape;
  if (!in.rank_known || !out.rank_known || in.rank() != out.rank()) return false;
  for (int d = 0; d < in.rank(); ++d)
    if (!in.dims[d].same_as(out.dims[d])) return false;
  if (!pattern::has_input(n, 4)) return true;
  const auto steps = pattern::constant_ints(g, idx, n.inputs[4]);
  return steps && std::all_of(steps->begin(), steps->end(), [](int64_t s) { return s > 0; });
}

// X when `kv` (B, H, S, D) is X (B, h, S, D) with each head repeated H/h times in a row (the
// pattern above), with h known; kNoValue otherwise.
ValueId unrepeated(const Graph& g, const GraphIndex& idx, ValueId kv) {
  const Node* reshape = pattern::producer(g, idx, kv);
  if (!reshape || !pattern::is_onnx(*reshape, "Reshape")) return kNoValue;
  const Node* expand = pattern::producer(g, idx, reshape->inputs[0]);
  while (expand && pattern::is_onnx(*expand, "Identity")) expand = pattern::producer(g, idx, expand->inputs[0]);
  if (!expand || !pattern::is_onnx(*expand, "Expand")) return kNoValue;
  const Node* unsqueeze = pattern::producer(g, idx, expand->inputs[0]);
  while (unsqueeze && keeps_all(g, idx, *unsqueeze)) unsqueeze = pattern::producer(g, idx, unsqueeze->inputs[0]);
  if (!unsqueeze || !pattern::is_onnx(*unsqueeze, "Unsqueeze") || !pattern::has_input(*unsqueeze, 1)) return kNoValue;
  const auto axes = pattern::constant_ints(g, idx, unsqueeze->inputs[1]);
  if (!axes || axes->size() != 1 || !((*axes)[0] == 2 || (*axes)[0] == -3)) return kNoValue;
  const ValueId x = unsqueeze->inputs[0];
  const Shape &xs = g.value(x).shape, &es = g.value(expand->outputs[0]).shape, &rs = g.value(kv).shape;
  if (xs.rank() != 4 || es.rank() != 5 || rs.rank() != 4 || !xs.dims[1].is_known() || !es.dims[2].is_known() ||
      !rs.dims[1].is_known())
    return kNoValue;
  const int64_t h = xs.dims[1].value, n = es.dims[2].value;
  const bool expanded = es.dims[0].same_as(xs.dims[0]) && es.dims[1].same_as(xs.dims[1]) &&
                        es.dims[3].same_as(xs.dims[2]) && es.dims[4].same_as(xs.dims[3]);
  const bool merged = rs.dims[0].same_as(xs.dims[0]) && rs.dims[1].value == h * n && rs.dims[2].same_as(xs.dims[2]) &&
                      rs.dims[3].same_as(xs.dims[3]);
  return h > 0 && n > 1 && expanded && merged ? x : kNoValue;
}

Node attention(Graph& g, const Match& m, const Node& at) {
  const Found f = *check(g, m);
  const ValueId y = at.outputs[0], q = m.value("q");
  std::vector<ValueId> ins{q, m.value("k"), m.value("v")};
  const ValueId k_heads = unrepeated(g, m.index(), ins[1]), v_heads = unrepeated(g, m.index(), ins[2]);
  if (k_heads != kNoValue && v_heads != kNoValue && g.value(ins[1]).shape.dims[1].same_as(g.value(q).shape.dims[1]) &&
      g.value(k_heads).shape.dims[1].same_as(g.value(v_heads).shape.dims[1])) {
    ins[1] = k_heads;
    ins[2] = v_heads;
  }
  const Shape qs = g.value(q).shape;  // a copy: new values may move the graph's
  const DType lse_type = g.value(q).dtype == DType::kDouble ? DType::kDouble : DType::kFloat;
  const ValueId lse =
      g.new_value(g.value(y).name + "/logsumexp", lse_type, Shape::of({qs.dims[0], qs.dims[1], qs.dims[2]}));
  // The backend the kernel chose (at::SDPBackend), a host scalar its backward reads.
  const ValueId backend = g.new_value(g.value(y).name + "/backend", DType::kInt64, Shape::of({}));
  Attributes a;
  a.set("causal", int64_t{f.causal ? 1 : 0});
  if (!f.default_scale) a.set("scale", static_cast<float>(f.scale.coef));  // absent: 1/√D
  std::vector<ValueId> outs{y, lse, backend};
  if (f.dropout > 0.0) {
    a.set("dropout", static_cast<float>(f.dropout));
    // The random state the draw came from (its form is the backend's: no shape), a device
    // value the backward reads as data, so a CUDA graph replays it without a host read.
    for (const char* part : {"/rng_state0", "/rng_state1"})
      outs.push_back(g.new_value(g.value(y).name + part, DType::kInt64, Shape::unknown()));
  }
  if (f.mask != kNoValue) ins.push_back(f.mask);
  return Node{kOurDomain, "Attention", g.unique_node_name(at.name + "/Attention"), std::move(ins), std::move(outs),
              std::move(a)};
}

class AttentionFusion final : public Pass {
 public:
  std::string_view name() const override { return "attention_fusion"; }
  bool run(Graph& g) override {
    static const Rule kRule{"MatMul(Softmax(scaled Q·Kᵀ [+ mask]) [kept as is], V) -> Attention",
                            op("MatMul").in({probabilities(kChain, false), val("v")}),
                            [](const Graph& g, const Match& m) { return check(g, m).has_value(); }, attention};
    return rewrite::apply(g, {kRule});
  }
};

}  // namespace

std::unique_ptr<Pass> make_attention_fusion_pass() { return std::make_unique<AttentionFusion>(); }

}  // namespace torch_ort
