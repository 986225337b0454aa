// The evaluator's ops (eval/eval.h): one plain loop per op, numpy broadcasting, exact integers.
#include "csrc/core/eval/eval.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

namespace torch_ort::eval {
namespace {

using Outs = std::vector<Tensor>;
using OpFn = std::function<Outs(const Node&, const Ins&, const Options&)>;

[[noreturn]] void fail(const Node& n, const std::string& why) {
  throw EvalError("eval: " + n.op_type + " (node " + n.name + "): " + why);
}
const Tensor& arg(const Node& n, const Ins& in, size_t i) {
  if (in.size() <= i || !in[i]) fail(n, "input " + std::to_string(i) + " is missing");
  return *in[i];
}
const Tensor* opt_arg(const Ins& in, size_t i) { return in.size() > i ? in[i] : nullptr; }
const Dims& int_arg(const Node& n, const Tensor& t, const char* what) {
  if (!t.integral() || t.dtype == DType::kBool) fail(n, std::string(what) + " must be integers");
  return t.ints;
}
std::string str(const Dims& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s.append(i ? "," : "").append(std::to_string(d[i]));
  return s + ")";
}
int64_t norm_axis(const Node& n, int64_t a, int64_t rank) {
  if (a < -rank || a >= rank) fail(n, "axis " + std::to_string(a) + " out of range for rank " + std::to_string(rank));
  return a < 0 ? a + rank : a;
}
void check_size(const Node& n, const Dims& shape, const Options& opts) {
  if (numel_of(shape) > opts.max_elements) fail(n, "result " + str(shape) + " is too large");
}
int64_t prod(const Dims& s, size_t b, size_t e) {
  int64_t p = 1;
  for (size_t k = b; k < std::min(e, s.size()); ++k) p *= s[k];
  return p;
}

// Numpy broadcasting of two shapes.
Dims broadcast(const Node& n, const Dims& a, const Dims& b) {
  const size_t r = std::max(a.size(), b.size());
  Dims out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) fail(n, "shapes " + str(a) + " and " + str(b) + " do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}
// Flat index into `dims` of the element at output position `flat` of `out` (broadcast read).
int64_t source_index(int64_t flat, const Dims& out, const Dims& dims) {
  int64_t src = 0, stride = 1;
  const size_t off = out.size() - dims.size();
  for (size_t k = out.size(); k-- > 0;) {
    const int64_t coord = flat % out[k];
    flat /= out[k];
    if (k >= off) {
      const int64_t d = dims[k - off];
      src += (d == 1 ? 0 : coord) * stride;
      stride *= d;
    }
  }
  return src;
}

Tensor cast(const Node& n, const Tensor& x, DType to) {
  if (dtype_size(to) == 0) fail(n, "cannot cast to " + std::string(dtype_name(to)));
  Tensor r{to, x.shape, {}, {}};
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.at(i);
    if (to == DType::kBool) {
      r.ints.push_back(x.integral() ? x.ints[i] != 0 : v != 0.0);
    } else if (r.integral()) {
      if (x.integral()) { r.ints.push_back(to == DType::kInt32 ? static_cast<int32_t>(x.ints[i]) : x.ints[i]); continue; }
      // float -> int truncates toward zero; out-of-range or NaN is undefined.
      if (!std::isfinite(v) || std::fabs(v) >= 9.2e18) fail(n, "value " + std::to_string(v) + " has no integer");
      r.ints.push_back(static_cast<int64_t>(std::trunc(v)));
    } else {
      r.reals.push_back(v);
    }
  }
  return r;
}

Tensor binary(const Node& n, const Tensor& a, const Tensor& b, const Options& opts) {
  const std::string& op = n.op_type;
  if (a.dtype != b.dtype) fail(n, "operands of different dtypes");
  if (a.dtype == DType::kBool) fail(n, "arithmetic on bool");
  const Dims dims = broadcast(n, a.shape, b.shape);
  check_size(n, dims, opts);
  Tensor r{a.dtype, dims, {}, {}};
  const int64_t total = numel_of(dims);
  for (int64_t i = 0; i < total; ++i) {
    const int64_t ia = source_index(i, dims, a.shape), ib = source_index(i, dims, b.shape);
    if (r.integral()) {
      const int64_t x = a.ints[ia], y = b.ints[ib];
      int64_t z = 0;
      bool overflow = false;
      if (op == "Add") overflow = __builtin_add_overflow(x, y, &z);
      else if (op == "Sub") overflow = __builtin_sub_overflow(x, y, &z);
      else if (op == "Mul") overflow = __builtin_mul_overflow(x, y, &z);
      else if (y == 0) fail(n, "integer division by zero");
      else if (x == std::numeric_limits<int64_t>::min() && y == -1) overflow = true;
      else z = x / y;  // ONNX integer Div truncates, as C++ does
      if (overflow || (a.dtype == DType::kInt32 && z != static_cast<int32_t>(z))) fail(n, "integer overflow");
      r.ints.push_back(z);
    } else {
      const double x = a.reals[ia], y = b.reals[ib];
      r.reals.push_back(op == "Add" ? x + y : op == "Sub" ? x - y : op == "Mul" ? x * y : x / y);
    }
  }
  return r;
}

Dims axes_of(const Node& n, const Ins& in) {
  if (const Tensor* a = opt_arg(in, 1)) return int_arg(n, *a, "axes");
  return n.attrs.get_ints("axes", {});
}

Tensor squeeze(const Node& n, const Ins& in) {
  Tensor r = arg(n, in, 0);
  const Dims axes = axes_of(n, in);
  const int64_t rank = static_cast<int64_t>(r.shape.size());
  std::vector<char> gone(rank, 0);
  if (axes.empty()) {
    for (int64_t d = 0; d < rank; ++d) gone[d] = r.shape[d] == 1;
  } else {
    for (int64_t a : axes) {
      const int64_t d = norm_axis(n, a, rank);
      if (r.shape[d] != 1) fail(n, "squeezed dim " + std::to_string(d) + " is not 1");
      gone[d] = 1;
    }
  }
  Dims dims;
  for (int64_t d = 0; d < rank; ++d)
    if (!gone[d]) dims.push_back(r.shape[d]);
  r.shape = std::move(dims);
  return r;
}

Tensor unsqueeze(const Node& n, const Ins& in) {
  Tensor r = arg(n, in, 0);
  const Dims axes = axes_of(n, in);
  const int64_t out_rank = static_cast<int64_t>(r.shape.size() + axes.size());
  std::vector<char> is_new(out_rank, 0);
  for (int64_t a : axes)
    if (is_new[norm_axis(n, a, out_rank)]++) fail(n, "axis " + std::to_string(a) + " repeated");
  Dims dims;
  size_t k = 0;
  for (int64_t d = 0; d < out_rank; ++d) dims.push_back(is_new[d] ? 1 : r.shape[k++]);
  r.shape = std::move(dims);
  return r;
}

Tensor reshape(const Node& n, const Ins& in) {
  Tensor r = arg(n, in, 0);
  const Tensor& s = arg(n, in, 1);
  if (s.dtype != DType::kInt64) fail(n, "shape must be int64");
  const bool allowzero = n.attrs.get_int("allowzero", 0) != 0;
  Dims dims = s.ints;
  int64_t infer = -1, known = 1;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] == 0 && !allowzero) {
      if (k >= r.shape.size()) fail(n, "0 copies a dim the input does not have");
      dims[k] = r.shape[k];
    }
    if (dims[k] == -1) {
      if (infer >= 0) fail(n, "more than one -1");
      infer = static_cast<int64_t>(k);
    } else if (dims[k] < 0) {
      fail(n, "negative dim " + std::to_string(dims[k]));
    } else if (__builtin_mul_overflow(known, dims[k], &known)) {
      fail(n, "target " + str(s.ints) + " is too large");
    }
  }
  const int64_t total = r.numel();
  if (infer >= 0) {
    if (known == 0 || total % known != 0) fail(n, "cannot infer the -1 of " + str(s.ints));
    dims[infer] = total / known;
  }
  if (numel_of(dims) != total) fail(n, "cannot reshape " + str(r.shape) + " to " + str(s.ints));
  r.shape = std::move(dims);
  return r;
}

Tensor expand(const Node& n, const Ins& in, const Options& opts) {
  const Tensor& x = arg(n, in, 0);
  const Tensor& s = arg(n, in, 1);
  if (s.dtype != DType::kInt64) fail(n, "shape must be int64");
  const Dims dims = broadcast(n, x.shape, s.ints);
  check_size(n, dims, opts);
  Tensor r{x.dtype, dims, {}, {}};
  for (int64_t i = 0, total = numel_of(dims); i < total; ++i) r.push(x, source_index(i, dims, x.shape));
  return r;
}

Tensor concat(const Node& n, const Ins& in, const Options& opts) {
  const Tensor& x = arg(n, in, 0);
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) fail(n, "Concat of scalars");
  const int64_t axis = norm_axis(n, n.attrs.get_int("axis", 0), rank);
  Dims dims = x.shape;
  dims[axis] = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    const Tensor& c = arg(n, in, k);
    if (c.dtype != x.dtype || c.shape.size() != x.shape.size()) fail(n, "inputs differ in dtype or rank");
    for (int64_t d = 0; d < rank; ++d)
      if (d != axis && c.shape[d] != x.shape[d]) fail(n, "shapes " + str(x.shape) + " and " + str(c.shape) + " differ");
    dims[axis] += c.shape[axis];
  }
  check_size(n, dims, opts);
  Tensor r{x.dtype, dims, {}, {}};
  const int64_t outer = prod(x.shape, 0, axis);
  for (int64_t o = 0; o < outer; ++o)
    for (const Tensor* c : in) {
      const int64_t chunk = prod(c->shape, axis, c->shape.size());
      for (int64_t j = 0; j < chunk; ++j) r.push(*c, o * chunk + j);
    }
  return r;
}

Tensor gather(const Node& n, const Ins& in, const Options& opts) {
  const Tensor& x = arg(n, in, 0);
  const Dims& idx = int_arg(n, arg(n, in, 1), "indices");
  const Dims& idx_shape = in[1]->shape;
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) fail(n, "Gather from a scalar");
  const int64_t axis = norm_axis(n, n.attrs.get_int("axis", 0), rank);
  // out = data.dims[:axis] + indices.dims + data.dims[axis+1:]
  Dims dims(x.shape.begin(), x.shape.begin() + axis);
  dims.insert(dims.end(), idx_shape.begin(), idx_shape.end());
  dims.insert(dims.end(), x.shape.begin() + axis + 1, x.shape.end());
  check_size(n, dims, opts);
  const int64_t outer = prod(x.shape, 0, axis), len = x.shape[axis], inner = prod(x.shape, axis + 1, x.shape.size());
  Tensor r{x.dtype, dims, {}, {}};
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k : idx) {
      if (k < -len || k >= len) fail(n, "index " + std::to_string(k) + " out of range for " + std::to_string(len));
      const int64_t kk = k < 0 ? k + len : k;
      for (int64_t i = 0; i < inner; ++i) r.push(x, (o * len + kk) * inner + i);
    }
  return r;
}

Tensor slice(const Node& n, const Ins& in, const Options& opts) {
  const Tensor& x = arg(n, in, 0);
  auto ints_at = [&](size_t i) { const Tensor* t = opt_arg(in, i); return t ? int_arg(n, *t, "slice bounds") : Dims{}; };
  if (!opt_arg(in, 1) || !opt_arg(in, 2)) fail(n, "starts and ends are required");
  const std::vector<Dims> pick = slice_picks(n, x.shape, ints_at(1), ints_at(2), ints_at(3), ints_at(4));
  Dims dims;
  for (const Dims& p : pick) dims.push_back(static_cast<int64_t>(p.size()));
  check_size(n, dims, opts);
  Tensor r{x.dtype, dims, {}, {}};
  const int64_t total = numel_of(dims);
  Dims at(dims.size());
  for (int64_t i = 0; i < total; ++i) {
    int64_t lin = i, src = 0;
    for (size_t d = dims.size(); d-- > 0;) { at[d] = lin % dims[d]; lin /= dims[d]; }
    for (size_t d = 0; d < dims.size(); ++d) src = src * x.shape[d] + pick[d][at[d]];
    r.push(x, src);
  }
  return r;
}

#define OP(name) {name, []([[maybe_unused]] const Node& n, [[maybe_unused]] const Ins& in, [[maybe_unused]] const Options& opts) -> Outs

const std::map<std::string, OpFn>& ops() {
  static const std::map<std::string, OpFn> table = {
      OP("Identity") { return {arg(n, in, 0)}; }},
      OP("Shape") {
        const Tensor& x = arg(n, in, 0);
        const auto [b, e] = shape_range(n.attrs, static_cast<int64_t>(x.shape.size()));
        const Dims d(x.shape.begin() + b, x.shape.begin() + e);
        return {Tensor::of_ints(DType::kInt64, {static_cast<int64_t>(d.size())}, d)};
      }},
      OP("Cast") { return {cast(n, arg(n, in, 0), static_cast<DType>(n.attrs.get_int("to", 0)))}; }},
      OP("CastLike") { return {cast(n, arg(n, in, 0), arg(n, in, 1).dtype)}; }},  // input 1: its dtype only
      OP("Sqrt") {
        Tensor r = arg(n, in, 0);
        if (r.integral()) fail(n, "Sqrt of integers");
        for (double& v : r.reals) v = std::sqrt(v);
        return {r};
      }},
      OP("Add") { return {binary(n, arg(n, in, 0), arg(n, in, 1), opts)}; }},
      OP("Sub") { return {binary(n, arg(n, in, 0), arg(n, in, 1), opts)}; }},
      OP("Mul") { return {binary(n, arg(n, in, 0), arg(n, in, 1), opts)}; }},
      OP("Div") { return {binary(n, arg(n, in, 0), arg(n, in, 1), opts)}; }},
      OP("Concat") { return {concat(n, in, opts)}; }},
      OP("Squeeze") { return {squeeze(n, in)}; }},
      OP("Unsqueeze") { return {unsqueeze(n, in)}; }},
      OP("Reshape") { return {reshape(n, in)}; }},
      OP("Expand") { return {expand(n, in, opts)}; }},
      OP("Gather") { return {gather(n, in, opts)}; }},
      OP("Slice") { return {slice(n, in, opts)}; }},
  };
  return table;
}
#undef OP

bool default_domain(const std::string& d) { return d.empty() || d == "ai.onnx"; }

}  // namespace

std::pair<int64_t, int64_t> shape_range(const Attributes& attrs, int64_t rank) {
  int64_t start = attrs.get_int("start", 0), end = attrs.get_int("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, 0, rank);
  return {start, std::max(start, end)};
}

std::vector<Dims> slice_picks(const Node& n, const Dims& shape, const Dims& starts, const Dims& ends,
                              Dims axes, Dims steps) {
  if (axes.empty()) { axes.resize(starts.size()); std::iota(axes.begin(), axes.end(), 0); }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    fail(n, "starts, ends, axes and steps differ in length");
  std::vector<Dims> pick;
  for (int64_t s : shape) { pick.emplace_back(s); std::iota(pick.back().begin(), pick.back().end(), 0); }
  std::vector<char> seen(shape.size(), 0);
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t a = norm_axis(n, axes[i], static_cast<int64_t>(shape.size())), len = shape[a], step = steps[i];
    if (seen[a]++) fail(n, "axis " + std::to_string(axes[i]) + " repeated");
    if (step == 0) fail(n, "step 0");
    // ONNX clamping: starts to [0, len] ([0, len-1] for negative steps), ends likewise ([-1, len-1]).
    auto clamp = [&](int64_t v, bool is_end) {
      if (v < 0) v = v < std::numeric_limits<int64_t>::min() / 2 ? -len - 1 : v + len;
      if (step > 0) return std::clamp<int64_t>(v, 0, len);
      return std::clamp<int64_t>(v, is_end ? -1 : 0, len - 1);
    };
    const int64_t b = clamp(starts[i], false), e = clamp(ends[i], true);
    pick[a].clear();
    // k stays in [-1, len]; stop before k += step could overflow (a step near INT64_MAX).
    for (int64_t k = b; step > 0 ? k < e : k > e;) {
      pick[a].push_back(k);
      if (__builtin_add_overflow(k, step, &k)) break;
    }
  }
  return pick;
}

bool has_op(const std::string& domain, const std::string& op_type) {
  return default_domain(domain) && ops().count(op_type) != 0;
}

std::vector<Tensor> eval_node(const Node& n, const Ins& in, const Options& opts) {
  if (!default_domain(n.domain)) fail(n, "unknown domain '" + n.domain + "'");
  auto it = ops().find(n.op_type);
  if (it == ops().end()) fail(n, "unsupported op '" + n.op_type + "'");
  for (const Tensor* t : in)
    if (t && static_cast<int64_t>(t->integral() ? t->ints.size() : t->reals.size()) != numel_of(t->shape))
      fail(n, "an input's data does not match its shape " + str(t->shape));
  return it->second(n, in, opts);
}

}  // namespace torch_ort::eval
