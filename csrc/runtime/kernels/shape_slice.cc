// Slicing kernels and their gradient ops: Slice / SliceGrad, Split / SplitGrad, ConcatGrad.
// Slice regions are computed once (ONNX clamping rules) and applied as ATen views, so the forward
// is a view and the gradient writes dY into the same view of zeros.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <algorithm>
#include <limits>

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/split_with_sizes.h>
#include <ATen/ops/zeros.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

// One sliced axis as a forward-strided view: x.slice(axis, lo, hi, stride), flipped afterwards
// when the ONNX step was negative.
struct AxisSlice {
  int64_t axis, lo, hi, stride;
  bool reversed;
};

// Slice(data, starts, ends, axes?, steps?) since opset 10; attributes starts/ends/axes before.
// Input `first` is where `starts` sits (1 for Slice, 2 for SliceGrad, which also reads dY).
std::vector<AxisSlice> slice_regions(const KernelCtx& c, c10::IntArrayRef shape, int first) {
  const bool inputs = c.opset >= 10 || c.has_input(first);
  const std::vector<int64_t> starts = inputs ? c.input_ints(first) : c.attrs.get_ints("starts", {});
  const std::vector<int64_t> ends = inputs ? c.input_ints(first + 1) : c.attrs.get_ints("ends", {});
  std::vector<int64_t> axes =
      inputs ? (c.has_input(first + 2) ? c.input_ints(first + 2) : std::vector<int64_t>{})
             : c.attrs.get_ints("axes", {});
  std::vector<int64_t> steps =
      inputs && c.has_input(first + 3) ? c.input_ints(first + 3) : std::vector<int64_t>{};
  const size_t n = starts.size();
  if (axes.empty())
    for (size_t i = 0; i < n; ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(n, 1);
  if (ends.size() != n || axes.size() != n || steps.size() != n)
    c.fail("starts, ends, axes and steps must have one entry each per sliced axis (got " +
           std::to_string(n) + ", " + std::to_string(ends.size()) + ", " + std::to_string(axes.size()) +
           ", " + std::to_string(steps.size()) + ")");
  std::vector<AxisSlice> out;
  std::vector<bool> seen(shape.size(), false);
  for (size_t i = 0; i < n; ++i) {
    const int64_t axis = norm_axis(c, axes[i], static_cast<int64_t>(shape.size()));
    if (seen[axis]) c.fail("axis " + std::to_string(axes[i]) + " is sliced twice");
    seen[axis] = true;
    const int64_t dim = shape[axis], step = steps[i];
    if (step == 0) c.fail("step 0 on axis " + std::to_string(axis));
    int64_t s = starts[i] < 0 ? starts[i] + dim : starts[i];
    int64_t e = ends[i] < 0 ? ends[i] + dim : ends[i];
    int64_t count;
    if (dim == 0) {
      out.push_back({axis, 0, 0, 1, false});  // nothing to take (and no valid clamp range)
    } else if (step > 0) {
      s = std::clamp<int64_t>(s, 0, dim), e = std::clamp<int64_t>(e, 0, dim);
      count = e > s ? (e - s + step - 1) / step : 0;
      out.push_back({axis, s, count ? s + (count - 1) * step + 1 : s, step, false});
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1), e = std::clamp<int64_t>(e, -1, dim - 1);
      count = s > e ? (s - e - step - 1) / -step : 0;
      // The same elements in ascending order: lo = the last one taken, then flip.
      out.push_back(count ? AxisSlice{axis, s + (count - 1) * step, s + 1, -step, true}
                          : AxisSlice{axis, 0, 0, 1, false});
    }
  }
  return out;
}

at::Tensor apply_slice(at::Tensor t, const std::vector<AxisSlice>& regions) {
  for (const AxisSlice& r : regions) t = t.slice(r.axis, r.lo, r.hi, r.stride);
  return t;
}
std::vector<int64_t> reversed_axes(const std::vector<AxisSlice>& regions) {
  std::vector<int64_t> axes;
  for (const AxisSlice& r : regions)
    if (r.reversed) axes.push_back(r.axis);
  return axes;
}

void slice_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const std::vector<AxisSlice> regions = slice_regions(c, x.sizes(), 1);
  at::Tensor y = apply_slice(x, regions);
  const std::vector<int64_t> flip = reversed_axes(regions);
  c.set_output(0, flip.empty() ? y : at::flip(y, flip));
}

// (dY, shape(X), starts, ends, axes?, steps?) -> zeros(shape) with dY in the sliced region.
void slice_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const std::vector<int64_t> shape = c.input_ints(1);
  const std::vector<AxisSlice> regions = slice_regions(c, shape, 2);
  if (is_absent_gradient(dy)) return c.set_output(0, absent_gradient(shape, dy.options()));
  at::Tensor dx = at::zeros(shape, dy.options());
  const std::vector<int64_t> flip = reversed_axes(regions);
  apply_slice(dx, regions).copy_(flip.empty() ? dy : at::flip(dy, flip));
  c.set_output(0, dx);
}

// Split sizes along axis of a dim: the `split` input (opset 13+) or attribute (before); else
// num_outputs (opset 18) or the output count, in chunks of ceil(dim / n) with a smaller last one.
std::vector<int64_t> split_sizes(const KernelCtx& c, int64_t dim, int split_input, int64_t n_out) {
  std::vector<int64_t> sizes =
      c.has_input(split_input) ? c.input_ints(split_input) : c.attrs.get_ints("split", {});
  if (sizes.empty()) {
    const int64_t n = c.attrs.get_int("num_outputs", n_out);
    if (n <= 0) c.fail("cannot split into " + std::to_string(n) + " outputs");
    const int64_t chunk = (dim + n - 1) / n;
    sizes.assign(n, chunk);
    sizes.back() = dim - chunk * (n - 1);
    if (sizes.back() < 0)
      c.fail("cannot split a dim of " + std::to_string(dim) + " into " + std::to_string(n) + " chunks of " +
             std::to_string(chunk));
  }
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (total != dim || static_cast<int64_t>(sizes.size()) != n_out)
    c.fail("split sizes " + c10::str(c10::IntArrayRef(sizes)) + " must sum to the dim (" +
           std::to_string(dim) + ") with one size per output (" + std::to_string(n_out) + " outputs)");
  return sizes;
}

void split_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", 0), x.dim());
  std::vector<at::Tensor> parts =
      at::split_with_sizes(x, split_sizes(c, x.size(axis), 1, c.num_outputs()), axis);
  for (int i = 0; i < c.num_outputs(); ++i) c.set_output(i, std::move(parts[i]));
}

// (shape(X), split?, dY_0, ..., dY_n-1) -> cat(dY_i or zeros) along axis.
void split_grad_kernel(KernelCtx& c) {
  const std::vector<int64_t> shape = c.input_ints(0);
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", 0), static_cast<int64_t>(shape.size()));
  const int n = c.num_inputs() - 2;
  at::TensorOptions opts;
  for (int i = 0; i < n; ++i)
    if (c.has_input(2 + i)) opts = c.input(2 + i).options();
  const std::vector<int64_t> sizes = split_sizes(c, shape[axis], 1, n);
  std::vector<at::Tensor> parts;
  for (int i = 0; i < n; ++i) {
    if (c.has_input(2 + i)) { parts.push_back(c.input(2 + i)); continue; }
    std::vector<int64_t> s = shape;
    s[axis] = sizes[i];
    parts.push_back(at::zeros(s, opts));
  }
  c.set_output(0, at::cat(parts, axis));
}

// (dY, shape(X_0), ..., shape(X_n-1)) -> dX_i = dY.narrow(axis, offset_i, X_i.size(axis)).
void concat_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", 0), dy.dim());
  int64_t offset = 0;
  for (int i = 1; i < c.num_inputs(); ++i) {
    const std::vector<int64_t> s = c.input_ints(i);
    if (static_cast<int64_t>(s.size()) != dy.dim())
      c.fail("input " + std::to_string(i - 1) + " of shape " + c10::str(c10::IntArrayRef(s)) +
             " does not fit dY " + c10::str(dy.sizes()));
    c.set_output(i - 1, dy.narrow(axis, offset, s[axis]));
    offset += s[axis];
  }
  if (offset != dy.size(axis))
    c.fail("input extents sum to " + std::to_string(offset) + " on axis " + std::to_string(axis) +
           ", dY has " + std::to_string(dy.size(axis)));
}

}  // namespace

REGISTER_KERNEL("Slice", slice_kernel);
REGISTER_KERNEL("Split", split_kernel);
REGISTER_KERNEL_IN(kOurDomain, "SliceGrad", slice_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "SplitGrad", split_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "ConcatGrad", concat_grad_kernel);

}  // namespace torch_ort::kernels
