// attention_fusion: scaled-dot-product attention written as ops -> one com.torch_ort::Attention
// (Q, K, V, [mask]; causal, scale, dropout) whose kernel is ATen's fused SDPA (flash attention on
// CPU; with dropout, the backend eager SDPA picks for it: on the CPU the math path).
//
// Pattern (what the exporter emits for F.scaled_dot_product_attention, and hand-written HF/nanoGPT
// attention), read from the output MatMul backwards:
//   Y = MatMul(P, V),  P = [Cast to itself | Dropout | Where(IsNaN(P'), 0, P')] Softmax(X, -1)
//   X = S | Add(S, M) | Add(M, S),   S = [Mul|Div by a scalar] MatMul([Mul(Q, c)], [Mul(Kᵀ, c)])
//   Kᵀ = Transpose(K, [0,1,3,2]) | Reshape(Transpose(Reshape(K, (BH,S,D)), [0,2,1]), (B,H,D,S))
// Conditions: Q, K, V of rank 4; every scale factor a constant scalar (constants, CastLike, Sqrt,
// Div, and Shape(x)[i] of a known dim: the exporter computes 1/√D from Shape(Q)), or in all
// exactly 1/√D of a dynamic head size D (then no scale attribute: the kernel's default); every
// intermediate read only by the next node of the chain; the mask of rank <= 4 and of Q's dtype,
// computed from nothing that can carry a gradient (Attention gives the mask none). A Dropout
// whose mask nothing reads is taken when it is the identity (ratio 0, no training_mode, or
// training_mode a constant false), or when it drops: training_mode a constant true and the ratio
// a constant in (0, 1) (absent: ONNX's 0.5), which becomes the `dropout` attribute (one such
// Dropout per chain). A ratio or training flag known only at run time is not fused.
// Action: the output MatMul becomes Attention (same Y value, plus a LogSumExp output its
// gradient reads, the backend the kernel chose and, with dropout, the random state the backward
// replays the mask from: outputs 3 and 4, see ops/attention.cc); the chain's other nodes go. A mask that is the exporter's causal mask
// (Where(Trilu(ones(L, S)) == 0, -big, 0)) becomes causal=1 and is dropped. The NaN guard
// (IsNaN -> 0) is absorbed: the kernel yields 0 for a fully masked row, as the guard does.
#include <cmath>
#include <optional>
#include <set>
#include <vector>

#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"

namespace torch_ort {
namespace {

bool is_float(DType t) {
  return t == DType::kFloat || t == DType::kDouble || t == DType::kFloat16 || t == DType::kBFloat16;
}

// A scale factor as coef · D^power, D the head size: the exporter computes SDPA's default scale
// 1/√D from Shape(Q)[-1], which stays symbolic when the head size is dynamic.
struct Mono {
  double coef = 1.0;
  double power = 0.0;
  std::vector<ValueId> dim_of;  // the values whose last dim D was read (must share Q's)
  Mono& operator*=(const Mono& o) {
    coef *= o.coef;
    power += o.power;
    dim_of.insert(dim_of.end(), o.dim_of.begin(), o.dim_of.end());
    return *this;
  }
};

struct Match {
  std::vector<NodeId> remove;  // chain nodes replaced by the Attention node
  NodeId out_matmul = -1;      // becomes the Attention node
  ValueId q = kNoValue, k = kNoValue, v = kNoValue, mask = kNoValue;
  bool causal = false;
  Mono scale;                  // of the scores: constant, or the default 1/√D
  bool default_scale = false;  // the kernel computes 1/√D from Q at run time (no attribute)
  double dropout = 0.0;        // the rate of a training-mode Dropout of P, 0 for none
};

class Matcher {
 public:
  Matcher(const Graph& g, const GraphIndex& idx) : g_(g), idx_(idx) {
    for (ValueId o : g.outputs) graph_outputs_.insert(o);
  }

  // The node producing v when it is a default-domain `op`, else nullptr. The graph passed verify(),
  // so a standard op has the inputs and output 0 this matcher reads by position (op_arity.h).
  const Node* made_by(ValueId v, const char* op) const {
    if (v == kNoValue || v >= static_cast<ValueId>(idx_.producer.size())) return nullptr;
    const NodeId p = idx_.producer[v];
    if (p < 0 || g_.nodes[p].op_type != op || !g_.nodes[p].domain.empty()) return nullptr;
    return &g_.nodes[p];
  }
  NodeId id_of(const Node* n) const { return static_cast<NodeId>(n - g_.nodes.data()); }
  // An intermediate the fused node swallows: read by `readers` nodes only and not a graph output.
  bool private_value(ValueId v, size_t readers = 1) const {
    return idx_.consumers[v].size() == readers && !graph_outputs_.count(v);
  }

  // The value of a constant scalar expression (one element), or nullopt.
  std::optional<double> scalar(ValueId v, int depth = 0) const {
    if (v == kNoValue || depth > 16) return std::nullopt;
    if (auto it = g_.initializers.find(v); it != g_.initializers.end()) return one(it->second);
    const NodeId p = idx_.producer[v];
    if (p < 0 || !g_.nodes[p].domain.empty()) return std::nullopt;
    const Node& n = g_.nodes[p];
    auto arg = [&](size_t i) { return i < n.inputs.size() ? scalar(n.inputs[i], depth + 1) : std::nullopt; };
    const std::string& op = n.op_type;
    if (op == "Constant") {
      if (const TensorData* t = n.attrs.get_tensor("value")) return one(*t);
      if (n.attrs.has("value_float")) return n.attrs.get_float("value_float", 0.0f);
      if (n.attrs.has("value_int")) return static_cast<double>(n.attrs.get_int("value_int", 0));
      return std::nullopt;
    }
    if (op == "Identity" || op == "Reshape" || op == "Squeeze" || op == "Unsqueeze") return arg(0);
    if (op == "Cast" || op == "CastLike") {
      const std::optional<double> x = arg(0);
      const DType to = g_.value(n.outputs[0]).dtype;
      if (!x || to == DType::kUndefined || to == DType::kBool) return std::nullopt;
      return is_float(to) ? x : std::optional<double>(std::trunc(*x));
    }
    if (op == "Sqrt" || op == "Reciprocal" || op == "Neg") {
      const std::optional<double> x = arg(0);
      if (!x) return std::nullopt;
      return op == "Sqrt" ? std::sqrt(*x) : op == "Neg" ? -*x : 1.0 / *x;
    }
    if (op == "Mul" || op == "Div" || op == "Add" || op == "Sub") {
      const std::optional<double> a = arg(0), b = arg(1);
      if (!a || !b) return std::nullopt;
      return op == "Mul" ? *a * *b : op == "Div" ? *a / *b : op == "Add" ? *a + *b : *a - *b;
    }
    if (op == "Gather") return shape_element(n);
    return std::nullopt;
  }

  // A scale factor (one element that does not provably raise the rank 4 by broadcasting): a
  // constant, or constants and Shape(x)[-1] of an unknown last dim combined by Sqrt/Mul/Div.
  std::optional<Mono> factor(ValueId c, int depth = 0) const {
    if (c == kNoValue || depth > 16 || g_.value(c).shape.rank() > 4) return std::nullopt;
    if (std::optional<double> k = scalar(c)) return Mono{*k, 0.0, {}};
    const NodeId p = idx_.producer[c];
    if (p < 0 || !g_.nodes[p].domain.empty()) return std::nullopt;
    const Node& n = g_.nodes[p];
    const std::string& op = n.op_type;
    auto arg = [&](size_t i) { return i < n.inputs.size() ? factor(n.inputs[i], depth + 1) : std::nullopt; };
    if (op == "Identity" || op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" ||
        ((op == "Cast" || op == "CastLike") && is_float(g_.value(n.outputs[0]).dtype)))
      return arg(0);
    if (op == "Sqrt" || op == "Reciprocal") {
      std::optional<Mono> x = arg(0);
      if (!x || x->coef <= 0) return std::nullopt;
      if (op == "Sqrt") return Mono{std::sqrt(x->coef), x->power / 2, x->dim_of};
      return Mono{1.0 / x->coef, -x->power, x->dim_of};
    }
    if (op == "Mul" || op == "Div") {
      std::optional<Mono> a = arg(0), b = arg(1);
      if (!a || !b || b->coef == 0) return std::nullopt;
      if (op == "Div") b = Mono{1.0 / b->coef, -b->power, b->dim_of};
      return *a *= *b;
    }
    if (op == "Gather") {  // Shape(x)[-1] with x's last dim unknown here
      const Node* sh = made_by(n.inputs[0], "Shape");
      const std::optional<double> i = n.inputs.size() > 1 ? scalar(n.inputs[1]) : std::nullopt;
      if (!sh || !i || n.attrs.get_int("axis", 0) != 0 || sh->attrs.get_int("start", 0) != 0 || sh->attrs.has("end"))
        return std::nullopt;
      const int64_t r = g_.value(sh->inputs[0]).shape.rank();
      if (r < 1 || !(*i == -1 || *i == static_cast<double>(r - 1))) return std::nullopt;
      return Mono{1.0, 1.0, {sh->inputs[0]}};
    }
    return std::nullopt;
  }

  // Kᵀ: K (B, H, S, D) with its last two dims swapped; records the chain's nodes.
  std::optional<ValueId> untranspose(ValueId kt, std::vector<NodeId>& chain) const {
    if (const Node* t = made_by(kt, "Transpose")) {
      if (t->attrs.get_ints("perm", {}) != std::vector<int64_t>{0, 1, 3, 2}) return std::nullopt;
      chain.push_back(id_of(t));
      return t->inputs[0];
    }
    // The exporter's form: flatten (B, H) to one dim, swap, split back. Row-major reshapes keep
    // the element order, so the shapes alone prove it: (B·H, S, D) and back to (B, H, D, S).
    const Node* r2 = made_by(kt, "Reshape");
    if (!r2 || !private_value(r2->inputs[0])) return std::nullopt;
    const Node* t = made_by(r2->inputs[0], "Transpose");
    if (!t || t->attrs.get_ints("perm", {}) != std::vector<int64_t>{0, 2, 1} || !private_value(t->inputs[0]))
      return std::nullopt;
    const Node* r1 = made_by(t->inputs[0], "Reshape");
    if (!r1) return std::nullopt;
    const ValueId k = r1->inputs[0];
    const Shape& ks = g_.value(k).shape;
    const Shape& flat = g_.value(r1->outputs[0]).shape;
    const Shape& out = g_.value(kt).shape;
    if (ks.rank() != 4 || flat.rank() != 3 || out.rank() != 4) return std::nullopt;
    const bool ok = flat.dims[1].same_as(ks.dims[2]) && flat.dims[2].same_as(ks.dims[3]) &&
                    out.dims[0].same_as(ks.dims[0]) && out.dims[1].same_as(ks.dims[1]) &&
                    out.dims[2].same_as(ks.dims[3]) && out.dims[3].same_as(ks.dims[2]);
    if (!ok) return std::nullopt;
    chain.insert(chain.end(), {id_of(r2), id_of(t), id_of(r1)});
    return k;
  }

  // x, or x's input when x = Mul(x', c) / Mul(c, x') with c a scale factor (folded into scale).
  // Only a Mul whose result nothing else reads is absorbed.
  ValueId unscale(ValueId x, Mono& scale, std::vector<NodeId>& chain) const {
    const Node* m = made_by(x, "Mul");
    if (!m || m->inputs.size() != 2 || !private_value(x)) return x;
    for (int side : {1, 0}) {
      if (std::optional<Mono> c = factor(m->inputs[side])) {
        scale *= *c;
        chain.push_back(id_of(m));
        return m->inputs[1 - side];
      }
    }
    return x;
  }

  // The exporter's is_causal mask: Where(Equal(Trilu(ones(L, S), lower), 0), -big, 0), (L, S)
  // matching Q's and K's sequence dims.
  // Constant folding may have turned it into an initializer: its values then say it.
  bool causal_mask(ValueId m, const Shape& qs, const Shape& ks) const {
    if (auto it = g_.initializers.find(m); it != g_.initializers.end()) return causal_values(it->second, qs, ks);
    const Node* w = made_by(m, "Where");
    if (!w || w->inputs.size() != 3) return false;
    const std::optional<double> neg = scalar(w->inputs[1]), zero = scalar(w->inputs[2]);
    if (!neg || !zero || *zero != 0.0 || !(*neg <= -1e30)) return false;
    const Node* eq = made_by(w->inputs[0], "Equal");
    if (!eq || eq->inputs.size() != 2 || scalar(eq->inputs[1]) != 0.0) return false;
    const Node* tri = made_by(eq->inputs[0], "Trilu");
    if (!tri || tri->attrs.get_int("upper", 1) != 0) return false;
    if (tri->inputs.size() > 1 && tri->inputs[1] != kNoValue && scalar(tri->inputs[1]) != 0.0) return false;
    const Node* ones = made_by(tri->inputs[0], "Expand");
    if (!ones || !scalar(ones->inputs[0]) || *scalar(ones->inputs[0]) == 0.0) return false;
    const Shape& s = g_.value(tri->inputs[0]).shape;
    return s.rank() == 2 && s.dims[0].same_as(qs.dims[2]) && s.dims[1].same_as(ks.dims[2]);
  }

  // True when no gradient can reach the mask: every float value it is computed from is a
  // constant (integer and bool values, Shape results among them, carry no gradient).
  bool gradient_free(ValueId v, std::set<ValueId>& seen) const {
    if (!seen.insert(v).second || !is_float(g_.value(v).dtype) || g_.initializers.count(v)) return true;
    const NodeId p = idx_.producer[v];
    if (p < 0) return false;  // a float graph input: a parameter or a user tensor
    for (ValueId in : g_.nodes[p].inputs)
      if (in != kNoValue && !gradient_free(in, seen)) return false;
    return true;
  }

  std::optional<Match> match(NodeId at) const;

 private:
  static std::optional<double> one(const TensorData& t) {
    try {
      if (t.numel() != 1) return std::nullopt;
      return t.as_doubles().at(0);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  static bool causal_values(const TensorData& t, const Shape& qs, const Shape& ks) {
    if (t.dims.size() != 2 || !qs.dims[2].is_known() || !ks.dims[2].is_known() ||
        t.dims[0] != qs.dims[2].value || t.dims[1] != ks.dims[2].value)
      return false;
    std::vector<double> v;
    try {
      v = t.as_doubles();
    } catch (const std::exception&) {
      return false;
    }
    for (int64_t i = 0; i < t.dims[0]; ++i)
      for (int64_t j = 0; j < t.dims[1]; ++j)
        if (const double x = v[i * t.dims[1] + j]; j <= i ? x != 0.0 : !(x <= -1e30)) return false;
    return true;
  }
  // Gather(Shape(x), i) of one element when x's dim is known.
  std::optional<double> shape_element(const Node& gather) const {
    const Node* sh = made_by(gather.inputs[0], "Shape");
    const std::optional<double> i = gather.inputs.size() > 1 ? scalar(gather.inputs[1]) : std::nullopt;
    if (!sh || !i || gather.attrs.get_int("axis", 0) != 0) return std::nullopt;
    const Shape& xs = g_.value(sh->inputs[0]).shape;
    if (!xs.rank_known) return std::nullopt;
    const int64_t r = xs.rank();
    auto clamp = [r](int64_t a) { return std::min(std::max(a < 0 ? a + r : a, int64_t{0}), r); };
    const int64_t start = clamp(sh->attrs.get_int("start", 0)), end = clamp(sh->attrs.get_int("end", r));
    int64_t k = static_cast<int64_t>(*i);
    if (k < 0) k += end - start;
    if (k < 0 || start + k >= end || !xs.dims[start + k].is_known()) return std::nullopt;
    return static_cast<double>(xs.dims[start + k].value);
  }

  const Graph& g_;
  const GraphIndex& idx_;
  std::set<ValueId> graph_outputs_;
};

std::optional<Match> Matcher::match(NodeId at) const {
  const Node& mm = g_.nodes[at];
  if (mm.op_type != "MatMul" || !mm.domain.empty() || mm.inputs.size() != 2) return std::nullopt;
  Match m;
  m.out_matmul = at;
  m.v = mm.inputs[1];
  // P: the softmax output, through what leaves its values unchanged.
  ValueId p = mm.inputs[0];
  if (!private_value(p)) return std::nullopt;
  for (;;) {
    if (const Node* w = made_by(p, "Where"); w && w->inputs.size() == 3) {  // NaN guard
      const Node* nan = made_by(w->inputs[0], "IsNaN");
      if (!nan || nan->inputs[0] != w->inputs[2] || scalar(w->inputs[1]) != 0.0 ||
          !private_value(w->inputs[0]) || !private_value(w->inputs[2], 2))
        return std::nullopt;
      m.remove.insert(m.remove.end(), {id_of(w), id_of(nan)});
      p = w->inputs[2];
      continue;
    }
    const NodeId pn = idx_.producer[p];
    if (pn < 0 || !g_.nodes[pn].domain.empty()) return std::nullopt;
    const Node& n = g_.nodes[pn];
    const bool same_type = g_.value(n.outputs[0]).dtype == g_.value(n.inputs[0]).dtype;
    // Dropout (its mask unread) is the identity when its ratio is 0 or it is not training; when
    // it drops (training_mode constant true, a constant ratio in (0, 1)) the kernel draws it.
    auto in_is = [&](size_t i, double c) { return i < n.inputs.size() && scalar(n.inputs[i]) == c; };
    auto absent = [&](size_t i) { return i >= n.inputs.size() || n.inputs[i] == kNoValue; };
    const bool dropout = n.op_type == "Dropout" &&
                         (n.outputs.size() < 2 || n.outputs[1] == kNoValue || private_value(n.outputs[1], 0));
    const bool no_drop = dropout && (in_is(1, 0.0) || absent(2) || in_is(2, 0.0));
    bool drops = false;
    if (dropout && !no_drop && m.dropout == 0.0) {
      const std::optional<double> ratio = absent(1) ? std::optional<double>(0.5) : scalar(n.inputs[1]);
      const std::optional<double> training = scalar(n.inputs[2]);
      drops = ratio && *ratio > 0.0 && *ratio < 1.0 && training && *training != 0.0;
      if (drops) m.dropout = *ratio;
    }
    if (!((n.op_type == "Cast" && same_type) || n.op_type == "Identity" || no_drop || drops)) break;
    if (!private_value(n.inputs[0])) return std::nullopt;
    m.remove.push_back(pn);
    p = n.inputs[0];
  }
  const Node* sm = made_by(p, "Softmax");
  if (!sm) return std::nullopt;
  const Shape& xs = g_.value(sm->inputs[0]).shape;
  auto opset = g_.opset_imports.find("");
  const int64_t axis = sm->attrs.get_int("axis", -1);
  if ((opset != g_.opset_imports.end() && opset->second < 13) || !(axis == -1 || (axis == 3 && xs.rank() == 4)))
    return std::nullopt;
  m.remove.push_back(id_of(sm));
  // X = S (+ M)
  ValueId x = sm->inputs[0], s = x;
  if (!private_value(x)) return std::nullopt;
  if (const Node* add = made_by(x, "Add"); add && add->inputs.size() == 2) {
    // The scores side is the one that is (a scaled) MatMul; the other is the mask.
    auto scores_side = [&](ValueId t) {
      const Node* d = made_by(t, "Div");
      Mono unused;
      std::vector<NodeId> none;
      return made_by(d ? d->inputs[0] : unscale(t, unused, none), "MatMul") != nullptr;
    };
    const int side = scores_side(add->inputs[0]) ? 0 : 1;
    s = add->inputs[side];
    m.mask = add->inputs[1 - side];
    m.remove.push_back(id_of(add));
    if (!private_value(s)) return std::nullopt;
  }
  // S = [scaled] Q·Kᵀ
  if (const Node* d = made_by(s, "Div"); d && d->inputs.size() == 2) {
    const std::optional<Mono> c = factor(d->inputs[1]);
    if (!c || c->coef == 0.0 || !private_value(d->inputs[0])) return std::nullopt;
    m.scale *= Mono{1.0 / c->coef, -c->power, c->dim_of};
    m.remove.push_back(id_of(d));
    s = d->inputs[0];
  } else {
    s = unscale(s, m.scale, m.remove);
  }
  const Node* qk = made_by(s, "MatMul");
  if (!qk || qk->inputs.size() != 2) return std::nullopt;
  m.remove.push_back(id_of(qk));
  m.q = unscale(qk->inputs[0], m.scale, m.remove);
  const ValueId kt = unscale(qk->inputs[1], m.scale, m.remove);
  if (!private_value(kt)) return std::nullopt;
  const std::optional<ValueId> k = untranspose(kt, m.remove);
  if (!k) return std::nullopt;
  m.k = *k;
  // Conditions on the leaves.
  const Shape &qs = g_.value(m.q).shape, &ks = g_.value(m.k).shape, &vs = g_.value(m.v).shape;
  const DType dt = g_.value(m.q).dtype;
  if (qs.rank() != 4 || ks.rank() != 4 || vs.rank() != 4 || !is_float(dt) || g_.value(m.k).dtype != dt ||
      g_.value(m.v).dtype != dt || !std::isfinite(m.scale.coef))
    return std::nullopt;
  // A factor that read a dynamic head size must read Q's: then only 1/√D (SDPA's default) is taken.
  if (m.scale.power != 0.0) {
    for (ValueId x : m.scale.dim_of) {
      const Shape& xs = g_.value(x).shape;
      if (x != m.q && !(xs.rank() == 4 && xs.dims[3].same_as(qs.dims[3]))) return std::nullopt;
    }
    if (m.scale.power != -0.5 || std::abs(m.scale.coef - 1.0) > 1e-6) return std::nullopt;
    m.default_scale = true;
  }
  // The exporter spreads 1/√D over Q and Kᵀ as two rounded square roots (and folding may round
  // them in float): snap back to the exact 1/√D eager SDPA computes.
  if (qs.dims[3].is_known()) {
    const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(qs.dims[3].value));
    if (std::abs(m.scale.coef / inv_sqrt_d - 1.0) < 1e-6) m.scale.coef = inv_sqrt_d;
  }
  if (m.mask != kNoValue) {
    const Value& mv = g_.value(m.mask);
    std::set<ValueId> seen;
    if (causal_mask(m.mask, qs, ks)) {
      m.causal = true;
      m.mask = kNoValue;
    } else if (mv.dtype != dt || !mv.shape.rank_known || mv.shape.rank() > 4 || !gradient_free(m.mask, seen)) {
      return std::nullopt;
    }
  }
  return m;
}

class AttentionFusion final : public Pass {
 public:
  std::string_view name() const override { return "attention_fusion"; }

  bool run(Graph& g) override {
    std::vector<Match> found;
    {
      const GraphIndex idx(g);
      const Matcher matcher(g, idx);
      std::vector<char> taken(g.nodes.size(), 0);
      for (NodeId i = 0; i < static_cast<NodeId>(g.nodes.size()); ++i) {
        std::optional<Match> m = matcher.match(i);
        if (!m) continue;
        bool overlaps = taken[i];
        for (NodeId r : m->remove) overlaps |= taken[r] != 0;
        if (overlaps) continue;
        taken[i] = 1;
        for (NodeId r : m->remove) taken[r] = 1;
        found.push_back(std::move(*m));
      }
    }
    if (found.empty()) return false;
    std::vector<char> drop(g.nodes.size(), 0);
    for (const Match& m : found) {
      for (NodeId r : m.remove) drop[r] = 1;
      Node& at = g.nodes[m.out_matmul];
      const ValueId y = at.outputs[0];
      const Shape& qs = g.value(m.q).shape;
      const DType lse_type = g.value(m.q).dtype == DType::kDouble ? DType::kDouble : DType::kFloat;
      const ValueId lse = g.new_value(g.value(y).name + "/logsumexp", lse_type,
                                      Shape::of({qs.dims[0], qs.dims[1], qs.dims[2]}));
      // The backend the kernel chose (at::SDPBackend), a host scalar its backward reads.
      const ValueId backend = g.new_value(g.value(y).name + "/backend", DType::kInt64, Shape::of({}));
      Attributes a;
      a.set("causal", int64_t{m.causal ? 1 : 0});
      if (!m.default_scale) a.set("scale", static_cast<float>(m.scale.coef));  // absent: 1/√D
      std::vector<ValueId> outs{y, lse, backend};
      if (m.dropout > 0.0) {
        a.set("dropout", static_cast<float>(m.dropout));
        // The random state the draw came from (its form is the backend's: no shape), a device
        // value the backward reads as data, so a CUDA graph replays it without a host read.
        for (const char* part : {"/rng_state0", "/rng_state1"})
          outs.push_back(g.new_value(g.value(y).name + part, DType::kInt64, Shape::unknown()));
      }
      std::vector<ValueId> ins{m.q, m.k, m.v};
      if (m.mask != kNoValue) ins.push_back(m.mask);
      at = Node{kOurDomain, "Attention", g.unique_node_name(at.name + "/Attention"), std::move(ins), std::move(outs),
                std::move(a)};
    }
    pattern::erase_nodes(g, drop);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_attention_fusion_pass() { return std::make_unique<AttentionFusion>(); }

}  // namespace torch_ort
