// The index family: Gather, GatherElements, GatherND, Scatter*, NonZero, OneHot, and our
// gradients of the gathers, LabelRows and padding elimination's row moves. Kernels: csrc/runtime/kernels/index.cc (Gather: shape.cc).
// One home per op: its traits line (index_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/limits.h"
#include "csrc/core/ops/families.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {

std::vector<OpEntry> index_ops() {
  return {
      {"", "Gather", {.recomputable = true, .host_computable = true}},
      {"", "NonZero", {.output_dtypes = {DType::kInt64}}},
      {"", "OneHot", {.host_inputs = {1}}},  // depth
      // (labels) -> the positions whose label is not ignore_index (passes/label_sparsity.cc)
      {kOurDomain, "LabelRows",
       {.output_dtypes = {DType::kInt64}, .arity = OpArity{1, 1, 1, 1}, .selects_rows = true}},
      // Padding elimination (passes/padding_elimination.cc): (mask, ids[, labels]) -> the rows (b·T + t)
      // that count; (X, rows) -> X's (B, T) rows taken; (X, rows, shape) -> zeros of (B, T, ...) with
      // X's rows put back; (mask, rows, ids) -> the mask, checked.
      {kOurDomain, "PaddingRows",
       {.output_dtypes = {DType::kInt64}, .arity = OpArity{2, 3, 1, 1}, .selects_rows = true}},
      {kOurDomain, "PackRows", {.arity = OpArity{2, 2, 1, 1}}},
      {kOurDomain, "PadRows", {.host_inputs = {2}, .arity = OpArity{3, 3, 1, 1}}},  // shape
      {kOurDomain, "PaddingMaskCheck", {.view = ViewRule::kInput0, .arity = OpArity{3, 3, 1, 1}}},
      // arity: (dY, shape(X), indices)
      {kOurDomain, "GatherElementsGrad", {.host_inputs = {1}, .arity = OpArity{3, 3, 1, 1}}},  // shape(X)
      {kOurDomain, "GatherGrad", {.host_inputs = {1}, .inplace_inputs = {3}, .arity = OpArity{3, 4, 1, 1}}},
      {kOurDomain, "GatherNDGrad", {.host_inputs = {1}, .arity = OpArity{3, 3, 1, 1}}},
  };
}

}  // namespace torch_ort::ops

namespace torch_ort {
namespace {

// --- shape rules (shapes/shape_rules.h)

// Gather(data, indices; axis): data[:axis] + indices.shape + data[axis+1:]. On a shape vector
// with constant indices it also picks the values (Shape -> Gather(0) is "the batch size").
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


void same_as_input1(ShapeCtx& c) { c.set(0, c.in(1)); }

// NonZero(X) -> (rank(X), number of non-zeros): the count is data-dependent.
void nonzero_shape(ShapeCtx& c) {
  const int64_t r = c.rank(0);
  c.set(0, Shape::of({r >= 0 ? Dim::known(r) : Dim{}, Dim{}}));
}

// LabelRows(labels; ignore_index) -> (number of labels that are not ignore_index): data-dependent.
void label_rows_shape(ShapeCtx& c) { c.set(0, Shape::of({Dim{}})); }

// PaddingRows(mask, ids[, labels]) -> (number of rows that count): data-dependent.
// One symbol for it, the pass's own (passes/padding_elimination.cc): every packed value has that many rows.
void padding_rows_shape(ShapeCtx& c) { c.set(0, Shape::of({Dim::symbolic("padding_rows")})); }

// PackRows(X (B, T, ...), rows (K)) -> (K, ...).
void pack_rows_shape(ShapeCtx& c) {
  const Shape x = c.in(0), rows = c.in(1);
  if (!x.rank_known || x.rank() < 2 || !rows.rank_known || rows.rank() != 1) return;
  Shape out = Shape::of({rows.dims[0]});
  out.dims.insert(out.dims.end(), x.dims.begin() + 2, x.dims.end());
  c.set(0, out);
}

// PadRows(X (K, ...), rows, shape) -> (shape[0], shape[1], ...).
void pad_rows_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  if (!x.rank_known || x.rank() < 1) return;
  const SymValues* v = c.values(2);
  Shape out = Shape::of({Dim{}, Dim{}});
  for (size_t k = 0; v && k < 2 && k < v->size(); ++k)
    if ((*v)[k]) out.dims[k] = (*v)[k]->to_dim();
  out.dims.insert(out.dims.end(), x.dims.begin() + 1, x.dims.end());
  c.set(0, out);
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


// --- gradient rules (autodiff/gradient_registry.h)

// Gather-like ops scatter dY back into zeros of X's shape, summing where indices repeat. The
// gradient op reads shape_of(X) and the indices, never X itself (nothing big is saved).
void scatter_back(GradCtx& g, const char* grad_op) {
  g.set_grad(0, g.ours(grad_op, {g.grad_out(0), g.shape_of(g.in(0)), g.in(1)}, g.attrs(),
                       DType::kUndefined, g.info(g.in(0)).shape));
}

// dX = zeros(shape(X)).index_add(axis, indices, dY)
void gather_grad(GradCtx& g) { scatter_back(g, "GatherGrad"); }

// dX = zeros(shape(X)).scatter_add(axis, indices, dY)
void gather_elements_grad(GradCtx& g) { scatter_back(g, "GatherElementsGrad"); }

// dX = zeros(shape(X)).index_put(indices, dY, accumulate=True)
void gather_nd_grad(GradCtx& g) { scatter_back(g, "GatherNDGrad"); }

// ScatterND(data, indices, updates): dUpdates = GatherND(dY, indices); dData = dY, zeroed where
// the scatter overwrote data (reduction none; dY itself for add), as torch's index_put gradient.
void scatter_nd_grad(GradCtx& g) {
  const std::string reduction = g.attrs().get_string("reduction", "none");
  if (reduction != "none" && reduction != "add")
    throw GradientError(g.node().describe() + ": no gradient for ScatterND with reduction '" + reduction + "'");
  const ValueId dy = g.grad_out(0);
  if (g.needs(2)) g.set_grad(2, g.op("GatherND", {dy, g.in(1)}, {}, DType::kUndefined, g.info(g.in(2)).shape));
  if (!g.needs(0)) return;
  if (reduction == "add") return g.set_grad(0, dy);
  const DType dtype = g.info(g.in(0)).dtype;
  Attributes zero;
  zero.set("value", TensorData::scalar_float(dtype, 0.0));
  const ValueId zeros = g.op("ConstantOfShape", {g.shape_of(g.in(2))}, std::move(zero), dtype, g.info(g.in(2)).shape);
  g.set_grad(0, g.op("ScatterND", {dy, g.in(1), zeros}, {}, DType::kUndefined, g.info(g.in(0)).shape));
}

// Padding elimination's moves are each other's gradients: dX of PackRows is dY padded back,
// dX of PadRows is dY's counted rows; the checked mask passes its gradient through.
void pack_rows_grad(GradCtx& g) {
  g.set_grad(0, g.ours("PadRows", {g.grad_out(0), g.in(1), g.shape_of(g.in(0))}, {}, DType::kUndefined,
                       g.info(g.in(0)).shape));
}
void pad_rows_grad(GradCtx& g) {
  g.set_grad(0, g.ours("PackRows", {g.grad_out(0), g.in(1)}, {}, DType::kUndefined, g.info(g.in(0)).shape));
}
void padding_mask_check_grad(GradCtx& g) { g.set_grad(0, g.grad_out(0)); }

}  // namespace

REGISTER_SHAPE_RULE("Gather", gather_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "PaddingRows", padding_rows_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "PackRows", pack_rows_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "PadRows", pad_rows_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "PaddingMaskCheck", same_as_input0);
REGISTER_SHAPE_RULE("GatherElements", same_as_input1);  // the indices' shape
REGISTER_SHAPE_RULE("ScatterElements", same_as_input0);
REGISTER_SHAPE_RULE("ScatterND", same_as_input0);
REGISTER_SHAPE_RULE("NonZero", nonzero_shape);
REGISTER_SHAPE_RULE("OneHot", one_hot_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "LabelRows", label_rows_shape);
REGISTER_SHAPE_RULE("GatherND", gather_nd_shape);
// Declared by the gradient builder: (dY, shape_of(X), indices) -> X's shape.
REGISTER_SHAPE_RULE_IN(kOurDomain, "GatherGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "GatherElementsGrad", declared_by_gradient_builder);
REGISTER_SHAPE_RULE_IN(kOurDomain, "GatherNDGrad", declared_by_gradient_builder);

REGISTER_GRADIENT("Gather", gather_grad, {1});
REGISTER_GRADIENT("GatherElements", gather_elements_grad, {1});
REGISTER_GRADIENT("GatherND", gather_nd_grad, {1});
REGISTER_GRADIENT("ScatterND", scatter_nd_grad, {1});
REGISTER_GRADIENT_IN(kOurDomain, "PackRows", pack_rows_grad, {1});
REGISTER_GRADIENT_IN(kOurDomain, "PadRows", pad_rows_grad, {1, 2});
REGISTER_GRADIENT_IN(kOurDomain, "PaddingMaskCheck", padding_mask_check_grad, {1, 2});

NO_GRADIENT("NonZero", "integer output");

}  // namespace torch_ort
