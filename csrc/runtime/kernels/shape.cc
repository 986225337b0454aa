// Shape and layout kernels: Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Expand, Concat,
// Gather, and the ops that make tensors from metadata (Shape, Size, Constant, ConstantOfShape).
// Views are returned where ATen gives them (no kernel here mutates its input).
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <algorithm>

#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/where.h>

#include "csrc/runtime/dtype.h"
#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

std::string dims_str(c10::IntArrayRef d) { return c10::str(d); }

void reshape_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  std::vector<int64_t> shape = c.input_ints(1);
  // 0 copies the input's dim at that position unless allowzero=1 (then 0 is a real size).
  if (!c.attrs.get_int("allowzero", 0))
    for (size_t i = 0; i < shape.size(); ++i)
      if (shape[i] == 0) {
        if (static_cast<int64_t>(i) >= x.dim())
          c.fail("shape " + dims_str(shape) + " copies dim " + std::to_string(i) +
                 " (0) from an input of rank " + std::to_string(x.dim()));
        shape[i] = x.size(static_cast<int64_t>(i));
      }
  c.set_output(0, x.reshape(shape));  // -1 is inferred by ATen
}

void flatten_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  int64_t axis = c.attrs.get_int("axis", 1);
  if (axis < -x.dim() || axis > x.dim())
    c.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(x.dim()));
  if (axis < 0) axis += x.dim();
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.size(d);
  int64_t inner = 1;
  for (int64_t d = axis; d < x.dim(); ++d) inner *= x.size(d);
  c.set_output(0, x.reshape({outer, inner}));  // explicit sizes: -1 is ambiguous when empty
}

void transpose_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  std::vector<int64_t> perm = c.attrs.get_ints("perm", {});
  if (perm.empty())
    for (int64_t d = x.dim() - 1; d >= 0; --d) perm.push_back(d);  // default: reverse
  if (static_cast<int64_t>(perm.size()) != x.dim())
    c.fail("perm " + dims_str(perm) + " does not match input rank " + std::to_string(x.dim()));
  c.set_output(0, x.permute(perm));
}

// Shape and Size describe metadata: they live on the CPU, where shape consumers read them.
void shape_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const int64_t r = x.dim();
  auto clamp = [r](int64_t v) { return std::clamp(v < 0 ? v + r : v, int64_t{0}, r); };
  const int64_t start = clamp(c.attrs.get_int("start", 0));
  const int64_t end = clamp(c.attrs.get_int("end", r));
  at::Tensor out = at::empty({std::max<int64_t>(end - start, 0)}, at::kLong);
  for (int64_t d = start; d < end; ++d) out.mutable_data_ptr<int64_t>()[d - start] = x.size(d);
  c.set_output(0, out);
}

void size_kernel(KernelCtx& c) {
  c.set_output(0, at::scalar_tensor(c.input(0).numel(), at::kLong));
}

void squeeze_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  std::vector<int64_t> axes = axes_input_or_attr(c, 1);
  if (axes.empty()) return c.set_output(0, x.squeeze());  // every size-1 dim
  axes = norm_axes(c, std::move(axes), x.dim());
  for (int64_t a : axes)
    if (x.size(a) != 1)
      c.fail("cannot squeeze axis " + std::to_string(a) + " of size " + std::to_string(x.size(a)) +
             " (input shape " + dims_str(x.sizes()) + ")");
  c.set_output(0, x.squeeze(axes));
}

void unsqueeze_kernel(KernelCtx& c) {
  at::Tensor x = c.input(0);
  std::vector<int64_t> axes = axes_input_or_attr(c, 1);
  // Axes index the output, whose rank is input rank + number of axes.
  axes = norm_axes(c, std::move(axes), x.dim() + static_cast<int64_t>(axes.size()));
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    c.fail("axes " + dims_str(axes) + " repeat an axis");
  for (int64_t a : axes) x = x.unsqueeze(a);  // ascending, so earlier inserts fix later indices
  c.set_output(0, x);
}

void expand_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const std::vector<int64_t> shape = c.input_ints(1);
  // Numpy broadcast of x's shape and `shape` (either side may hold the 1).
  const size_t n = std::max(shape.size(), static_cast<size_t>(x.dim()));
  std::vector<int64_t> out(n, 1);
  for (size_t k = 0; k < n; ++k) {
    const int64_t a = k < static_cast<size_t>(x.dim()) ? x.size(x.dim() - 1 - k) : 1;
    const int64_t b = k < shape.size() ? shape[shape.size() - 1 - k] : 1;
    if (a != b && a != 1 && b != 1)
      c.fail("cannot broadcast input shape " + dims_str(x.sizes()) + " to " + dims_str(shape));
    out[n - 1 - k] = a == 1 ? b : a;
  }
  c.set_output(0, x.expand(out));
}

void concat_kernel(KernelCtx& c) {
  if (!c.attrs.has("axis")) c.fail("attribute 'axis' is required");
  std::vector<at::Tensor> parts;
  for (int i = 0; i < c.num_inputs(); ++i) {
    check_placed(c, c.input(i), c.input(0));
    parts.push_back(c.input(i));
  }
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", 0), c.input(0).dim());
  c.set_output(0, at::cat(parts, axis));
}

void gather_kernel(KernelCtx& c) {
  const at::Tensor& data = c.input(0);
  check_placed(c, c.input(1), data);
  at::Tensor idx = c.input(1);
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", 0), data.dim());
  if (idx.scalar_type() != at::kLong) idx = idx.to(at::kLong);
  // ONNX counts negative indices from the end; index_select would reject them.
  idx = at::where(at::lt(idx, 0), at::add(idx, data.size(axis)), idx);
  std::vector<int64_t> out(data.sizes().begin(), data.sizes().begin() + axis);
  out.insert(out.end(), idx.sizes().begin(), idx.sizes().end());
  out.insert(out.end(), data.sizes().begin() + axis + 1, data.sizes().end());
  c.set_output(0, at::index_select(data, axis, idx.reshape({-1})).reshape(out));
}

void constant_kernel(KernelCtx& c) {
  const Attributes& a = c.attrs;
  at::Tensor t;
  if (const TensorData* td = a.get_tensor("value")) t = tensor_from_data(*td, c.node.describe());
  else if (a.has("value_float")) t = at::scalar_tensor(a.get_float("value_float", 0), at::kFloat);
  else if (a.has("value_int")) t = at::scalar_tensor(a.get_int("value_int", 0), at::kLong);
  else if (a.has("value_ints")) {
    std::vector<int64_t> v = a.get_ints("value_ints", {});
    t = tensor_from_data(TensorData::from_int64s(v), c.node.describe());
  } else if (a.has("value_floats")) {
    const auto& v = std::get<std::vector<float>>(a.all().at("value_floats"));
    t = at::empty({static_cast<int64_t>(v.size())}, at::kFloat);
    std::copy(v.begin(), v.end(), t.mutable_data_ptr<float>());
  } else {
    c.fail("needs one of the attributes value, value_float(s), value_int(s)");
  }
  c.set_output(0, t.to(c.device));
}

void constant_of_shape_kernel(KernelCtx& c) {
  const std::vector<int64_t> shape = c.input_ints(0);
  at::Scalar v = 0.0f;
  at::ScalarType dt = at::kFloat;  // ONNX default: float32 zeros
  if (const TensorData* td = c.attrs.get_tensor("value")) {
    at::Tensor t = tensor_from_data(*td, c.node.describe());
    if (t.numel() != 1) c.fail("attribute 'value' must hold exactly one element");
    v = t.item();
    dt = t.scalar_type();
  }
  c.set_output(0, at::full(shape, v, at::TensorOptions().dtype(dt).device(c.device)));
}

}  // namespace

REGISTER_KERNEL("Reshape", reshape_kernel);
REGISTER_KERNEL("Flatten", flatten_kernel);
REGISTER_KERNEL("Transpose", transpose_kernel);
REGISTER_KERNEL("Shape", shape_kernel);
REGISTER_KERNEL("Size", size_kernel);
REGISTER_KERNEL("Squeeze", squeeze_kernel);
REGISTER_KERNEL("Unsqueeze", unsqueeze_kernel);
REGISTER_KERNEL("Expand", expand_kernel);
REGISTER_KERNEL("Concat", concat_kernel);
REGISTER_KERNEL("Gather", gather_kernel);
REGISTER_KERNEL("Constant", constant_kernel);
REGISTER_KERNEL("ConstantOfShape", constant_of_shape_kernel);

}  // namespace torch_ort::kernels
