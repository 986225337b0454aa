// Fused attention's shared pieces (kernels attention.cc): the arguments both kernels read, and
// the math composite (attention_math.cc) that every backend falls back to, dropout included.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

#include "csrc/runtime/kernel.h"

namespace torch_ort::kernels::attention {

struct AttnArgs {
  at::Tensor q, k, v;               // (B, H, L, D), (B, H, S, D), (B, H, S, Dv)
  std::optional<at::Tensor> mask;   // additive, viewed as 4-D, broadcastable to (B, H, L, S)
  bool causal = false;              // top-left aligned: query i sees keys j <= i
  std::optional<double> scale;      // absent: SDPA's default 1/√D
  double dropout = 0.0;             // the rate p of the dropout on the probabilities, in [0, 1)
};

// The math composite: scores in float (double for double); rows that are fully masked give 0 (as
// the flash kernel does; the exporter's NaN guard does the same for the unfused graph).
at::ScalarType acc_type(const at::Tensor& q);
double scale_of(const AttnArgs& a);
at::Tensor math_scores(const AttnArgs& a);                       // (B, H, L, S)
at::Tensor math_probs(const at::Tensor& s, const at::Tensor& lse);

// Dropout on the math path: the same draws as eager's at::dropout of the probabilities (so a
// seeded run matches eager SDPA, and the global stream advances as eager's does), and the state
// the backward replays the keep-mask M from (RngState0):
//   on the CPU (bernoulli_(1 − p) from the default generator), that generator's state just
//     before the draw (a few KB): the backward draws M again from a private generator set to it,
//     so no (L, S) matrix is kept between forward and backward;
//   elsewhere (CUDA: native_dropout, which a CUDA graph replays with fresh philox offsets, where
//     a host seed would be baked into the capture), M itself (bool).
struct Drawn {
  at::Tensor dropped;  // P ⊙ M/(1 − p)
  at::Tensor state;    // the CPU generator's state (uint8) or M (bool)
};
Drawn draw_dropout(const at::Tensor& probs, double p);
// M/(1 − p) in the scores' dtype, from the forward's state.
at::Tensor replay_dropout(const KernelCtx& c, const at::Tensor& scores, double p, const at::Tensor& state);

}  // namespace torch_ort::kernels::attention
