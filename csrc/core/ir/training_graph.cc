#include "csrc/core/ir/training_graph.h"

namespace torch_ort {

Graph as_exportable_graph(const TrainingGraph& tg) {
  Graph g = tg.graph;
  g.name = tg.graph.name + "_training";
  for (ValueId v : tg.grad_of_outputs)
    if (v != kNoValue) g.inputs.push_back(v);
  // Each gradient leaves the graph under its input's name ("fc1.weight_grad"), through an
  // Identity: readable, and distinct even where two inputs share one gradient value.
  for (size_t i = 0; i < tg.input_grads.size(); ++i) {
    ValueId v = tg.input_grads[i];
    if (v == kNoValue) continue;
    const Value& in = g.value(g.inputs[i]);
    ValueId named = g.new_value(in.name + "_grad", g.value(v).dtype, in.shape);
    g.nodes.push_back(Node{"", "Identity", g.unique_node_name(in.name + "_grad"), {v}, {named}, {}});
    g.outputs.push_back(named);
  }
  return g;
}

}  // namespace torch_ort
