// Shape rules of indexing ops: Split, Gather (also on shape vectors), Scatter*, NonZero, OneHot.
#include "csrc/core/ir/limits.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

// Split(X, split?; axis, num_outputs): sizes from input 1 (opset >= 13) or the 'split'
// attribute; without them an equal split over the outputs (opset 18: the last chunk may be
// smaller, ceil-sized chunks first).
void split_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  if (!x.rank_known) return;
  const int64_t axis = norm_axis(c, c.attrs().get_int("axis", 0), x.rank());
  const int n = c.num_outputs();
  std::vector<Dim> sizes(n);
  const SymValues* given = c.values(1);
  const auto attr = c.attrs().get_ints("split", {});
  if (given && static_cast<int>(given->size()) == n) {
    for (int k = 0; k < n; ++k) sizes[k] = (*given)[k] ? (*given)[k]->to_dim() : Dim{};
  } else if (c.has_in(1)) {
    // sizes known only at run time: unknown along the axis
  } else if (static_cast<int>(attr.size()) == n) {
    for (int k = 0; k < n; ++k) sizes[k] = Dim::known(attr[k]);
  } else if (x.dims[axis].is_known()) {
    const int64_t d = x.dims[axis].value, chunk = (d + n - 1) / n;
    for (int k = 0; k < n; ++k) sizes[k] = Dim::known(k + 1 < n ? chunk : d - chunk * (n - 1));
  } else {
    for (int k = 0; k < n; ++k) sizes[k] = dim_div_exact(x.dims[axis], Dim::known(n));
  }
  for (int k = 0; k < n; ++k) {
    Shape out = x;
    out.dims[axis] = sizes[k];
    c.set(k, out);
  }
}

// Gather(data, indices; axis): data[:axis] + indices.shape + data[axis+1:]. On a shape vector
// with constant indices it also picks the values (Shape -> Gather(0) is "the batch size").
// GatherND(data, indices; batch_dims b) -> indices[:-1] + data[b + indices[-1]:].
void gather_nd_shape(ShapeCtx& c) {
  const Shape data = c.in(0), idx = c.in(1);
  if (!data.rank_known || !idx.rank_known || idx.rank() < 1 || !idx.dims.back().is_known()) return;
  const int64_t start = checked_add(c.attrs().get_int("batch_dims", 0), idx.dims.back().value);
  if (start < 0 || start > data.rank()) return;  // the kernel reports it, naming the node
  Shape out = Shape::of({idx.dims.begin(), idx.dims.end() - 1});
  out.dims.insert(out.dims.end(), data.dims.begin() + start, data.dims.end());
  c.set(0, out);
}

// Our Embedding(weight (V, D...), indices) -> indices' shape + D...
void embedding_shape(ShapeCtx& c) {
  const Shape w = c.in(0), idx = c.in(1);
  if (!w.rank_known || !idx.rank_known || w.rank() < 1) return;
  Shape out = idx;
  out.dims.insert(out.dims.end(), w.dims.begin() + 1, w.dims.end());
  c.set(0, out);
}

void gather_shape(ShapeCtx& c) {
  const Shape data = c.in(0), idx = c.in(1);
  if (!data.rank_known || !idx.rank_known) return;
  const int64_t axis = norm_axis(c, c.attrs().get_int("axis", 0), data.rank());
  Shape out = Shape::of({data.dims.begin(), data.dims.begin() + axis});
  out.dims.insert(out.dims.end(), idx.dims.begin(), idx.dims.end());
  out.dims.insert(out.dims.end(), data.dims.begin() + axis + 1, data.dims.end());
  const SymValues* v = c.values(0);
  const auto picks = c.ints(1);
  if (v && picks && data.rank() == 1 && idx.rank() <= 1) {
    const int64_t n = static_cast<int64_t>(v->size());
    SymValues got;
    for (int64_t i : *picks) {
      if (i < -n || i >= n)
        c.fail("index " + std::to_string(i) + " is out of range for " + std::to_string(n) +
               " elements");
      got.push_back((*v)[i < 0 ? i + n : i]);
    }
    return c.set_values(0, std::move(got), idx.rank() == 0);
  }
  c.set(0, out);
}

void same_as_input0(ShapeCtx& c) { c.set(0, c.in(0)); }
void same_as_input1(ShapeCtx& c) { c.set(0, c.in(1)); }

// NonZero(X) -> (rank(X), number of non-zeros): the count is data-dependent.
void nonzero_shape(ShapeCtx& c) {
  const int64_t r = c.rank(0);
  c.set(0, Shape::of({r >= 0 ? Dim::known(r) : Dim{}, Dim{}}));
}

// OneHot(indices, depth, values; axis = -1): indices' shape with `depth` inserted at axis.
void one_hot_shape(ShapeCtx& c) {
  Shape x = c.in(0);
  if (!x.rank_known) return;
  const SymValues* depth = c.values(1);
  const int64_t axis = norm_axis(c, c.attrs().get_int("axis", -1), x.rank() + 1);
  x.dims.insert(x.dims.begin() + axis,
                depth && depth->size() == 1 && (*depth)[0] ? (*depth)[0]->to_dim() : Dim{});
  c.set(0, x);
}

}  // namespace

REGISTER_SHAPE_RULE("Split", split_shape);
REGISTER_SHAPE_RULE("Gather", gather_shape);
REGISTER_SHAPE_RULE("GatherElements", same_as_input1);  // the indices' shape
REGISTER_SHAPE_RULE("ScatterElements", same_as_input0);
REGISTER_SHAPE_RULE("ScatterND", same_as_input0);
REGISTER_SHAPE_RULE("NonZero", nonzero_shape);
REGISTER_SHAPE_RULE("OneHot", one_hot_shape);

REGISTER_SHAPE_RULE("GatherND", gather_nd_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "Embedding", embedding_shape);

}  // namespace torch_ort
