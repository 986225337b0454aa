// Pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool and their gradient ops.
// 1-D pools run as 2-D with a height of 1. ATen pads symmetrically and at most half a kernel;
// other pads (auto_pad SAME, foreign models) pad the input explicitly (−inf for max; for the
// average a sum-pool divided by a pooled count of the cells that count). With ceil_mode that
// explicit path keeps every window that fits the padded input, which may be one more than ATen.
//
// MaxPool's gradient needs each output's argmax. We keep it from the forward, as ONNX's optional
// Indices output (requested by the autodiff), instead of recomputing the pool in backward:
// 8 bytes per *output* element saved (a 2x2/2 pool: half the size of its float input), one cheap
// scatter in backward, and no input saved for the gradient at all (the gradient gets X's shape).
// Recomputing would save X instead (4x more elements) plus a second forward pool in backward.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <limits>

#include <ATen/core/Tensor.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/avg_pool2d.h>
#include <ATen/ops/avg_pool2d_backward.h>
#include <ATen/ops/avg_pool3d.h>
#include <ATen/ops/avg_pool3d_backward.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/max_pool2d_with_indices.h>
#include <ATen/ops/max_pool3d_with_indices.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include "csrc/runtime/kernels/common.h"
#include "csrc/runtime/kernels/cnn_spatial.h"

namespace torch_ort::kernels {
namespace {

// A pool as ATen runs it: 2-D or 3-D (1-D lifted), and whether ATen can take the pads itself.
struct Pool {
  Spatial s;
  bool lifted = false;  // a 1-D pool run as 2-D: tensors get a unit dim at 2
  bool direct = true;   // pads symmetric and <= kernel/2
  bool ceil = false;
  std::vector<int64_t> zeros;
};

Pool pool_args(const KernelCtx& c, c10::IntArrayRef x) {
  Pool p{resolve_spatial(c, x, kernel_shape_attr(c, x))};
  p.ceil = c.attrs.get_int("ceil_mode", 0) != 0;
  for (int64_t d = 0; d < p.s.rank(); ++d)
    if (p.s.begin[d] < 0 || p.s.end[d] < 0) c.fail("negative pads are not supported");
  if (p.s.rank() == 1) {
    for (auto* v : {&p.s.kernel, &p.s.strides, &p.s.dilations}) v->insert(v->begin(), 1);
    for (auto* v : {&p.s.begin, &p.s.end}) v->insert(v->begin(), 0);
    p.lifted = true;
  }
  p.direct = p.s.symmetric();
  for (int64_t d = 0; d < p.s.rank(); ++d) p.direct &= p.s.begin[d] <= p.s.kernel[d] / 2;
  p.zeros.assign(p.s.rank(), 0);
  return p;
}

at::Tensor lift(const Pool& p, const at::Tensor& t) { return p.lifted ? t.unsqueeze(2) : t; }
at::Tensor unlift(const Pool& p, const at::Tensor& t) { return p.lifted ? t.squeeze(2) : t; }
std::vector<int64_t> lift(const Pool& p, std::vector<int64_t> shape) {
  if (p.lifted) shape.insert(shape.begin() + 2, 1);
  return shape;
}

// Per-plane argmax positions of a pool over the padded input -> positions in the unpadded one.
at::Tensor unpad_indices(const at::Tensor& idx, const Pool& p, c10::IntArrayRef padded,
                         c10::IntArrayRef plain) {
  at::Tensor rest = idx, out = at::zeros_like(idx);
  int64_t plain_stride = 1;
  for (int64_t d = p.s.rank() - 1; d >= 0; --d) {
    const int64_t size = padded[d + 2];
    out.add_(rest.remainder(size).sub(p.s.begin[d]).mul(plain_stride));
    rest = rest.div(size, "floor");
    plain_stride *= plain[d + 2];
  }
  return out;
}

// (X) -> (Y, [Indices]); Indices flatten over the whole unpadded input, as ONNX defines them.
void max_pool_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const Pool p = pool_args(c, x.sizes());
  if (c.output_wanted(1) && c.attrs.get_int("storage_order", 0) != 0)
    c.fail("Indices with storage_order=1 (column-major) are not supported");
  if (!p.direct && !at::isFloatingType(x.scalar_type()))
    c.fail("pads beyond ATen's symmetric half-kernel need a floating input, got " +
           std::string(c10::toString(x.scalar_type())));
  at::Tensor xl = lift(p, x);
  if (!p.direct) xl = pad_spatial(xl, p.s, -std::numeric_limits<double>::infinity());
  const std::vector<int64_t>& pad = p.direct ? p.s.begin : p.zeros;
  auto [y, idx] = p.s.rank() == 2
      ? at::max_pool2d_with_indices(xl, p.s.kernel, p.s.strides, pad, p.s.dilations, p.ceil)
      : at::max_pool3d_with_indices(xl, p.s.kernel, p.s.strides, pad, p.s.dilations, p.ceil);
  c.set_output(0, unlift(p, y));
  if (!c.output_wanted(1)) return;
  const std::vector<int64_t> plain = lift(p, x.sizes().vec());
  if (!p.direct) idx = unpad_indices(idx, p, xl.sizes(), plain);
  int64_t plane = 1;
  for (size_t d = 2; d < plain.size(); ++d) plane *= plain[d];
  std::vector<int64_t> offsets_shape{x.size(0), x.size(1)};
  offsets_shape.resize(idx.dim(), 1);
  at::Tensor offsets = at::arange(x.size(0) * x.size(1), idx.options()).mul(plane).reshape(offsets_shape);
  c.set_output(1, unlift(p, idx.add(offsets)));
}

// (dY, Indices, shape(X)) -> dX: each output's gradient added at its argmax.
void max_pool_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const at::Tensor& idx = c.input(1);
  const std::vector<int64_t> shape = shape_input(c, 2, 3);
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (!idx.sizes().equals(dy.sizes()))
    c.fail("Indices of shape " + c10::str(idx.sizes()) + " do not match dY of shape " + c10::str(dy.sizes()));
  at::Tensor dx = at::zeros({numel}, dy.options());
  dx.index_add_(0, idx.reshape(-1).to(at::kLong), dy.reshape(-1));
  c.set_output(0, dx.view(shape));
}

// Window sums with every window over the explicitly padded input, and the count each window
// divides by: the pads count when count_include_pad, else only the input's own cells.
struct PaddedAverage {
  at::Tensor count;  // (1, 1, out...) divisor per output position
  std::vector<int64_t> padded_shape;
};

at::Tensor sum_pool(const Pool& p, const at::Tensor& t) {
  return p.s.rank() == 2 ? at::avg_pool2d(t, p.s.kernel, p.s.strides, p.zeros, p.ceil, true, 1)
                         : at::avg_pool3d(t, p.s.kernel, p.s.strides, p.zeros, p.ceil, true, 1);
}

PaddedAverage padded_average(const KernelCtx& c, const Pool& p, std::vector<int64_t> lifted_shape,
                             const at::TensorOptions& opts) {
  std::vector<int64_t> cell_shape(lifted_shape.begin() + 2, lifted_shape.end());
  cell_shape.insert(cell_shape.begin(), {1, 1});
  const double pad_counts = c.attrs.get_int("count_include_pad", 0) ? 1.0 : 0.0;
  at::Tensor cells = pad_spatial(at::ones(cell_shape, opts), p.s, pad_counts);
  PaddedAverage a{sum_pool(p, cells), lifted_shape};
  for (int64_t d = 0; d < p.s.rank(); ++d) a.padded_shape[d + 2] += p.s.begin[d] + p.s.end[d];
  return a;
}

void check_no_dilation(const KernelCtx& c, const Pool& p) {
  for (int64_t d : p.s.dilations)
    if (d != 1) c.fail("dilations " + c10::str(p.s.dilations) + " are not supported for AveragePool");
}

// (X) -> Y
void average_pool_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const Pool p = pool_args(c, x.sizes());
  check_no_dilation(c, p);
  const bool include_pad = c.attrs.get_int("count_include_pad", 0) != 0;
  const at::Tensor xl = lift(p, x);
  at::Tensor y;
  if (p.direct) {
    y = p.s.rank() == 2 ? at::avg_pool2d(xl, p.s.kernel, p.s.strides, p.s.begin, p.ceil, include_pad)
                        : at::avg_pool3d(xl, p.s.kernel, p.s.strides, p.s.begin, p.ceil, include_pad);
  } else {
    const PaddedAverage a = padded_average(c, p, xl.sizes().vec(), xl.options());
    y = at::div(sum_pool(p, pad_spatial(xl, p.s, 0.0)), a.count);
  }
  c.set_output(0, unlift(p, y));
}

// (dY, shape(X)) -> dX; the input itself is never read (ATen takes it only for its sizes).
void average_pool_grad_kernel(KernelCtx& c) {
  const std::vector<int64_t> x_shape = shape_input(c, 1, 3);
  const Pool p = pool_args(c, x_shape);
  check_no_dilation(c, p);
  const std::vector<int64_t> shape = lift(p, x_shape);
  const at::Tensor dy = lift(p, c.input(0));
  auto backward = [&](const at::Tensor& g, const std::vector<int64_t>& in_shape, c10::IntArrayRef pad,
                      bool include_pad, std::optional<int64_t> divisor) {
    const at::Tensor self = at::empty(in_shape, g.options());
    return p.s.rank() == 2
        ? at::avg_pool2d_backward(g, self, p.s.kernel, p.s.strides, pad, p.ceil, include_pad, divisor)
        : at::avg_pool3d_backward(g, self, p.s.kernel, p.s.strides, pad, p.ceil, include_pad, divisor);
  };
  at::Tensor dx;
  if (p.direct) {
    dx = backward(dy, shape, p.s.begin, c.attrs.get_int("count_include_pad", 0) != 0, std::nullopt);
  } else {
    const PaddedAverage a = padded_average(c, p, shape, dy.options());
    dx = crop_spatial(backward(at::div(dy, a.count), a.padded_shape, p.zeros, true, 1), p.s);
  }
  c.set_output(0, unlift(p, dx));
}

std::vector<int64_t> spatial_dims(const KernelCtx& c, const at::Tensor& x) {
  if (x.dim() < 3) c.fail("expected an (N, C, D1, ...) input, got shape " + c10::str(x.sizes()));
  std::vector<int64_t> dims;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

void global_average_pool_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  c.set_output(0, at::mean(x, spatial_dims(c, x), true));
}

void global_max_pool_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  c.set_output(0, at::amax(x, spatial_dims(c, x), true));
}

// (dY, X, Y) -> dX = dY · [X == Y] / #ties: ties share the gradient, as in ATen's amax backward.
void global_max_pool_grad_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(1);
  const at::Tensor mask = at::eq(x, c.input(2)).to(c.input(0).scalar_type());
  c.set_output(0, at::mul(mask, at::div(c.input(0), mask.sum(spatial_dims(c, x), true))));
}

}  // namespace

REGISTER_KERNEL("MaxPool", max_pool_kernel);
REGISTER_KERNEL("AveragePool", average_pool_kernel);
REGISTER_KERNEL("GlobalAveragePool", global_average_pool_kernel);
REGISTER_KERNEL("GlobalMaxPool", global_max_pool_kernel);
REGISTER_KERNEL_IN(kOurDomain, "MaxPoolGrad", max_pool_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "AveragePoolGrad", average_pool_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "GlobalMaxPoolGrad", global_max_pool_grad_kernel);

}  // namespace torch_ort::kernels
