// SkipLayerNorm (residual add + LayerNorm, skip_layer_norm_fusion.cc) and SkipLayerNormGrad.
// fp32 on an AVX-512 CPU runs the one-pass loops of cpu/layer_norm.cc; fp32 on CUDA runs torch_ort._C_cuda's
// kernel when it is loaded; everything else runs the unfused reference (at::add + ATen's layer
// norm forward/backward), which is also what the tests compare the fused loops against.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include "csrc/runtime/kernels/fused_layer_norm.h"

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <ATen/ops/sum.h>

#include <optional>

#include "csrc/runtime/kernels/common.h"
#include "csrc/runtime/kernels/cpu/layer_norm.h"
#include "csrc/runtime/kernels/cuda_table.h"
#include "csrc/runtime/kernels/decimal.h"

namespace torch_ort::kernels {
namespace {

at::Tensor opt_input(const KernelCtx& c, int i) { return c.has_input(i) ? c.input(i) : at::Tensor(); }

// A per-column vector input (Gamma, Beta, Bias): C elements of X's dtype, used flat.
at::Tensor column_vector(const KernelCtx& c, int i, const char* what, int64_t cols, const at::Tensor& like) {
  if (!c.has_input(i)) return at::Tensor();
  const at::Tensor& v = c.input(i);
  if (v.numel() != cols)
    c.fail(std::string(what) + " of shape " + c10::str(v.sizes()) + " must have " + std::to_string(cols) +
           " elements (the last dim of the input)");
  if (v.scalar_type() != like.scalar_type())
    c.fail(std::string(what) + " is " + std::string(c10::toString(v.scalar_type())) + " but the input is " +
           c10::toString(like.scalar_type()));
  return v.reshape({cols});
}

std::vector<int64_t> stats_shape(const at::Tensor& x) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end());
  s.back() = 1;
  return s;
}

// The fused loops take contiguous fp32 (a no-op view when already so).
bool fused_dtype(const at::Tensor& x) { return x.scalar_type() == at::kFloat; }
const float* fp(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }
float* mfp(at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// (X, Skip, Gamma, [Beta], [Bias]) -> (Y, Mean, InvStdDev, Sum)
void skip_layer_norm_kernel(KernelCtx& c) {
  const at::Tensor& x0 = c.input(0);
  if (x0.dim() < 1) c.fail("input X must have rank >= 1, got a scalar");
  const at::Tensor& skip0 = c.input(1);
  if (!skip0.sizes().equals(x0.sizes()))
    c.fail("Skip of shape " + c10::str(skip0.sizes()) + " does not match X of shape " + c10::str(x0.sizes()));
  if (skip0.scalar_type() != x0.scalar_type()) c.fail("Skip and X differ in dtype");
  const int64_t cols = x0.size(-1), rows = cols == 0 ? 0 : x0.numel() / cols;
  const at::Tensor gamma = column_vector(c, 2, "Gamma", cols, x0),
                   beta = column_vector(c, 3, "Beta", cols, x0), bias = column_vector(c, 4, "Bias", cols, x0);
  const double eps = shortest_decimal(c.attrs.get_float("epsilon", 1e-5f));
  const std::vector<int64_t> st = stats_shape(x0);

  if (fused_dtype(x0) && rows > 0) {
    const SkipLayerNormCudaFn cuda =
        x0.is_cuda() ? cuda_kernel<SkipLayerNormCudaFn>(kSkipLayerNormCuda) : nullptr;
    if (cuda || (x0.is_cpu() && cpu::fused_loops_available())) {
      const at::Tensor x = x0.contiguous(), skip = skip0.contiguous();
      const at::Tensor g = gamma.contiguous(), b = beta.defined() ? beta.contiguous() : beta,
                       bi = bias.defined() ? bias.contiguous() : bias;
      at::Tensor y = at::empty(x.sizes(), x.options()), sum = at::empty(x.sizes(), x.options());
      at::Tensor mean = at::empty(st, x.options()), invstd = at::empty(st, x.options());
      if (cuda) {
        cuda(x, skip, g, b, bi, eps, y, mean, invstd, sum);
      } else {
        cpu::skip_layer_norm_forward({fp(x), fp(skip), fp(bi), fp(g), fp(b), static_cast<float>(eps), rows,
                                      cols, mfp(y), mfp(mean), mfp(invstd), mfp(sum)});
      }
      c.set_output(0, std::move(y));
      c.set_output(1, std::move(mean));
      c.set_output(2, std::move(invstd));
      return c.set_output(3, std::move(sum));
    }
  }
  // Reference: the unfused ops, in the exported order ((x + bias) + skip, then LayerNorm).
  const at::Tensor sum = at::add(bias.defined() ? at::add(x0, bias) : x0, skip0);
  auto [y, mean, invstd] =
      at::native_layer_norm(sum, {cols}, gamma, beta.defined() ? std::optional(beta) : std::nullopt, eps);
  const at::ScalarType stash = x0.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  c.set_output(0, std::move(y));
  c.set_output(1, mean.to(stash).reshape(st));
  c.set_output(2, invstd.to(stash).reshape(st));
  c.set_output(3, sum);
}

// (dY, [dSum], Sum, Gamma, Mean, InvStdDev) -> (dX, [dGamma], [dBeta], [dBias])
void skip_layer_norm_grad_kernel(KernelCtx& c) {
  const at::Tensor& dy0 = c.input(0);
  const at::Tensor& sum0 = c.input(2);
  if (sum0.dim() < 1) c.fail("input Sum must have rank >= 1, got a scalar");
  if (!dy0.sizes().equals(sum0.sizes()))
    c.fail("dY of shape " + c10::str(dy0.sizes()) + " does not match Sum of shape " + c10::str(sum0.sizes()));
  const at::Tensor dsum0 = opt_input(c, 1);
  if (dsum0.defined() && !dsum0.sizes().equals(sum0.sizes()))
    c.fail("dSum of shape " + c10::str(dsum0.sizes()) + " does not match Sum of shape " +
           c10::str(sum0.sizes()));
  const int64_t cols = sum0.size(-1), rows = cols == 0 ? 0 : sum0.numel() / cols;
  const at::Tensor gamma = column_vector(c, 3, "Gamma", cols, sum0);
  const at::Tensor& mean0 = c.input(4);
  const at::Tensor& invstd0 = c.input(5);
  if (mean0.numel() != rows || invstd0.numel() != rows)
    c.fail("Mean/InvStdDev must have one value per row (" + std::to_string(rows) + "), got " +
           std::to_string(mean0.numel()) + " and " + std::to_string(invstd0.numel()));
  const bool want_dx = c.output_wanted(0) || c.output_wanted(3);

  if (fused_dtype(sum0) && rows > 0 && dy0.scalar_type() == at::kFloat && mean0.scalar_type() == at::kFloat &&
      invstd0.scalar_type() == at::kFloat && (!dsum0.defined() || dsum0.scalar_type() == at::kFloat)) {
    const SkipLayerNormGradCudaFn cuda =
        sum0.is_cuda() ? cuda_kernel<SkipLayerNormGradCudaFn>(kSkipLayerNormGradCuda) : nullptr;
    if (cuda || (sum0.is_cpu() && cpu::fused_loops_available())) {
      const at::Tensor dy = dy0.contiguous(), sum = sum0.contiguous(), g = gamma.contiguous();
      const at::Tensor dsum = dsum0.defined() ? dsum0.contiguous() : dsum0;
      const at::Tensor mean = mean0.contiguous(), invstd = invstd0.contiguous();
      at::Tensor dx = at::empty(sum.sizes(), sum.options());
      at::Tensor dgamma = c.output_wanted(1) ? at::empty({cols}, sum.options()) : at::Tensor();
      at::Tensor dbeta = c.output_wanted(2) ? at::empty({cols}, sum.options()) : at::Tensor();
      at::Tensor dbias = c.output_wanted(3) ? at::empty({cols}, sum.options()) : at::Tensor();
      if (cuda) {
        cuda(dy, dsum, sum, g, mean, invstd, dx, dgamma, dbeta, dbias);
      } else {
        cpu::skip_layer_norm_backward({fp(dy), fp(dsum), fp(sum), fp(g), fp(mean), fp(invstd), rows, cols,
                                       mfp(dx), mfp(dgamma), mfp(dbeta), mfp(dbias)});
      }
      c.set_output(0, std::move(dx));
      c.set_output(1, std::move(dgamma));
      c.set_output(2, std::move(dbeta));
      return c.set_output(3, std::move(dbias));
    }
  }
  // Reference: ATen's layer-norm backward (Gamma stands in for the bias argument, which only
  // gives dBeta its dtype and shape), then + dSum, and the bias gradient as a column sum.
  const at::ScalarType stat = sum0.is_cpu() ? sum0.scalar_type() : at::toOpMathType(sum0.scalar_type());
  auto [dx, dgamma, dbeta] =
      at::native_layer_norm_backward(dy0, sum0, {cols}, mean0.to(stat), invstd0.to(stat), gamma, gamma,
                                     {want_dx, c.output_wanted(1), c.output_wanted(2)});
  if (want_dx && dsum0.defined()) dx = at::add(dx, dsum0);
  if (c.output_wanted(3)) c.set_output(3, at::sum(dx.reshape({rows, cols}), {0}));
  c.set_output(0, std::move(dx));
  c.set_output(1, std::move(dgamma));
  c.set_output(2, std::move(dbeta));
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, "SkipLayerNorm", skip_layer_norm_kernel);
REGISTER_KERNEL_IN(kOurDomain, "SkipLayerNormGrad", skip_layer_norm_grad_kernel);

}  // namespace torch_ort::kernels
