// Gradient rules of indexing and slicing ops (Gather*, Slice, Concat, Split, Tile, Trilu, Max/Min,
// CastLike), and the comparison/logic ops whose outputs carry no gradient.
#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"

namespace torch_ort {
namespace {

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

// dX = zeros(shape(X)) with dY written into the sliced region. starts/ends/axes/steps are passed
// through as they are (constants or run-time values); opset < 10 carries them as attributes.
void slice_grad(GradCtx& g) {
  std::vector<ValueId> ins{g.grad_out(0), g.shape_of(g.in(0))};
  for (int i = 1; i < static_cast<int>(g.node().inputs.size()); ++i)
    ins.push_back(g.has_in(i) ? g.in(i) : kNoValue);
  g.set_grad(0, g.ours("SliceGrad", std::move(ins), g.attrs(), DType::kUndefined, g.info(g.in(0)).shape));
}

// dX_i = dY narrowed to X_i's extent along axis; every input's shape fixes the offsets, but only
// the inputs that need a gradient get an output.
void concat_grad(GradCtx& g) {
  std::vector<ValueId> ins{g.grad_out(0)}, like;
  for (int i = 0; i < static_cast<int>(g.node().inputs.size()); ++i) {
    ins.push_back(g.shape_of(g.in(i)));
    like.push_back(g.needs(i) ? g.in(i) : kNoValue);
  }
  Attributes a;
  a.set("axis", g.attrs().get_int("axis", 0));
  std::vector<ValueId> grads = g.ours_multi("ConcatGrad", std::move(ins), like, std::move(a));
  for (int i = 0; i < static_cast<int>(grads.size()); ++i) g.set_grad(i, grads[i]);
}

// dX = concat(dY_0, ..., dY_n-1) along axis; an output with no incoming gradient contributes
// zeros, sized as the forward split it (same split input / num_outputs / attributes).
void split_grad(GradCtx& g) {
  std::vector<ValueId> ins{g.shape_of(g.in(0)), g.has_in(1) ? g.in(1) : kNoValue};
  for (int i = 0; i < static_cast<int>(g.node().outputs.size()); ++i) ins.push_back(g.grad_out(i));
  ValueId any = kNoValue;
  for (size_t i = 2; i < ins.size() && any == kNoValue; ++i) any = ins[i];
  g.set_grad(0, g.ours("SplitGrad", std::move(ins), g.attrs(), g.info(any).dtype, g.info(g.in(0)).shape));
}

// dX = dY viewed as (r_0, x_0, r_1, x_1, ...) and summed over the repeat axes r_k.
void tile_grad(GradCtx& g) {
  g.set_grad(0, g.ours("TileGrad", {g.grad_out(0), g.shape_of(g.in(0))}, {}, DType::kUndefined,
                       g.info(g.in(0)).shape));
}

// dX = Trilu(dY, k) with the forward's `upper`: the kept triangle passes dY, the rest is zero.
void trilu_grad(GradCtx& g) {
  std::vector<ValueId> ins{g.grad_out(0)};
  if (g.has_in(1)) ins.push_back(g.in(1));
  g.set_grad(0, g.op("Trilu", std::move(ins), g.attrs(), DType::kUndefined, g.info(g.in(0)).shape));
}

// dX = cast(dY, dtype(X)); the `like` input only names a dtype.
void cast_like_grad(GradCtx& g) {
  const DType to = g.info(g.in(0)).dtype;
  if (g.info(g.grad_out(0)).dtype == to) return g.set_grad(0, g.grad_out(0));
  Attributes a;
  a.set("to", static_cast<int64_t>(to));
  g.set_grad(0, g.op("Cast", {g.grad_out(0)}, std::move(a), to, g.info(g.in(0)).shape));
}

// Variadic Max/Min: dX_i = sum_to_shape(dY · [X_i == Y] / #{j : X_j == Y}) — ties share dY
// equally, as torch.maximum/minimum split it between two equal operands.
void min_max_grad(GradCtx& g) {
  std::vector<ValueId> ins{g.grad_out(0), g.out(0)}, like;
  for (int i = 0; i < static_cast<int>(g.node().inputs.size()); ++i) {
    ins.push_back(g.in(i));
    like.push_back(g.needs(i) ? g.in(i) : kNoValue);
  }
  std::vector<ValueId> grads = g.ours_multi("MinMaxGrad", std::move(ins), like);
  for (int i = 0; i < static_cast<int>(grads.size()); ++i) g.set_grad(i, grads[i]);
}

}  // namespace

REGISTER_GRADIENT("Gather", gather_grad, {1});
REGISTER_GRADIENT("GatherElements", gather_elements_grad, {1});
REGISTER_GRADIENT("GatherND", gather_nd_grad, {1});
REGISTER_GRADIENT("Slice", slice_grad, {1, 2, 3, 4});
REGISTER_GRADIENT("Concat", concat_grad, {});
REGISTER_GRADIENT("Split", split_grad, {1});
REGISTER_GRADIENT("Tile", tile_grad, {1});
REGISTER_GRADIENT("Trilu", trilu_grad, {1});
REGISTER_GRADIENT("CastLike", cast_like_grad, {1});
REGISTER_GRADIENT("Max", min_max_grad, {});
REGISTER_GRADIENT("Min", min_max_grad, {});

// Boolean outputs and index ranges: no gradient flows through them.
NO_GRADIENT("GreaterOrEqual", "boolean output");
NO_GRADIENT("LessOrEqual", "boolean output");
NO_GRADIENT("And", "boolean output");
NO_GRADIENT("Or", "boolean output");
NO_GRADIENT("Xor", "boolean output");
NO_GRADIENT("IsNaN", "boolean output");
NO_GRADIENT("IsInf", "boolean output");
NO_GRADIENT("Range", "an arange, not differentiable (as torch.arange)");

}  // namespace torch_ort
