// Reverse-mode autodiff over the IR: forward graph in, training graph (forward | backward) out.
#pragma once

#include <vector>

#include "csrc/core/ir/graph.h"
#include "csrc/core/ir/training_graph.h"

namespace torch_ort {

// Builds gradients for the graph inputs flagged in input_requires_grad (same length as
// forward.inputs). Throws GradientError naming the op and node when a needed rule is missing.
TrainingGraph build_training_graph(const Graph& forward, const std::vector<bool>& input_requires_grad);

}  // namespace torch_ort
