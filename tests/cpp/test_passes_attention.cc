// attention_fusion: structure of tiny hand-written attention graphs before and after the pass,
// the fused graph's numbers against the unfused one (reference evaluator), and the numeric
// gradient cases of Attention (its rule and AttentionGrad, through test_gradients.cc's checker).
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/ir/verifier.h"
#include "csrc/core/ir/op_traits.h"
#include "csrc/core/passes/pass.h"
#include "tests/cpp/grad_cases.h"
#include "tests/cpp/ir_builders.h"
#include "tests/cpp/reference_eval.h"

namespace torch_ort {
namespace {

using testing::add_node;

// --- reference (double precision) Attention and AttentionGrad for the evaluator ---------------
// s = scale·Q·Kᵀ (+ mask, broadcast) (−∞ above the diagonal when causal); P = softmax(s); Y = P·V.
// K and V may have fewer heads (grouped): query head h reads KV head h / (H / Hkv).
struct Sdpa {
  int64_t B, H, L, S, D, Dv, Hkv;
  std::vector<double> s, lse, p;  // (B, H, L, S), (B, H, L), (B, H, L, S)
  int64_t kv(int64_t bh) const { return bh / H * Hkv + bh % H / (H / Hkv); }  // K/V's (b, head) of Q's
};
Sdpa sdpa(const Node& n, const ref::Tensor& q, const ref::Tensor& k, const ref::Tensor& v,
          const ref::Tensor* mask) {
  if (q.shape.size() != 4 || k.shape.size() != 4 || v.shape.size() != 4) ref::fail(n, "Q, K, V must be 4-D");
  Sdpa r{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3], k.shape[1], {}, {}, {}};
  if (r.Hkv < 1 || r.H % r.Hkv != 0 || v.shape[1] != r.Hkv) ref::fail(n, "K and V heads must divide Q's");
  const double scale = n.attrs.has("scale") ? n.attrs.get_float("scale", 1.0f) : 1.0 / std::sqrt(double(q.shape[3]));
  const bool causal = n.attrs.get_int("causal", 0) != 0;
  ref::Dims md(4, 1);
  if (mask)
    for (size_t i = 0; i < mask->shape.size(); ++i) md[4 - mask->shape.size() + i] = mask->shape[i];
  r.s.assign(r.B * r.H * r.L * r.S, 0.0);
  r.lse.assign(r.B * r.H * r.L, 0.0);
  for (int64_t bh = 0; bh < r.B * r.H; ++bh)
    for (int64_t i = 0; i < r.L; ++i) {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < r.S; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < r.D; ++d) acc += q.reals[(bh * r.L + i) * r.D + d] * k.reals[(r.kv(bh) * r.S + j) * r.D + d];
        acc *= scale;
        if (mask) {
          const int64_t b = bh / r.H, h = bh % r.H;
          acc += mask->reals[ref::ravel({md[0] == 1 ? 0 : b, md[1] == 1 ? 0 : h, md[2] == 1 ? 0 : i, md[3] == 1 ? 0 : j}, md)];
        }
        if (causal && j > i) acc = -std::numeric_limits<double>::infinity();
        r.s[(bh * r.L + i) * r.S + j] = acc;
        mx = std::max(mx, acc);
      }
      double sum = 0;
      for (int64_t j = 0; j < r.S; ++j) sum += std::exp(r.s[(bh * r.L + i) * r.S + j] - mx);
      r.lse[bh * r.L + i] = mx + std::log(sum);
    }
  r.p.resize(r.s.size());
  for (size_t e = 0; e < r.s.size(); ++e) r.p[e] = std::exp(r.s[e] - r.lse[e / r.S]);
  return r;
}

const bool kRefAttention = ref::register_op(kOurDomain, "Attention", [](const Node& n, const ref::Ins& in) {
  const Sdpa r = sdpa(n, *in[0], *in[1], *in[2], in.size() > 3 ? in[3] : nullptr);
  ref::Tensor y = ref::zeros(in[0]->dtype, {r.B, r.H, r.L, r.Dv});
  for (int64_t bh = 0; bh < r.B * r.H; ++bh)
    for (int64_t i = 0; i < r.L; ++i)
      for (int64_t j = 0; j < r.S; ++j)
        for (int64_t d = 0; d < r.Dv; ++d)
          y.reals[(bh * r.L + i) * r.Dv + d] +=
              r.p[(bh * r.L + i) * r.S + j] * in[2]->reals[(r.kv(bh) * r.S + j) * r.Dv + d];
  ref::Tensor lse = ref::Tensor::of_reals(DType::kFloat, {r.B, r.H, r.L}, r.lse);
  ref::Tensor backend = ref::zeros(DType::kInt64, {});  // the math backend, 0
  return ref::Outs{y, lse, backend};
});

// dS = P ⊙ (dY·Vᵀ − rowsum(dY ⊙ Y) + dLSE); dQ = scale·dS·K; dK = scale·dSᵀ·Q; dV = Pᵀ·dY.
const bool kRefAttentionGrad = ref::register_op(kOurDomain, "AttentionGrad", [](const Node& n, const ref::Ins& in) {
  const ref::Tensor &q = *in[1], &k = *in[2], &v = *in[3], &y = *in[4];
  const Sdpa r = sdpa(n, q, k, v, in.size() > 6 ? in[6] : nullptr);
  const double scale = n.attrs.has("scale") ? n.attrs.get_float("scale", 1.0f) : 1.0 / std::sqrt(double(q.shape[3]));
  ref::Tensor dq = ref::zeros(q.dtype, q.shape), dk = ref::zeros(k.dtype, k.shape),
                 dv = ref::zeros(v.dtype, v.shape);
  auto dy = [&](int64_t e) { return in[0] ? in[0]->reals[e] : 0.0; };
  for (int64_t bh = 0; bh < r.B * r.H; ++bh)
    for (int64_t i = 0; i < r.L; ++i) {
      double delta = 0;
      for (int64_t d = 0; d < r.Dv; ++d) delta += dy((bh * r.L + i) * r.Dv + d) * y.reals[(bh * r.L + i) * r.Dv + d];
      if (in.size() > 7 && in[7]) delta -= in[7]->reals[bh * r.L + i];
      for (int64_t j = 0; j < r.S; ++j) {
        const double p = r.p[(bh * r.L + i) * r.S + j];
        double dp = 0;
        for (int64_t d = 0; d < r.Dv; ++d) {
          dp += dy((bh * r.L + i) * r.Dv + d) * v.reals[(r.kv(bh) * r.S + j) * r.Dv + d];
          dv.reals[(r.kv(bh) * r.S + j) * r.Dv + d] += p * dy((bh * r.L + i) * r.Dv + d);
        }
        const double ds = p * (dp - delta) * scale;
        for (int64_t d = 0; d < r.D; ++d) {
          dq.reals[(bh * r.L + i) * r.D + d] += ds * k.reals[(r.kv(bh) * r.S + j) * r.D + d];
          dk.reals[(r.kv(bh) * r.S + j) * r.D + d] += ds * q.reals[(bh * r.L + i) * r.D + d];
        }
      }
    }
  return ref::Outs{dq, dk, dv};
});

// --- tiny graphs in the exporter's shapes: Q, K, V (B, 2, T, 4) --------------------------------
struct Opts {
  bool causal = false;        // the exporter's is_causal mask (Trilu/Equal/Where) added to the scores
  bool mask = false;          // Where(keep (B, 1, 1, T) bool input, 0, -big) added to the scores
  bool float_mask = false;    // the mask is a float graph input instead (a gradient could reach it)
  bool nan_guard = false;     // Where(IsNaN(P), 0, P) after Softmax
  bool reshape_kt = false;    // Kᵀ as Reshape/Transpose/Reshape (the exporter) instead of Transpose
  bool div_scale = false;     // (Q·Kᵀ) / 2 instead of the exporter's Q·√s and Kᵀ·√s
  int64_t softmax_axis = -1;
  double dropout = -1;        // >= 0: a training-mode Dropout of this ratio after Softmax
  bool ratio_input = false;   // ... whose ratio is a graph input (known only at run time)
  bool training_input = false;  // ... whose training_mode is a graph input
  bool leak_probs = false;    // P is also a graph output
  bool dynamic_head = false;  // the head size D is a symbol: the scale 1/√D is not a constant
  // K and V inputs of one head, repeated to Q's two: 1 head by head as Hugging Face's repeat_kv
  // (Unsqueeze at 2, a Slice keeping all, Expand, Identity, Reshape); 2 tiled (Unsqueeze at 1).
  int grouped = 0;
};

struct Built {
  Graph g;
  ValueId q, k, v, y;
};

Built attention_graph(const Opts& o) {
  Built b;
  Graph& g = b.g;
  const Dim B = Dim::symbolic("B"), T = Dim::symbolic("T"), H = Dim::known(2);
  const Dim D = o.dynamic_head ? Dim::symbolic("D") : Dim::known(4);
  auto val = [&](const std::string& name, std::vector<Dim> dims, DType t = DType::kFloat) {
    return g.add_value(name, t, Shape::of(std::move(dims)));
  };
  auto fconst = [&](const std::string& name, double x) {
    ValueId c = val(name, {});
    g.initializers[c] = TensorData::scalar_float(DType::kFloat, x);
    return c;
  };
  auto iconst = [&](const std::string& name, std::vector<int64_t> x) {
    ValueId c = g.add_value(name, DType::kInt64, Shape::of({Dim::known(static_cast<int64_t>(x.size()))}));
    g.initializers[c] = TensorData::from_int64s(x);
    return c;
  };
  b.q = val("q", {B, H, T, D});
  b.k = val("k", {B, H, T, D});
  b.v = val("v", {B, H, T, D});
  g.inputs = {b.q, b.k, b.v};
  if (o.grouped) {
    const Dim one = Dim::known(1);
    for (ValueId* kv : {&b.k, &b.v}) {
      const std::string name = g.value(*kv).name;
      const ValueId x = val(name + "_heads", {B, one, T, D});
      g.inputs[kv == &b.k ? 1 : 2] = x;
      const bool tiled = o.grouped == 2;
      const ValueId u = val(name + "_unsq", {B, one, one, T, D});
      const ValueId kept = val(name + "_kept", {B, one, one, T, D});
      const ValueId e = val(name + "_exp", tiled ? std::vector<Dim>{B, H, one, T, D} : std::vector<Dim>{B, one, H, T, D});
      const ValueId c = val(name + "_clone", g.value(e).shape.dims);
      add_node(g, "Unsqueeze", {x, iconst(name + "_axes", {tiled ? 1 : 2})}, {u}, "/" + name + "_unsq");
      add_node(g, "Slice", {u, iconst(name + "_s0", {0}), iconst(name + "_s1", {INT64_MAX}), iconst(name + "_sa", {2}),
                            iconst(name + "_st", {1})}, {kept}, "/" + name + "_slice");
      ValueId shape5 = g.add_value(name + "_shape5", DType::kInt64, Shape::of({Dim::known(5)}));
      ValueId shape_x = g.add_value(name + "_shape_x", DType::kInt64, Shape::of({Dim::known(4)}));
      add_node(g, "Shape", {x}, {shape_x}, "/" + name + "_shape_x");
      std::vector<ValueId> parts;
      for (int i = 0; i < 5; ++i) {
        parts.push_back(g.add_value(name + "_d" + std::to_string(i), DType::kInt64, Shape::of({Dim::known(1)})));
        const bool repeat_axis = i == (tiled ? 1 : 2);
        if (repeat_axis) {
          g.initializers[parts.back()] = TensorData::from_int64s({2});
        } else {
          const int64_t src = i < (tiled ? 1 : 2) ? i : i - 1;
          add_node(g, "Gather", {shape_x, iconst(name + "_at" + std::to_string(i), {src})}, {parts.back()},
                   "/" + name + "_d" + std::to_string(i));
        }
      }
      add_node(g, "Concat", parts, {shape5}, "/" + name + "_shape5").attrs.set("axis", int64_t{0});
      add_node(g, "Expand", {kept, shape5}, {e}, "/" + name + "_expand");
      add_node(g, "Identity", {e}, {c}, "/" + name + "_clone");
      add_node(g, "Reshape", {c, iconst(name + "_shape4", {0, 2, -1, 4})}, {*kv}, "/" + name + "_merge");
    }
  }
  // the exporter's scale: √(1/√(Shape(q)[-1])) on each of Q and Kᵀ
  ValueId shape_q = g.add_value("shape_q", DType::kInt64, Shape::of({Dim::known(4)}));
  add_node(g, "Shape", {b.q}, {shape_q}, "/shape_q");
  ValueId d = g.add_value("d", DType::kInt64, Shape::of({Dim::known(1)}));
  add_node(g, "Gather", {shape_q, iconst("minus1", {-1})}, {d}, "/gather_d");
  ValueId df = val("d_f", {Dim::known(1)}), sq = val("sqrt_d", {Dim::known(1)}), inv = val("inv", {Dim::known(1)});
  add_node(g, "CastLike", {d, b.q}, {df}, "/castlike");
  add_node(g, "Sqrt", {df}, {sq}, "/sqrt_d");
  add_node(g, "Div", {fconst("one", 1.0), sq}, {inv}, "/div_inv");
  ValueId root = val("root", {Dim::known(1)});
  add_node(g, "Sqrt", {inv}, {root}, "/sqrt_scale");

  // shape vectors from Shape(k), as the exporter builds them ((-1, S, D), (B, H, D, S), (L, S))
  ValueId shape_k = g.add_value("shape_k4", DType::kInt64, Shape::of({Dim::known(4)}));
  add_node(g, "Shape", {b.k}, {shape_k}, "/shape_k4");
  auto target = [&](const std::string& name, std::vector<int64_t> picks) {
    std::vector<ValueId> parts;
    for (int64_t i : picks) {
      const std::string part = name + std::to_string(parts.size());
      parts.push_back(g.add_value(part, DType::kInt64, Shape::of({Dim::known(1)})));
      if (i < 0)
        g.initializers[parts.back()] = TensorData::from_int64s({-1});
      else
        add_node(g, "Gather", {shape_k, iconst(part + "_at", {i})}, {parts.back()}, "/" + part);
    }
    ValueId t = g.add_value(name, DType::kInt64, Shape::of({Dim::known(static_cast<int64_t>(picks.size()))}));
    add_node(g, "Concat", parts, {t}, "/" + name).attrs.set("axis", int64_t{0});
    return t;
  };
  ValueId kt = val("kt", {B, H, D, T});
  if (o.reshape_kt) {
    const Dim BH = Dim::symbolic("2*B");
    ValueId flat = val("k_flat", {BH, T, D}), flat_t = val("k_flat_t", {BH, D, T});
    add_node(g, "Reshape", {b.k, target("flat_shape", {-1, 2, 3})}, {flat}, "/k_flat");
    add_node(g, "Transpose", {flat}, {flat_t}, "/k_swap").attrs.set("perm", std::vector<int64_t>{0, 2, 1});
    add_node(g, "Reshape", {flat_t, target("kt_shape", {0, 1, 3, 2})}, {kt}, "/k_back");
  } else {
    add_node(g, "Transpose", {b.k}, {kt}, "/kt").attrs.set("perm", std::vector<int64_t>{0, 1, 3, 2});
  }
  ValueId scores = val("scores", {B, H, T, T});
  if (o.div_scale) {
    ValueId raw = val("raw", {B, H, T, T});
    add_node(g, "MatMul", {b.q, kt}, {raw}, "/qk");
    add_node(g, "Div", {raw, fconst("two", 2.0)}, {scores}, "/div_scores");
  } else {
    ValueId qs = val("q_scaled", {B, H, T, D}), kts = val("kt_scaled", {B, H, D, T});
    add_node(g, "Mul", {b.q, root}, {qs}, "/q_scale");
    add_node(g, "Mul", {kt, root}, {kts}, "/kt_scale");
    add_node(g, "MatMul", {qs, kts}, {scores}, "/qk");
  }
  ValueId x = scores;
  auto add_mask = [&](ValueId m, const std::string& name) {
    ValueId sum = val(name, {B, H, T, T});
    add_node(g, "Add", {x, m}, {sum}, "/" + name);
    x = sum;
  };
  if (o.causal) {
    const ValueId tt = target("tt", {2, 2});  // (L, S) = (T, T)
    ValueId ones = val("ones", {T, T}), tri = val("tri", {T, T}), zero_at = val("zero_at", {T, T}, DType::kBool);
    ValueId causal = val("causal_mask", {T, T});
    add_node(g, "Expand", {fconst("c1", 1.0), tt}, {ones}, "/ones");
    add_node(g, "Trilu", {ones}, {tri}, "/tril").attrs.set("upper", int64_t{0});
    add_node(g, "Equal", {tri, fconst("c0", 0.0)}, {zero_at}, "/eq");
    add_node(g, "Where", {zero_at, fconst("big", -3.4028234663852886e38), fconst("z", 0.0)}, {causal}, "/where_causal");
    add_mask(causal, "with_causal");
  }
  if (o.mask) {
    ValueId keep = val("keep", {B, Dim::known(1), Dim::known(1), T}, DType::kBool);
    g.inputs.push_back(keep);
    ValueId m = val("pad_mask", {B, Dim::known(1), Dim::known(1), T});
    add_node(g, "Where", {keep, fconst("mz", 0.0), fconst("mbig", -3.4028234663852886e38)}, {m}, "/where_pad");
    add_mask(m, "with_mask");
  }
  if (o.float_mask) {
    ValueId m = val("bias", {T, T});
    g.inputs.push_back(m);
    add_mask(m, "with_bias");
  }
  ValueId p = val("probs", {B, H, T, T});
  add_node(g, "Softmax", {x}, {p}, "/softmax").attrs.set("axis", o.softmax_axis);
  if (o.nan_guard) {
    ValueId nan = val("isnan", {B, H, T, T}, DType::kBool), guarded = val("guarded", {B, H, T, T});
    add_node(g, "IsNaN", {p}, {nan}, "/isnan");
    add_node(g, "Where", {nan, fconst("gz", 0.0), p}, {guarded}, "/guard");
    p = guarded;
  }
  if (o.dropout >= 0) {
    ValueId dropped = val("dropped", {B, H, T, T});
    ValueId training = g.add_value("training", DType::kBool, Shape::of({}));
    if (o.training_input)
      g.inputs.push_back(training);
    else
      g.initializers[training] = TensorData{DType::kBool, {}, std::string(1, '\1')};
    ValueId ratio = o.ratio_input ? val("ratio", {}) : fconst("ratio", o.dropout);
    if (o.ratio_input) g.inputs.push_back(ratio);
    add_node(g, "Dropout", {p, ratio, training}, {dropped}, "/dropout");
    p = dropped;
  }
  b.y = val("y", {B, H, T, D});
  add_node(g, "MatMul", {p, b.v}, {b.y}, "/pv");
  g.outputs = {b.y};
  if (o.leak_probs) g.outputs.push_back(p);
  verify(g);
  return b;
}

// Runs attention_fusion then dce (as the pipeline does), verifying after each.
bool fuse(Graph& g) {
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(make_attention_fusion_pass());
  passes.push_back(make_dce_pass());
  PipelineOptions po;
  po.verify_after_each = true;
  const std::vector<std::string> changed = run_pipeline(g, passes, po);
  return std::find(changed.begin(), changed.end(), "attention_fusion") != changed.end();
}

std::vector<const Node*> ops(const Graph& g, const std::string& op) {
  std::vector<const Node*> r;
  for (const Node& n : g.nodes)
    if (n.op_type == op) r.push_back(&n);
  return r;
}

// Y of the graph on fixed random inputs (B = 2, T = 3), through the reference evaluator.
std::vector<double> run_ref(const Built& b) {
  std::map<ValueId, ref::Tensor> feeds;
  uint64_t state = 42;
  auto rnd = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(state >> 11) / static_cast<double>(1ULL << 53) * 2.0 - 1.0;
  };
  for (ValueId in : b.g.inputs) {
    const Value& v = b.g.value(in);
    ref::Dims dims;
    for (const Dim& d : v.shape.dims) dims.push_back(d.is_known() ? d.value : (d.symbol == "B" ? 2 : 3));
    ref::Tensor t = ref::zeros(v.dtype, dims);
    for (int64_t i = 0; i < t.numel(); ++i)
      ref::set(t, i, v.dtype == DType::kBool ? (i % 3 != 2) : rnd());  // keep every 3rd key masked
    feeds[in] = t;
  }
  return ref::evaluate(b.g, feeds).at(b.y).reals;
}

void expect_same_numbers(const Built& before, const Built& after) {
  const std::vector<double> want = run_ref(before), got = run_ref(after);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "element " << i;
}

TEST(AttentionFusion, CausalSdpaExportBecomesOneCausalAttention) {
  const Built before = attention_graph({.causal = true, .reshape_kt = true});
  Built b = attention_graph({.causal = true, .reshape_kt = true});
  EXPECT_EQ(make_attention_fusion_pass()->name(), "attention_fusion");
  ASSERT_TRUE(fuse(b.g));
  const auto att = ops(b.g, "Attention");
  ASSERT_EQ(att.size(), 1u);
  EXPECT_EQ(att[0]->domain, kOurDomain);
  EXPECT_EQ(att[0]->inputs, (std::vector<ValueId>{b.q, b.k, b.v}));  // the causal mask is an attribute
  EXPECT_EQ(att[0]->outputs[0], b.y);                                 // readers of Y are untouched
  EXPECT_EQ(att[0]->attrs.get_int("causal", 0), 1);
  EXPECT_FLOAT_EQ(att[0]->attrs.get_float("scale", 0), 0.5f);         // 1/√4 from Shape(q)[-1]
  ASSERT_EQ(att[0]->outputs.size(), 3u);
  EXPECT_EQ(b.g.value(att[0]->outputs[1]).shape.to_string(), "[B,2,T]");  // LogSumExp (B, H, L)
  EXPECT_EQ(b.g.value(att[0]->outputs[2]).shape.to_string(), "[]");       // Backend, a scalar
  EXPECT_EQ(b.g.value(att[0]->outputs[2]).dtype, DType::kInt64);
  for (const char* gone : {"Softmax", "MatMul", "Trilu", "Where", "Transpose", "Reshape", "Mul", "Sqrt"})
    EXPECT_TRUE(ops(b.g, gone).empty()) << gone << " left behind";
  expect_same_numbers(before, b);
}

TEST(AttentionFusion, PaddingMaskWithNanGuardBecomesAttentionWithMask) {
  const Opts o{.mask = true, .nan_guard = true};
  const Built before = attention_graph(o);
  Built b = attention_graph(o);
  ASSERT_TRUE(fuse(b.g));
  const auto att = ops(b.g, "Attention");
  ASSERT_EQ(att.size(), 1u);
  ASSERT_EQ(att[0]->inputs.size(), 4u);
  EXPECT_EQ(b.g.value(att[0]->inputs[3]).name, "pad_mask");
  EXPECT_EQ(att[0]->attrs.get_int("causal", 1), 0);
  EXPECT_TRUE(ops(b.g, "IsNaN").empty());
  EXPECT_EQ(ops(b.g, "Where").size(), 1u);  // the mask's own Where stays
  expect_same_numbers(before, b);
}

TEST(AttentionFusion, HandWrittenTransposeDivAndZeroDropout) {
  const Opts o{.mask = true, .div_scale = true, .dropout = 0.0};
  const Built before = attention_graph(o);
  Built b = attention_graph(o);
  ASSERT_TRUE(fuse(b.g));
  const auto att = ops(b.g, "Attention");
  ASSERT_EQ(att.size(), 1u);
  EXPECT_FLOAT_EQ(att[0]->attrs.get_float("scale", 0), 0.5f);  // ÷ 2
  EXPECT_TRUE(ops(b.g, "Dropout").empty());
  EXPECT_FALSE(att[0]->attrs.has("dropout"));  // ratio 0: the identity, nothing to draw
  EXPECT_EQ(att[0]->outputs.size(), 3u);
  expect_same_numbers(before, b);
}

// Training-mode dropout (HF's attention dropout 0.1): the kernel draws it. Attention carries the
// rate and two more outputs, the random state, which its gradient reads to replay the mask.
TEST(AttentionFusion, TrainingDropoutBecomesAttentionWithDropout) {
  Built b = attention_graph({.causal = true, .nan_guard = true, .reshape_kt = true, .dropout = 0.1});
  ASSERT_TRUE(fuse(b.g));
  const auto att = ops(b.g, "Attention");
  ASSERT_EQ(att.size(), 1u);
  EXPECT_FLOAT_EQ(att[0]->attrs.get_float("dropout", 0), 0.1f);
  EXPECT_EQ(att[0]->attrs.get_int("causal", 0), 1);
  EXPECT_EQ(att[0]->outputs[0], b.y);
  ASSERT_EQ(att[0]->outputs.size(), 5u);
  for (int i : {3, 4}) EXPECT_EQ(b.g.value(att[0]->outputs[i]).dtype, DType::kInt64);
  for (const char* gone : {"Softmax", "Dropout", "IsNaN", "Where", "Trilu"})
    EXPECT_TRUE(ops(b.g, gone).empty()) << gone << " left behind";
  EXPECT_TRUE(is_random(*att[0]));
  EXPECT_FALSE(is_recomputable(*att[0]));

  TrainingGraph tg = build_training_graph(b.g, {true, true, true});
  verify(as_exportable_graph(tg));
  const auto grads = ops(tg.graph, "AttentionGrad");
  ASSERT_EQ(grads.size(), 1u);
  const Node& fwd = *ops(tg.graph, "Attention")[0];
  ASSERT_EQ(grads[0]->inputs.size(), 11u);
  EXPECT_EQ(grads[0]->inputs[8], fwd.outputs[2]);   // Backend
  EXPECT_EQ(grads[0]->inputs[9], fwd.outputs[3]);   // the random state: the same draw
  EXPECT_EQ(grads[0]->inputs[10], fwd.outputs[4]);
  EXPECT_FLOAT_EQ(grads[0]->attrs.get_float("dropout", 0), 0.1f);
  EXPECT_TRUE(ops(tg.graph, "DropoutGrad").empty());
}

// A Dropout that drops with no ratio input takes ONNX's default 0.5.
TEST(AttentionFusion, DropoutWithoutRatioTakesTheDefault) {
  Built b = attention_graph({.causal = true, .dropout = 0.1});
  for (Node& n : b.g.nodes)
    if (n.op_type == "Dropout") n.inputs[1] = kNoValue;
  ASSERT_TRUE(fuse(b.g));
  const auto att = ops(b.g, "Attention");
  ASSERT_EQ(att.size(), 1u);
  EXPECT_FLOAT_EQ(att[0]->attrs.get_float("dropout", 0), 0.5f);
}

TEST(AttentionFusion, DynamicHeadSizeKeepsSdpaDefaultScale) {
  const Opts o{.causal = true, .reshape_kt = true, .dynamic_head = true};
  const Built before = attention_graph(o);
  Built b = attention_graph(o);
  ASSERT_TRUE(fuse(b.g));
  const auto att = ops(b.g, "Attention");
  ASSERT_EQ(att.size(), 1u);
  EXPECT_FALSE(att[0]->attrs.has("scale"));  // the kernel takes 1/√D from Q at run time
  EXPECT_TRUE(ops(b.g, "Sqrt").empty());
  expect_same_numbers(before, b);  // D = 3 in the evaluation
}

// Hugging Face's repeat_kv of grouped K and V: Attention reads the unrepeated K and V (the kernel
// runs grouped heads), and the repeats go.
TEST(AttentionFusion, RepeatedKeysAndValuesReachAttentionUnrepeated) {
  const Opts o{.causal = true, .reshape_kt = true, .grouped = 1};
  const Built before = attention_graph(o);
  Built b = attention_graph(o);
  ASSERT_TRUE(fuse(b.g));
  const auto att = ops(b.g, "Attention");
  ASSERT_EQ(att.size(), 1u);
  EXPECT_EQ(att[0]->inputs, (std::vector<ValueId>{b.q, *b.g.find("k_heads"), *b.g.find("v_heads")}));
  for (const char* gone : {"Unsqueeze", "Slice", "Expand", "Identity", "Reshape"})
    EXPECT_TRUE(ops(b.g, gone).empty()) << gone << " left behind";
  expect_same_numbers(before, b);

  TrainingGraph tg = build_training_graph(b.g, {true, true, true});
  verify(as_exportable_graph(tg));
  const auto grads = ops(tg.graph, "AttentionGrad");
  ASSERT_EQ(grads.size(), 1u);
  EXPECT_EQ(tg.graph.value(grads[0]->outputs[1]).shape.to_string(), "[B,1,T,4]");  // dK like K: one head
}

// Repeats of another order (tiled: Unsqueeze at 1) are not the kernel's grouping: they stay.
TEST(AttentionFusion, TiledRepeatOfKeysAndValuesStays) {
  const Opts o{.causal = true, .grouped = 2};
  const Built before = attention_graph(o);
  Built b = attention_graph(o);
  ASSERT_TRUE(fuse(b.g));
  const auto att = ops(b.g, "Attention");
  ASSERT_EQ(att.size(), 1u);
  EXPECT_EQ(att[0]->inputs, (std::vector<ValueId>{b.q, b.k, b.v}));
  EXPECT_EQ(ops(b.g, "Expand").size(), 2u);
  expect_same_numbers(before, b);
}

TEST(AttentionFusion, DoesNotFireWhenAConditionFails) {
  const std::vector<std::pair<const char*, Opts>> cases = {
      {"softmax over another axis", {.causal = true, .softmax_axis = 2}},
      {"probabilities read elsewhere", {.causal = true, .leak_probs = true}},
      {"mask a gradient can reach", {.float_mask = true}},
      {"dropout ratio known only at run time", {.causal = true, .dropout = 0.1, .ratio_input = true}},
      {"dropout training flag known only at run time", {.causal = true, .dropout = 0.1, .training_input = true}},
      {"dropout of ratio 1", {.causal = true, .dropout = 1.0}},
  };
  for (const auto& [why, o] : cases) {
    Built b = attention_graph(o);
    const size_t n = b.g.nodes.size();
    EXPECT_FALSE(fuse(b.g)) << why;
    EXPECT_TRUE(ops(b.g, "Attention").empty()) << why;
    EXPECT_EQ(ops(b.g, "Softmax").size(), 1u) << why;
    EXPECT_LE(b.g.nodes.size(), n) << why;
  }
}

TEST(AttentionFusion, ScoresReadByAnotherNodeKeepTheGraph) {
  Built b = attention_graph({.causal = true});
  ValueId scores = *b.g.find("scores");
  ValueId extra = b.g.add_value("extra", DType::kFloat, Shape::unknown());
  add_node(b.g, "Relu", {scores}, {extra}, "/other_reader");
  b.g.outputs.push_back(extra);
  EXPECT_FALSE(fuse(b.g));
  EXPECT_EQ(ops(b.g, "Softmax").size(), 1u);
}

}  // namespace

// Numeric gradient cases: Attention's rule emits AttentionGrad, checked against finite
// differences of the forward (mask without gradient; causal; cross-attention L != S).
namespace gradcheck {
namespace {

ValueId attention(Graph& g, std::vector<ValueId> ins, Attributes a) {
  ValueId y = g.new_value("attn_y", DType::kUndefined, Shape::unknown());
  ValueId lse = g.new_value("attn_lse", DType::kUndefined, Shape::unknown());
  g.nodes.push_back(Node{kOurDomain, "Attention", g.unique_node_name("/attn"), std::move(ins), {y, lse}, std::move(a)});
  return y;
}

std::vector<Case> attention_cases() {
  std::vector<Case> c;
  c.push_back({"Attention_cross_with_mask", "com.torch_ort::Attention",
               {G({1, 2, 3, 4}), G({1, 2, 5, 4}), G({1, 2, 5, 3}), N({3, 5})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) {
                 return std::vector<ValueId>{attention(g, in, A({{"scale", 0.5f}, {"causal", I{0}}}))};
               }});
  c.push_back({"Attention_causal", "com.torch_ort::Attention", {G({2, 1, 4, 2}), G({2, 1, 4, 2}), G({2, 1, 4, 2})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) {
                 return std::vector<ValueId>{attention(g, in, A({{"scale", 0.7f}, {"causal", I{1}}}))};
               }});
  c.push_back({"Attention_grouped_heads", "com.torch_ort::Attention",
               {G({1, 4, 3, 2}), G({1, 2, 3, 2}), G({1, 2, 3, 3})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) {
                 return std::vector<ValueId>{attention(g, in, A({{"scale", 0.6f}, {"causal", I{1}}}))};
               }});
  c.push_back({"Attention_value_grad_only", "com.torch_ort::Attention",
               {N({1, 1, 3, 2}), N({1, 1, 3, 2}), G({1, 1, 3, 2})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) {
                 return std::vector<ValueId>{attention(g, in, A({{"scale", 1.0f}}))};
               }});
  return c;
}
REGISTER_GRAD_CASES(attention_cases());

}  // namespace
}  // namespace gradcheck
}  // namespace torch_ort
