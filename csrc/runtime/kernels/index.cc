// Gather-family kernels: GatherElements, GatherND, and the gradient ops of Gather, GatherElements
// and GatherND, which scatter dY into zeros of the data's shape and sum where indices repeat.
// (Gather's forward lives with the shape kernels.) ONNX indices may be negative: counted from the end.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/index.h>
#include <ATen/ops/index_add.h>
#include <ATen/ops/index_put.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/scatter_add.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

// int64 indices (placed with `like`) with negatives wrapped by `size`.
at::Tensor wrap_indices(const KernelCtx& c, const at::Tensor& idx, int64_t size, const at::Tensor& like) {
  check_placed(c, idx, like);
  at::Tensor i = idx;
  if (i.scalar_type() != at::kLong) i = i.to(at::kLong);
  return at::where(at::lt(i, 0), at::add(i, size), i);
}

int64_t product(c10::IntArrayRef s, size_t b, size_t e) {
  int64_t p = 1;
  for (size_t d = b; d < e; ++d) p *= s[d];
  return p;
}

// ---- GatherElements: out[i][j][k] = data[idx[i][j][k]][j][k] (axis 0), same rank as data.
void gather_elements_kernel(KernelCtx& c) {
  const at::Tensor& data = c.input(0);
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", 0), data.dim());
  if (c.input(1).dim() != data.dim())
    c.fail("indices of rank " + std::to_string(c.input(1).dim()) + " for data of rank " +
           std::to_string(data.dim()) + " (GatherElements needs equal ranks)");
  c.set_output(0, at::gather(data, axis, wrap_indices(c, c.input(1), data.size(axis), data)));
}

// dX = zeros(shape).scatter_add(axis, indices, dY)
void gather_elements_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const std::vector<int64_t> shape = c.input_ints(1);
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", 0), static_cast<int64_t>(shape.size()));
  at::Tensor idx = wrap_indices(c, c.input(2), shape[axis], dy);
  at::Tensor z = at::zeros(shape, dy.options());
  z.scatter_add_(axis, idx, dy);
  c.set_output(0, std::move(z));
}

// ---- GatherND with batch_dims b: data (B..., D_0..D_k-1, R...), indices (B..., M..., k)
// -> out (B..., M..., R...). Both sides are flattened to one batch dim and indexed with
// [arange(B), idx_0, ..., idx_k-1], so forward and backward share one indexing recipe.
struct NdIndex {
  std::vector<int64_t> flat_data;  // (B, D_0, ..., R...)
  std::vector<int64_t> flat_out;   // (B, M, R...)
  std::vector<int64_t> out;        // the ONNX output shape
  c10::List<std::optional<at::Tensor>> index;
};

NdIndex nd_index(const KernelCtx& c, c10::IntArrayRef data, const at::Tensor& indices,
                 const at::Tensor& like) {
  const int64_t b = c.attrs.get_int("batch_dims", 0), r = static_cast<int64_t>(data.size()),
                q = indices.dim();
  if (q < 1 || b < 0 || b >= std::min(q, r))
    c.fail("batch_dims " + std::to_string(b) + " must be below the ranks of indices (" + std::to_string(q) +
           ") and data (" + std::to_string(r) + ")");
  const int64_t k = indices.size(q - 1);
  if (b + k > r)
    c.fail("indices address " + std::to_string(k) + " dims after " + std::to_string(b) +
           " batch dims, but data has rank " + std::to_string(r) + " " + c10::str(data));
  for (int64_t d = 0; d < b; ++d)
    if (indices.size(d) != data[d])
      c.fail("batch dim " + std::to_string(d) + " differs: data " + c10::str(data) + ", indices " +
             c10::str(indices.sizes()));
  NdIndex nd;
  const int64_t B = product(data, 0, b), M = product(indices.sizes(), b, q - 1);
  nd.flat_data = {B};
  nd.flat_data.insert(nd.flat_data.end(), data.begin() + b, data.end());
  nd.flat_out = {B, M};
  nd.flat_out.insert(nd.flat_out.end(), data.begin() + b + k, data.end());
  nd.out.assign(indices.sizes().begin(), indices.sizes().end() - 1);
  nd.out.insert(nd.out.end(), data.begin() + b + k, data.end());
  check_placed(c, indices, like);
  at::Tensor idx = indices.to(at::kLong).reshape({B, M, k});
  nd.index.push_back(std::optional<at::Tensor>(at::arange(B, idx.options()).view({B, 1}).expand({B, M})));
  for (int64_t j = 0; j < k; ++j)
    nd.index.push_back(std::optional<at::Tensor>(wrap_indices(c, idx.select(2, j), data[b + j], like)));
  return nd;
}

void gather_nd_kernel(KernelCtx& c) {
  const at::Tensor& data = c.input(0);
  NdIndex nd = nd_index(c, data.sizes(), c.input(1), data);
  c.set_output(0, at::index(data.reshape(nd.flat_data), nd.index).reshape(nd.out));
}

// dX = zeros(shape) with dY's rows added where the indices point, as eager's indexing backward
// does: index_put_ with accumulate. On the CPU, which runs that element by element, the
// (B, D_0..D_k-1) position is flattened to one row number instead and index_add_ adds each row
// vectorized, about 3x faster (the sums may differ from eager's in the last bit). Elsewhere
// index_put_ stays: CUDA's is sorted and deterministic, its index_add_ uses atomics.
void gather_nd_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const std::vector<int64_t> shape = c.input_ints(1);
  NdIndex nd = nd_index(c, shape, c.input(2), dy);
  if (!dy.is_cpu()) {
    at::Tensor z = at::zeros(nd.flat_data, dy.options());
    z.index_put_(nd.index, dy.reshape(nd.flat_out), /*accumulate=*/true);
    return c.set_output(0, z.reshape(shape));
  }
  const int64_t addressed = static_cast<int64_t>(nd.index.size());  // B and the k indexed dims
  at::Tensor row = nd.index.get(0).value();
  for (int64_t j = 1; j < addressed; ++j) row = row.mul(nd.flat_data[j]).add(nd.index.get(j).value());
  const int64_t rows = product(nd.flat_data, 0, addressed);
  const int64_t inner = product(nd.flat_data, addressed, nd.flat_data.size());
  at::Tensor z = at::zeros({rows, inner}, dy.options());
  z.index_add_(0, row.reshape({-1}), dy.reshape({row.numel(), inner}));
  c.set_output(0, z.reshape(shape));
}

// ---- Gather's gradient: dY (outer..., idx..., inner...) added into rows of zeros(outer, n, inner),
// or of the accumulator (input 3: the other Gathers' gradients of the same value), overwritten
// where the plan allows.
void gather_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const std::vector<int64_t> shape = c.input_ints(1);
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", 0), static_cast<int64_t>(shape.size()));
  at::Tensor idx = wrap_indices(c, c.input(2), shape[axis], dy).reshape({-1});
  const int64_t outer = product(shape, 0, axis), inner = product(shape, axis + 1, shape.size());
  if (dy.numel() != outer * idx.numel() * inner)
    c.fail("gradient of shape " + c10::str(dy.sizes()) + " does not match data shape " +
           c10::str(c10::IntArrayRef(shape)) + " with " + std::to_string(idx.numel()) + " indices on axis " +
           std::to_string(axis));
  at::Tensor z = accumulator(c, 3, shape, dy);
  if (!z.defined()) z = at::zeros(shape, dy.options());
  z.view({outer, shape[axis], inner}).index_add_(1, idx, dy.reshape({outer, idx.numel(), inner}));
  c.set_output(0, std::move(z));
}

// LabelRows(labels; ignore_index) -> the positions of the labels that are not ignore_index, in
// order. How many there are is data: the host waits for it (a counted host read).
void label_rows_kernel(KernelCtx& c) {
  const at::Tensor& labels = c.input(0);
  if (labels.dim() != 1 || at::isFloatingType(labels.scalar_type()))
    c.fail("labels must be a 1-D integer tensor, got " + std::string(c10::toString(labels.scalar_type())) + " " +
           c10::str(labels.sizes()));
  HostReadScope::add();  // counted on every device, as every host read is (kernel.h)
  at::Tensor rows = at::nonzero(labels.ne(c.attrs.get_int("ignore_index", -100))).view({-1});
  LabelCountScope::add(rows.size(0), labels.numel());  // the size is on the host already
  c.set_output(0, std::move(rows));
}

}  // namespace

REGISTER_KERNEL("GatherElements", gather_elements_kernel);
REGISTER_KERNEL_IN(kOurDomain, "LabelRows", label_rows_kernel);
REGISTER_KERNEL("GatherND", gather_nd_kernel);
REGISTER_KERNEL_IN(kOurDomain, "GatherGrad", gather_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "GatherElementsGrad", gather_elements_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "GatherNDGrad", gather_nd_grad_kernel);

}  // namespace torch_ort::kernels
