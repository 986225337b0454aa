// Nodes that act row by row on (B, T, ...) values, the token-wise work of a transformer (its
// norms, projections, MLP and residual adds): which inputs a row reads as its own row, and which
// it reads whole. A node that acts row by row may run on some of the rows only, given those rows
// of what it reads row by row. Shared by the passes that move such work onto fewer rows:
// padding_elimination (the rows whose attention_mask counts) and label_sparsity (those whose
// label counts).
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "csrc/core/ir/graph.h"

namespace torch_ort {

struct RowInputs {
  std::vector<int> rows;   // read row by row: (B, T, ...) as the outputs are
  std::vector<int> whole;  // read whole by every row, whatever their shape (a GEMM's weight, a reduction's axes)
};  // every other input present varies along the trailing dims only (each row reads all of it)

// Elementwise and never random: a FusedElementwise instruction, or an op of ours made of them.
bool elementwise_rows(const Node& n);

// How n reads its inputs when it acts row by row, or nullopt where a row of its outputs may
// depend on other rows (or nothing says it does not). is_rows(v): v is a (B, T, ...) value; every
// output of n must be one. Reductions, Softmax and LayerNormalization count only over trailing
// axes given as negative numbers (so that they stay right on the rows alone, of lower rank).
std::optional<RowInputs> row_inputs(const Graph& g, const GraphIndex& idx, const Node& n,
                                    const std::function<bool(ValueId)>& is_rows);

}  // namespace torch_ort
