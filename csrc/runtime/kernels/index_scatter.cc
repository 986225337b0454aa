// Scatter-family and data-dependent index kernels: ScatterND, ScatterElements, NonZero, OneHot,
// TopK. ONNX indices may be negative: counted from the end. Scatters write into a copy of the
// data; with reduction "none" a position written twice takes one of the updates (ONNX leaves
// which undefined).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/index_put.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/scatter.h>
#include <ATen/ops/scatter_reduce.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

at::Tensor wrapped(const KernelCtx& c, const at::Tensor& idx, int64_t size, const at::Tensor& like) {
  check_placed(c, idx, like);
  at::Tensor i = idx.scalar_type() == at::kLong ? idx : idx.to(at::kLong);
  return at::where(at::lt(i, 0), at::add(i, size), i);
}

// The reduction attribute as scatter_reduce's name ("" for none).
std::string reduction(const KernelCtx& c) {
  const std::string r = c.attrs.get_string("reduction", "none");
  if (r == "none") return "";
  if (r == "add") return "sum";
  if (r == "mul") return "prod";
  if (r == "max" || r == "min") return "a" + r;
  c.fail("reduction must be none, add, mul, max or min, got \"" + r + "\"");
}

// ScatterElements(data, indices, updates; axis, reduction): out = data, then
// out[... idx[i][j] ...] (op)= updates[i][j] along axis.
void scatter_elements_kernel(KernelCtx& c) {
  const at::Tensor& data = c.input(0);
  const at::Tensor& updates = c.input(2);
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", 0), data.dim());
  if (c.input(1).dim() != data.dim() || !c.input(1).sizes().equals(updates.sizes()))
    c.fail("indices " + c10::str(c.input(1).sizes()) + " and updates " + c10::str(updates.sizes()) +
           " must have one shape, of data's rank " + std::to_string(data.dim()));
  check_placed(c, data, updates);
  at::Tensor idx = wrapped(c, c.input(1), data.size(axis), data);
  const std::string r = reduction(c);
  c.set_output(0, r.empty() ? at::scatter(data, axis, idx, updates)
                            : at::scatter_reduce(data, axis, idx, updates, r, /*include_self=*/true));
}

// ScatterND(data, indices, updates; reduction): indices (..., k) address the first k dims of data;
// updates have indices' leading shape followed by data's dims after k.
void scatter_nd_kernel(KernelCtx& c) {
  const at::Tensor& data = c.input(0);
  const at::Tensor& indices = c.input(1);
  const at::Tensor& updates = c.input(2);
  check_placed(c, data, updates);
  if (indices.dim() < 1) c.fail("indices must have rank >= 1");
  const int64_t k = indices.size(-1);
  if (k > data.dim())
    c.fail("indices address " + std::to_string(k) + " dims of data of rank " + std::to_string(data.dim()));
  std::vector<int64_t> want(indices.sizes().begin(), indices.sizes().end() - 1);
  want.insert(want.end(), data.sizes().begin() + k, data.sizes().end());
  if (!updates.sizes().equals(want))
    c.fail("updates " + c10::str(updates.sizes()) + " must have shape " + c10::str(c10::IntArrayRef(want)));
  c10::List<std::optional<at::Tensor>> index;
  for (int64_t j = 0; j < k; ++j)
    index.push_back(std::optional<at::Tensor>(wrapped(c, indices.select(-1, j), data.size(j), data)));
  const std::string r = reduction(c);
  if (r.empty()) return c.set_output(0, at::index_put(data, index, updates));
  if (r == "sum") return c.set_output(0, at::index_put(data, index, updates, /*accumulate=*/true));
  // mul/max/min: scatter_reduce along the first k dims flattened to one, at linear positions.
  at::Tensor linear = at::zeros_like(index.get(0).value());
  for (int64_t j = 0; j < k; ++j) linear = at::add(at::mul(linear, data.size(j)), index.get(j).value());
  std::vector<int64_t> flat_data{-1}, flat_updates{linear.numel()};
  flat_data.insert(flat_data.end(), data.sizes().begin() + k, data.sizes().end());
  flat_updates.insert(flat_updates.end(), data.sizes().begin() + k, data.sizes().end());
  at::Tensor u = updates.reshape(flat_updates);
  std::vector<int64_t> bcast(u.dim(), 1);
  bcast[0] = linear.numel();
  at::Tensor where = linear.reshape(bcast).expand(u.sizes());
  c.set_output(0, at::scatter_reduce(data.reshape(flat_data), 0, where, u, r, /*include_self=*/true)
                      .reshape(data.sizes()));
}

// NonZero(X) -> (rank, n) int64 positions of the non-zero elements, in row-major order. How many
// there are is data: the host waits for it (a counted host read).
void nonzero_kernel(KernelCtx& c) {
  HostReadScope::add();
  c.set_output(0, at::nonzero(c.input(0)).t().contiguous());
}

// OneHot(indices, depth, values; axis): values = [off, on]; indices in [-depth, depth) count from
// the end when negative, others give an all-off row.
void one_hot_kernel(KernelCtx& c) {
  const at::Tensor& indices = c.input(0);
  const double depth_value = c.input_scalar(1, 0);
  const int64_t depth = static_cast<int64_t>(depth_value);
  if (depth < 1) c.fail("depth must be at least 1, got " + std::to_string(depth_value));
  const at::Tensor& values = c.input(2);
  if (values.numel() != 2) c.fail("values must hold [off, on], got " + std::to_string(values.numel()) + " elements");
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", -1), indices.dim() + 1);
  at::Tensor idx = indices.to(at::kLong);
  check_placed(c, idx, values);
  idx = at::where(at::lt(idx, 0), at::add(idx, depth), idx);
  at::Tensor classes = at::arange(depth, idx.options());
  at::Tensor hot = at::eq(idx.unsqueeze(-1), classes).movedim(-1, axis);
  at::Tensor flat = values.reshape({2});
  c.set_output(0, at::where(hot, flat[1], flat[0]));
}

// TopK(X, K; axis, largest, sorted) -> (values, int64 indices), always sorted (ONNX allows it when
// sorted = 0). Equal values come in ATen's order, which ONNX's lower-index-first rule may not be.
void topk_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const std::vector<int64_t> k = c.input_ints(1);
  if (k.size() != 1 || k[0] < 0) c.fail("K must be one non-negative value");
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", -1), x.dim());
  if (k[0] > x.size(axis))
    c.fail("K " + std::to_string(k[0]) + " exceeds the axis' size " + std::to_string(x.size(axis)));
  auto [values, indices] = at::topk(x, k[0], axis, c.attrs.get_int("largest", 1) != 0, /*sorted=*/true);
  c.set_output(0, values);
  c.set_output(1, indices);
}

}  // namespace

REGISTER_KERNEL("ScatterElements", scatter_elements_kernel);
REGISTER_KERNEL("ScatterND", scatter_nd_kernel);
REGISTER_KERNEL("NonZero", nonzero_kernel);
REGISTER_KERNEL("OneHot", one_hot_kernel);
REGISTER_KERNEL("TopK", topk_kernel);

}  // namespace torch_ort::kernels
