// The op families: one ops/<family>.cc per family, the one home of each of its ops. A family file
// holds, for every op of the family, its traits line (the family's function below, gathered by
// op_traits.cc), its shape rule (REGISTER_SHAPE_RULE, shapes/shape_rules.h) and its gradient rule
// or the reason it has none (REGISTER_GRADIENT / NO_GRADIENT, autodiff/gradient_registry.h). Our
// gradient ops (ReluGrad, MaxPoolGrad, ...) live in the family of their forward op. A family is
// named like the files of its kernels (csrc/runtime/kernels/) and of its parity rows
// (tests/python/op_table/).
//
// Layering: this header, like op_traits.h, includes only op_traits.h (so ir/graph.h, ir/dtype.h),
// and is read by op_traits.cc alone. The family .cc files are registration units at the top of the
// core: they may include shapes/ and autodiff/ headers, and nothing includes them.
#pragma once

#include <vector>

#include "csrc/core/ir/op_traits.h"

namespace torch_ort::ops {

std::vector<OpEntry> elementwise_ops();  // elementwise.cc: arithmetic, activations, comparisons, casts
std::vector<OpEntry> shape_ops();        // shape.cc: Reshape, Transpose, Slice, Split, Concat, Shape, Range, ...
std::vector<OpEntry> index_ops();        // index.cc: Gather*, Scatter*, NonZero, OneHot
std::vector<OpEntry> reduce_ops();       // reduce.cc: Reduce*, ArgMax/ArgMin, TopK, CumSum, softmax
std::vector<OpEntry> linalg_ops();       // linalg.cc: MatMul, Gemm
std::vector<OpEntry> cnn_ops();          // cnn.cc: convolutions, pooling, batch normalization
std::vector<OpEntry> nn_ops();           // nn.cc: layer normalisation, losses, Embedding
std::vector<OpEntry> attention_ops();    // attention.cc: our fused Attention
std::vector<OpEntry> fused_ops();        // fused.cc: our other fused ops (passes/*_fusion.cc)
std::vector<OpEntry> random_ops();       // random.cc: ops that draw random numbers, DropoutGrad
std::vector<OpEntry> aten_ops();         // aten.cc: ops that run PyTorch code
std::vector<OpEntry> transfer_ops();     // transfer.cc: placement's ToHost, ToDevice

}  // namespace torch_ort::ops
