// Resolution of the spatial attributes shared by the convolution and pooling kernels.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "csrc/runtime/kernels/cnn_spatial.h"

#include <ATen/ops/constant_pad_nd.h>

namespace torch_ort::kernels {
namespace {

std::vector<int64_t> per_dim(const KernelCtx& c, const char* name, int64_t n) {
  std::vector<int64_t> v = c.attrs.get_ints(name, std::vector<int64_t>(n, 1));
  if (static_cast<int64_t>(v.size()) != n)
    c.fail(std::string(name) + " has " + std::to_string(v.size()) + " values for " +
           std::to_string(n) + " spatial dims");
  return v;
}

}  // namespace

bool Spatial::any_pad() const {
  for (size_t i = 0; i < begin.size(); ++i)
    if (begin[i] != 0 || end[i] != 0) return true;
  return false;
}

std::vector<int64_t> kernel_shape_attr(const KernelCtx& c, c10::IntArrayRef x) {
  if (!c.attrs.has("kernel_shape")) c.fail("the kernel_shape attribute is required");
  std::vector<int64_t> k = c.attrs.get_ints("kernel_shape", {});
  if (k.size() + 2 != x.size())
    c.fail("kernel_shape " + c10::str(k) + " does not fit an input of shape " + c10::str(x) +
           " (N, C and one size per kernel dim)");
  return k;
}

Spatial resolve_spatial(const KernelCtx& c, c10::IntArrayRef x, std::vector<int64_t> kernel,
                        bool transposed) {
  const int64_t n = static_cast<int64_t>(kernel.size());
  if (n < 1 || n > 3 || static_cast<int64_t>(x.size()) != n + 2)
    c.fail("expected an (N, C, D1, ..., Dn) input with 1 to 3 spatial dims matching the kernel " +
           c10::str(kernel) + ", got shape " + c10::str(x));
  Spatial s{std::move(kernel), per_dim(c, "strides", n), per_dim(c, "dilations", n), {}, {}};
  const std::string auto_pad = c.attrs.get_string("auto_pad", "NOTSET");
  std::vector<int64_t> out_shape = c.attrs.get_ints("output_shape", {});
  if (!out_shape.empty() && static_cast<int64_t>(out_shape.size()) == n + 2)
    out_shape.erase(out_shape.begin(), out_shape.begin() + 2);  // given with N and C
  const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  if (auto_pad == "NOTSET" && (out_shape.empty() || !transposed)) {
    std::vector<int64_t> pads = c.attrs.get_ints("pads", std::vector<int64_t>(2 * n, 0));
    if (static_cast<int64_t>(pads.size()) != 2 * n)
      c.fail("pads " + c10::str(pads) + " needs " + std::to_string(2 * n) + " values (begins, then ends)");
    s.begin.assign(pads.begin(), pads.begin() + n);
    s.end.assign(pads.begin() + n, pads.end());
  } else if (auto_pad == "VALID" && out_shape.empty()) {
    s.begin.assign(n, 0);
    s.end.assign(n, 0);
  } else if (same || (transposed && !out_shape.empty())) {
    if (transposed && !out_shape.empty() && static_cast<int64_t>(out_shape.size()) != n)
      c.fail("output_shape " + c10::str(out_shape) + " needs " + std::to_string(n) + " spatial sizes");
    const std::vector<int64_t> op = transposed ? c.attrs.get_ints("output_padding", std::vector<int64_t>(n, 0))
                                               : std::vector<int64_t>(n, 0);
    for (int64_t d = 0; d < n; ++d) {
      const int64_t in = x[d + 2], span = (s.kernel[d] - 1) * s.dilations[d] + 1;
      int64_t total;
      if (transposed) {
        const int64_t out = out_shape.empty() ? in * s.strides[d] : out_shape[d];
        total = s.strides[d] * (in - 1) + op.at(d) + span - out;
      } else {
        const int64_t out = (in + s.strides[d] - 1) / s.strides[d];  // ceil(in / stride)
        total = std::max<int64_t>(0, (out - 1) * s.strides[d] + span - in);
      }
      // SAME_UPPER puts the odd pad at the end; SAME_LOWER (and ConvTranspose's output_shape
      // without SAME_UPPER) at the beginning.
      const int64_t small = total / 2, big = total - small;
      const bool upper = auto_pad == "SAME_UPPER";
      s.begin.push_back(upper ? small : big);
      s.end.push_back(upper ? big : small);
    }
  } else {
    c.fail("auto_pad '" + auto_pad + "' is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER");
  }
  for (int64_t d = 0; d < n; ++d)
    if (s.strides[d] < 1 || s.dilations[d] < 1 || s.kernel[d] < 1)
      c.fail("kernel, strides and dilations must be positive (kernel " + c10::str(s.kernel) +
             ", strides " + c10::str(s.strides) + ", dilations " + c10::str(s.dilations) + ")");
  return s;
}

at::Tensor pad_spatial(const at::Tensor& x, const Spatial& s, double value) {
  std::vector<int64_t> pad;  // constant_pad_nd: last dim first, (begin, end) pairs
  for (int64_t d = s.rank() - 1; d >= 0; --d) {
    pad.push_back(s.begin[d]);
    pad.push_back(s.end[d]);
  }
  return at::constant_pad_nd(x, pad, value);
}

at::Tensor crop_spatial(const at::Tensor& x, const Spatial& s) {
  at::Tensor r = x;
  for (int64_t d = 0; d < s.rank(); ++d) {
    const int64_t dim = d + 2;
    r = r.narrow(dim, s.begin[d], r.size(dim) - s.begin[d] - s.end[d]);
  }
  return r;
}

std::vector<int64_t> shape_input(const KernelCtx& c, int i, int64_t min_rank) {
  std::vector<int64_t> shape = c.input_ints(i);
  if (static_cast<int64_t>(shape.size()) < min_rank)
    c.fail("input " + std::to_string(i) + " must be a shape of rank >= " + std::to_string(min_rank) +
           ", got " + c10::str(shape));
  return shape;
}

}  // namespace torch_ort::kernels
