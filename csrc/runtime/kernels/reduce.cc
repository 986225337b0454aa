// Reductions, scans and normalizations along axes: ReduceSum, ReduceMean, the other Reduce* ops,
// ArgMax/ArgMin, CumSum, Softmax, LogSoftmax.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <algorithm>
#include <numeric>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_log_softmax.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/amin.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/argmin.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/log.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/prod.h>
#include <ATen/ops/rsub.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/div.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/sum.h>

#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels {
namespace {

// Resolved axes of a Reduce* node; `noop` when empty axes mean "do nothing".
struct ReduceAxes {
  std::vector<int64_t> dims;
  bool noop = false;
};

ReduceAxes reduce_axes(const KernelCtx& c, const at::Tensor& x) {
  // axes: input 1 (ReduceSum since 13, the others since 18) or the attribute before that.
  std::vector<int64_t> axes = axes_input_or_attr(c, 1);
  if (axes.empty()) {
    if (c.attrs.get_int("noop_with_empty_axes", 0)) return {{}, true};
    axes.resize(x.dim());
    std::iota(axes.begin(), axes.end(), 0);  // explicit: ATen reads an empty list as "all" too
  }
  return {norm_axes(c, std::move(axes), x.dim()), false};
}

void reduce_sum_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  ReduceAxes r = reduce_axes(c, x);
  if (r.noop) return c.set_output(0, x);
  // dtype pinned: ATen would widen int32 sums to int64, ONNX keeps the input type.
  c.set_output(0, at::sum(x, r.dims, c.attrs.get_int("keepdims", 1) != 0, x.scalar_type()));
}

void reduce_mean_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  ReduceAxes r = reduce_axes(c, x);
  if (r.noop) return c.set_output(0, x);
  const bool keep = c.attrs.get_int("keepdims", 1) != 0;
  if (at::isFloatingType(x.scalar_type())) return c.set_output(0, at::mean(x, r.dims, keep));
  // ATen's mean rejects integers; ONNX defines it as the truncated sum / count.
  int64_t n = 1;
  for (int64_t d : r.dims) n *= x.size(d);
  c.set_output(0, at::div(at::sum(x, r.dims, keep, x.scalar_type()), n, "trunc"));
}

// ReduceMax/ReduceMin/ReduceProd/ReduceL1/ReduceL2/ReduceLogSum/ReduceLogSumExp/ReduceSumSquare:
// one recipe over the resolved axes (`noop_with_empty_axes` passes X through).
enum class Reduce { kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

template <Reduce R>
void reduce_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  ReduceAxes r = reduce_axes(c, x);
  if (r.noop) return c.set_output(0, x);
  const bool keep = c.attrs.get_int("keepdims", 1) != 0;
  for (int64_t d : r.dims)
    if (x.size(d) == 0 && (R == Reduce::kMax || R == Reduce::kMin))
      c.fail("cannot reduce an empty axis " + std::to_string(d) + " of " + c10::str(x.sizes()));
  if constexpr (R == Reduce::kMax) return c.set_output(0, at::amax(x, r.dims, keep));
  if constexpr (R == Reduce::kMin) return c.set_output(0, at::amin(x, r.dims, keep));
  if constexpr (R == Reduce::kProd) {  // ATen's prod takes one dim at a time: the highest first
    at::Tensor y = x;
    std::vector<int64_t> dims = r.dims;
    std::sort(dims.rbegin(), dims.rend());
    for (int64_t d : dims) y = at::prod(y, d, keep, x.scalar_type());
    return c.set_output(0, y);
  }
  if constexpr (R == Reduce::kL1) return c.set_output(0, at::sum(at::abs(x), r.dims, keep, x.scalar_type()));
  if constexpr (R == Reduce::kSumSquare)
    return c.set_output(0, at::sum(at::mul(x, x), r.dims, keep, x.scalar_type()));
  if (!at::isFloatingType(x.scalar_type()))
    c.fail("needs a floating-point input, got " + std::string(c10::toString(x.scalar_type())));
  if constexpr (R == Reduce::kL2) return c.set_output(0, at::sqrt(at::sum(at::mul(x, x), r.dims, keep)));
  if constexpr (R == Reduce::kLogSum) return c.set_output(0, at::log(at::sum(x, r.dims, keep)));
  if constexpr (R == Reduce::kLogSumExp) return c.set_output(0, at::logsumexp(x, r.dims, keep));
}

// ArgMax/ArgMin(X; axis, keepdims, select_last_index): int64 positions; ties go to the first
// (ATen's rule too) or, with select_last_index, to the last (searched on the flipped axis).
template <bool kMax>
void arg_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", 0), x.dim());
  const bool keep = c.attrs.get_int("keepdims", 1) != 0;
  if (x.size(axis) == 0) c.fail("cannot search an empty axis " + std::to_string(axis) + " of " + c10::str(x.sizes()));
  if (c.attrs.get_int("select_last_index", 0) == 0)
    return c.set_output(0, kMax ? at::argmax(x, axis, keep) : at::argmin(x, axis, keep));
  at::Tensor flipped = at::flip(x, {axis});
  at::Tensor i = kMax ? at::argmax(flipped, axis, keep) : at::argmin(flipped, axis, keep);
  c.set_output(0, at::rsub(i, x.size(axis) - 1));
}

// Opset < 13 Softmax coerces the input to 2-D at `axis` (default 1) and normalizes each row;
// opset 13+ normalizes along one axis (default -1).
template <bool kLog>
void softmax_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const bool legacy = c.opset < 13;
  const int64_t axis = norm_axis(c, c.attrs.get_int("axis", legacy ? 1 : -1), x.dim());
  auto fn = [](const at::Tensor& t, int64_t d) {
    return kLog ? at::_log_softmax(t, d, false) : at::_softmax(t, d, false);
  };
  if (!legacy || axis == x.dim() - 1) return c.set_output(0, fn(x, axis));
  const auto sizes = x.sizes();
  int64_t rows = 1;
  for (int64_t d = 0; d < axis; ++d) rows *= sizes[d];
  c.set_output(0, fn(x.reshape({rows, -1}), 1).reshape(sizes));
}

// CumSum(X, axis): running sums along axis. `reverse` sums from the end; `exclusive` leaves each
// element out of its own sum, by shifting the inclusive sums one place (exact, unlike
// subtracting the element again) and putting 0 first.
void cumsum_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const std::vector<int64_t> axis = c.input_ints(1);
  if (axis.size() != 1) c.fail("axis must hold one value, got " + std::to_string(axis.size()));
  const int64_t rank = x.dim(), dim = norm_axis(c, axis[0], rank);
  const bool reverse = c.attrs.get_int("reverse", 0) != 0;
  at::Tensor y = at::cumsum(reverse ? x.flip(dim) : x, dim, x.scalar_type());  // ONNX keeps int32
  if (c.attrs.get_int("exclusive", 0) != 0 && y.numel() > 0) {
    std::vector<int64_t> pad(2 * static_cast<size_t>(rank - dim), 0);  // last dim first
    pad[2 * static_cast<size_t>(rank - 1 - dim)] = 1;
    y = at::constant_pad_nd(y.narrow(dim, 0, y.size(dim) - 1), pad, 0);
  }
  c.set_output(0, reverse ? y.flip(dim) : y);
}

}  // namespace

REGISTER_KERNEL("ReduceSum", reduce_sum_kernel);
REGISTER_KERNEL("CumSum", cumsum_kernel);
REGISTER_KERNEL("ReduceMean", reduce_mean_kernel);
REGISTER_KERNEL("ReduceMax", reduce_kernel<Reduce::kMax>);
REGISTER_KERNEL("ReduceMin", reduce_kernel<Reduce::kMin>);
REGISTER_KERNEL("ReduceProd", reduce_kernel<Reduce::kProd>);
REGISTER_KERNEL("ReduceL1", reduce_kernel<Reduce::kL1>);
REGISTER_KERNEL("ReduceL2", reduce_kernel<Reduce::kL2>);
REGISTER_KERNEL("ReduceLogSum", reduce_kernel<Reduce::kLogSum>);
REGISTER_KERNEL("ReduceLogSumExp", reduce_kernel<Reduce::kLogSumExp>);
REGISTER_KERNEL("ReduceSumSquare", reduce_kernel<Reduce::kSumSquare>);
REGISTER_KERNEL("ArgMax", arg_kernel<true>);
REGISTER_KERNEL("ArgMin", arg_kernel<false>);
REGISTER_KERNEL("Softmax", softmax_kernel<false>);
REGISTER_KERNEL("LogSoftmax", softmax_kernel<true>);

}  // namespace torch_ort::kernels
