// Fused attention (csrc/core/passes/attention_fusion.cc): Attention(Q, K, V, [mask]) ->
// (Y, LogSumExp, [Backend], [RngState0], [RngState1]) and AttentionGrad(dY, Q, K, V, Y, LogSumExp,
// [mask], [dLSE], [Backend], [RngState0], [RngState1]) -> (dQ, dK, dV) on the backend eager
// F.scaled_dot_product_attention picks for the same tensors and dropout rate
// (at::_fused_sdp_choice: cuDNN, flash or memory-efficient attention on CUDA, flash on the CPU,
// else math; with dropout on the CPU, math). The forward records its choice (Backend, a host
// scalar: at::SDPBackend's value) and the backward runs the same backend's kernel on what that
// kernel saved (Y and its LogSumExp, no (L, S) matrix). With a `dropout` rate p the forward also
// returns the random state of its draw and the backward replays exactly that mask: a fused CUDA
// kernel's philox (seed, offset) tensors, passed through untouched (device tensors under CUDA
// graph capture: never read on the host), or the math path's (attention.h: the CPU generator's
// state, or the mask on another device; RngState1 unused). Inputs no fused kernel takes (head
// sizes that differ, broadcast batch dims, a gradient into LogSumExp) go to the math composite
// (attention_math.cc), which keeps the same contract (the probabilities recomputed from
// LogSumExp), so the result is right on every path. Every path agrees with the unfused graph's
// dropout(softmax(scale·Q·Kᵀ + mask), p)·V.
// Grouped-query attention: K and V may have fewer heads than Q, a divisor of Q's (query head h
// reads KV head h / (H/Hkv), as eager SDPA's enable_gqa and Hugging Face's repeat_kv). Flash
// attention (CPU and CUDA) takes them as they are; for any other backend the kernels repeat K and
// V to Q's heads first and sum the repeated heads' gradients back.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <array>
#include <cmath>
#include <optional>
#include <tuple>

#include <ATen/Dispatch.h>
#include <ATen/ExpandUtils.h>
#include <ATen/SDPBackend.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_backward.h>
#include <ATen/ops/_scaled_dot_product_flash_attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_backward.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros_like.h>

#include "csrc/runtime/kernels/attention.h"
#include "csrc/runtime/kernels/common.h"
#include "csrc/runtime/kernels/decimal.h"

namespace torch_ort::kernels {
namespace {

using namespace attention;

// Whether an additive (B|1, H|1, L, S) mask, with a row per query and a column per key (neither
// broadcast), hides exactly the keys after each query: 0 on and below the diagonal, -1e30 or less
// above it, in every batch and head. That is causal attention, which the fused kernels run by
// skipping the hidden blocks instead of adding the mask to them: what eager SDPA runs when Hugging
// Face passes is_causal instead of the mask it materialises under export. The mask is read on the
// host, so only a CPU mask is examined (a device one would cost a synchronisation); the scan stops
// at the first entry that differs.
bool hides_only_the_future(const at::Tensor& m, int64_t rows, int64_t cols) {
  if (!m.is_cpu() || m.dim() != 4 || m.size(2) != rows || m.size(3) != cols) return false;
  bool causal = true;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, m.scalar_type(), "hides_only_the_future", [&] {
    for (int64_t b = 0; causal && b < (m.stride(0) == 0 ? 1 : m.size(0)); ++b)
      for (int64_t h = 0; causal && h < (m.stride(1) == 0 ? 1 : m.size(1)); ++h) {
        const at::Tensor slice = m.select(0, b).select(0, h);
        const scalar_t* p = slice.const_data_ptr<scalar_t>();
        const int64_t rs = slice.stride(0), cs = slice.stride(1);
        for (int64_t i = 0; causal && i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) {
            const float v = static_cast<float>(p[i * rs + j * cs]);
            if (j <= i ? v != 0.0f : !(v <= -1e30f)) {
              causal = false;
              break;
            }
          }
      }
  });
  return causal;
}

AttnArgs read_args(const KernelCtx& c, int first, int mask_at) {
  AttnArgs a{c.input(first), c.input(first + 1), c.input(first + 2), std::nullopt,
             c.attrs.get_int("causal", 0) != 0, std::nullopt};
  if (c.attrs.has("scale")) a.scale = shortest_decimal(c.attrs.get_float("scale", 1.0f));
  if (c.attrs.has("dropout")) a.dropout = shortest_decimal(c.attrs.get_float("dropout", 0.0f));
  if (!(a.dropout >= 0.0 && a.dropout < 1.0)) c.fail("dropout must be in [0, 1), got " + std::to_string(a.dropout));
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
  // Heads: K's and V's each Q's or 1 (broadcast), or one count that divides Q's (grouped).
  const int64_t h = a.q.size(1), hk = a.k.size(1), hv = a.v.size(1);
  const auto broadcasts = [h](int64_t x) { return x == h || x == 1; };
  if (!(broadcasts(hk) && broadcasts(hv)) && !(hk == hv && hk > 0 && h % hk == 0))
    c.fail("K and V have " + std::to_string(hk) + " and " + std::to_string(hv) + " heads; each must be Q's " +
           std::to_string(h) + " or 1, or both one count that divides it (grouped-query attention)");
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
    if (hides_only_the_future(m, a.q.size(2), a.k.size(2))) {
      a.causal = true;  // the mask dropped: the same scores, without the hidden blocks
    } else {
      a.mask = m.scalar_type() == a.q.scalar_type() ? m : m.to(a.q.scalar_type());
    }
  }
  return a;
}

// The query heads per KV head when K and V share a head count that divides Q's and is smaller
// (grouped-query attention), else 1.
int64_t kv_groups(const AttnArgs& a) {
  const int64_t h = a.q.size(1), hkv = a.k.size(1);
  return hkv < h && hkv == a.v.size(1) && hkv > 0 && h % hkv == 0 ? h / hkv : 1;
}

// The fused kernels want one head size, equal B, and equal H (flash: or grouped K and V).
bool dense_heads(const AttnArgs& a) {
  return a.q.size(3) == a.v.size(3) && a.q.size(0) == a.k.size(0) && a.q.size(0) == a.v.size(0) &&
         ((a.q.size(1) == a.k.size(1) && a.q.size(1) == a.v.size(1)) || kv_groups(a) > 1);
}

// K or V (B, Hkv, S, D) with each head repeated `groups` times in a row: (B, Hkv·groups, S, D).
at::Tensor repeat_heads(const at::Tensor& t, int64_t groups) {
  return t.unsqueeze(2).expand({t.size(0), t.size(1), groups, t.size(2), t.size(3)}).flatten(1, 2);
}
// The gradient of repeat_heads: the repeated heads' gradients summed, (B, Hkv, S, D).
at::Tensor sum_heads(const at::Tensor& g, int64_t groups) {
  return g.unflatten(1, {g.size(1) / groups, groups}).sum(2);
}

using at::SDPBackend;

// The backend eager SDPA runs for these tensors in a training step (Q, K, V requiring grad when
// `training`: some backends take only inference shapes). Math where no fused kernel applies, and
// for a CUDA flash head size that is no multiple of 8 (eager pads Q, K and V for it; the math
// path gives the same result without the copies).
// With dropout the choice is eager's for the same rate (on the CPU: math, which has the only CPU
// dropout).
// Grouped K and V: flash attention where eager's choice with enable_gqa is flash (which takes the
// grouped heads); otherwise the choice for K and V repeated to Q's heads (the tensors eager runs
// on after Hugging Face's repeat_kv), which the_args_for then repeats: only flash runs them grouped.
SDPBackend choose_backend(const AttnArgs& a, bool training) {
  if (!dense_heads(a) || (a.dropout > 0.0 && a.q.is_cpu())) return SDPBackend::math;
  const bool gqa = kv_groups(a) > 1;
  int64_t choice;
  if (training) {
    at::AutoGradMode grad(true);  // the choice reads GradMode and requires_grad, as in eager
    choice = at::_fused_sdp_choice(a.q.detach().requires_grad_(true), a.k.detach().requires_grad_(true),
                                   a.v.detach().requires_grad_(true), a.mask, a.dropout, a.causal, a.scale, gqa);
  } else {
    choice = at::_fused_sdp_choice(a.q, a.k, a.v, a.mask, a.dropout, a.causal, a.scale, gqa);
  }
  const auto b = static_cast<SDPBackend>(choice);
  if (b == SDPBackend::flash_attention && a.q.is_cuda() && a.q.size(3) % 8 != 0) return SDPBackend::math;
  if (gqa && b != SDPBackend::flash_attention) {  // the choice reads metadata: empty tensors, no copy
    AttnArgs repeated = a;
    for (at::Tensor* t : {&repeated.k, &repeated.v})
      *t = at::empty({t->size(0), a.q.size(1), t->size(2), t->size(3)}, t->options());  // repeat_heads' layout
    return choose_backend(repeated, training);
  }
  if (b == SDPBackend::flash_attention || b == SDPBackend::efficient_attention || b == SDPBackend::cudnn_attention)
    return b;
  return SDPBackend::math;
}

// The arguments `backend` runs on: grouped K and V repeated to Q's heads unless it is flash.
AttnArgs the_args_for(AttnArgs a, SDPBackend backend) {
  if (const int64_t groups = kv_groups(a); groups > 1 && backend != SDPBackend::flash_attention) {
    a.k = repeat_heads(a.k, groups);
    a.v = repeat_heads(a.v, groups);
  }
  return a;
}

// The memory-efficient kernel reads a bias whose rows are 16-element aligned: the mask's last dim
// padded (a copy of the mask, before it is broadcast) and viewed back at S, then expanded.
at::Tensor efficient_bias(const AttnArgs& a) {
  at::Tensor m = *a.mask;
  const int64_t s = m.size(3);
  if (s % 16 != 0 || m.stride(3) != 1) m = at::constant_pad_nd(m, {0, (16 - s % 16) % 16}, 0.0).narrow(3, 0, s);
  return m.expand({a.q.size(0), a.q.size(1), a.q.size(2), a.k.size(2)});
}

// The philox seed and offset a fused kernel takes without dropout: never read, but on the
// queries' device (the cuDNN backward, unlike flash and memory-efficient attention, checks that
// every tensor argument shares one device).
at::Tensor no_dropout_rng(const at::Tensor& like) {
  static const at::Tensor host = at::empty({}, at::TensorOptions().dtype(at::kLong));
  return like.is_cpu() ? host : at::empty({}, like.options().dtype(at::kLong));
}

void attention_kernel(KernelCtx& c) {
  const AttnArgs given = read_args(c, 0, 3);
  const bool training = c.output_wanted(1);  // the backward reads LogSumExp
  const SDPBackend backend = choose_backend(given, training);
  const AttnArgs a = the_args_for(given, backend);
  c.set_output(2, at::scalar_tensor(static_cast<int64_t>(backend), at::kLong));  // a host value
  const double p = a.dropout;
  at::Tensor y, lse, rng0, rng1;  // rng: the fused kernel's philox seed and offset
  switch (backend) {
    case SDPBackend::flash_attention:
      if (a.q.is_cpu()) {
        std::tie(y, lse) = at::_scaled_dot_product_flash_attention_for_cpu(a.q, a.k, a.v, 0.0, a.causal, a.mask, a.scale);
      } else {
        auto res = at::_scaled_dot_product_flash_attention(a.q, a.k, a.v, p, a.causal, false, a.scale);
        y = std::get<0>(res);
        lse = std::get<1>(res);
        rng0 = std::get<6>(res);
        rng1 = std::get<7>(res);
      }
      break;
    case SDPBackend::efficient_attention: {
      auto res = at::_scaled_dot_product_efficient_attention(
          a.q, a.k, a.v, a.mask ? std::optional<at::Tensor>(efficient_bias(a)) : std::nullopt, training, p,
          a.causal, a.scale);
      y = std::get<0>(res);
      // Rows of LogSumExp may be padded (to a multiple of 32): the graph's value is the (B, H, L)
      // view, and the backward views the whole buffer again (full_lse).
      lse = training ? std::get<1>(res).narrow(-1, 0, a.q.size(2)) : at::Tensor();
      rng0 = std::get<2>(res);
      rng1 = std::get<3>(res);
      break;
    }
    case SDPBackend::cudnn_attention: {
      auto res = at::_scaled_dot_product_cudnn_attention(a.q, a.k, a.v, a.mask, training, p, a.causal, false,
                                                         a.scale);
      y = std::get<0>(res);
      lse = std::get<1>(res);
      if (lse.defined() && lse.dim() == 4) lse = lse.squeeze(-1);  // (B, H, L, 1): the same buffer
      rng0 = std::get<6>(res);
      rng1 = std::get<7>(res);
      break;
    }
    default: {
      const at::Tensor s = math_scores(a);
      lse = at::logsumexp(s, {-1});
      at::Tensor probs = math_probs(s, lse);
      if (p > 0.0) {
        Drawn d = draw_dropout(probs, p);
        probs = std::move(d.dropped);
        rng0 = std::move(d.state);
        rng1 = at::empty({0}, a.q.options().dtype(at::kLong));  // unused on this path
      }
      y = at::matmul(probs, a.v.to(s.scalar_type())).to(a.q.scalar_type());
    }
  }
  c.set_output(0, y);
  c.set_output(1, lse);
  if (p > 0.0) {
    if (!rng0.defined() || !rng1.defined())
      c.fail("the fused kernel (at::SDPBackend " + std::to_string(static_cast<int>(backend)) +
             ") returned no random state for its dropout");
    c.set_output(3, rng0);
    c.set_output(4, rng1);
  }
}

// The whole LogSumExp buffer a fused forward made, from the (B, H, L) view the graph kept.
at::Tensor full_lse(const at::Tensor& lse) {
  const int64_t rows = lse.stride(1);
  if (lse.dim() != 3 || lse.stride(2) != 1 || rows == lse.size(2) || lse.storage_offset() != 0) return lse;
  return lse.as_strided({lse.size(0), lse.size(1), rows}, {lse.size(1) * rows, rows, 1});
}

void attention_grad_kernel(KernelCtx& c) {
  const AttnArgs given = read_args(c, 1, 6);
  const at::Tensor& y = c.input(4);
  const at::Tensor& lse = c.input(5);
  const at::Tensor dy = c.has_input(0) ? c.input(0) : at::zeros_like(y);  // only dLSE flows
  const bool dlse = c.has_input(7);  // a gradient into LogSumExp: only the math path takes it
  // The forward's backend (a graph without the input: choose again, as that forward did).
  SDPBackend backend =
      c.has_input(8) ? static_cast<SDPBackend>(c.input_item(8).toLong()) : choose_backend(given, true);
  const double p = given.dropout;
  if (p > 0.0 && !(c.has_input(9) && c.has_input(10)))
    c.fail("dropout " + std::to_string(p) + " without the forward's random state (inputs 9 and 10): the "
           "backward cannot replay its mask");
  if (dlse && p > 0.0 && backend != SDPBackend::math)
    c.fail("a gradient into LogSumExp with dropout: the math path cannot replay the fused kernel's mask");
  if (dlse) backend = SDPBackend::math;
  const AttnArgs a = the_args_for(given, backend);
  const int64_t groups = a.k.size(1) == given.k.size(1) ? 1 : kv_groups(given);  // K, V repeated here
  const at::Tensor rng0 = p > 0.0 ? c.input(9) : no_dropout_rng(a.q);
  const at::Tensor rng1 = p > 0.0 ? c.input(10) : rng0;
  const std::array<bool, 4> wanted{c.output_wanted(0), c.output_wanted(1), c.output_wanted(2), false};
  at::Tensor dq, dk, dv;
  switch (backend) {
    case SDPBackend::flash_attention:
      if (a.q.is_cpu()) {
        if (p > 0.0) c.fail("CPU flash attention has no dropout; the forward ran math");
        std::tie(dq, dk, dv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
            dy, a.q, a.k, a.v, y, lse, 0.0, a.causal, a.mask, a.scale);
      } else {
        std::tie(dq, dk, dv) = at::_scaled_dot_product_flash_attention_backward(
            dy, a.q, a.k, a.v, y, lse, at::Tensor(), at::Tensor(), a.q.size(2), a.k.size(2), p, a.causal, rng0,
            rng1, a.scale);
      }
      break;
    case SDPBackend::efficient_attention:
      std::tie(dq, dk, dv, std::ignore) = at::_scaled_dot_product_efficient_attention_backward(
          dy.contiguous(), a.q, a.k, a.v, a.mask ? efficient_bias(a) : at::Tensor(), y, full_lse(lse), rng0, rng1, p,
          wanted, a.causal, a.scale);
      break;
    case SDPBackend::cudnn_attention:
      std::tie(dq, dk, dv) = at::_scaled_dot_product_cudnn_attention_backward(
          dy, a.q, a.k, a.v, y, lse.dim() == 3 ? lse.unsqueeze(-1) : lse, rng0, rng1,
          a.mask ? *a.mask : at::Tensor(), at::Tensor(), at::Tensor(), a.q.size(2), a.k.size(2), p, a.causal,
          a.scale);
      break;
    default: {
      // With dropout, Pd = P ⊙ M/(1−p) and Y = Pd·V: dV = Pdᵀ·dY, dPd = dY·Vᵀ, and
      // dS = P ⊙ (dPd ⊙ M/(1−p) − rowsum(dY ⊙ Y) + dLSE) (rowsum(dP ⊙ P) = rowsum(dY ⊙ Y) still);
      // dQ = scale·dS·K, dK = scale·dSᵀ·Q. Without dropout M/(1−p) = 1.
      const at::Tensor s = math_scores(a);
      const at::ScalarType acc = s.scalar_type();
      const at::Tensor probs = math_probs(s, lse.to(acc));
      const at::Tensor keep = p > 0.0 ? replay_dropout(c, s, p, rng0) : at::Tensor();
      const at::Tensor g = dy.to(acc);
      at::Tensor delta = g.mul(y.to(acc)).sum(-1, /*keepdim=*/true);
      if (dlse) delta = delta.sub(c.input(7).to(acc).unsqueeze(-1));
      at::Tensor dp = at::matmul(g, a.v.to(acc).transpose(-2, -1));
      if (keep.defined()) dp.mul_(keep);
      const at::Tensor ds = probs.mul(dp.sub_(delta));
      dq = at::matmul(ds, a.k.to(acc)).mul_(scale_of(a));
      dk = at::sum_to(at::matmul(ds.transpose(-2, -1), a.q.to(acc)).mul_(scale_of(a)), a.k.sizes());
      const at::Tensor dropped = keep.defined() ? probs.mul(keep) : probs;
      dv = at::sum_to(at::matmul(dropped.transpose(-2, -1), g), a.v.sizes());
      dq = at::sum_to(dq, a.q.sizes());
    }
  }
  if (groups > 1) {
    if (dk.defined()) dk = sum_heads(dk, groups);
    if (dv.defined()) dv = sum_heads(dv, groups);
  }
  // The efficient kernel leaves the gradients it was not asked for undefined.
  const at::Tensor* grads[] = {&dq, &dk, &dv};
  const at::Tensor* like[] = {&given.q, &given.k, &given.v};
  for (int i = 0; i < 3; ++i)
    if (c.output_wanted(i) && grads[i]->defined()) c.set_output(i, grads[i]->to(like[i]->scalar_type()));
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, "Attention", attention_kernel);
REGISTER_KERNEL_IN(kOurDomain, "AttentionGrad", attention_grad_kernel);

}  // namespace torch_ort::kernels
