// Liveness and the execution plan: which forward values backward keeps (the saved set), and the
// point after which every other buffer is freed.
#pragma once

#include <vector>

#include "csrc/core/ir/training_graph.h"
#include "csrc/core/planner/placement.h"

namespace torch_ort {

struct Step {
  NodeId node;                    // index into graph.nodes
  std::vector<ValueId> free_after;  // values whose last use is this step (dropped right after it)
  // Input whose buffer output 0 may take over (its buffer dies here; see choose_inplace
  // in memory.h), or
  // -1. The runtime reuses it only when nothing else holds that buffer.
  int inplace = -1;
};

struct Plan {
  std::vector<Step> forward;        // in order
  std::vector<Step> backward;       // in order (empty for inference plans)
  std::vector<ValueId> saved;       // forward values (not constants) the backward reads
  std::vector<ValueId> free_at_forward_end;  // forward values dead once forward returns
  int64_t num_forward_values = 0;   // values produced by forward nodes (the "save everything" count)
  int64_t num_saved_activations = 0;  // saved values produced by forward nodes (not graph inputs)
  Placement placement;              // where each value lives (place_host_values; empty: the device)
};

// Training plan over a training graph. Graph outputs are kept until returned; initializers are
// engine constants, never saved.
Plan plan_training(const TrainingGraph& tg);
// Inference plan: forward only, nothing saved.
Plan plan_inference(const Graph& g);

}  // namespace torch_ort
