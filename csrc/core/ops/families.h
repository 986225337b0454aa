// The op families whose traits op_traits.cc gathers: one function per ops/<family>.cc, each
// returning its ops' lines. Families follow the shape rules (shapes/rules_<family>.cc).
#pragma once

#include <vector>

#include "csrc/core/ops/op_traits.h"

namespace torch_ort::ops {

std::vector<OpEntry> elementwise_ops();  // elementwise.cc: arithmetic, activations, comparisons
std::vector<OpEntry> data_ops();         // data.cc: Shape, Size, ranges and constants, Concat, Slice
std::vector<OpEntry> shape_ops();        // shape.cc: Reshape, Transpose, (Un)Squeeze, Expand, ...
std::vector<OpEntry> index_ops();        // index.cc: Gather, Split, NonZero
std::vector<OpEntry> reduce_ops();       // reduce.cc: Reduce*, ArgMax/ArgMin and their gradients
std::vector<OpEntry> linalg_ops();       // linalg.cc: MatMul, Gemm, pooling
std::vector<OpEntry> nn_ops();           // nn.cc: normalisation, softmax, losses
std::vector<OpEntry> random_ops();       // random.cc: ops that draw random numbers, DropoutGrad
std::vector<OpEntry> fused_ops();        // fused.cc: our fused ops (passes/*_fusion.cc)
std::vector<OpEntry> gradient_ops();     // gradients.cc: our gradient ops
std::vector<OpEntry> aten_ops();         // aten.cc: ops that run PyTorch code

}  // namespace torch_ort::ops
