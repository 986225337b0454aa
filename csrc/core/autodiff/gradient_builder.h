// Reverse-mode autodiff over the IR: forward graph in, training graph (forward | backward) out.
#pragma once

#include <vector>

#include "csrc/core/ir/graph.h"

namespace torch_ort {

// The forward+backward graph. nodes[0, num_forward_nodes) run in the forward call; the rest run
// in the backward call. Graph inputs are the forward inputs; the incoming output gradients are
// extra values (not in graph.inputs) listed in grad_of_outputs; graph.outputs are the forward
// outputs. Exported as ONNX, inputs = inputs + grad_of_outputs, outputs = outputs + input_grads.
struct TrainingGraph {
  Graph graph;
  size_t num_forward_nodes = 0;
  std::vector<ValueId> grad_of_outputs;  // per graph output: its gradient input, or kNoValue (not differentiable)
  std::vector<ValueId> input_grads;      // per graph input: its gradient, or kNoValue (not requested / unreachable)
};

// Builds gradients for the graph inputs flagged in input_requires_grad (same length as
// forward.inputs). Throws GradientError naming the op and node when a needed rule is missing.
TrainingGraph build_training_graph(const Graph& forward, const std::vector<bool>& input_requires_grad);

// Serializable form of a training graph (for DebugOptions.save_onnx): a plain Graph whose inputs
// are inputs + gradient inputs, and whose outputs are outputs + input gradients.
Graph as_exportable_graph(const TrainingGraph& tg);

}  // namespace torch_ort
