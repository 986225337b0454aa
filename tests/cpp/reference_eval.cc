// Reference evaluator (test oracle): one plain loop per op, double precision, numpy broadcasting.
#include "tests/cpp/reference_eval.h"

#include "csrc/core/eval/eval.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace torch_ort::ref {

void fail(const Node& n, const std::string& why) {
  throw std::runtime_error("reference_eval: " + n.op_type + " (node " + n.name + "): " + why);
}
int64_t prod(const Dims& s, size_t b, size_t e) {
  e = std::min(e, s.size());
  return std::accumulate(s.begin() + std::min(b, e), s.begin() + e, int64_t{1}, std::multiplies<>());
}

Dims unravel(int64_t lin, const Dims& s) {
  Dims idx(s.size());
  for (size_t d = s.size(); d-- > 0;) { idx[d] = lin % s[d]; lin /= s[d]; }
  return idx;
}
int64_t ravel(const Dims& idx, const Dims& s) {
  int64_t lin = 0;
  for (size_t d = 0; d < s.size(); ++d) lin = lin * s[d] + idx[d];
  return lin;
}

Tensor zeros(DType dtype, Dims shape) {
  const int64_t n = prod(shape);
  Tensor t{dtype, std::move(shape), {}, {}};
  if (t.integral()) t.ints.assign(n, 0);
  else t.reals.assign(n, 0.0);
  return t;
}
Tensor ints(const Dims& v) { return Tensor::of_ints(DType::kInt64, {int64_t(v.size())}, v); }
double get(const Tensor& t, int64_t i) { return t.integral() ? double(t.ints.at(i)) : t.reals.at(i); }
void set(Tensor& t, int64_t i, double v) {
  if (!t.integral()) { t.reals.at(i) = v; return; }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  // INT64_MAX (an open Slice end, say) reads as the double 2^63, past int64's range: saturate
  t.ints.at(i) = t.dtype == DType::kBool ? v != 0 : v >= 0x1p63 ? kMax : v <= -0x1p63 ? kMin : int64_t(v);
}
void apply(Tensor& t, const std::function<double(double)>& f) {
  for (int64_t i = 0; i < t.numel(); ++i) set(t, i, f(get(t, i)));
}
const Dims& ints_of(const Node& n, const Tensor& t) {
  if (!t.integral()) fail(n, "expected an integral tensor, got " + std::string(dtype_name(t.dtype)));
  return t.ints;
}

namespace {

std::string str(const Dims& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s.append(i ? "," : "").append(std::to_string(d[i]));
  return s + ")";
}
int64_t norm_axis(const Node& n, int64_t a, int64_t rank) {
  if (a < -rank || a >= rank) fail(n, "axis " + std::to_string(a) + " out of range");
  return a < 0 ? a + rank : a;
}
}  // namespace

// Offset into a tensor of shape `in` (right-aligned, size-1 dims broadcast) for linear index
// `lin` of a tensor of shape `out`.
int64_t bcast_offset(int64_t lin, const Dims& out, const Dims& in) {
  int64_t off = 0, stride = 1;
  for (int64_t d = int64_t(out.size()) - 1, e = int64_t(in.size()) - 1; d >= 0; --d, --e) {
    int64_t idx = lin % out[d];
    lin /= out[d];
    if (e >= 0) {
      if (in[e] != 1) off += idx * stride;
      stride *= in[e];
    }
  }
  return off;
}
Dims bcast_shape(const Node& n, const Dims& a, const Dims& b) {
  Dims r(std::max(a.size(), b.size()));
  for (size_t i = 0; i < r.size(); ++i) {
    int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) fail(n, "shapes " + str(a) + " and " + str(b) + " do not broadcast");
    r[r.size() - 1 - i] = x == 1 ? y : x;
  }
  return r;
}
// out[i] = f(inputs broadcast together at i)
Tensor nary(const Node& n, const Ins& xs, DType dtype, const std::function<double(const double*)>& f) {
  Dims shape;
  for (auto* x : xs) shape = bcast_shape(n, shape, x->shape);
  Tensor r = zeros(dtype, shape);
  std::vector<double> v(xs.size());
  for (int64_t i = 0; i < r.numel(); ++i) {
    for (size_t k = 0; k < xs.size(); ++k) v[k] = get(*xs[k], bcast_offset(i, shape, xs[k]->shape));
    set(r, i, f(v.data()));
  }
  return r;
}
namespace {

Tensor broadcast_to(const Node& n, const Tensor& x, const Dims& shape) {
  Tensor s = zeros(x.dtype, shape);  // only its shape is read
  return nary(n, {&x, &s}, x.dtype, [](const double* v) { return v[0]; });
}
// Sums x down to `target` (reverse numpy broadcasting); also serves as ReduceSum(keepdims=1).
Tensor sum_to(const Node& n, const Tensor& x, const Dims& target) {
  if (target.size() > x.shape.size() || bcast_shape(n, target, x.shape) != x.shape)
    fail(n, "cannot sum " + str(x.shape) + " down to " + str(target));
  Tensor r = zeros(x.dtype, target);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t o = bcast_offset(i, x.shape, target);
    set(r, o, get(r, o) + get(x, i));
  }
  return r;
}
// Normalized, sorted reduction axes; empty `axes` means all (unless noop).
Dims reduce_axes(const Node& n, Dims axes, int64_t rank) {
  if (axes.empty()) { axes.resize(rank); std::iota(axes.begin(), axes.end(), 0); }
  for (auto& a : axes) a = norm_axis(n, a, rank);
  std::sort(axes.begin(), axes.end());
  return axes;
}
Tensor reduce_sum(const Node& n, const Tensor& x, const Dims& axes, bool keepdims) {
  Dims keep = x.shape, drop;
  for (auto a : axes) keep[a] = 1;
  for (size_t d = 0; d < keep.size(); ++d)
    if (!std::binary_search(axes.begin(), axes.end(), int64_t(d))) drop.push_back(keep[d]);
  Tensor r = sum_to(n, x, keep);
  if (!keepdims) r.shape = drop;
  return r;
}
// Calls f(base, stride, len) for every 1-D lane of `shape` along `axis`.
void for_each_lane(const Dims& shape, int64_t axis, const std::function<void(int64_t, int64_t, int64_t)>& f) {
  int64_t outer = prod(shape, 0, axis), len = shape[axis], inner = prod(shape, axis + 1);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) f(o * len * inner + i, inner, len);
}
Tensor log_softmax(const Tensor& x, int64_t axis) {
  Tensor r = x;
  for_each_lane(x.shape, axis, [&](int64_t b, int64_t s, int64_t len) {
    double m = -INFINITY, z = 0;
    for (int64_t j = 0; j < len; ++j) m = std::max(m, x.reals[b + j * s]);
    for (int64_t j = 0; j < len; ++j) z += std::exp(x.reals[b + j * s] - m);
    for (int64_t j = 0; j < len; ++j) r.reals[b + j * s] = x.reals[b + j * s] - m - std::log(z);
  });
  return r;
}
Tensor transpose(const Tensor& x, const Dims& perm) {
  Dims shape(perm.size()), st(x.shape.size(), 1);
  for (int64_t d = int64_t(st.size()) - 2; d >= 0; --d) st[d] = st[d + 1] * x.shape[d + 1];
  for (size_t i = 0; i < perm.size(); ++i) shape[i] = x.shape[perm[i]];
  Tensor r{x.dtype, shape, {}, {}};
  for (int64_t i = 0; i < prod(shape); ++i) {
    int64_t lin = i, off = 0;
    for (int64_t d = int64_t(shape.size()) - 1; d >= 0; --d) { off += (lin % shape[d]) * st[perm[d]]; lin /= shape[d]; }
    r.push(x, off);
  }
  return r;
}
Tensor matmul(const Node& n, Tensor a, Tensor b) {
  bool a1 = a.shape.size() == 1, b1 = b.shape.size() == 1;
  if (a.shape.empty() || b.shape.empty()) fail(n, "MatMul of a scalar");
  if (a1) a.shape.insert(a.shape.begin(), 1);
  if (b1) b.shape.push_back(1);
  int64_t M = a.shape.end()[-2], K = a.shape.back(), N = b.shape.back();
  if (b.shape.end()[-2] != K) fail(n, "inner dims differ: " + str(a.shape) + " x " + str(b.shape));
  Dims ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Dims batch = bcast_shape(n, ba, bb), shape = batch;
  shape.insert(shape.end(), {M, N});
  Tensor r = zeros(a.dtype, shape);
  for (int64_t q = 0; q < prod(batch); ++q) {
    const double* A = &a.reals[bcast_offset(q, batch, ba) * M * K];
    const double* B = &b.reals[bcast_offset(q, batch, bb) * K * N];
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k) r.reals[(q * M + i) * N + j] += A[i * K + k] * B[k * N + j];
  }
  if (a1) r.shape.erase(r.shape.end() - 2);
  if (b1) r.shape.pop_back();
  return r;
}
// Per-target weight (0 when ignored) for the loss ops; scores/input are (N, C, d1, ...).
struct Targets {
  int64_t C = 0, D = 0;        // classes; product of the extra dims
  std::vector<int64_t> t;      // label per (n, d)
  std::vector<double> w;       // weight per (n, d); 0 for ignored targets
  double wsum = 0;             // the "mean" denominator
};
Targets targets(const Node& n, const Dims& scores, const Tensor& labels, const Tensor* weights) {
  if (scores.size() < 2) fail(n, "scores must be (N, C, ...), got " + str(scores));
  Targets T;
  T.C = scores[1];
  T.D = prod(scores, 2);
  if (labels.numel() != scores[0] * T.D) fail(n, "labels " + str(labels.shape) + " vs scores " + str(scores));
  bool has_ignore = n.attrs.has("ignore_index");
  int64_t ignore = n.attrs.get_int("ignore_index", 0);
  for (int64_t t : ints_of(n, labels)) {
    bool skip = has_ignore && t == ignore;
    if (!skip && (t < 0 || t >= T.C)) fail(n, "label " + std::to_string(t) + " out of range");
    T.t.push_back(t);
    T.w.push_back(skip ? 0.0 : weights ? weights->reals.at(t) : 1.0);
    T.wsum += T.w.back();
  }
  return T;
}
Tensor nll_forward(const Node& n, const Tensor& lp, const Tensor& labels, const Tensor* weights) {
  Targets T = targets(n, lp.shape, labels, weights);
  Tensor loss = zeros(lp.dtype, labels.shape);
  for (size_t i = 0; i < T.t.size(); ++i) {
    int64_t nn = int64_t(i) / T.D, d = int64_t(i) % T.D;
    if (T.w[i] != 0) loss.reals[i] = -T.w[i] * lp.reals[(nn * T.C + T.t[i]) * T.D + d];
  }
  std::string red = n.attrs.get_string("reduction", "mean");
  if (red == "none") return loss;
  double s = std::accumulate(loss.reals.begin(), loss.reals.end(), 0.0);
  if (red != "sum" && red != "mean") fail(n, "bad reduction " + red);
  return Tensor::of_reals(lp.dtype, {}, {red == "sum" ? s : s / T.wsum});
}
// d loss / d input[n, c, d] = g(n,d) * w(n,d) * (p[n,c,d] - [c == t]) for SCE (softmax=true),
// = -g(n,d) * w(n,d) * [c == t] for NLL.
Tensor loss_grad(const Node& n, const Tensor& dloss, const Tensor& x, const Tensor& labels,
                    const Tensor* weights, bool softmax) {
  Targets T = targets(n, x.shape, labels, weights);
  std::string red = n.attrs.get_string("reduction", "mean");
  Tensor r = zeros(x.dtype, x.shape);
  for (size_t i = 0; i < T.t.size(); ++i) {
    int64_t nn = int64_t(i) / T.D, d = int64_t(i) % T.D;
    double g = red == "none" ? dloss.reals.at(i) : dloss.reals.at(0) / (red == "mean" ? T.wsum : 1.0);
    for (int64_t c = 0; c < T.C; ++c) {
      int64_t o = (nn * T.C + c) * T.D + d;
      double p = softmax ? std::exp(x.reals[o]) : 0.0;
      r.reals[o] = g * T.w[i] * (p - (c == T.t[i] ? 1.0 : 0.0));
    }
  }
  return r;
}
// Axes from input i when present (opset >= 13/18), else from the "axes" attribute.
Dims axes_of(const Node& n, const Ins& in, size_t i) {
  if (in.size() > i && in[i]) return ints_of(n, *in[i]);
  return n.attrs.get_ints("axes", {});
}

#define OP(name) {name, []([[maybe_unused]] const Node& n, [[maybe_unused]] const Ins& in) -> Outs
#define X(i) (*in.at(i))
#define UNARY(name, expr) OP(name) { return {nary(n, {in.at(0)}, X(0).dtype, [](const double* v) { double x = v[0]; return (expr); })}; }}
#define BINARY(name, dt, expr) OP(name) { return {nary(n, {in.at(0), in.at(1)}, dt, [](const double* v) { double a = v[0], b = v[1]; return (expr); })}; }}

// Dropout's mask in the oracle: a fixed hash of the element index, so every evaluation of the
// forward (finite differences run it many times) drops the same elements.
bool kept(int64_t i, double ratio) { return double((uint64_t(i) * 2654435761u) % 1000) / 1000.0 >= ratio; }
double ratio_of(const Ins& in, size_t i) { return in.size() > i && in[i] ? get(*in[i], 0) : 0.5; }

const std::map<std::string, OpFn>& onnx_ops() {
  static const std::map<std::string, OpFn> ops = {
      OP("Dropout") {  // (data, ratio?, training_mode?) -> (output, mask)
        const bool training = in.size() > 2 && in[2] && get(*in[2], 0) != 0;
        const double ratio = training ? ratio_of(in, 1) : 0.0;
        Tensor out = X(0), mask = zeros(DType::kBool, X(0).shape);
        for (int64_t i = 0; i < out.numel(); ++i) {
          mask.ints[i] = kept(i, ratio);
          out.reals[i] = mask.ints[i] ? out.reals[i] / (1.0 - ratio) : 0.0;
        }
        return {out, mask};
      }},
      BINARY("Pow", X(0).dtype, std::pow(a, b)), BINARY("Equal", DType::kBool, double(a == b)),
      BINARY("Greater", DType::kBool, double(a > b)), BINARY("Less", DType::kBool, double(a < b)),
      UNARY("Neg", -x), UNARY("Exp", std::exp(x)), UNARY("Log", std::log(x)),
      UNARY("Relu", x > 0 ? x : 0.0), UNARY("Tanh", std::tanh(x)), UNARY("Sigmoid", 1 / (1 + std::exp(-x))),
      UNARY("Sin", std::sin(x)), UNARY("Cos", std::cos(x)), UNARY("Softplus", std::log1p(std::exp(x))),
      OP("LeakyRelu") {
        const double alpha = n.attrs.get_float("alpha", 0.01f);
        return {nary(n, {in.at(0)}, X(0).dtype, [alpha](const double* v) { return v[0] > 0 ? v[0] : alpha * v[0]; })};
      }},
      OP("Not") { return {nary(n, {in.at(0)}, DType::kBool, [](const double* v) { return double(v[0] == 0); })}; }},
      OP("Sum") { return {nary(n, in, X(0).dtype, [k = in.size()](const double* v) { return std::accumulate(v, v + k, 0.0); })}; }},
      OP("Where") { return {nary(n, in, X(1).dtype, [](const double* v) { return v[0] != 0 ? v[1] : v[2]; })}; }},
      OP("Softmax") {
        Tensor r = log_softmax(X(0), norm_axis(n, n.attrs.get_int("axis", -1), X(0).shape.size()));
        apply(r, [](double v) { return std::exp(v); });
        return {r};
      }},
      OP("LogSoftmax") { return {log_softmax(X(0), norm_axis(n, n.attrs.get_int("axis", -1), X(0).shape.size()))}; }},
      OP("MatMul") { return {matmul(n, X(0), X(1))}; }},
      OP("Gemm") {
        Tensor a = X(0), b = X(1);
        if (a.shape.size() != 2 || b.shape.size() != 2) fail(n, "Gemm needs 2-D A and B");
        if (n.attrs.get_int("transA", 0)) a = transpose(a, {1, 0});
        if (n.attrs.get_int("transB", 0)) b = transpose(b, {1, 0});
        Tensor y = matmul(n, a, b);
        double alpha = n.attrs.get_float("alpha", 1.f), beta = n.attrs.get_float("beta", 1.f);
        if (in.size() < 3 || !in[2]) { apply(y, [alpha](double v) { return alpha * v; }); return {y}; }
        return {nary(n, {&y, in[2]}, y.dtype, [=](const double* v) { return alpha * v[0] + beta * v[1]; })};
      }},
      OP("ReduceSum") {
        Dims axes = axes_of(n, in, 1);
        if (axes.empty() && n.attrs.get_int("noop_with_empty_axes", 0)) return {X(0)};
        return {reduce_sum(n, X(0), reduce_axes(n, axes, X(0).shape.size()), n.attrs.get_int("keepdims", 1))};
      }},
      OP("ReduceMean") {
        Dims axes = axes_of(n, in, 1);
        if (axes.empty() && n.attrs.get_int("noop_with_empty_axes", 0)) return {X(0)};
        Tensor r = reduce_sum(n, X(0), reduce_axes(n, axes, X(0).shape.size()), n.attrs.get_int("keepdims", 1));
        apply(r, [k = double(X(0).numel()) / double(r.numel())](double v) { return v / k; });
        return {r};
      }},
      OP("Flatten") {
        int64_t r = X(0).shape.size(), axis = n.attrs.get_int("axis", 1);
        axis = axis < 0 ? axis + r : axis;
        Tensor y = X(0);
        y.shape = {prod(y.shape, 0, axis), prod(y.shape, axis)};
        return {y};
      }},
      OP("Transpose") {
        Dims perm(X(0).shape.size());
        std::iota(perm.rbegin(), perm.rend(), 0);
        Dims p = n.attrs.get_ints("perm", perm);
        if (!std::is_permutation(p.begin(), p.end(), perm.begin(), perm.end())) fail(n, "perm " + str(p) + " for rank " + std::to_string(perm.size()));
        return {transpose(X(0), p)};
      }},
      OP("Constant") {
        if (auto* t = n.attrs.get_tensor("value")) return {eval::from_data(*t)};
        if (n.attrs.has("value_float"))
          return {Tensor::of_reals(DType::kFloat, {}, {n.attrs.get_float("value_float", 0)})};
        if (n.attrs.has("value_int")) return {Tensor::of_ints(DType::kInt64, {}, {n.attrs.get_int("value_int", 0)})};
        if (n.attrs.has("value_ints")) return {ints(n.attrs.get_ints("value_ints", {}))};
        fail(n, "unsupported Constant attribute");
      }},
      OP("Size") { return {Tensor::of_ints(DType::kInt64, {}, {X(0).numel()})}; }},
      OP("ConstantOfShape") {
        const Tensor v = n.attrs.get_tensor("value") ? eval::from_data(*n.attrs.get_tensor("value"))
                                                     : Tensor::of_reals(DType::kFloat, {1}, {0.0});
        Tensor r = zeros(v.dtype, ints_of(n, X(0)));
        for (int64_t i = 0; i < r.numel(); ++i) set(r, i, get(v, 0));
        return {r};
      }},
      OP("SoftmaxCrossEntropyLoss") {
        Tensor lp = log_softmax(X(0), 1);
        return {nll_forward(n, lp, X(1), in.size() > 2 ? in[2] : nullptr), lp};
      }},
      OP("NegativeLogLikelihoodLoss") { return {nll_forward(n, X(0), X(1), in.size() > 2 ? in[2] : nullptr)}; }},
  };
  return ops;
}

const std::map<std::string, OpFn>& our_ops() {  // domain com.torch_ort: gradient ops
  static const std::map<std::string, OpFn> ops = {
      OP("DropoutGrad") {  // (dY, mask, ratio?, training_mode?) -> dY · mask / (1 − ratio)
        const bool training = in.size() > 3 && in[3] && get(*in[3], 0) != 0;
        if (!training) return {X(0)};
        const double ratio = ratio_of(in, 2);
        Tensor r = X(0);
        for (int64_t i = 0; i < r.numel(); ++i) r.reals[i] = get(X(1), i) ? r.reals[i] / (1.0 - ratio) : 0.0;
        return {r};
      }},
      BINARY("ReluGrad", X(0).dtype, b > 0 ? a : 0.0), BINARY("SigmoidGrad", X(0).dtype, a * b * (1 - b)),
      BINARY("TanhGrad", X(0).dtype, a * (1 - b * b)),
      OP("SoftmaxGrad") {  // Y * (dY - sum(dY * Y))
        Tensor r = X(0);
        const auto &dy = X(0).reals, &y = X(1).reals;
        for_each_lane(r.shape, norm_axis(n, n.attrs.get_int("axis", -1), r.shape.size()), [&](int64_t b, int64_t s, int64_t len) {
          double acc = 0;
          for (int64_t j = 0; j < len; ++j) acc += dy[b + j * s] * y[b + j * s];
          for (int64_t j = 0; j < len; ++j) r.reals[b + j * s] = y[b + j * s] * (dy[b + j * s] - acc);
        });
        return {r};
      }},
      OP("LogSoftmaxGrad") {  // dY - exp(Y) * sum(dY)
        Tensor r = X(0);
        const auto &dy = X(0).reals, &y = X(1).reals;
        for_each_lane(r.shape, norm_axis(n, n.attrs.get_int("axis", -1), r.shape.size()), [&](int64_t b, int64_t s, int64_t len) {
          double acc = 0;
          for (int64_t j = 0; j < len; ++j) acc += dy[b + j * s];
          for (int64_t j = 0; j < len; ++j) r.reals[b + j * s] = dy[b + j * s] - std::exp(y[b + j * s]) * acc;
        });
        return {r};
      }},
      OP("SumToShape") { return {sum_to(n, X(0), ints_of(n, X(1)))}; }},
      OP("ReduceSumGrad") {
        const Dims& shape = ints_of(n, X(1));
        Tensor dy = X(0);
        Dims axes = reduce_axes(n, n.attrs.get_ints("axes", {}), shape.size());
        if (!n.attrs.get_int("keepdims", 1)) for (auto a : axes) dy.shape.insert(dy.shape.begin() + a, 1);
        return {broadcast_to(n, dy, shape)};
      }},
      OP("ReduceMeanGrad") {
        Tensor r = our_ops().at("ReduceSumGrad")(n, in).at(0);
        apply(r, [k = double(r.numel()) / double(X(0).numel())](double v) { return v / k; });
        return {r};
      }},
      OP("SoftmaxCrossEntropyLossGrad") { return {loss_grad(n, X(0), X(1), X(2), in.size() > 3 ? in[3] : nullptr, true)}; }},
      OP("NegativeLogLikelihoodLossGrad") { return {loss_grad(n, X(0), X(1), X(2), in.size() > 3 ? in[3] : nullptr, false)}; }},
  };
  return ops;
}
#undef OP
#undef X
#undef UNARY
#undef BINARY

}  // namespace

std::map<std::string, OpFn>& extra_ops() {  // "domain::op" -> fn, filled by register_op
  static std::map<std::string, OpFn> ops;
  return ops;
}

bool register_op(const std::string& domain, const std::string& op, OpFn fn) {
  if (!extra_ops().emplace(domain + "::" + op, std::move(fn)).second)
    throw std::logic_error("reference_eval: op '" + domain + "::" + op + "' registered twice");
  return true;
}

Outs eval_node(const Node& n, const Ins& in) {
  bool ours = n.domain == kOurDomain;
  if (!ours && !n.domain.empty() && n.domain != "ai.onnx") fail(n, "unknown domain '" + n.domain + "'");
  const auto& table = ours ? our_ops() : onnx_ops();
  auto it = table.find(n.op_type);
  if (it == table.end() && !ours && eval::has_op(n.domain, n.op_type)) {
    if (in.empty() || !in[0]) fail(n, "input 0 is missing");
    return eval::eval_node(n, in);  // integers exact, floats in double
  }
  if (it == table.end()) {
    it = extra_ops().find((ours ? std::string(kOurDomain) : std::string()) + "::" + n.op_type);
    if (it == extra_ops().end()) fail(n, "unsupported op '" + n.op_type + "' in domain '" + n.domain + "'");
  }
  if (in.empty() || !in[0]) {
    if (n.op_type != "Constant") fail(n, "input 0 is missing");
  }
  try {
    return it->second(n, in);
  } catch (const std::out_of_range& e) {  // in.at(i), get / set, ...: a missing input or bad index
    fail(n, std::string("missing input or index out of range (") + e.what() + ")");
  }
}

std::map<ValueId, Tensor> evaluate(const Graph& g, const std::map<ValueId, Tensor>& feeds, size_t max_nodes) {
  std::map<ValueId, Tensor> env = feeds;
  for (const auto& [id, t] : g.initializers) env.emplace(id, eval::from_data(t));
  for (size_t k = 0; k < std::min(max_nodes, g.nodes.size()); ++k) {
    const Node& n = g.nodes[k];
    Ins in;
    for (ValueId v : n.inputs) {
      if (v != kNoValue && !env.count(v)) fail(n, "input '" + g.value(v).name + "' is not defined");
      in.push_back(v == kNoValue ? nullptr : &env.at(v));
    }
    Outs out = ref::eval_node(n, in);  // not eval::eval_node, which ADL finds too
    if (n.outputs.size() > out.size()) fail(n, "node has more outputs than the op defines");
    for (size_t i = 0; i < n.outputs.size(); ++i)
      if (n.outputs[i] != kNoValue) env[n.outputs[i]] = std::move(out[i]);
  }
  return env;
}

}  // namespace torch_ort::ref
