// Reference evaluator, indexing family: index-by-index loops for Gather*, Slice, Split,
// Concat's gradient, Tile and Pad (comparisons, Max/Min, Trilu, Range: reference_eval_compare.cc).
#include <functional>
#include <numeric>
#include <stdexcept>

#include "csrc/core/eval/eval.h"
#include "tests/cpp/reference_eval.h"

namespace torch_ort::ref {
namespace {

int64_t axis_of(const Node& n, int64_t a, size_t rank) {
  const int64_t r = int64_t(rank);
  if (a < -r || a >= r) fail(n, "axis " + std::to_string(a) + " out of range");
  return a < 0 ? a + r : a;
}
int64_t wrap(const Node& n, int64_t v, int64_t dim) {
  int64_t i = v < 0 ? v + dim : v;
  if (i < 0 || i >= dim) fail(n, "index " + std::to_string(v) + " out of range for " + std::to_string(dim));
  return i;
}

// Elements picked per axis (a cartesian product): out[i, j, ...] = x[pick[0][i], pick[1][j], ...].
// `scatter` runs it backwards: x (zeros of `shape`) += dy at the picked places.
Tensor select(const Tensor& x, const std::vector<Dims>& pick) {
  Dims s;
  for (const Dims& p : pick) s.push_back(int64_t(p.size()));
  Tensor r{x.dtype, s, {}, {}};
  for (int64_t i = 0; i < prod(s); ++i) {
    Dims idx = unravel(i, s);
    for (size_t d = 0; d < idx.size(); ++d) idx[d] = pick[d][idx[d]];
    r.push(x, ravel(idx, x.shape));
  }
  return r;
}
Tensor scatter(const Tensor& dy, const Dims& shape, const std::vector<Dims>& pick) {
  Tensor r = zeros(dy.dtype, shape);
  for (int64_t i = 0; i < dy.numel(); ++i) {
    Dims idx = unravel(i, dy.shape);
    for (size_t d = 0; d < idx.size(); ++d) idx[d] = pick[d][idx[d]];
    r.reals[ravel(idx, shape)] += dy.reals[i];
  }
  return r;
}
std::vector<Dims> all_of(const Dims& shape) {
  std::vector<Dims> pick;
  for (int64_t s : shape) { pick.emplace_back(s); std::iota(pick.back().begin(), pick.back().end(), 0); }
  return pick;
}

// Slice's picks, from the core evaluator: (data or shape, starts, ends, axes?, steps?) at inputs
// [first, first+4).
std::vector<Dims> slice_pick(const Node& n, const Dims& shape, const Ins& in, size_t first) {
  auto opt = [&](size_t i) { return in.size() > i && in[i] ? ints_of(n, *in[i]) : Dims{}; };
  return eval::slice_picks(n, shape, opt(first), opt(first + 1), opt(first + 2), opt(first + 3));
}

// Split sizes: the split input, else num_outputs / the output count (ceil chunks, smaller last).
Dims split_sizes(const Node& n, int64_t dim, const Tensor* split, int64_t n_out) {
  if (split) return ints_of(n, *split);
  const int64_t k = n.attrs.get_int("num_outputs", n_out), chunk = (dim + k - 1) / k;
  Dims s(k, chunk);
  s.back() = dim - chunk * (k - 1);
  return s;
}
std::vector<Dims> chunk_pick(const Dims& shape, int64_t axis, const Dims& sizes, size_t k) {
  std::vector<Dims> pick = all_of(shape);
  const int64_t off = std::accumulate(sizes.begin(), sizes.begin() + k, int64_t{0});
  pick[axis].resize(sizes[k]);
  std::iota(pick[axis].begin(), pick[axis].end(), off);
  return pick;
}

#define X(i) (*in.at(i))

// GatherND visits (batch..., m...) positions p of indices; each addresses a contiguous run of
// `inner` data elements at `offset(p)`.
void gather_nd_walk(const Node& n, const Dims& data, const Tensor& idx,
                    const std::function<void(int64_t out, int64_t in, int64_t inner)>& f) {
  const int64_t b = n.attrs.get_int("batch_dims", 0), k = idx.shape.back();
  const Dims lead(idx.shape.begin(), idx.shape.end() - 1);
  const Dims& ix = ints_of(n, idx);
  const int64_t inner = prod(data, b + k);
  for (int64_t p = 0; p < prod(lead); ++p) {
    Dims at = unravel(p, lead), full(data.size(), 0);
    for (int64_t d = 0; d < b; ++d) full[d] = at[d];
    for (int64_t j = 0; j < k; ++j) full[b + j] = wrap(n, ix[p * k + j], data[b + j]);
    f(p * inner, ravel(full, data), inner);
  }
}
// Gather / GatherElements: (out index, data index) pairs.
void gather_walk(const Node& n, const Dims& data, const Tensor& idx, bool elements,
                 const std::function<void(int64_t, int64_t)>& f) {
  const int64_t axis = axis_of(n, n.attrs.get_int("axis", 0), data.size());
  Dims out = elements ? idx.shape : Dims(data.begin(), data.begin() + axis);
  const Dims& ix = ints_of(n, idx);
  if (!elements) {
    out.insert(out.end(), idx.shape.begin(), idx.shape.end());
    out.insert(out.end(), data.begin() + axis + 1, data.end());
  }
  for (int64_t i = 0; i < prod(out); ++i) {
    Dims o = unravel(i, out), d;
    if (elements) {
      d = o;
      d[axis] = wrap(n, ix[i], data[axis]);
    } else {
      const size_t q = idx.shape.size();
      d.assign(o.begin(), o.begin() + axis);
      d.push_back(wrap(n, ix[ravel(Dims(o.begin() + axis, o.begin() + axis + q), idx.shape)], data[axis]));
      d.insert(d.end(), o.begin() + axis + q, o.end());
    }
    f(i, ravel(d, data));
  }
}
Outs gather_fwd(const Node& n, const Ins& in, bool elements) {
  Tensor r{X(0).dtype, {}, {}, {}};
  gather_walk(n, X(0).shape, X(1), elements, [&](int64_t, int64_t j) { r.push(X(0), j); });
  const int64_t axis = axis_of(n, n.attrs.get_int("axis", 0), X(0).shape.size());
  if (elements) { r.shape = X(1).shape; return {r}; }
  r.shape.assign(X(0).shape.begin(), X(0).shape.begin() + axis);
  r.shape.insert(r.shape.end(), X(1).shape.begin(), X(1).shape.end());
  r.shape.insert(r.shape.end(), X(0).shape.begin() + axis + 1, X(0).shape.end());
  return {r};
}
Outs gather_bwd(const Node& n, const Ins& in, bool elements) {  // (dY, shape, indices[, accumulator])
  Tensor r = in.size() > 3 && in[3] ? *in[3] : zeros(X(0).dtype, ints_of(n, X(1)));
  gather_walk(n, r.shape, X(2), elements, [&](int64_t i, int64_t j) { r.reals[j] += X(0).reals[i]; });
  return {r};
}

const bool kRegistered = [] {
  const auto reg = [](const char* op, OpFn f) { register_op("", op, std::move(f)); };
  const auto ours = [](const char* op, OpFn f) { register_op(kOurDomain, op, std::move(f)); };
  reg("GatherElements", [](const Node& n, const Ins& in) { return gather_fwd(n, in, true); });
  ours("GatherGrad", [](const Node& n, const Ins& in) { return gather_bwd(n, in, false); });
  // Padding elimination's moves: (X (B, T, ...), rows) -> (K, ...) and back into zeros of (B, T, ...).
  ours("PackRows", [](const Node& n, const Ins& in) -> Outs {
    const int64_t row = prod(X(0).shape, 2);
    const Dims& rows = ints_of(n, X(1));
    Tensor r{X(0).dtype, {static_cast<int64_t>(rows.size())}, {}, {}};
    r.shape.insert(r.shape.end(), X(0).shape.begin() + 2, X(0).shape.end());
    for (int64_t k : rows)
      for (int64_t j = 0; j < row; ++j) r.push(X(0), k * row + j);
    return {r};
  });
  ours("PadRows", [](const Node& n, const Ins& in) -> Outs {
    const Dims &to = ints_of(n, X(2)), &rows = ints_of(n, X(1));
    Dims s{to[0], to[1]};
    s.insert(s.end(), X(0).shape.begin() + 1, X(0).shape.end());
    Tensor r = zeros(X(0).dtype, s);
    const int64_t row = prod(X(0).shape, 1);
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t j = 0; j < row; ++j) set(r, rows[i] * row + j, get(X(0), static_cast<int64_t>(i) * row + j));
    return {r};
  });
  // Run-time checks: their first input, when the check holds.
  ours("PaddingMaskCheck", [](const Node&, const Ins& in) -> Outs { return {X(0)}; });
  ours("DecisionCheck", [](const Node& n, const Ins& in) -> Outs {
    if (X(1).numel() == 0 || get(X(1), 0) == 0) fail(n, "the decision does not hold");
    return {X(0)};
  });
  ours("GatherElementsGrad", [](const Node& n, const Ins& in) { return gather_bwd(n, in, true); });
  reg("GatherND", [](const Node& n, const Ins& in) -> Outs {
    const int64_t b = n.attrs.get_int("batch_dims", 0), k = X(1).shape.back();
    Dims s(X(1).shape.begin(), X(1).shape.end() - 1);
    s.insert(s.end(), X(0).shape.begin() + b + k, X(0).shape.end());
    Tensor r{X(0).dtype, s, {}, {}};
    gather_nd_walk(n, X(0).shape, X(1), [&](int64_t, int64_t i, int64_t len) {
      for (int64_t j = 0; j < len; ++j) r.push(X(0), i + j); });
    return {r};
  });
  ours("GatherNDGrad", [](const Node& n, const Ins& in) -> Outs {  // (dY, shape, indices)
    Tensor r = zeros(X(0).dtype, ints_of(n, X(1)));
    gather_nd_walk(n, r.shape, X(2), [&](int64_t o, int64_t i, int64_t len) {
      for (int64_t j = 0; j < len; ++j) r.reals[i + j] += X(0).reals[o + j]; });
    return {r};
  });
  ours("SliceGrad", [](const Node& n, const Ins& in) -> Outs {
    const Dims& shape = ints_of(n, X(1));
    return {scatter(X(0), shape, slice_pick(n, shape, in, 2))};
  });
  reg("Split", [](const Node& n, const Ins& in) -> Outs {
    const int64_t axis = axis_of(n, n.attrs.get_int("axis", 0), X(0).shape.size());
    const Dims sizes = split_sizes(n, X(0).shape[axis], in.size() > 1 ? in[1] : nullptr, n.outputs.size());
    Outs r;
    for (size_t k = 0; k < sizes.size(); ++k) r.push_back(select(X(0), chunk_pick(X(0).shape, axis, sizes, k)));
    return r;
  });
  ours("SplitGrad", [](const Node& n, const Ins& in) -> Outs {  // (shape, split?, dY_0, ...)
    const Dims& shape = ints_of(n, X(0));
    const int64_t axis = axis_of(n, n.attrs.get_int("axis", 0), shape.size());
    const Dims sizes = split_sizes(n, shape[axis], in[1], int64_t(in.size()) - 2);
    Tensor r = zeros(DType::kDouble, shape);
    for (size_t k = 0; k < sizes.size(); ++k) {
      if (!in.at(2 + k)) continue;
      Tensor part = scatter(*in[2 + k], shape, chunk_pick(shape, axis, sizes, k));
      r.dtype = part.dtype;
      for (int64_t i = 0; i < r.numel(); ++i) r.reals[i] += part.reals[i];
    }
    return {r};
  });
  ours("ConcatGrad", [](const Node& n, const Ins& in) -> Outs {  // (dY, shape_0, ...) -> dX_i
    const int64_t axis = axis_of(n, n.attrs.get_int("axis", 0), X(0).shape.size());
    Dims sizes;
    for (size_t i = 1; i < in.size(); ++i) sizes.push_back(ints_of(n, X(i)).at(axis));
    Outs r;
    for (size_t k = 0; k < sizes.size(); ++k) r.push_back(select(X(0), chunk_pick(X(0).shape, axis, sizes, k)));
    return r;
  });
  reg("Tile", [](const Node& n, const Ins& in) -> Outs {
    Dims s = X(0).shape;
    for (size_t d = 0; d < s.size(); ++d) s[d] *= ints_of(n, X(1)).at(d);
    Tensor r{X(0).dtype, s, {}, {}};
    for (int64_t i = 0; i < prod(s); ++i) {
      Dims idx = unravel(i, s);
      for (size_t d = 0; d < idx.size(); ++d) idx[d] %= X(0).shape[d];
      r.push(X(0), ravel(idx, X(0).shape));
    }
    return {r};
  });
  // Pad in constant mode (the mode with a gradient rule): out[i] = x[i - begin] inside x, else the
  // value; a negative begin or end crops.
  reg("Pad", [](const Node& n, const Ins& in) -> Outs {
    if (n.attrs.get_string("mode", "constant") != "constant") fail(n, "only constant mode");
    const size_t rank = X(0).shape.size();
    const Dims pads = in.size() > 1 && in[1] ? ints_of(n, X(1)) : n.attrs.get_ints("pads", {});
    const double value = in.size() > 2 && in[2] ? get(X(2), 0) : 0.0;
    Dims axes(rank);
    std::iota(axes.begin(), axes.end(), 0);
    if (in.size() > 3 && in[3]) axes = ints_of(n, X(3));
    if (pads.size() != 2 * axes.size()) fail(n, "pads do not match the axes");
    Dims begin(rank, 0), s = X(0).shape;
    for (size_t k = 0; k < axes.size(); ++k) {
      const size_t d = size_t(axis_of(n, axes[k], rank));
      begin[d] = pads[k];
      s[d] += pads[k] + pads[k + axes.size()];
    }
    Tensor r = zeros(X(0).dtype, s);
    for (int64_t i = 0; i < r.numel(); ++i) {
      Dims idx = unravel(i, s);
      bool inside = true;
      for (size_t d = 0; d < rank; ++d) {
        idx[d] -= begin[d];
        inside &= idx[d] >= 0 && idx[d] < X(0).shape[d];
      }
      set(r, i, inside ? get(X(0), ravel(idx, X(0).shape)) : value);
    }
    return {r};
  });
  ours("TileGrad", [](const Node& n, const Ins& in) -> Outs {  // (dY, shape)
    Tensor r = zeros(X(0).dtype, ints_of(n, X(1)));
    for (int64_t i = 0; i < X(0).numel(); ++i) {
      Dims idx = unravel(i, X(0).shape);
      for (size_t d = 0; d < idx.size(); ++d) idx[d] %= r.shape[d];
      r.reals[ravel(idx, r.shape)] += X(0).reals[i];
    }
    return {r};
  });
  return true;
}();
#undef X

}  // namespace
}  // namespace torch_ort::ref
