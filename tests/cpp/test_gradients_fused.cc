// Numeric gradient cases of the fused ops of our domain (BiasGelu, FusedElementwise, SkipLayerNorm,
// BiasDropout, FusedMatMul), run by test_gradients.cc's checker, and the double-precision reference
// forward and backward ops the torch-free evaluator needs for them. Each reference is written from
// the op's formulas, not from its kernel: forward and backward are independent implementations, so
// a wrong gradient rule or a backward op that disagrees with its forward shows as a mismatch.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/cpp/grad_cases.h"
#include "tests/cpp/reference_eval.h"

namespace torch_ort {
namespace {

using ref::Dims;
using ref::Tensor;

// --- broadcasting: shapes with ref::bcast_shape, offsets by multi-index -----------------------
// Offset in a tensor of shape s of the element that broadcasts to index idx of the larger shape.
int64_t source_offset(const Dims& idx, const Dims& s) {
  int64_t off = 0;
  const size_t lead = idx.size() - s.size();
  for (size_t i = 0; i < s.size(); ++i) off = off * s[i] + (s[i] == 1 ? 0 : idx[lead + i]);
  return off;
}

// --- BiasGelu / BiasGeluGrad ------------------------------------------------------------------
// exact: gelu(u) = u·Φ(u), gelu'(u) = Φ(u) + u·φ(u);
// tanh:  gelu(u) = ½u(1 + tanh t), t = √(2/π)(u + 0.044715u³),
//        gelu'(u) = ½(1 + tanh t) + ½u(1 − tanh² t)·√(2/π)(1 + 3·0.044715u²).
constexpr double kPi = 3.14159265358979323846;
bool tanh_form(const Node& n) {
  const std::string a = n.attrs.get_string("approximate", "none");
  if (a != "none" && a != "tanh") ref::fail(n, "approximate must be 'none' or 'tanh'");
  return a == "tanh";
}
double gelu(double u, bool tanh_approx) {
  if (!tanh_approx) return 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));
  const double t = std::sqrt(2.0 / kPi) * (u + 0.044715 * u * u * u);
  return 0.5 * u * (1.0 + std::tanh(t));
}
double gelu_derivative(double u, bool tanh_approx) {
  if (!tanh_approx)
    return 0.5 * (1.0 + std::erf(u / std::sqrt(2.0))) + u * std::exp(-0.5 * u * u) / std::sqrt(2.0 * kPi);
  const double c = std::sqrt(2.0 / kPi), th = std::tanh(c * (u + 0.044715 * u * u * u));
  return 0.5 * (1.0 + th) + 0.5 * u * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * u * u);
}

// X + bias, broadcast (the bias is optional).
Tensor biased(const Node& n, const Tensor& x, const Tensor* bias) {
  if (!bias) return x;
  Tensor r = ref::zeros(x.dtype, ref::bcast_shape(n, x.shape, bias->shape));
  for (int64_t e = 0; e < r.numel(); ++e) {
    const Dims idx = ref::unravel(e, r.shape);
    r.reals[e] = x.reals[source_offset(idx, x.shape)] + bias->reals[source_offset(idx, bias->shape)];
  }
  return r;
}

const bool kRefBiasGelu = ref::register_op(kOurDomain, "BiasGelu", [](const Node& n, const ref::Ins& in) {
  Tensor u = biased(n, *in.at(0), in.size() > 1 ? in[1] : nullptr);
  const bool t = tanh_form(n);
  ref::apply(u, [t](double v) { return gelu(v, t); });
  return ref::Outs{u};
});

// (dY, X, [bias]) -> dY · gelu'(X + bias)
const bool kRefBiasGeluGrad = ref::register_op(kOurDomain, "BiasGeluGrad", [](const Node& n, const ref::Ins& in) {
  Tensor u = biased(n, *in.at(1), in.size() > 2 ? in[2] : nullptr);
  const Tensor& dy = *in.at(0);
  if (dy.shape != u.shape) ref::fail(n, "dY must have the shape of X + bias");
  const bool t = tanh_form(n);
  for (int64_t e = 0; e < u.numel(); ++e) u.reals[e] = dy.reals[e] * gelu_derivative(u.reals[e], t);
  return ref::Outs{u};
});

// --- FusedElementwise / FusedElementwiseGrad --------------------------------------------------
// The program (elementwise_chain_fusion.cc): ops[k] with operands[2k], operands[2k+1]; an operand
// o >= 0 and < n_inputs is input o, o >= n_inputs is instruction o − n_inputs's result, o < 0 is
// consts[−o − 1]; the result is the last instruction's.
struct Program {
  std::vector<std::string> ops;
  std::vector<int64_t> operands;
  std::vector<double> consts;
  int64_t n_inputs;
};
bool unary(const std::string& op) { return op != "Add" && op != "Sub" && op != "Mul" && op != "Div" && op != "Pow"; }

Program program(const Node& n, int64_t n_inputs) {
  Program p{n.attrs.get_strings("ops", {}), n.attrs.get_ints("operands", {}), {}, n_inputs};
  for (float c : n.attrs.get_floats("consts", {})) p.consts.push_back(c);
  if (p.ops.empty() || p.operands.size() != 2 * p.ops.size()) ref::fail(n, "bad program");
  for (size_t k = 0; k < p.ops.size(); ++k)
    for (int j = 0; j < (unary(p.ops[k]) ? 1 : 2); ++j) {
      const int64_t o = p.operands[2 * k + j];
      if (o >= n_inputs + int64_t(k) || (o < 0 && -o - 1 >= int64_t(p.consts.size())))
        ref::fail(n, "instruction " + std::to_string(k) + " has a bad operand");
    }
  return p;
}

double apply(const Node& n, const std::string& op, double a, double b) {
  if (op == "Add") return a + b;
  if (op == "Sub") return a - b;
  if (op == "Mul") return a * b;
  if (op == "Div") return a / b;
  if (op == "Pow") return std::pow(a, b);
  if (op == "Neg") return -a;
  if (op == "Exp") return std::exp(a);
  if (op == "Log") return std::log(a);
  if (op == "Tanh") return std::tanh(a);
  if (op == "Sigmoid") return 1.0 / (1.0 + std::exp(-a));
  if (op == "Relu") return a > 0 ? a : 0.0;
  if (op == "Sqrt") return std::sqrt(a);
  if (op == "Erf") return std::erf(a);
  if (op == "Reciprocal") return 1.0 / a;
  ref::fail(n, "unknown instruction " + op);
}

// (∂op/∂a, ∂op/∂b) at (a, b).
std::pair<double, double> partials(const std::string& op, double a, double b) {
  if (op == "Add") return {1.0, 1.0};
  if (op == "Sub") return {1.0, -1.0};
  if (op == "Mul") return {b, a};
  if (op == "Div") return {1.0 / b, -a / (b * b)};
  if (op == "Pow") return {b * std::pow(a, b - 1.0), 0.0};  // the exponent is a constant
  if (op == "Neg") return {-1.0, 0.0};
  if (op == "Exp") return {std::exp(a), 0.0};
  if (op == "Log") return {1.0 / a, 0.0};
  if (op == "Tanh") return {1.0 - std::tanh(a) * std::tanh(a), 0.0};
  if (op == "Sigmoid") {
    const double s = 1.0 / (1.0 + std::exp(-a));
    return {s * (1.0 - s), 0.0};
  }
  if (op == "Relu") return {a > 0 ? 1.0 : 0.0, 0.0};
  if (op == "Sqrt") return {0.5 / std::sqrt(a), 0.0};
  if (op == "Erf") return {2.0 / std::sqrt(kPi) * std::exp(-a * a), 0.0};
  return {-1.0 / (a * a), 0.0};  // Reciprocal
}

// Runs the program at one element: the instruction results, with each input read at `idx`.
struct ElementRun {
  std::vector<double> in, r;  // input values at this element, instruction results
};
ElementRun run_element(const Node& n, const Program& p, const ref::Ins& ins, const Dims& idx) {
  ElementRun e;
  for (const Tensor* t : ins) e.in.push_back(t->reals[source_offset(idx, t->shape)]);
  auto val = [&](int64_t o) { return o < 0 ? p.consts[-o - 1] : o < p.n_inputs ? e.in[o] : e.r[o - p.n_inputs]; };
  for (size_t k = 0; k < p.ops.size(); ++k)
    e.r.push_back(apply(n, p.ops[k], val(p.operands[2 * k]), unary(p.ops[k]) ? 0.0 : val(p.operands[2 * k + 1])));
  return e;
}

Dims broadcast_all(const Node& n, const ref::Ins& ins) {
  Dims s;
  for (const Tensor* t : ins) {
    if (!t) ref::fail(n, "inputs must all be present");
    s = ref::bcast_shape(n, s, t->shape);
  }
  return s;
}

const bool kRefFusedElementwise = ref::register_op(kOurDomain, "FusedElementwise", [](const Node& n, const ref::Ins& in) {
  const Program p = program(n, int64_t(in.size()));
  Tensor y = ref::zeros(in.at(0)->dtype, broadcast_all(n, in));
  for (int64_t e = 0; e < y.numel(); ++e) y.reals[e] = run_element(n, p, in, ref::unravel(e, y.shape)).r.back();
  return ref::Outs{y};
});

// (dY, inputs...) -> one gradient per input, shaped as the input (broadcast elements summed):
// reverse mode over the program at each element.
const bool kRefFusedElementwiseGrad = ref::register_op(kOurDomain, "FusedElementwiseGrad", [](const Node& n, const ref::Ins& in) {
  const ref::Ins xs(in.begin() + 1, in.end());
  const Program p = program(n, int64_t(xs.size()));
  const Tensor& dy = *in.at(0);
  if (dy.shape != broadcast_all(n, xs)) ref::fail(n, "dY must have the output's shape");
  ref::Outs grads;
  for (const Tensor* x : xs) grads.push_back(ref::zeros(x->dtype, x->shape));
  for (int64_t e = 0; e < dy.numel(); ++e) {
    const Dims idx = ref::unravel(e, dy.shape);
    const ElementRun run = run_element(n, p, xs, idx);
    auto val = [&](int64_t o) { return o < 0 ? p.consts[-o - 1] : o < p.n_inputs ? run.in[o] : run.r[o - p.n_inputs]; };
    std::vector<double> adj(p.ops.size(), 0.0), din(xs.size(), 0.0);
    adj.back() = dy.reals[e];
    auto add_adjoint = [&](int64_t o, double g) {
      if (o >= p.n_inputs) adj[o - p.n_inputs] += g;
      else if (o >= 0) din[o] += g;
    };
    for (size_t k = p.ops.size(); k-- > 0;) {
      const int64_t oa = p.operands[2 * k], ob = p.operands[2 * k + 1];
      const auto [pa, pb] = partials(p.ops[k], val(oa), unary(p.ops[k]) ? 0.0 : val(ob));
      add_adjoint(oa, adj[k] * pa);
      if (!unary(p.ops[k])) add_adjoint(ob, adj[k] * pb);
    }
    for (size_t i = 0; i < xs.size(); ++i) grads[i].reals[source_offset(idx, xs[i]->shape)] += din[i];
  }
  // join (passes/split_grad_join.cc): the listed inputs' gradients side by side along the last dim,
  // in output join[0]; the others' outputs absent.
  const std::vector<int64_t> join = n.attrs.get_ints("join", {});
  if (join.empty()) return grads;
  const Dims& piece = grads.at(join[0]).shape;
  const int64_t cols = piece.back(), rows = grads[join[0]].numel() / cols, width = cols * int64_t(join.size());
  Dims shape = piece;
  shape.back() = width;
  Tensor joint = ref::zeros(grads[join[0]].dtype, shape);
  for (size_t q = 0; q < join.size(); ++q) {
    if (grads.at(join[q]).shape != piece) ref::fail(n, "joined gradients must share one shape");
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) joint.reals[r * width + int64_t(q) * cols + k] = grads[join[q]].reals[r * cols + k];
  }
  grads[join[0]] = joint;
  return grads;
});

// --- SkipLayerNorm / SkipLayerNormGrad --------------------------------------------------------
// S = X + Skip (+ Bias); per row of the last dim: μ = mean(S), r = 1/√(var(S) + ε) (population
// variance), Y = (S − μ)·r·Gamma (+ Beta); outputs (Y, μ, r, S), the statistics with last dim 1.
const Tensor* opt(const ref::Ins& in, size_t i) { return in.size() > i ? in[i] : nullptr; }
Dims stats_shape(Dims s) {
  s.back() = 1;
  return s;
}

const bool kRefSkipLayerNorm = ref::register_op(kOurDomain, "SkipLayerNorm", [](const Node& n, const ref::Ins& in) {
  const Tensor &x = *in.at(0), &skip = *in.at(1), &gamma = *in.at(2);
  const Tensor *beta = opt(in, 3), *bias = opt(in, 4);
  if (x.shape.empty() || skip.shape != x.shape) ref::fail(n, "X and Skip must have one shape of rank >= 1");
  const int64_t cols = x.shape.back(), rows = x.numel() / cols;
  for (const Tensor* v : {&gamma, beta, bias})
    if (v && v->numel() != cols) ref::fail(n, "Gamma/Beta/Bias must have one value per column");
  const double eps = n.attrs.get_float("epsilon", 1e-5f);
  Tensor y = ref::zeros(x.dtype, x.shape), s = ref::zeros(x.dtype, x.shape);
  Tensor mean = ref::zeros(x.dtype, stats_shape(x.shape)), inv = mean;
  for (int64_t i = 0; i < rows; ++i) {
    double m = 0, var = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t e = i * cols + j;
      s.reals[e] = x.reals[e] + skip.reals[e] + (bias ? bias->reals[j] : 0.0);
      m += s.reals[e] / double(cols);
    }
    for (int64_t j = 0; j < cols; ++j) var += (s.reals[i * cols + j] - m) * (s.reals[i * cols + j] - m) / double(cols);
    const double r = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < cols; ++j)
      y.reals[i * cols + j] = (s.reals[i * cols + j] - m) * r * gamma.reals[j] + (beta ? beta->reals[j] : 0.0);
    mean.reals[i] = m;
    inv.reals[i] = r;
  }
  return ref::Outs{y, mean, inv, s};
});

// (dY, [dSum], Sum, Gamma, Mean, InvStdDev) -> (dS, dGamma, dBeta, dBias), x̂ = (S − μ)·r, g = dY·Gamma:
// dS = r·(g − mean(g) − x̂·mean(g·x̂)) + dSum; dGamma = Σ_rows dY·x̂; dBeta = Σ_rows dY; dBias = Σ_rows dS.
const bool kRefSkipLayerNormGrad = ref::register_op(kOurDomain, "SkipLayerNormGrad", [](const Node& n, const ref::Ins& in) {
  const Tensor *dy = in.at(0), *dsum = opt(in, 1);
  const Tensor &s = *in.at(2), &gamma = *in.at(3), &mean = *in.at(4), &inv = *in.at(5);
  const int64_t cols = s.shape.back(), rows = s.numel() / cols;
  if ((dy && dy->shape != s.shape) || (dsum && dsum->shape != s.shape)) ref::fail(n, "dY/dSum must have Sum's shape");
  if (mean.numel() != rows || inv.numel() != rows || gamma.numel() != cols) ref::fail(n, "bad statistics or Gamma");
  Tensor ds = ref::zeros(s.dtype, s.shape), dgamma = ref::zeros(s.dtype, {cols});
  Tensor dbeta = dgamma, dbias = dgamma;
  for (int64_t i = 0; i < rows; ++i) {
    const double m = mean.reals[i], r = inv.reals[i];
    auto xhat = [&](int64_t j) { return (s.reals[i * cols + j] - m) * r; };
    auto dyv = [&](int64_t j) { return dy ? dy->reals[i * cols + j] : 0.0; };
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < cols; ++j) {
      mg += dyv(j) * gamma.reals[j] / double(cols);
      mgx += dyv(j) * gamma.reals[j] * xhat(j) / double(cols);
    }
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t e = i * cols + j;
      ds.reals[e] = r * (dyv(j) * gamma.reals[j] - mg - xhat(j) * mgx) + (dsum ? dsum->reals[e] : 0.0);
      dgamma.reals[j] += dyv(j) * xhat(j);
      dbeta.reals[j] += dyv(j);
      dbias.reals[j] += ds.reals[e];
    }
  }
  return ref::Outs{ds, dgamma, dbeta, dbias};
});

// --- BiasDropout ------------------------------------------------------------------------------
// (X, [Bias], [Residual], [ratio = 0.5], [training_mode = false]) -> (Y, Mask):
// Y = Mask·(X + Bias)/(1 − ratio) + Residual. The mask is a fixed function of the element index
// (finite differences see one mask; the backward reads it from the forward's Mask output); no
// element is dropped outside training. The evaluator's DropoutGrad gives dY·Mask/(1 − ratio).
bool keep(int64_t i, double ratio) {
  uint64_t z = uint64_t(i) + 0x9E3779B97F4A7C15ULL;  // splitmix64's finaliser: a well-mixed draw per index
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return double((z ^ (z >> 31)) % 1000u) / 1000.0 >= ratio;
}

const bool kRefBiasDropout = ref::register_op(kOurDomain, "BiasDropout", [](const Node& n, const ref::Ins& in) {
  const Tensor& x = *in.at(0);
  const Tensor *bias = opt(in, 1), *res = opt(in, 2), *ratio_in = opt(in, 3), *train_in = opt(in, 4);
  if (x.shape.empty()) ref::fail(n, "X must have rank >= 1");
  const int64_t cols = x.shape.back();
  if (bias && bias->numel() != cols) ref::fail(n, "Bias must hold one value per column");
  if (res && res->shape != x.shape) ref::fail(n, "Residual must have X's shape");
  const bool training = train_in && ref::get(*train_in, 0) != 0;
  const double ratio = training ? (ratio_in ? ref::get(*ratio_in, 0) : 0.5) : 0.0;
  Tensor y = ref::zeros(x.dtype, x.shape), mask = ref::zeros(DType::kBool, x.shape);
  for (int64_t e = 0; e < x.numel(); ++e) {
    mask.ints[e] = keep(e, ratio);
    const double v = x.reals[e] + (bias ? bias->reals[e % cols] : 0.0);
    y.reals[e] = (mask.ints[e] ? v / (1.0 - ratio) : 0.0) + (res ? res->reals[e] : 0.0);
  }
  return ref::Outs{y, mask};
});

// --- FusedMatMul ------------------------------------------------------------------------------
// Y = alpha·A'·B' + bias; A' = transA ? A with its two innermost dims swapped : A (B' likewise);
// the batch dims broadcast (numpy), the bias broadcasts onto Y and is not scaled.
const bool kRefFusedMatMul = ref::register_op(kOurDomain, "FusedMatMul", [](const Node& n, const ref::Ins& in) {
  const Tensor &a = *in.at(0), &b = *in.at(1);
  const Tensor* bias = opt(in, 2);
  if (a.shape.size() < 2 || b.shape.size() < 2) ref::fail(n, "A and B must have rank >= 2");
  const bool ta = n.attrs.get_int("transA", 0) != 0, tb = n.attrs.get_int("transB", 0) != 0;
  const double alpha = n.attrs.get_float("alpha", 1.0f);
  const size_t ra = a.shape.size(), rb = b.shape.size();
  const int64_t M = a.shape[ra - (ta ? 1 : 2)], K = a.shape[ra - (ta ? 2 : 1)];
  const int64_t Kb = b.shape[rb - (tb ? 1 : 2)], N = b.shape[rb - (tb ? 2 : 1)];
  if (K != Kb) ref::fail(n, "inner dimensions differ");
  const Dims ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Dims ys = ref::bcast_shape(n, ba, bb);
  const Dims batch = ys;
  ys.push_back(M);
  ys.push_back(N);
  Tensor y = ref::zeros(a.dtype, ys);
  if (bias) ref::bcast_shape(n, ys, bias->shape);
  for (int64_t e = 0; e < y.numel(); ++e) {
    const Dims idx = ref::unravel(e, ys);
    const Dims bidx(idx.begin(), idx.end() - 2);
    const int64_t m = idx[idx.size() - 2], j = idx.back();
    const int64_t oa = source_offset(bidx, ba) * M * K, ob = source_offset(bidx, bb) * K * N;
    double acc = 0;
    for (int64_t k = 0; k < K; ++k)
      acc += a.reals[oa + (ta ? k * M + m : m * K + k)] * b.reals[ob + (tb ? j * K + k : k * N + j)];
    y.reals[e] = alpha * acc + (bias ? bias->reals[source_offset(idx, bias->shape)] : 0.0);
  }
  return ref::Outs{y};
});

// The references against hand-computed values (the gradient cases check backward against forward,
// so a forward reference wrong in a way its own backward shares would go unseen there).
Tensor T(Dims s, std::vector<double> d) { return Tensor::of_reals(DType::kDouble, std::move(s), std::move(d)); }
ref::Outs run(const std::string& op, std::vector<Tensor> ins, Attributes a = {}) {
  ref::Ins p;
  for (auto& t : ins) p.push_back(&t);
  return ref::eval_node(Node{kOurDomain, op, "/t", {}, {}, std::move(a)}, p);
}

TEST(GradCheckFusedReference, ForwardOpsOnHandComputedValues) {
  Attributes mm;
  mm.set("transA", int64_t{1});
  mm.set("alpha", 0.5f);
  // Aᵀ·B = [[1, 3], [2, 4]]·[5, 6]ᵀ = [23, 34]; ·0.5 + 1
  EXPECT_EQ(run("FusedMatMul", {T({2, 2}, {1, 2, 3, 4}), T({2, 1}, {5, 6}), T({1}, {1})}, mm)[0].reals,
            (std::vector<double>{12.5, 18}));
  Attributes tb;
  tb.set("transB", int64_t{1});
  const auto y = run("FusedMatMul", {T({2, 1, 2}, {1, 2, 3, 4}), T({3, 2}, {1, 0, 0, 1, 1, 1})}, tb)[0];
  EXPECT_EQ(y.shape, (Dims{2, 1, 3}));
  EXPECT_EQ(y.reals, (std::vector<double>{1, 2, 3, 3, 4, 7}));
  // gelu(1) = Φ(1) = 0.841344746...; the tanh form 0.841191990...
  EXPECT_NEAR(run("BiasGelu", {T({1}, {0.25}), T({1}, {0.75})})[0].reals[0], 0.8413447460685429, 1e-12);
  Attributes th;
  th.set("approximate", std::string("tanh"));
  EXPECT_NEAR(run("BiasGelu", {T({1}, {1.0})}, th)[0].reals[0], 0.8411919906082768, 1e-12);
  // (x + b)·2 − 1 over a (2, 2) input and a row
  Attributes pr;
  pr.set("ops", std::vector<std::string>{"Add", "Mul", "Sub"});
  pr.set("operands", std::vector<int64_t>{0, 1, 2, -1, 3, -2});
  pr.set("consts", std::vector<float>{2.0f, 1.0f});
  EXPECT_EQ(run("FusedElementwise", {T({2, 2}, {1, 2, 3, 4}), T({2}, {10, 20})}, pr)[0].reals,
            (std::vector<double>{21, 43, 25, 47}));
  // S = [1, 3] + bias 0: μ = 2, var = 1; Y = [−1, 1]·r·Gamma + Beta
  Attributes eps;
  eps.set("epsilon", 0.0f);
  const auto sln = run("SkipLayerNorm", {T({1, 2}, {1, 2}), T({1, 2}, {0, 1}), T({2}, {2, 3}), T({2}, {0.5, 0.5})}, eps);
  EXPECT_EQ(sln[0].reals, (std::vector<double>{-1.5, 3.5}));
  EXPECT_EQ(sln[1].reals, (std::vector<double>{2}));
  EXPECT_EQ(sln[2].reals, (std::vector<double>{1}));
  EXPECT_EQ(sln[3].reals, (std::vector<double>{1, 3}));
  // Dropout of X + Bias at ratio 0.5 in training, + Residual: kept elements doubled, some dropped
  const Tensor train = Tensor::of_ints(DType::kBool, {}, {1});
  const auto bd = run("BiasDropout", {T({1, 8}, std::vector<double>(8, 1)), T({8}, std::vector<double>(8, 1)),
                                      T({1, 8}, std::vector<double>(8, 10)), T({}, {0.5}), train});
  int kept = 0;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(bd[0].reals[i], bd[1].ints[i] ? 14.0 : 10.0) << i;
    kept += bd[1].ints[i] != 0;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 8);
}

}  // namespace

// Numeric gradient cases of the fused ops (their rules and the backward ops those emit).
namespace gradcheck {
namespace {

using Strs = std::vector<std::string>;
using Floats = std::vector<float>;

ValueId ours(Graph& g, const std::string& op, std::vector<ValueId> ins, Attributes a, int num_outputs,
             std::vector<ValueId>* outs = nullptr) {
  std::vector<ValueId> o;
  for (int i = 0; i < num_outputs; ++i) o.push_back(g.new_value(op + "_out", DType::kUndefined, Shape::unknown()));
  g.nodes.push_back(Node{kOurDomain, op, g.unique_node_name("/" + op), std::move(ins), o, std::move(a)});
  if (outs) *outs = o;
  return o[0];
}

ValueId bool_const(Graph& g, bool v) {
  ValueId t = g.new_value("training_mode", DType::kBool, Shape::of({}));
  g.initializers[t] = TensorData{DType::kBool, {}, std::string(1, v ? '\1' : '\0')};
  return t;
}

// A program of the elementwise chain fusion: (op, operand a, operand b) per instruction.
Attributes prog(std::initializer_list<std::tuple<const char*, int64_t, int64_t>> code, Floats consts = {}) {
  Strs ops;
  std::vector<int64_t> operands;
  for (const auto& [op, a, b] : code) {
    ops.push_back(op);
    operands.push_back(a);
    operands.push_back(b);
  }
  Attributes at = A({{"ops", ops}, {"operands", operands}});
  if (!consts.empty()) at.set("consts", consts);
  return at;
}

std::vector<Case> fused_cases() {
  std::vector<Case> c;
  const std::string kBiasGelu = "com.torch_ort::BiasGelu", kFE = "com.torch_ort::FusedElementwise",
                    kSLN = "com.torch_ort::SkipLayerNorm", kBD = "com.torch_ort::BiasDropout",
                    kFMM = "com.torch_ort::FusedMatMul";

  // BiasGelu(X, [bias]) -> BiasGeluGrad (+ row sums for the bias), both approximate forms.
  for (const char* approx : {"none", "tanh"}) {
    const Attributes at = A({{"approximate", std::string(approx)}});
    const std::string tag = std::string("_") + approx;
    c.push_back({"BiasGelu_bias" + tag, kBiasGelu, {G({2, 3, 4}), G({4})}, at, 1, [at](Graph& g, const std::vector<ValueId>& in) {
                   return std::vector<ValueId>{ours(g, "BiasGelu", in, at, 1)};
                 }});
    c.push_back({"BiasGelu_no_bias" + tag, kBiasGelu, {G({3, 4})}, at, 1, [at](Graph& g, const std::vector<ValueId>& in) {
                   return std::vector<ValueId>{ours(g, "BiasGelu", in, at, 1)};
                 }});
  }
  c.push_back({"BiasGelu_bias_only", kBiasGelu, {N({3, 5}), G({5})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
                 return std::vector<ValueId>{ours(g, "BiasGelu", in, {}, 1)};
               }});

  // FusedElementwise: operands >= n_inputs are earlier results, < 0 constants.
  // gelu-tanh of X + b: a last-dim row, scalar constants, Pow and Tanh (n_inputs = 2).
  c.push_back({"FusedElementwise_bias_gelu_chain", kFE, {G({2, 3, 4}), G({4})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) {
                 const Attributes at = prog({{"Add", 0, 1},     // 2: u = x + b
                                             {"Pow", 2, -1},    // 3: u³
                                             {"Mul", 3, -2},    // 4: 0.044715·u³
                                             {"Add", 2, 4},     // 5
                                             {"Mul", 5, -3},    // 6: √(2/π)·(...)
                                             {"Tanh", 6, 0},    // 7
                                             {"Add", 7, -4},    // 8: 1 + tanh
                                             {"Mul", 2, 8},     // 9
                                             {"Mul", 9, -5}},   // 10: ½·u·(1 + tanh)
                                            {3.0f, 0.044715f, 0.7978845608f, 1.0f, 0.5f});
                 return std::vector<ValueId>{ours(g, "FusedElementwise", in, at, 1)};
               }});
  // Every instruction of the kernel: inputs x, y (full), s (a scalar input), b (a (1, 4) row).
  c.push_back({"FusedElementwise_every_op_scalar_and_row", kFE, {G({3, 4}), G({3, 4}), G({}), G({1, 4})}, {}, 1,
               [](Graph& g, const std::vector<ValueId>& in) {
                 const Attributes at = prog({{"Exp", 0, 0},          // 4: eˣ
                                             {"Sqrt", 4, 0},         // 5: e^(x/2)
                                             {"Sigmoid", 1, 0},      // 6
                                             {"Mul", 5, 6},          // 7
                                             {"Erf", 1, 0},          // 8
                                             {"Div", 8, 3},          // 9: erf(y) / b
                                             {"Sub", 7, 9},          // 10
                                             {"Mul", 10, 2},         // 11: · s
                                             {"Relu", 0, 0},         // 12
                                             {"Neg", 12, 0},         // 13
                                             {"Add", 11, 13},        // 14
                                             {"Reciprocal", 4, 0},   // 15: e^(−x)
                                             {"Add", 15, -1},        // 16: + 1
                                             {"Log", 16, 0},         // 17
                                             {"Sub", 14, 17},        // 18
                                             {"Div", 18, -2},        // 19: ÷ 2 (a constant)
                                             {"Sub", -1, 19}},       // 20: 1 − (...) (a constant first)
                                            {1.0f, 2.0f});
                 return std::vector<ValueId>{ours(g, "FusedElementwise", in, at, 1)};
               }});
  // An input without gradient (a weight row), an input read twice: tanh(x·w)·x.
  c.push_back({"FusedElementwise_no_grad_row", kFE, {G({2, 2, 3}), N({3})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
                 const Attributes at = prog({{"Mul", 0, 1}, {"Tanh", 2, 0}, {"Mul", 3, 0}});
                 return std::vector<ValueId>{ours(g, "FusedElementwise", in, at, 1)};
               }});
  // The chain's output read by another fused chain (the gradient arrives through FusedElementwiseGrad).
  c.push_back({"FusedElementwise_two_chains", kFE, {G({3, 4}), G({4})}, {}, 1, [](Graph& g, const std::vector<ValueId>& in) {
                 const ValueId h = ours(g, "FusedElementwise", in, prog({{"Sub", 0, 1}, {"Exp", 2, 0}}), 1);
                 const ValueId y = ours(g, "FusedElementwise", {h, in[1]}, prog({{"Mul", 0, 1}, {"Erf", 2, 0}}), 1);
                 return std::vector<ValueId>{y};
               }});

  // SkipLayerNorm(X, Skip, Gamma, [Beta], [Bias]) -> (Y, Mean, InvStdDev, Sum).
  auto sln = [](std::vector<int> outs, Attributes at = {}) {
    return [outs, at](Graph& g, const std::vector<ValueId>& in) {
      std::vector<ValueId> o, r;
      ours(g, "SkipLayerNorm", in, at, 4, &o);
      for (int i : outs) r.push_back(o[i]);
      return r;
    };
  };
  c.push_back({"SkipLayerNorm_gamma_only", kSLN, {G({3, 5}), G({3, 5}), G({5})}, {}, 1, sln({0})});
  c.push_back({"SkipLayerNorm_beta", kSLN, {G({2, 3, 4}), G({2, 3, 4}), G({4}), G({4})}, {}, 1,
               sln({0}, A({{"epsilon", 1e-3f}}))});
  c.push_back({"SkipLayerNorm_bias_no_beta", kSLN, {G({3, 4}), G({3, 4}), G({4}), Omit(), G({4})}, {}, 1, sln({0})});
  c.push_back({"SkipLayerNorm_beta_bias", kSLN, {G({2, 2, 4}), G({2, 2, 4}), G({4}), G({4}), G({4})}, {}, 1, sln({0})});
  c.push_back({"SkipLayerNorm_sum_output_read", kSLN, {G({3, 4}), G({3, 4}), G({4}), G({4}), G({4})}, {}, 1, sln({0, 3})});
  c.push_back({"SkipLayerNorm_only_sum_read", kSLN, {G({3, 4}), G({3, 4}), G({4}), G({4}), G({4})}, {}, 1, sln({3})});
  c.push_back({"SkipLayerNorm_statistics_read", kSLN, {G({3, 4}), G({3, 4}), G({4}), G({4}), G({4})}, {}, 1, sln({0, 1, 2, 3})});
  c.push_back({"SkipLayerNorm_params_frozen", kSLN, {G({3, 4}), N({3, 4}), N({4}), N({4}), G({4})}, {}, 1, sln({0})});
  c.push_back({"SkipLayerNorm_params_only", kSLN, {N({3, 4}), N({3, 4}), G({4}), G({4}), N({4})}, {}, 1, sln({0})});

  // BiasDropout(X, [Bias], [Residual], [ratio], [training_mode]) -> (Y, Mask); the oracle's mask is
  // a fixed function of the element index, so finite differences see the forward's mask.
  auto bias_dropout = [](double ratio, int training, bool bias, bool residual) {
    return [=](Graph& g, const std::vector<ValueId>& in) {
      std::vector<ValueId> ins{in[0], bias ? in[1] : kNoValue, residual ? in[bias ? 2 : 1] : kNoValue};
      if (ratio >= 0) {
        ins.push_back(g.new_value("ratio", DType::kDouble, Shape::of({})));
        g.initializers[ins.back()] = TensorData::scalar_float(DType::kDouble, ratio);
      } else if (training >= 0) {
        ins.push_back(kNoValue);  // the default ratio, 0.5
      }
      if (training >= 0) ins.push_back(bool_const(g, training != 0));
      while (ins.back() == kNoValue) ins.pop_back();
      return std::vector<ValueId>{ours(g, "BiasDropout", ins, {}, 2)};
    };
  };
  c.push_back({"BiasDropout_training_bias_residual", kBD, {G({2, 3, 4}), G({4}), G({2, 3, 4})}, {}, 1,
               bias_dropout(0.3, 1, true, true)});
  c.push_back({"BiasDropout_training_default_ratio", kBD, {G({3, 5}), G({5}), G({3, 5})}, {}, 1,
               bias_dropout(-1, 1, true, true)});
  c.push_back({"BiasDropout_ratio_zero", kBD, {G({3, 4}), G({4}), G({3, 4})}, {}, 1, bias_dropout(0.0, 1, true, true)});
  c.push_back({"BiasDropout_inference", kBD, {G({3, 4}), G({4}), G({3, 4})}, {}, 1, bias_dropout(0.3, 0, true, true)});
  c.push_back({"BiasDropout_no_training_input", kBD, {G({3, 4}), G({4}), G({3, 4})}, {}, 1, bias_dropout(-1, -1, true, true)});
  c.push_back({"BiasDropout_bias_only", kBD, {G({3, 4}), G({4})}, {}, 1, bias_dropout(0.25, 1, true, false)});
  c.push_back({"BiasDropout_residual_only", kBD, {G({3, 4}), G({3, 4})}, {}, 1, bias_dropout(0.25, 1, false, true)});
  c.push_back({"BiasDropout_frozen_input", kBD, {N({3, 4}), G({4}), G({3, 4})}, {}, 1, bias_dropout(0.3, 1, true, true)});

  // FusedMatMul(A, B, [bias]): flags, alpha, batched A × 2-D B (the flattened Gemm gradient),
  // batch broadcasting, 2-D A × batched B.
  auto fmm = [](int64_t ta, int64_t tb, float alpha) {
    Attributes at = A({{"transA", ta}, {"transB", tb}});
    if (alpha != 1.0f) at.set("alpha", alpha);
    return [at](Graph& g, const std::vector<ValueId>& in) { return std::vector<ValueId>{ours(g, "FusedMatMul", in, at, 1)}; };
  };
  c.push_back({"FusedMatMul_2d_bias", kFMM, {G({3, 4}), G({4, 5}), G({5})}, {}, 1, fmm(0, 0, 1.0f)});
  c.push_back({"FusedMatMul_transA_alpha", kFMM, {G({4, 3}), G({4, 5})}, {}, 1, fmm(1, 0, 0.5f)});
  c.push_back({"FusedMatMul_transB_full_bias", kFMM, {G({3, 4}), G({5, 4}), G({3, 5})}, {}, 1, fmm(0, 1, 1.0f)});
  c.push_back({"FusedMatMul_transAB_alpha", kFMM, {G({4, 3}), G({5, 4}), G({1, 5})}, {}, 1, fmm(1, 1, 1.5f)});
  c.push_back({"FusedMatMul_batched_A_2d_B_bias_alpha", kFMM, {G({2, 3, 4}), G({4, 5}), G({5})}, {}, 1, fmm(0, 0, 0.7f)});
  c.push_back({"FusedMatMul_batched_A_2d_B_transB", kFMM, {G({2, 3, 4}), G({5, 4}), G({5})}, {}, 1, fmm(0, 1, 1.25f)});
  c.push_back({"FusedMatMul_batched_transA_2d_B", kFMM, {G({2, 4, 3}), G({4, 5})}, {}, 1, fmm(1, 0, 1.0f)});
  c.push_back({"FusedMatMul_batch_broadcast_transAB", kFMM, {G({2, 1, 4, 3}), G({3, 5, 4})}, {}, 1, fmm(1, 1, 0.5f)});
  c.push_back({"FusedMatMul_2d_A_batched_B", kFMM, {G({3, 4}), G({2, 4, 5}), G({2, 1, 5})}, {}, 1, fmm(0, 0, 1.0f)});
  c.push_back({"FusedMatMul_weights_only", kFMM, {N({2, 3, 4}), G({5, 4}), N({5})}, {}, 1, fmm(0, 1, 1.0f)});
  return c;
}
REGISTER_GRAD_CASES(fused_cases());

}  // namespace
}  // namespace gradcheck
}  // namespace torch_ort
