// Fused attention (csrc/core/passes/attention_fusion.cc): Attention(Q, K, V, [mask]) -> (Y, LogSumExp)
// and AttentionGrad(dY, Q, K, V, Y, LogSumExp, [mask], [dLSE]) -> (dQ, dK, dV) on ATen's fused SDPA
// kernels: flash attention on CPU (what eager F.scaled_dot_product_attention runs there), memory-
// efficient attention on CUDA. Inputs a fused kernel does not take (head sizes that differ,
// broadcast batch dims, unsupported dtypes) go to the math composite below, which keeps the same
// contract (LogSumExp per row, the probabilities recomputed in backward), so the result is right
// on every path. Both kernels agree with the unfused graph's softmax(scale·Q·Kᵀ + mask)·V.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <cmath>
#include <optional>

#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_backward.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros_like.h>

#include "csrc/runtime/kernels/common.h"
#include "csrc/runtime/kernels/decimal.h"

namespace torch_ort::kernels {
namespace {

struct AttnArgs {
  at::Tensor q, k, v;               // (B, H, L, D), (B, H, S, D), (B, H, S, Dv)
  std::optional<at::Tensor> mask;   // additive, viewed as 4-D, broadcastable to (B, H, L, S)
  bool causal = false;              // top-left aligned: query i sees keys j <= i
  std::optional<double> scale;      // absent: SDPA's default 1/√D
};

AttnArgs read_args(const KernelCtx& c, int first, int mask_at) {
  AttnArgs a{c.input(first), c.input(first + 1), c.input(first + 2), std::nullopt,
             c.attrs.get_int("causal", 0) != 0, std::nullopt};
  if (c.attrs.has("scale")) a.scale = shortest_decimal(c.attrs.get_float("scale", 1.0f));
  const char* names[] = {"Q", "K", "V"};
  const at::Tensor* t[] = {&a.q, &a.k, &a.v};
  for (int i = 0; i < 3; ++i) {
    if (t[i]->dim() != 4) c.fail(std::string(names[i]) + " must be 4-D (B, H, T, D), got " + c10::str(t[i]->sizes()));
    if (!at::isFloatingType(t[i]->scalar_type()) || t[i]->scalar_type() != a.q.scalar_type())
      c.fail(std::string("Q, K and V must share one floating dtype, got ") + c10::toString(a.q.scalar_type()) +
             ", " + c10::toString(a.k.scalar_type()) + ", " + c10::toString(a.v.scalar_type()));
  }
  if (a.q.size(3) != a.k.size(3)) c.fail("Q and K head sizes differ: " + c10::str(a.q.sizes(), " vs ", a.k.sizes()));
  if (a.k.size(2) != a.v.size(2)) c.fail("K and V lengths differ: " + c10::str(a.k.sizes(), " vs ", a.v.sizes()));
  if (c.has_input(mask_at)) {
    at::Tensor m = c.input(mask_at);
    if (m.dim() > 4 || !at::isFloatingType(m.scalar_type()))
      c.fail("the mask must be an additive float tensor of rank <= 4, got " + c10::str(m.sizes()) + " " +
             c10::toString(m.scalar_type()));
    while (m.dim() < 4) m = m.unsqueeze(0);
    const int64_t want[] = {std::max(a.q.size(0), a.k.size(0)), std::max(a.q.size(1), a.k.size(1)), a.q.size(2),
                            a.k.size(2)};
    for (int d = 0; d < 4; ++d)
      if (m.size(d) != 1 && m.size(d) != want[d])
        c.fail("the mask of shape " + c10::str(c.input(mask_at).sizes()) + " does not broadcast to the scores " +
               c10::str(c10::IntArrayRef(want)));
    a.mask = m.scalar_type() == a.q.scalar_type() ? m : m.to(a.q.scalar_type());
  }
  return a;
}

// The fused kernels want one head size and equal (B, H) for Q, K and V.
bool dense_heads(const AttnArgs& a) {
  return a.q.size(3) == a.v.size(3) && a.q.size(0) == a.k.size(0) && a.q.size(0) == a.v.size(0) &&
         a.q.size(1) == a.k.size(1) && a.q.size(1) == a.v.size(1);
}
bool use_cpu_flash(const AttnArgs& a) { return a.q.is_cpu() && dense_heads(a); }
// Memory-efficient attention: fp32/fp16/bf16, aligned head sizes, no mask (a bias would need the
// kernel's alignment padding); anything else takes the math path.
bool use_cuda_efficient(const AttnArgs& a) {
  const auto t = a.q.scalar_type();
  return a.q.is_cuda() && dense_heads(a) && !a.mask &&
         (t == at::kFloat || t == at::kHalf || t == at::kBFloat16) && a.q.size(3) % 8 == 0 && a.q.size(3) <= 128;
}

// --- the math composite: scores in float (double for double), rows that are fully masked give 0
// (as the flash kernel does; the exporter's NaN guard does the same for the unfused graph).
at::ScalarType acc_type(const at::Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

double scale_of(const AttnArgs& a) { return a.scale.value_or(1.0 / std::sqrt(static_cast<double>(a.q.size(3)))); }

at::Tensor math_scores(const AttnArgs& a) {
  const at::ScalarType acc = acc_type(a.q);
  at::Tensor s = at::matmul(a.q.to(acc), a.k.to(acc).transpose(-2, -1)).mul_(scale_of(a));  // (B, H, L, S)
  if (a.causal) {
    at::Tensor above = at::ones({s.size(-2), s.size(-1)}, s.options().dtype(at::kBool)).triu(1);
    s.masked_fill_(above, -std::numeric_limits<double>::infinity());
  }
  if (a.mask) s = s.add(a.mask->to(acc));
  return s;
}
at::Tensor math_probs(const at::Tensor& s, const at::Tensor& lse) {
  at::Tensor p = at::exp(s.sub(lse.unsqueeze(-1)));
  return p.masked_fill_(p.isnan(), 0.0);
}

void attention_kernel(KernelCtx& c) {
  const AttnArgs a = read_args(c, 0, 3);
  if (use_cpu_flash(a)) {
    auto [y, lse] = at::_scaled_dot_product_flash_attention_for_cpu(a.q, a.k, a.v, 0.0, a.causal, a.mask, a.scale);
    c.set_output(0, y);
    c.set_output(1, lse);
    return;
  }
  if (use_cuda_efficient(a)) {
    auto res = at::_scaled_dot_product_efficient_attention(a.q, a.k, a.v, std::nullopt, /*compute_log_sumexp=*/true,
                                                           0.0, a.causal, a.scale);
    c.set_output(0, std::get<0>(res));
    // The kernel pads LogSumExp's rows to a multiple of 32; the graph's value is (B, H, L).
    c.set_output(1, std::get<1>(res).narrow(-1, 0, a.q.size(2)));
    return;
  }
  const at::Tensor s = math_scores(a);
  const at::Tensor lse = at::logsumexp(s, {-1});
  c.set_output(0, at::matmul(math_probs(s, lse), a.v.to(s.scalar_type())).to(a.q.scalar_type()));
  c.set_output(1, lse);
}

void attention_grad_kernel(KernelCtx& c) {
  const AttnArgs a = read_args(c, 1, 6);
  const at::Tensor& y = c.input(4);
  const at::Tensor& lse = c.input(5);
  const at::Tensor dy = c.has_input(0) ? c.input(0) : at::zeros_like(y);  // only dLSE flows
  const bool dlse = c.has_input(7);  // a gradient into LogSumExp: only the math path takes it
  at::Tensor dq, dk, dv;
  if (use_cpu_flash(a) && !dlse) {
    std::tie(dq, dk, dv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        dy, a.q, a.k, a.v, y, lse, 0.0, a.causal, a.mask, a.scale);
  } else if (use_cuda_efficient(a) && !dlse) {
    const int64_t rows = (a.q.size(2) + 31) / 32 * 32;
    const at::Tensor lse_padded = at::constant_pad_nd(lse, {0, rows - lse.size(-1)}, 0.0).contiguous();
    const at::Tensor unused = at::empty({}, a.q.options().dtype(at::kLong).device(at::kCPU));  // no dropout
    std::tie(dq, dk, dv, std::ignore) = at::_scaled_dot_product_efficient_attention_backward(
        dy.contiguous(), a.q, a.k, a.v, at::Tensor(), y, lse_padded, unused, unused, 0.0,
        {c.output_wanted(0), c.output_wanted(1), c.output_wanted(2), false}, a.causal, a.scale);
  } else {  // dV = Pᵀ·dY, dS = P ⊙ (dY·Vᵀ − rowsum(dY ⊙ Y) + dLSE), dQ = scale·dS·K, dK = scale·dSᵀ·Q
    const at::Tensor s = math_scores(a);
    const at::ScalarType acc = s.scalar_type();
    const at::Tensor p = math_probs(s, lse.to(acc));
    const at::Tensor g = dy.to(acc);
    at::Tensor delta = g.mul(y.to(acc)).sum(-1, /*keepdim=*/true);
    if (dlse) delta = delta.sub(c.input(7).to(acc).unsqueeze(-1));
    const at::Tensor ds = p.mul(at::matmul(g, a.v.to(acc).transpose(-2, -1)).sub(delta));
    dq = at::matmul(ds, a.k.to(acc)).mul_(scale_of(a));
    dk = at::sum_to(at::matmul(ds.transpose(-2, -1), a.q.to(acc)).mul_(scale_of(a)), a.k.sizes());
    dv = at::sum_to(at::matmul(p.transpose(-2, -1), g), a.v.sizes());
    dq = at::sum_to(dq, a.q.sizes());
  }
  // The efficient kernel leaves the gradients it was not asked for undefined.
  const at::Tensor* grads[] = {&dq, &dk, &dv};
  const at::Tensor* like[] = {&a.q, &a.k, &a.v};
  for (int i = 0; i < 3; ++i)
    if (c.output_wanted(i) && grads[i]->defined()) c.set_output(i, grads[i]->to(like[i]->scalar_type()));
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, "Attention", attention_kernel);
REGISTER_KERNEL_IN(kOurDomain, "AttentionGrad", attention_grad_kernel);

}  // namespace torch_ort::kernels
