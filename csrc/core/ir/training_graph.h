// The training graph: one Graph holding forward and backward, and which values are the gradients
// flowing in and out. Autodiff builds it (autodiff/gradient_builder.h); passes, the planner and the
// runtime read it, so it lives here, below all of them.
#pragma once

#include <cstddef>
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

// Serializable form of a training graph (for DebugOptions.save_onnx): a plain Graph whose inputs
// are inputs + gradient inputs, and whose outputs are outputs + input gradients.
Graph as_exportable_graph(const TrainingGraph& tg);

}  // namespace torch_ort
