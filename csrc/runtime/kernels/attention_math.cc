// Fused attention's math composite (attention.h): scores, probabilities from LogSumExp, and the
// dropout mask drawn in forward as eager draws it and replayed in backward from the saved state.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <cmath>
#include <limits>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/native_dropout.h>
#include <ATen/ops/ones.h>

#include "csrc/runtime/kernels/attention.h"
#include "csrc/runtime/kernels/common.h"

namespace torch_ort::kernels::attention {

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

Drawn draw_dropout(const at::Tensor& probs, double p) {
  if (fused_dropout_device(probs)) {
    auto [dropped, keep] = at::native_dropout(probs, p, true);
    return {std::move(dropped), std::move(keep)};
  }
  // eager's _dropout: noise = bernoulli_(1 − p) from the default generator, ÷ (1 − p), × P.
  at::Tensor state;
  {
    at::Generator global = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(global.mutex());  // bernoulli_ takes it again: released first
    state = global.get_state();
  }
  at::Tensor noise = at::empty(probs.sizes(), probs.options());
  noise.bernoulli_(1.0 - p);
  noise.div_(1.0 - p);
  return {probs.mul(noise), std::move(state)};
}

at::Tensor replay_dropout(const KernelCtx& c, const at::Tensor& scores, double p, const at::Tensor& state) {
  if (state.scalar_type() == at::kBool) {
    if (state.sizes() != scores.sizes())
      c.fail("the saved dropout mask " + c10::str(state.sizes()) + " does not match the scores " +
             c10::str(scores.sizes()));
    return state.to(scores.scalar_type()).mul_(1.0 / (1.0 - p));  // native_dropout's scale
  }
  if (!scores.is_cpu() || !state.is_cpu() || state.scalar_type() != at::kByte)
    c.fail("the dropout state must be the forward's CPU generator state (uint8, CPU scores) or its keep-mask, "
           "got " + c10::str(state.sizes()) + " " + c10::toString(state.scalar_type()) + " on " +
           state.device().str() + " for scores on " + scores.device().str());
  at::Generator replay = at::detail::createCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(replay.mutex());
    replay.set_state(state);
  }
  return at::empty(scores.sizes(), scores.options()).bernoulli_(1.0 - p, replay).div_(1.0 - p);
}

}  // namespace torch_ort::kernels::attention
