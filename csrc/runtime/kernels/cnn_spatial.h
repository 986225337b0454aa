// Spatial attributes of Conv, ConvTranspose and the pools (kernel, strides, dilations, pads),
// resolved once per call against the input's sizes, including auto_pad.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "csrc/runtime/kernel.h"

namespace torch_ort::kernels {

struct Spatial {
  std::vector<int64_t> kernel;     // per spatial dim
  std::vector<int64_t> strides;    // default 1
  std::vector<int64_t> dilations;  // default 1
  std::vector<int64_t> begin;      // pads before each spatial dim
  std::vector<int64_t> end;        // pads after each spatial dim
  int64_t rank() const { return static_cast<int64_t>(kernel.size()); }
  // ATen takes one pad per dim (applied on both sides); anything else is padded explicitly.
  bool symmetric() const { return begin == end; }
  bool any_pad() const;
};

// `kernel` comes from the kernel_shape attribute or the weight; pads from `pads` or auto_pad.
// For ConvTranspose (`transposed`), auto_pad SAME and output_shape define the pads from the
// output size instead (ONNX: total = stride·(in−1) + output_padding + (k−1)·d + 1 − out).
// `x` is the input's shape (N, C, D1, ..., Dn).
Spatial resolve_spatial(const KernelCtx& c, c10::IntArrayRef x, std::vector<int64_t> kernel,
                        bool transposed = false);

// The kernel_shape attribute, checked against the input's spatial rank (pools).
std::vector<int64_t> kernel_shape_attr(const KernelCtx& c, c10::IntArrayRef x);

// Pads `x`'s trailing spatial dims by (begin, end) with `value` (ATen's constant_pad_nd order).
at::Tensor pad_spatial(const at::Tensor& x, const Spatial& s, double value);
// The inverse for a gradient: the interior of `x` without the (begin, end) border.
at::Tensor crop_spatial(const at::Tensor& x, const Spatial& s);

// X's sizes as a vector (the *Grad ops get the forward input's shape as an int64 input).
std::vector<int64_t> shape_input(const KernelCtx& c, int i, int64_t min_rank);

}  // namespace torch_ort::kernels
