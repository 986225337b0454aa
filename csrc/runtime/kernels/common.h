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

// Tensors one ATen op reads together must share a device (a 0-dim CPU tensor is the exception:
// ATen reads it as a number). Placement (planner/placement.h) makes every host/device crossing a
// node of the graph, so a mismatch is a placement bug, an error: a copy here would hide a
// host-device synchronisation.
inline void check_placed(const KernelCtx& c, const at::Tensor& a, const at::Tensor& b) {
  const auto scalar = [](const at::Tensor& t) { return t.dim() == 0 && t.is_cpu(); };
  if (a.device() != b.device() && !scalar(a) && !scalar(b))
    c.fail("internal: an input on " + a.device().str() + " meets one on " + b.device().str() +
           " (csrc/core/planner/placement.cc left a crossing without a ToHost/ToDevice node)");
}

// Devices where eager PyTorch's dropout is the fused native_dropout kernel (ATen's Dropout.cpp);
// Dropout and DropoutGrad follow the same split so that seeded runs match eager.
inline bool fused_dropout_device(const at::Tensor& x) {
  return x.is_cuda() || x.is_xpu() || x.is_lazy() || x.is_privateuseone();
}

// The buffer a scatter-back of gradients adds into: input i, the same value's other gradient
// contributions (a tied weight's), checked against `shape` and dY's dtype, overwritten where the
// plan allows and copied otherwise. Undefined when the node has no such input.
inline at::Tensor accumulator(const KernelCtx& c, int i, c10::IntArrayRef shape, const at::Tensor& dy) {
  if (!c.has_input(i)) return at::Tensor();
  const at::Tensor& acc = c.input(i);
  if (acc.sizes() != shape || acc.scalar_type() != dy.scalar_type())
    c.fail("accumulator of shape " + c10::str(acc.sizes()) + " (" + c10::toString(acc.scalar_type()) +
           ") does not match the gradient's " + c10::str(shape) + " (" + c10::toString(dy.scalar_type()) + ")");
  return c.may_overwrite_input(i, acc.sizes(), dy.scalar_type()) ? acc : acc.clone(at::MemoryFormat::Contiguous);
}

// The gradient of a graph output that autograd passed as None: a stride-0 view of one cached zero
// per dtype and device (never a filled buffer of the output's size: a GPT's logits are 200 MB).
// The cached zeros live for the process, so is_absent_gradient's storage test has no false hits.
at::Tensor absent_gradient(c10::IntArrayRef sizes, const at::TensorOptions& options);
bool is_absent_gradient(const at::Tensor& t);

// The 2-D products alpha·A·B and beta·C + alpha·A·B (C broadcast) in a new tensor, as at::mm and
// at::addmm make them, but one of BufferPool::kMappedBytes or more (the logits of a
// vocabulary-sized head) comes from the CPU buffer pool: its page faults cost a fifth of the GEMM
// when glibc maps it afresh each step (linalg.cc).
at::Tensor pooled_mm(const at::Tensor& a, const at::Tensor& b, double alpha = 1.0);
at::Tensor pooled_addmm(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, double beta, double alpha);

}  // namespace torch_ort::kernels
