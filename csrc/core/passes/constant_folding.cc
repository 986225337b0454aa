// Constant folding at build time: Constant nodes become initializers, and the exporter's shape
// arithmetic over constants (Shape of fully known dims, Gather/Slice picking known dims of a
// Shape, Cast/CastLike, Sqrt, Add/Sub/Mul/Div, Concat, (Un)Squeeze, Reshape, Expand, Identity) is
// evaluated once here, its result an initializer. A node folds only when every input it reads
// the data of is a constant: nothing that depends on a graph input's data or on a parameter (a
// graph input) folds; a Shape or a CastLike's type input reads only metadata. Results are
// bounded (kMaxFoldedElements) so a fold never bakes a large tensor into the graph.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_map>

#include "csrc/core/ir/limits.h"
#include "csrc/core/passes/pass.h"
#include "csrc/core/passes/pattern.h"

namespace torch_ort {
namespace {

using namespace pattern;

constexpr int64_t kMaxFoldedElements = 1024;   // largest result a fold may produce
constexpr int64_t kMaxInputElements = 1 << 16;  // larger constants are not read at all

// A small constant under evaluation: integers exactly (int64 positions reach INT64_MAX), floats
// as doubles already rounded to their dtype.
struct Const {
  DType dtype = DType::kUndefined;
  std::vector<int64_t> dims;
  std::vector<int64_t> ints;   // int32/int64/bool
  std::vector<double> reals;   // float/double/float16/bfloat16

  bool integral() const { return !is_floating(dtype); }
  int64_t numel() const { return integral() ? static_cast<int64_t>(ints.size()) : static_cast<int64_t>(reals.size()); }
  double at(int64_t i) const { return integral() ? static_cast<double>(ints[i]) : reals[i]; }
};

bool supported(DType t) {
  return t == DType::kInt64 || t == DType::kInt32 || t == DType::kBool || is_floating(t);
}

// Rounds v to the nearest value of a floating dtype (the runtime computes in that dtype).
double round_to(DType t, double v) {
  if (t == DType::kDouble) return v;
  if (t == DType::kFloat) return static_cast<double>(static_cast<float>(v));
  return TensorData::scalar_float(t, v).as_doubles()[0];  // float16 / bfloat16
}

std::optional<Const> from_data(const TensorData& t) {
  if (!supported(t.dtype) || t.numel() > kMaxInputElements) return std::nullopt;
  if (dtype_size(t.dtype) * t.numel() != static_cast<int64_t>(t.raw.size())) return std::nullopt;
  Const c{t.dtype, t.dims, {}, {}};
  if (t.dtype == DType::kBool) {
    for (unsigned char b : t.raw) c.ints.push_back(b != 0);
  } else if (c.integral()) {
    c.ints = t.as_int64s();
  } else {
    c.reals = t.as_doubles();
  }
  return c;
}

TensorData to_data(const Const& c) {
  TensorData t;
  t.dtype = c.dtype;
  t.dims = c.dims;
  auto put = [&t](const auto& x) { t.raw.append(reinterpret_cast<const char*>(&x), sizeof(x)); };
  for (int64_t i = 0; i < c.numel(); ++i) {
    switch (c.dtype) {
      case DType::kInt64: put(c.ints[i]); break;
      case DType::kInt32: put(static_cast<int32_t>(c.ints[i])); break;
      case DType::kBool: put(static_cast<uint8_t>(c.ints[i] != 0)); break;
      case DType::kFloat: put(static_cast<float>(c.reals[i])); break;
      case DType::kDouble: put(c.reals[i]); break;
      default: t.raw += TensorData::scalar_float(c.dtype, c.reals[i]).raw; break;  // 16-bit floats
    }
  }
  return t;
}

std::optional<Const> cast(const Const& x, DType to) {
  if (!supported(to)) return std::nullopt;
  Const r{to, x.dims, {}, {}};
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.at(i);
    if (to == DType::kBool) {
      r.ints.push_back(v != 0.0);
    } else if (r.integral()) {
      if (x.integral()) { r.ints.push_back(to == DType::kInt32 ? static_cast<int32_t>(x.ints[i]) : x.ints[i]); continue; }
      // float -> int truncates toward zero; out-of-range or NaN is undefined: do not fold.
      if (!std::isfinite(v) || std::fabs(v) >= 9.2e18) return std::nullopt;
      r.ints.push_back(static_cast<int64_t>(std::trunc(v)));
    } else {
      r.reals.push_back(round_to(to, x.integral() ? static_cast<double>(x.ints[i]) : v));
    }
  }
  return r;
}

// Numpy broadcasting of two shapes; nullopt when they do not broadcast.
std::optional<std::vector<int64_t>> broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t r = std::max(a.size(), b.size());
  std::vector<int64_t> out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Flat index into `dims` of the element at output position `flat` of `out` (broadcast read).
int64_t source_index(int64_t flat, const std::vector<int64_t>& out, const std::vector<int64_t>& dims) {
  int64_t src = 0, stride = 1;
  for (size_t k = out.size(); k-- > 0;) {
    const int64_t coord = flat % out[k];
    flat /= out[k];
    const size_t off = out.size() - dims.size();
    if (k >= off) {
      const int64_t d = dims[k - off];
      src += (d == 1 ? 0 : coord) * stride;
      stride *= d;
    }
  }
  return src;
}

// Element count, saturating at INT64_MAX: shapes here come from constants (an Expand or Reshape
// target may be hostile), and a saturated count is simply too large to fold. A dim over
// limits::kMaxDim saturates too, even beside a 0 ([0, 2^62] must not become an initializer).
int64_t numel_of(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims)
    if (d < 0 || d > limits::kMaxDim || __builtin_mul_overflow(n, d, &n))
      return std::numeric_limits<int64_t>::max();
  return n;
}

std::optional<Const> binary(const std::string& op, const Const& a, const Const& b) {
  if (a.dtype != b.dtype || a.dtype == DType::kBool) return std::nullopt;
  const auto dims = broadcast(a.dims, b.dims);
  if (!dims) return std::nullopt;
  const int64_t n = numel_of(*dims);
  if (n > kMaxFoldedElements) return std::nullopt;
  Const r{a.dtype, *dims, {}, {}};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t ia = source_index(i, *dims, a.dims), ib = source_index(i, *dims, b.dims);
    if (r.integral()) {
      const int64_t x = a.ints[ia], y = b.ints[ib];
      int64_t z = 0;
      bool overflow = false;
      if (op == "Add") overflow = __builtin_add_overflow(x, y, &z);
      else if (op == "Sub") overflow = __builtin_sub_overflow(x, y, &z);
      else if (op == "Mul") overflow = __builtin_mul_overflow(x, y, &z);
      else if (y == 0 || (x == std::numeric_limits<int64_t>::min() && y == -1)) overflow = true;
      else z = x / y;  // ONNX integer Div truncates, as C++ does
      if (overflow || (a.dtype == DType::kInt32 && z != static_cast<int32_t>(z))) return std::nullopt;
      r.ints.push_back(z);
    } else {
      const double x = a.reals[ia], y = b.reals[ib];
      // Exact in double and rounded once to the dtype: the correctly rounded float result.
      const double z = op == "Add" ? x + y : op == "Sub" ? x - y : op == "Mul" ? x * y : x / y;
      r.reals.push_back(round_to(r.dtype, z));
    }
  }
  return r;
}

class ConstantFolding final : public Pass {
 public:
  std::string_view name() const override { return "constant_folding"; }

  bool run(Graph& g) override {
    const GraphIndex idx(g);
    known_.clear();
    for (const auto& [v, t] : g.initializers)
      if (auto c = from_data(t)) known_.emplace(v, std::move(*c));
    auto it = g.opset_imports.find("");
    opset_ = it == g.opset_imports.end() ? 20 : it->second;

    std::vector<char> drop(g.nodes.size(), 0);
    bool changed = false;
    for (NodeId i = 0; i < static_cast<NodeId>(g.nodes.size()); ++i) {
      const Node& n = g.nodes[i];
      if (!n.domain.empty() || n.outputs.size() != 1 || n.outputs[0] == kNoValue)
        continue;
      const ValueId out = n.outputs[0];
      if (is_graph_output(g, out)) continue;  // outputs stay produced by nodes
      if (n.op_type == "Constant" && n.inputs.empty()) {
        std::optional<TensorData> data;
        try {
          data = constant_node_data(n);
        } catch (const std::exception&) {
        }
        if (!data || (g.value(out).dtype != DType::kUndefined && g.value(out).dtype != data->dtype)) continue;
        if (auto c = from_data(*data)) known_[out] = std::move(*c);
        install(g, out, std::move(*data));
        drop[i] = changed = true;
        continue;
      }
      std::optional<Const> r;
      try {
        r = evaluate(g, idx, n);
      } catch (const std::exception&) {  // a malformed attribute: leave the node to the verifier
        r.reset();
      }
      if (!r || r->numel() > kMaxFoldedElements || !fits(g.value(out), *r)) continue;
      install(g, out, to_data(*r));
      known_[out] = std::move(*r);
      drop[i] = changed = true;
    }
    erase_nodes(g, drop);
    return changed;
  }

 private:
  std::unordered_map<ValueId, Const> known_;  // values whose data is a (small) constant
  int64_t opset_ = 20;

  const Const* data(const Node& n, size_t i) const {
    if (!has_input(n, i)) return nullptr;
    auto it = known_.find(n.inputs[i]);
    return it == known_.end() ? nullptr : &it->second;
  }

  // The result agrees with what the graph says of the value (a disagreement is left to the verifier).
  static bool fits(const Value& v, const Const& r) {
    if (v.dtype != DType::kUndefined && v.dtype != r.dtype) return false;
    if (!v.shape.rank_known) return true;
    if (v.shape.dims.size() != r.dims.size()) return false;
    for (size_t k = 0; k < r.dims.size(); ++k)
      if (v.shape.dims[k].is_known() && v.shape.dims[k].value != r.dims[k]) return false;
    return true;
  }

  static void install(Graph& g, ValueId v, TensorData t) {
    Value& val = g.value(v);
    val.dtype = t.dtype;
    std::vector<Dim> dims;
    for (int64_t d : t.dims) dims.push_back(Dim::known(d));
    val.shape = Shape::of(std::move(dims));
    g.initializers[v] = std::move(t);
  }

  // The elements of a 1-D int64 value, each known or not: a constant, or the output of a Shape
  // node (a known dim is known even when its neighbours are symbolic).
  std::optional<std::vector<std::optional<int64_t>>> int_elements(const Graph& g, const GraphIndex& idx,
                                                                  const Node& n, size_t i) const {
    if (const Const* c = data(n, i)) {
      if (c->dtype != DType::kInt64 || c->dims.size() != 1) return std::nullopt;
      return std::vector<std::optional<int64_t>>(c->ints.begin(), c->ints.end());
    }
    const Node* p = has_input(n, i) ? producer(g, idx, n.inputs[i]) : nullptr;
    if (!p || !is_onnx(*p, "Shape") || !has_input(*p, 0)) return std::nullopt;
    const auto dims = shape_dims(g, *p);
    if (!dims) return std::nullopt;
    std::vector<std::optional<int64_t>> e;
    for (const Dim& d : *dims) e.push_back(d.is_known() ? std::optional<int64_t>(d.value) : std::nullopt);
    return e;
  }

  // Dims of Shape(x)[start:end] from x's static shape; nullopt when x's rank is unknown.
  static std::optional<std::vector<Dim>> shape_dims(const Graph& g, const Node& shape) {
    const Shape& s = g.value(shape.inputs[0]).shape;
    if (!s.rank_known) return std::nullopt;
    const int64_t r = s.rank();
    int64_t start = shape.attrs.get_int("start", 0), end = shape.attrs.get_int("end", r);
    if (start < 0) start += r;
    if (end < 0) end += r;
    start = std::clamp<int64_t>(start, 0, r);
    end = std::clamp<int64_t>(end, 0, r);
    return std::vector<Dim>(s.dims.begin() + start, s.dims.begin() + std::max(start, end));
  }

  static std::optional<Const> int64_vector(const std::vector<std::optional<int64_t>>& e, bool scalar) {
    Const r{DType::kInt64, {}, {}, {}};
    if (!scalar) r.dims = {static_cast<int64_t>(e.size())};
    for (const auto& x : e) {
      if (!x) return std::nullopt;  // a symbolic dim: known only at run time
      r.ints.push_back(*x);
    }
    return r;
  }

  std::optional<Const> evaluate(const Graph& g, const GraphIndex& idx, const Node& n) const {
    const std::string& op = n.op_type;
    if (op == "Shape") {
      if (!has_input(n, 0)) return std::nullopt;
      const auto dims = shape_dims(g, n);
      if (!dims) return std::nullopt;
      std::vector<std::optional<int64_t>> e;
      for (const Dim& d : *dims) e.push_back(d.is_known() ? std::optional<int64_t>(d.value) : std::nullopt);
      return int64_vector(e, false);
    }
    if (op == "CastLike") {  // input 1 gives only its dtype
      const Const* x = data(n, 0);
      if (!x || !has_input(n, 1)) return std::nullopt;
      return cast(*x, g.value(n.inputs[1]).dtype);
    }
    if (op == "Gather") return gather(g, idx, n);
    if (op == "Slice") return slice(g, idx, n);
    // The rest read the data of every present input.
    std::vector<const Const*> in;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (!has_input(n, k)) { in.push_back(nullptr); continue; }
      if (!data(n, k)) return std::nullopt;
      in.push_back(data(n, k));
    }
    if (in.empty() || !in[0]) return std::nullopt;
    const Const& x = *in[0];
    if (op == "Identity") return x;
    if (op == "Cast") return cast(x, static_cast<DType>(n.attrs.get_int("to", 0)));
    if (op == "Sqrt") {
      if (x.integral()) return std::nullopt;
      Const r = x;
      for (double& v : r.reals) v = round_to(r.dtype, std::sqrt(v));
      return r;
    }
    if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
      if (in.size() != 2 || !in[1]) return std::nullopt;
      return binary(op, x, *in[1]);
    }
    if (op == "Concat") return concat(n, in);
    if (op == "Unsqueeze" || op == "Squeeze") return squeeze(n, in, op == "Unsqueeze");
    if (op == "Reshape") return reshape(n, in);
    if (op == "Expand") return expand(in);
    return std::nullopt;
  }

  std::optional<Const> gather(const Graph& g, const GraphIndex& idx, const Node& n) const {
    const Const* ind = data(n, 1);
    if (!ind || !ind->integral() || ind->dtype == DType::kBool) return std::nullopt;
    const Const* c = data(n, 0);
    if (!c) {  // Gather(Shape(x), idx): the picked dims may be known though others are symbolic
      const auto e = int_elements(g, idx, n, 0);
      const int64_t axis = n.attrs.get_int("axis", 0);
      if (!e || (axis != 0 && axis != -1)) return std::nullopt;
      std::vector<std::optional<int64_t>> picked;
      const int64_t len = static_cast<int64_t>(e->size());
      for (int64_t k : ind->ints) {
        if (k < -len || k >= len) return std::nullopt;
        picked.push_back((*e)[k < 0 ? k + len : k]);
      }
      std::optional<Const> r = int64_vector(picked, ind->dims.empty());
      if (r) r->dims = ind->dims;
      return r;
    }
    const int64_t rank = static_cast<int64_t>(c->dims.size());
    int64_t axis = n.attrs.get_int("axis", 0);
    if (rank == 0 || axis < -rank || axis >= rank) return std::nullopt;
    if (axis < 0) axis += rank;
    // out = data.dims[:axis] + indices.dims + data.dims[axis+1:]
    int64_t outer = 1, inner = 1;
    for (int64_t k = 0; k < axis; ++k) outer *= c->dims[k];
    for (int64_t k = axis + 1; k < rank; ++k) inner *= c->dims[k];
    const int64_t len = c->dims[axis];
    Const r{c->dtype, {}, {}, {}};
    r.dims.assign(c->dims.begin(), c->dims.begin() + axis);
    r.dims.insert(r.dims.end(), ind->dims.begin(), ind->dims.end());
    r.dims.insert(r.dims.end(), c->dims.begin() + axis + 1, c->dims.end());
    if (numel_of(r.dims) > kMaxFoldedElements) return std::nullopt;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t k : ind->ints) {
        if (k < -len || k >= len) return std::nullopt;
        const int64_t kk = k < 0 ? k + len : k;
        for (int64_t in = 0; in < inner; ++in) {
          const int64_t src = (o * len + kk) * inner + in;
          if (c->integral()) r.ints.push_back(c->ints[src]);
          else r.reals.push_back(c->reals[src]);
        }
      }
    return r;
  }

  // Slice of a 1-D value (the exporter slices Shape vectors): starts/ends/axes/steps constant.
  std::optional<Const> slice(const Graph& g, const GraphIndex& idx, const Node& n) const {
    if (n.inputs.size() < 3) return std::nullopt;  // opset < 10 (attribute form): not emitted
    for (size_t k = 1; k < n.inputs.size(); ++k)
      if (has_input(n, k) && (!data(n, k) || !data(n, k)->integral())) return std::nullopt;
    const Const* c = data(n, 0);
    std::optional<std::vector<std::optional<int64_t>>> e;
    if (c) {
      if (c->dims.size() != 1) return std::nullopt;
      if (c->integral()) e.emplace(c->ints.begin(), c->ints.end());
    } else {
      e = int_elements(g, idx, n, 0);
    }
    if (!e && !c) return std::nullopt;
    const int64_t len = c ? c->dims[0] : static_cast<int64_t>(e->size());
    const auto one = [&](size_t k, int64_t dflt) -> std::optional<int64_t> {
      if (!has_input(n, k)) return dflt;
      const Const* v = data(n, k);
      if (v->numel() != 1) return std::nullopt;
      return v->ints[0];
    };
    const auto start0 = one(1, 0), end0 = one(2, len), axis = one(3, 0), step = one(4, 1);
    if (!start0 || !end0 || !axis || !step || (*axis != 0 && *axis != -1) || *step == 0) return std::nullopt;
    // ONNX clamping: starts to [0, len] ([0, len-1] for negative steps), ends likewise ([-1, len-1]).
    auto clamp = [&](int64_t v, bool is_end) {
      if (v < 0) v = v < std::numeric_limits<int64_t>::min() / 2 ? -len - 1 : v + len;
      if (*step > 0) return std::clamp<int64_t>(v, 0, len);
      return std::clamp<int64_t>(v, is_end ? -1 : 0, len - 1);
    };
    const int64_t s = clamp(*start0, false), t = clamp(*end0, true);
    std::vector<int64_t> picked;
    // k stays in [-1, len]; stop before k += step could overflow (a step near INT64_MAX).
    for (int64_t k = s; *step > 0 ? k < t : k > t;) {
      picked.push_back(k);
      if (__builtin_add_overflow(k, *step, &k)) break;
    }
    if (static_cast<int64_t>(picked.size()) > kMaxFoldedElements) return std::nullopt;
    if (c && !c->integral()) {
      Const r{c->dtype, {static_cast<int64_t>(picked.size())}, {}, {}};
      for (int64_t k : picked) r.reals.push_back(c->reals[k]);
      return r;
    }
    std::vector<std::optional<int64_t>> out;
    for (int64_t k : picked) out.push_back((*e)[k]);
    std::optional<Const> r = int64_vector(out, false);
    if (r && c) r->dtype = c->dtype;
    return r;
  }

  static std::optional<Const> concat(const Node& n, const std::vector<const Const*>& in) {
    const Const& x = *in[0];
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    int64_t axis = n.attrs.get_int("axis", 0);
    if (rank == 0 || axis < -rank || axis >= rank) return std::nullopt;
    if (axis < 0) axis += rank;
    Const r{x.dtype, x.dims, {}, {}};
    r.dims[axis] = 0;
    for (const Const* c : in) {
      if (!c || c->dtype != x.dtype || c->dims.size() != x.dims.size()) return std::nullopt;
      for (int64_t k = 0; k < rank; ++k)
        if (k != axis && c->dims[k] != x.dims[k]) return std::nullopt;
      r.dims[axis] += c->dims[axis];
    }
    if (numel_of(r.dims) > kMaxFoldedElements) return std::nullopt;
    int64_t outer = 1;
    for (int64_t k = 0; k < axis; ++k) outer *= x.dims[k];
    for (int64_t o = 0; o < outer; ++o)
      for (const Const* c : in) {
        const int64_t chunk = c->numel() / std::max<int64_t>(outer, 1);
        for (int64_t j = 0; j < chunk; ++j) {
          if (c->integral()) r.ints.push_back(c->ints[o * chunk + j]);
          else r.reals.push_back(c->reals[o * chunk + j]);
        }
      }
    return r;
  }

  std::optional<Const> squeeze(const Node& n, const std::vector<const Const*>& in, bool unsqueeze) const {
    std::vector<int64_t> axes;
    if (opset_ >= 13) {
      if (in.size() > 1 && in[1]) axes = in[1]->ints;
      else if (unsqueeze) return std::nullopt;
    } else {
      axes = n.attrs.get_ints("axes", {});
    }
    Const r = *in[0];
    if (unsqueeze) {
      const int64_t out_rank = static_cast<int64_t>(r.dims.size() + axes.size());
      std::vector<char> is_new(out_rank, 0);
      for (int64_t a : axes) {
        if (a < -out_rank || a >= out_rank) return std::nullopt;
        if (is_new[a < 0 ? a + out_rank : a]++) return std::nullopt;
      }
      std::vector<int64_t> dims;
      size_t k = 0;
      for (int64_t d = 0; d < out_rank; ++d) dims.push_back(is_new[d] ? 1 : r.dims[k++]);
      r.dims = std::move(dims);
      return r;
    }
    const int64_t rank = static_cast<int64_t>(r.dims.size());
    std::vector<char> gone(rank, 0);
    if (axes.empty()) {
      for (int64_t d = 0; d < rank; ++d) gone[d] = r.dims[d] == 1;
    } else {
      for (int64_t a : axes) {
        if (a < -rank || a >= rank || r.dims[a < 0 ? a + rank : a] != 1) return std::nullopt;
        gone[a < 0 ? a + rank : a] = 1;
      }
    }
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < rank; ++d)
      if (!gone[d]) dims.push_back(r.dims[d]);
    r.dims = std::move(dims);
    return r;
  }

  // Expand(data, shape): numpy broadcast of data onto shape (HF's `new_ones` scalars).
  static std::optional<Const> expand(const std::vector<const Const*>& in) {
    if (in.size() < 2 || !in[1] || in[1]->dtype != DType::kInt64) return std::nullopt;
    const Const& x = *in[0];
    const auto dims = broadcast(x.dims, in[1]->ints);
    if (!dims || numel_of(*dims) > kMaxFoldedElements) return std::nullopt;
    Const r{x.dtype, *dims, {}, {}};
    for (int64_t i = 0; i < numel_of(*dims); ++i) {
      const int64_t src = source_index(i, *dims, x.dims);
      if (x.integral()) r.ints.push_back(x.ints[src]);
      else r.reals.push_back(x.reals[src]);
    }
    return r;
  }

  static std::optional<Const> reshape(const Node& n, const std::vector<const Const*>& in) {
    if (in.size() < 2 || !in[1] || in[1]->dtype != DType::kInt64) return std::nullopt;
    Const r = *in[0];
    const bool allowzero = n.attrs.get_int("allowzero", 0) != 0;
    std::vector<int64_t> dims = in[1]->ints;
    int64_t infer = -1, known = 1;
    for (size_t k = 0; k < dims.size(); ++k) {
      if (dims[k] == 0 && !allowzero) {
        if (k >= r.dims.size()) return std::nullopt;
        dims[k] = r.dims[k];
      }
      if (dims[k] == -1) {
        if (infer >= 0) return std::nullopt;
        infer = static_cast<int64_t>(k);
      } else if (dims[k] < 0) {
        return std::nullopt;
      } else if (__builtin_mul_overflow(known, dims[k], &known)) {
        return std::nullopt;  // a target this large never matches a foldable constant
      }
    }
    if (infer >= 0) {
      if (known == 0 || r.numel() % known != 0) return std::nullopt;
      dims[infer] = r.numel() / known;
    }
    if (numel_of(dims) != r.numel()) return std::nullopt;
    r.dims = std::move(dims);
    return r;
  }
};

}  // namespace

std::unique_ptr<Pass> make_constant_folding_pass() { return std::make_unique<ConstantFolding>(); }

}  // namespace torch_ort
