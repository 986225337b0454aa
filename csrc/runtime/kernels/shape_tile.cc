// Kernels that repeat, mask or generate whole tensors: Tile and its gradient op, Trilu, Range, EyeLike.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/repeat.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tril.h>
#include <ATen/ops/triu.h>
#include <ATen/ops/zeros.h>

#include "csrc/runtime/dtype.h"
#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

void tile_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const std::vector<int64_t> repeats = c.input_ints(1);
  if (static_cast<int64_t>(repeats.size()) != x.dim())
    c.fail("repeats " + c10::str(c10::IntArrayRef(repeats)) + " must have one entry per dim of the input " +
           c10::str(x.sizes()));
  for (int64_t r : repeats)
    if (r < 0) c.fail("repeats " + c10::str(c10::IntArrayRef(repeats)) + " must be non-negative");
  c.set_output(0, x.repeat(repeats));
}

// (dY, shape(X)) -> dY viewed as (r_0, x_0, r_1, x_1, ...) summed over the r_k: tile t of dim d
// covers output rows [t·x_d, (t+1)·x_d), so the repeat index is the outer one.
void tile_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy = c.input(0);
  const std::vector<int64_t> shape = c.input_ints(1);
  if (static_cast<int64_t>(shape.size()) != dy.dim())
    c.fail("gradient of shape " + c10::str(dy.sizes()) + " does not fit input shape " +
           c10::str(c10::IntArrayRef(shape)));
  std::vector<int64_t> split, reduce;
  for (int64_t d = 0; d < dy.dim(); ++d) {
    if (shape[d] == 0 || dy.size(d) % shape[d] != 0) {
      if (shape[d] == 0) return c.set_output(0, at::zeros(shape, dy.options()));
      c.fail("gradient dim " + std::to_string(d) + " (" + std::to_string(dy.size(d)) +
             ") is no multiple of the input's (" + std::to_string(shape[d]) + ")");
    }
    split.push_back(dy.size(d) / shape[d]);
    split.push_back(shape[d]);
    reduce.push_back(2 * d);
  }
  if (reduce.empty()) return c.set_output(0, dy);  // a scalar tiles to itself
  c.set_output(0, at::sum(dy.reshape(split), reduce));
}

// Trilu(X, k?): keep the upper (upper=1, default) or lower triangle of the last two dims,
// shifted by diagonal k.
void trilu_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  if (x.dim() < 2) c.fail("input of rank " + std::to_string(x.dim()) + " (needs at least 2)");
  const int64_t k = c.has_input(1) ? static_cast<int64_t>(c.input_scalar(1, 0)) : 0;
  c.set_output(0, c.attrs.get_int("upper", 1) ? at::triu(x, k) : at::tril(x, k));
}

// Range(start, limit, delta): ceil((limit - start) / delta) values, in the inputs' dtype. The
// bounds are host values (usually sizes); the values are made where this step computes.
void range_kernel(KernelCtx& c) {
  const c10::Scalar s = c.input_item(0), l = c.input_item(1), d = c.input_item(2);
  const at::TensorOptions opts = at::TensorOptions().dtype(c.input(0).scalar_type()).device(c.device);
  if (d.toDouble() == 0) c.fail("delta must be non-zero");
  // ONNX yields max(count, 0) values where torch.arange would reject a limit on the wrong side.
  const double sd = s.toDouble(), ld = l.toDouble(), dd = d.toDouble();
  if ((dd > 0 && ld <= sd) || (dd < 0 && ld >= sd)) return c.set_output(0, at::empty({0}, opts));
  if (at::isIntegralType(c.input(0).scalar_type(), /*includeBool=*/false))
    return c.set_output(0, at::arange(s.toLong(), l.toLong(), d.toLong(), opts));
  c.set_output(0, at::arange(sd, ld, dd, opts));
}

// EyeLike(X; dtype, k): zeros of X's 2-D shape with ones on diagonal k (above the main one when
// positive), in `dtype` (default: X's).
void eye_like_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  if (x.dim() != 2) c.fail("needs a 2-D input, got " + c10::str(x.sizes()));
  at::ScalarType dtype = x.scalar_type();
  if (c.attrs.has("dtype"))
    dtype = to_aten(static_cast<DType>(c.attrs.get_int("dtype", 0)), "dtype of " + c.node.describe());
  at::Tensor y = at::zeros(x.sizes(), x.options().dtype(dtype));
  const int64_t k = c.attrs.get_int("k", 0);
  if (k < x.size(1) && -k < x.size(0)) y.diagonal(k).fill_(1);
  c.set_output(0, y);
}

}  // namespace

REGISTER_KERNEL("Tile", tile_kernel);
REGISTER_KERNEL("Trilu", trilu_kernel);
REGISTER_KERNEL("Range", range_kernel);
REGISTER_KERNEL("EyeLike", eye_like_kernel);
REGISTER_KERNEL_IN(kOurDomain, "TileGrad", tile_grad_kernel);

}  // namespace torch_ort::kernels
