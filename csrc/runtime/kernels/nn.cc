// Transformer-block kernels and their gradient ops: LayerNormalization, Gelu, Erf and our
// Embedding (a Gather that keeps padding_idx). Each forward calls the ATen function eager PyTorch
// calls, and each gradient op the ATen backward its autograd would, so results match eager.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <cmath>
#include <optional>

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/embedding_dense_backward.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/erf.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/index_add.h>
#include <ATen/ops/masked_fill.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/pow.h>

#include "csrc/runtime/buffer_pool.h"
#include "csrc/runtime/kernels/common.h"
#include "csrc/runtime/kernels/decimal.h"

namespace torch_ort::kernels {
namespace {

// --- LayerNormalization: Y = (X − mean) · invstd · Scale + B over the dims [axis, rank).

// Scale/B hold one value per normalised element; ATen wants them shaped like those dims.
std::optional<at::Tensor> ln_param(const KernelCtx& c, int i, c10::IntArrayRef normalized) {
  if (!c.has_input(i)) return std::nullopt;
  const at::Tensor& p = c.input(i);
  if (p.sizes().equals(normalized)) return p;
  if (p.numel() != c10::multiply_integers(normalized))
    c.fail(std::string(i == 1 ? "Scale" : "B") + " of shape " + c10::str(p.sizes()) +
           " does not match the normalized shape " + c10::str(normalized));
  return p.reshape(normalized);
}

int64_t ln_axis(const KernelCtx& c, const at::Tensor& x) {
  if (x.dim() == 0) c.fail("input must have rank >= 1");
  return norm_axis(c, c.attrs.get_int("axis", -1), x.dim());
}

// The dtype native_layer_norm gives mean/invstd on this device: the input's own on CPU (unless
// the parameters are of another dtype), the accumulation type (float for half) elsewhere.
at::ScalarType stat_dtype(const at::Tensor& x, const std::optional<at::Tensor>& scale) {
  const bool mixed = scale && scale->scalar_type() != x.scalar_type();
  if (x.is_cpu() && !mixed) return x.scalar_type();
  return at::toOpMathType(x.scalar_type());
}

// (X, Scale, [B]) -> (Y, [Mean], [InvStdDev]); Mean/InvStdDev keep the normalised dims as 1s.
void layer_norm_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(0);
  const int64_t axis = ln_axis(c, x);
  const c10::IntArrayRef normalized = x.sizes().slice(axis);
  const double eps = shortest_decimal(c.attrs.get_float("epsilon", 1e-5f));
  auto [y, mean, invstd] = at::native_layer_norm(x, normalized, ln_param(c, 1, normalized),
                                                 ln_param(c, 2, normalized), eps);
  c.set_output(0, std::move(y));
  // stash_type 1 (the default): statistics are float even for half inputs (ONNX's contract).
  const bool stash_float = c.attrs.get_int("stash_type", 1) == 1;
  for (int i : {1, 2}) {
    at::Tensor s = i == 1 ? mean : invstd;
    if (stash_float && at::isReducedFloatingType(s.scalar_type())) s = s.to(at::kFloat);
    c.set_output(i, std::move(s));
  }
}

struct LnBackwardArgs {
  at::Tensor dy, x, mean, invstd;
  std::optional<at::Tensor> scale;
  c10::IntArrayRef normalized;
};

// (dY, X, Scale, Mean, InvStdDev): the forward's saved statistics, cast back to the dtype ATen's
// backward reads them in (undoing the stash cast above).
LnBackwardArgs ln_backward_args(const KernelCtx& c) {
  LnBackwardArgs a{c.input(0), c.input(1), c.input(3), c.input(4), std::nullopt, {}};
  const int64_t axis = ln_axis(c, a.x);
  a.normalized = a.x.sizes().slice(axis);
  a.scale = ln_param(c, 2, a.normalized);
  const at::ScalarType st = stat_dtype(a.x, a.scale);
  if (a.mean.scalar_type() != st) a.mean = a.mean.to(st);
  if (a.invstd.scalar_type() != st) a.invstd = a.invstd.to(st);
  return a;
}

// -> dX
void layer_norm_grad_kernel(KernelCtx& c) {
  LnBackwardArgs a = ln_backward_args(c);
  c.set_output(0, std::get<0>(at::native_layer_norm_backward(a.dy, a.x, a.normalized, a.mean, a.invstd,
                                                             a.scale, std::nullopt, {true, false, false})));
}

// -> dScale = Σ_outer dY · (X − mean) · invstd, shaped like the Scale input
void layer_norm_scale_grad_kernel(KernelCtx& c) {
  LnBackwardArgs a = ln_backward_args(c);
  if (!a.scale) c.fail("the Scale input is required for its gradient");
  at::Tensor ds = std::get<1>(at::native_layer_norm_backward(a.dy, a.x, a.normalized, a.mean, a.invstd,
                                                             a.scale, std::nullopt, {false, true, false}));
  c.set_output(0, ds.reshape(c.input(2).sizes()));
}

// --- Gelu (opset 20): approximate = "none" (erf form) or "tanh".
std::string gelu_approximate(const KernelCtx& c) {
  std::string a = c.attrs.get_string("approximate", "none");
  if (a != "none" && a != "tanh") c.fail("approximate must be 'none' or 'tanh', got '" + a + "'");
  return a;
}
void gelu_kernel(KernelCtx& c) { c.set_output(0, at::gelu(c.input(0), gelu_approximate(c))); }
// (dY, X) -> dX
void gelu_grad_kernel(KernelCtx& c) {
  c.set_output(0, at::gelu_backward(c.input(0), c.input(1), gelu_approximate(c)));
}

// --- Erf
void erf_kernel(KernelCtx& c) { c.set_output(0, at::erf(c.input(0))); }
// (dY, X) -> dX = dY · 2/√π · exp(−X²), in the order of PyTorch's derivative formula
void erf_grad_kernel(KernelCtx& c) {
  const at::Tensor& x = c.input(1);
  c.set_output(0, at::mul(at::mul(at::exp(at::neg(at::pow(x, 2))), 2.0 / std::sqrt(M_PI)), c.input(0)));
}

// --- Embedding (ours): (weight (V, D), indices (...)) -> (..., D); padding_idx −1 means none.
void embedding_kernel(KernelCtx& c) {
  const at::Tensor& w = c.input(0);
  if (w.dim() != 2) c.fail("weight must be (num_embeddings, dim), got shape " + c10::str(w.sizes()));
  c.set_output(0, at::embedding(w, c.input(1), c.attrs.get_int("padding_idx", -1),
                                c.attrs.get_int("scale_grad_by_freq", 0) != 0, false));
}

// (dY, indices, shape of weight[, accumulator]) -> dWeight: dense, summed over repeated indices,
// zero at padding_idx (ATen's embedding_dense_backward, as eager autograd uses), added into the
// accumulator (the weight's other gradient contributions: a tied LM head's) when there is one,
// overwritten where the plan allows.
void embedding_grad_kernel(KernelCtx& c) {
  const std::vector<int64_t> wshape = c.input_ints(2);
  if (wshape.size() != 2) c.fail("weight shape must have 2 entries, got " + c10::str(wshape));
  const at::Tensor& dy = c.input(0);
  const int64_t pad = c.attrs.get_int("padding_idx", -1);
  const bool by_freq = c.attrs.get_int("scale_grad_by_freq", 0) != 0;
  at::Tensor dw = accumulator(c, 3, wshape, dy);
  // A float gradient starts as zeros from the pool (buffer_pool.h: a vocabulary-sized gradient,
  // reused step after step); index_add_ below sums as ATen's CPU embedding backward does, bit for bit
  // (test_cpu_buffer_pool.py).
  const bool pooled = !dw.defined() && !by_freq && dy.is_cpu() &&
                      (dy.scalar_type() == at::kFloat || dy.scalar_type() == at::kDouble);
  if (pooled) dw = BufferPool::process().empty(wshape, dy.options()).zero_();
  if (!dw.defined()) return c.set_output(0, at::embedding_dense_backward(dy, c.input(1), wshape[0], pad, by_freq));
  if (by_freq) {
    dw.add_(at::embedding_dense_backward(dy, c.input(1), wshape[0], pad, true));
  } else {
    const at::Tensor idx = c.input(1).reshape({-1});
    at::Tensor rows = dy.reshape({idx.numel(), wshape[1]});
    if (pad >= 0) rows = rows.masked_fill(idx.eq(pad).unsqueeze(1), 0);
    dw.index_add_(0, idx, rows);
  }
  c.set_output(0, std::move(dw));
}

}  // namespace

REGISTER_KERNEL("LayerNormalization", layer_norm_kernel);
REGISTER_KERNEL("Gelu", gelu_kernel);
REGISTER_KERNEL("Erf", erf_kernel);
REGISTER_KERNEL_IN(kOurDomain, "Embedding", embedding_kernel);
REGISTER_KERNEL_IN(kOurDomain, "LayerNormalizationGrad", layer_norm_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "LayerNormalizationScaleGrad", layer_norm_scale_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "GeluGrad", gelu_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "ErfGrad", erf_grad_kernel);
REGISTER_KERNEL_IN(kOurDomain, "EmbeddingGrad", embedding_grad_kernel);

}  // namespace torch_ort::kernels
