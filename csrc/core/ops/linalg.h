// What the linalg family (ops/linalg.cc) shares with other family files: the GEMM nodes gradient
// rules emit, also used by fused.cc's FusedMatMul. Included only by family .cc files (it reads
// autodiff/), never by op_traits.h.
#pragma once

#include "csrc/core/autodiff/grad_ctx.h"

namespace torch_ort {

// alpha · op(a) · op(b), op = transpose when the flag is set: an ONNX Gemm (2-D operands) ...
ValueId gemm(GradCtx& g, ValueId a, ValueId b, bool ta, bool tb, float alpha);
// ... or our FusedMatMul (operands of rank >= 2, batched like MatMul).
ValueId fused_matmul(GradCtx& g, ValueId a, ValueId b, bool ta, bool tb, float alpha);

}  // namespace torch_ort
