// What the nn family (ops/nn.cc) shares with other family files: the layer-norm statistics
// gradient, also used by fused.cc's SkipLayerNorm. Included only by family .cc files (it reads
// autodiff/), never by op_traits.h.
#pragma once

#include "csrc/core/autodiff/grad_ctx.h"

namespace torch_ort {

// Gradients reaching a layer norm's Mean (μ, output 1) and InvStdDev (r, output 2), when the graph
// reads them: dX += spread(dμ) + spread(dr · −r³) · (X − μ), spread = ReduceMean's gradient over
// the normalised axes [axis, rank) of X (÷ n, broadcast back); X is the normalised value (the
// input of LayerNormalization, the Sum output of SkipLayerNorm). kNoValue when neither is read.
// The exporter never exposes them; hand-built graphs may.
ValueId layer_norm_stats_grad(GradCtx& g, ValueId x, int64_t axis);

}  // namespace torch_ort
