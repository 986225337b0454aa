// Helpers shared by the kernel families: axis normalization, device alignment, attribute reads.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "csrc/runtime/kernel.h"

namespace torch_ort::kernels {

// ONNX axes may be negative (counted from the end); errors name the node and the bad axis.
inline int64_t norm_axis(const KernelCtx& ctx, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= (rank == 0 ? 1 : rank))
    ctx.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

inline std::vector<int64_t> norm_axes(const KernelCtx& ctx, std::vector<int64_t> axes, int64_t rank) {
  for (int64_t& a : axes) a = norm_axis(ctx, a, rank);
  return axes;
}

// Axes from input `i` (opset 13+/18+ form) or else from the "axes" attribute (older opsets).
inline std::vector<int64_t> axes_input_or_attr(const KernelCtx& ctx, int i) {
  if (ctx.has_input(i)) return ctx.input_ints(i);
  return ctx.attrs.get_ints("axes", {});
}

// Shape/Size results and constants read as shapes live on the CPU; a CPU tensor with dims
// meeting a device tensor is moved to the device (0-dim CPU tensors mix freely in ATen).
inline at::Tensor on_device_of(const at::Tensor& t, const at::Tensor& like) {
  if (t.device() == like.device() || t.dim() == 0) return t;
  return t.to(like.device());
}

// Devices where eager PyTorch's dropout is the fused native_dropout kernel (ATen's Dropout.cpp);
// Dropout and DropoutGrad follow the same split so that seeded runs match eager.
inline bool fused_dropout_device(const at::Tensor& x) {
  return x.is_cuda() || x.is_xpu() || x.is_lazy() || x.is_privateuseone();
}

// The gradient of a graph output that autograd passed as None: a stride-0 view of one cached zero
// per dtype and device (never a filled buffer of the output's size: a GPT's logits are 200 MB).
// The cached zeros live for the process, so is_absent_gradient's storage test has no false hits.
at::Tensor absent_gradient(c10::IntArrayRef sizes, const at::TensorOptions& options);
bool is_absent_gradient(const at::Tensor& t);

}  // namespace torch_ort::kernels
