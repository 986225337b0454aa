// Reference evaluator, NN family: LayerNormalization, Gelu, Erf, our Embedding and CrossEntropyLoss
// and their gradient ops, as plain loops in double precision (the oracle of the numeric checks).
#include <cmath>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>

#include "tests/cpp/reference_eval.h"

namespace torch_ort::ref {
namespace {

const Tensor& at(const Node& n, const Ins& in, size_t i) {
  if (i >= in.size() || !in[i]) fail(n, "input " + std::to_string(i) + " is missing");
  return *in[i];
}
const Tensor* opt(const Ins& in, size_t i) { return i < in.size() ? in[i] : nullptr; }
Tensor like(const Tensor& x) { return zeros(x.dtype, x.shape); }

// --- LayerNormalization: rows = dims before axis, n = elements per row.
struct Rows {
  int64_t rows, n;
  Dims stat_shape;  // X's shape with the normalised dims set to 1
};
Rows ln_rows(const Node& n, const Tensor& x) {
  const int64_t r = int64_t(x.shape.size());
  int64_t axis = n.attrs.get_int("axis", -1);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r) fail(n, "axis out of range");
  Rows R{prod(x.shape, 0, axis), prod(x.shape, axis, r), x.shape};
  for (int64_t d = axis; d < r; ++d) R.stat_shape[d] = 1;
  return R;
}
// Per row: mean, 1/sqrt(var + eps), and xhat = (x − mean)·invstd.
void ln_stats(const Node& n, const Tensor& x, const Rows& R, Tensor& mean, Tensor& inv, Tensor& xhat) {
  const double eps = n.attrs.get_float("epsilon", 1e-5f);
  mean = zeros(x.dtype, R.stat_shape);
  inv = mean;
  xhat = like(x);
  for (int64_t i = 0; i < R.rows; ++i) {
    const double* v = &x.reals[i * R.n];
    double m = 0, var = 0;
    for (int64_t j = 0; j < R.n; ++j) m += v[j] / double(R.n);
    for (int64_t j = 0; j < R.n; ++j) var += (v[j] - m) * (v[j] - m) / double(R.n);
    mean.reals[i] = m;
    inv.reals[i] = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < R.n; ++j) xhat.reals[i * R.n + j] = (v[j] - m) * inv.reals[i];
  }
}
double param(const Tensor* p, int64_t j, double dflt) { return p ? p->reals.at(j) : dflt; }

Outs layer_norm(const Node& n, const Ins& in) {
  const Tensor& x = at(n, in, 0);
  Rows R = ln_rows(n, x);
  Tensor mean, inv, y;
  ln_stats(n, x, R, mean, inv, y);
  for (int64_t k = 0; k < x.numel(); ++k) y.reals[k] = y.reals[k] * param(opt(in, 1), k % R.n, 1) + param(opt(in, 2), k % R.n, 0);
  return {y, mean, inv};
}

// The gradient ops read the forward's statistics (inputs 3, 4), as the kernels do.
Tensor xhat_from_inputs(const Node& n, const Ins& in, const Rows& R) {
  const Tensor &x = at(n, in, 1), &mean = at(n, in, 3), &inv = at(n, in, 4);
  if (mean.numel() != R.rows || inv.numel() != R.rows) fail(n, "Mean/InvStdDev do not have one value per row");
  Tensor xhat = like(x);
  for (int64_t k = 0; k < x.numel(); ++k) xhat.reals[k] = (x.reals[k] - mean.reals[k / R.n]) * inv.reals[k / R.n];
  return xhat;
}

// (dY, X, Scale, Mean, InvStdDev) -> dX = invstd·(g − mean(g) − xhat·mean(g·xhat)), g = dY·Scale
Outs layer_norm_grad(const Node& n, const Ins& in) {
  const Tensor &dy = at(n, in, 0), &x = at(n, in, 1), &inv = at(n, in, 4);
  Rows R = ln_rows(n, x);
  Tensor xhat = xhat_from_inputs(n, in, R), dx = like(x);
  for (int64_t i = 0; i < R.rows; ++i) {
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < R.n; ++j) {
      const double g = dy.reals[i * R.n + j] * param(opt(in, 2), j, 1);
      mg += g / double(R.n);
      mgx += g * xhat.reals[i * R.n + j] / double(R.n);
    }
    for (int64_t j = 0; j < R.n; ++j) {
      const int64_t k = i * R.n + j;
      dx.reals[k] = inv.reals[i] * (dy.reals[k] * param(opt(in, 2), j, 1) - mg - xhat.reals[k] * mgx);
    }
  }
  return {dx};
}

// -> dScale = Σ_rows dY · xhat, shaped like Scale
Outs layer_norm_scale_grad(const Node& n, const Ins& in) {
  const Tensor &dy = at(n, in, 0), &x = at(n, in, 1);
  Rows R = ln_rows(n, x);
  Tensor xhat = xhat_from_inputs(n, in, R), ds = like(at(n, in, 2));
  for (int64_t k = 0; k < x.numel(); ++k) ds.reals[k % R.n] += dy.reals[k] * xhat.reals[k];
  return {ds};
}

// --- Gelu / Erf
constexpr double kSqrt2OverPi = 0.7978845608028654, kC = 0.044715;
bool tanh_form(const Node& n) { return n.attrs.get_string("approximate", "none") == "tanh"; }
double gelu(double x, bool t) {
  return t ? 0.5 * x * (1 + std::tanh(kSqrt2OverPi * (x + kC * x * x * x))) : 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
double gelu_d(double x, bool t) {
  if (!t) return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
  const double th = std::tanh(kSqrt2OverPi * (x + kC * x * x * x));
  return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * kSqrt2OverPi * (1 + 3 * kC * x * x);
}
Outs map1(const Node& n, const Ins& in, const std::function<double(double)>& f) {
  Tensor y = at(n, in, 0);
  apply(y, f);
  return {y};
}
Outs map2(const Node& n, const Ins& in, const std::function<double(double, double)>& f) {  // (dY, X)
  Tensor dx = at(n, in, 0);
  const Tensor& x = at(n, in, 1);
  for (size_t k = 0; k < dx.reals.size(); ++k) dx.reals[k] = f(dx.reals[k], x.reals.at(k));
  return {dx};
}

// --- Embedding: out[i, :] = W[idx[i], :]; dW[idx[i], :] += dY[i, :] (not at padding_idx;
// divided by the index's count with scale_grad_by_freq).
Outs embedding(const Node& n, const Ins& in) {
  const Tensor &w = at(n, in, 0), &idx = at(n, in, 1);
  const int64_t V = w.shape.at(0), D = w.shape.at(1);
  Dims shape = idx.shape;
  shape.push_back(D);
  Tensor out{w.dtype, shape, {}, {}};
  for (int64_t r : ints_of(n, idx)) {
    if (r < 0 || r >= V) fail(n, "index " + std::to_string(r) + " out of range");
    for (int64_t d = 0; d < D; ++d) out.reals.push_back(w.reals[r * D + d]);
  }
  return {out};
}
Outs embedding_grad(const Node& n, const Ins& in) {
  const Tensor &dy = at(n, in, 0), &idx = at(n, in, 1), &shape = at(n, in, 2);
  const int64_t V = ints_of(n, shape).at(0), D = ints_of(n, shape).at(1);
  const int64_t pad = n.attrs.get_int("padding_idx", -1);
  const bool freq = n.attrs.get_int("scale_grad_by_freq", 0) != 0;
  std::vector<double> count(V, 0);
  const Dims& rows = ints_of(n, idx);
  for (int64_t r : rows) count.at(r) += 1;
  Tensor dw = in.size() > 3 && in[3] ? *in[3] : zeros(dy.dtype, {V, D});  // the accumulator
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = rows[i];
    if (r == pad) continue;
    for (int64_t d = 0; d < D; ++d) dw.reals[r * D + d] += dy.reals[int64_t(i) * D + d] / (freq ? count[r] : 1.0);
  }
  return {dw};
}

// --- CrossEntropyLoss with label smoothing ε; scores (N, C, d...), samples s = (n, d).
struct Ce {
  int64_t C, D;
  std::vector<int64_t> t;   // label per sample
  std::vector<bool> valid;  // not ignored
  double denom = 0;         // "mean": Σ w_t over valid samples
  std::string red;
  double eps;
};
Ce ce_setup(const Node& n, const Tensor& x, const Tensor& lab, const Tensor* w) {
  Ce c{x.shape.at(1), prod(x.shape, 2, x.shape.size()), {}, {}, 0, n.attrs.get_string("reduction", "mean"),
       n.attrs.get_float("label_smoothing", 0.0f)};
  const bool has_ignore = n.attrs.has("ignore_index");
  const int64_t ignore = n.attrs.get_int("ignore_index", 0);
  for (int64_t t : ints_of(n, lab)) {
    c.t.push_back(t);
    c.valid.push_back(!(has_ignore && c.t.back() == ignore));
    if (c.valid.back() && (c.t.back() < 0 || c.t.back() >= c.C)) fail(n, "label out of range");
    if (c.valid.back()) c.denom += w ? w->reals[c.t.back()] : 1.0;
  }
  return c;
}
double lp_at(const Tensor& x, const Ce& c, size_t s, int64_t k) {  // log_softmax over classes
  const int64_t nn = int64_t(s) / c.D, d = int64_t(s) % c.D;
  double m = -INFINITY, z = 0;
  for (int64_t j = 0; j < c.C; ++j) m = std::max(m, x.reals[(nn * c.C + j) * c.D + d]);
  for (int64_t j = 0; j < c.C; ++j) z += std::exp(x.reals[(nn * c.C + j) * c.D + d] - m);
  return x.reals[(nn * c.C + k) * c.D + d] - m - std::log(z);
}

Outs cross_entropy(const Node& n, const Ins& in) {
  const Tensor &x = at(n, in, 0), &lab = at(n, in, 1);
  const Tensor* w = opt(in, 2);
  Ce c = ce_setup(n, x, lab, w);
  Tensor loss = zeros(x.dtype, lab.shape), lp = like(x);
  for (size_t s = 0; s < c.t.size(); ++s) {
    for (int64_t k = 0; k < c.C; ++k) lp.reals[(int64_t(s) / c.D * c.C + k) * c.D + int64_t(s) % c.D] = lp_at(x, c, s, k);
    if (!c.valid[s]) continue;
    double smooth = 0;
    for (int64_t k = 0; k < c.C; ++k) smooth -= param(w, k, 1) * lp_at(x, c, s, k);
    loss.reals[s] = -(1 - c.eps) * param(w, c.t[s], 1) * lp_at(x, c, s, c.t[s]) + c.eps / double(c.C) * smooth;
  }
  if (c.red == "none") return {loss, lp};
  const double sum = std::accumulate(loss.reals.begin(), loss.reals.end(), 0.0);
  return {Tensor::of_reals(x.dtype, {}, {c.red == "sum" ? sum : sum / c.denom}), lp};
}

// (dLoss, log_prob, labels, [weights]) -> dScores = G_s·(a_s·softmax − target_s), with
// target_s[k] = (1 − ε)·w_t·[k == t] + ε/C·w_k and a_s = Σ_k target_s[k].
Outs cross_entropy_grad(const Node& n, const Ins& in) {
  const Tensor &dl = at(n, in, 0), &lp = at(n, in, 1), &lab = at(n, in, 2);
  const Tensor* w = opt(in, 3);
  Ce c = ce_setup(n, lp, lab, w);
  Tensor dx = like(lp);
  for (size_t s = 0; s < c.t.size(); ++s) {
    if (!c.valid[s]) continue;
    const double G = c.red == "none" ? dl.reals.at(s) : dl.reals.at(0) / (c.red == "mean" ? c.denom : 1.0);
    std::vector<double> target(c.C);
    double a = 0;
    for (int64_t k = 0; k < c.C; ++k) {
      target[k] = (k == c.t[s] ? (1 - c.eps) * param(w, k, 1) : 0.0) + c.eps / double(c.C) * param(w, k, 1);
      a += target[k];
    }
    for (int64_t k = 0; k < c.C; ++k) {
      const int64_t o = (int64_t(s) / c.D * c.C + k) * c.D + int64_t(s) % c.D;
      dx.reals[o] = G * (a * std::exp(lp.reals[o]) - target[k]);
    }
  }
  return {dx};
}

const bool kRegistered = [] {
  register_op("", "LayerNormalization", layer_norm);
  register_op(kOurDomain, "LayerNormalizationGrad", layer_norm_grad);
  register_op(kOurDomain, "LayerNormalizationScaleGrad", layer_norm_scale_grad);
  register_op("", "Gelu", [](const Node& n, const Ins& in) { return map1(n, in, [t = tanh_form(n)](double x) { return gelu(x, t); }); });
  register_op(kOurDomain, "GeluGrad", [](const Node& n, const Ins& in) {
    return map2(n, in, [t = tanh_form(n)](double dy, double x) { return dy * gelu_d(x, t); });
  });
  register_op("", "Erf", [](const Node& n, const Ins& in) { return map1(n, in, [](double x) { return std::erf(x); }); });
  register_op(kOurDomain, "ErfGrad", [](const Node& n, const Ins& in) {
    return map2(n, in, [](double dy, double x) { return dy * 2 / std::sqrt(M_PI) * std::exp(-x * x); });
  });
  register_op(kOurDomain, "Embedding", embedding);
  register_op(kOurDomain, "EmbeddingGrad", embedding_grad);
  register_op(kOurDomain, "CrossEntropyLoss", cross_entropy);
  register_op(kOurDomain, "CrossEntropyLossGrad", cross_entropy_grad);
  return true;
}();

}  // namespace
}  // namespace torch_ort::ref
