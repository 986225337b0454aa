// The recompute memory optimizer (ORTMODULE_MEMORY_OPT_LEVEL / ORTMODULE_MEMORY_OPT_CONFIG):
// instead of keeping a forward activation for backward, clone the small forward subgraph that
// computes it into backward, just before its first backward reader, and drop it from the saved
// set. Clones run the same kernels on the same inputs, so gradients are bit-identical.
//
// Opportunities are clustered by the op types of their subgraph, ORT style: "BiasGelu+",
// "FusedMatMul+Reshape+" (forward order, each op followed by '+'). A cluster has one occurrence
// per activation that matches it (typically one per transformer layer).
//   strategy 1 (recompute): the subgraph's inputs are values backward keeps anyway (or graph
//     inputs, constants); the activation's bytes are saved in full.
//   strategy 2 (recompute with compromise): the subgraph needs a forward value that was not kept;
//     that value is kept instead (it is smaller: e.g. the 16-bit input of a Cast to fp32), and
//     only the difference is saved.
// Levels: 0 only ORTMODULE_MEMORY_OPT_CONFIG's plans; 1 every strategy-1 opportunity inside a
// detected transformer layer (layer-boundary values — the residual stream — stay saved, so a
// layer's backward recomputes that layer only); 2 also the strategy-2 ones. A config entry with
// strategy 0 turns its cluster off at any level.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/shapes/sym_dim.h"

namespace torch_ort {

// One ORTMODULE_MEMORY_OPT_CONFIG entry: "<cluster>:<strategy>:<count>".
struct RecomputeRequest {
  std::string cluster;
  int strategy = 1;   // 0 off, 1 recompute, 2 recompute with compromise
  int64_t count = -1; // the first `count` occurrences in forward order; -1 all
};

struct RecomputeOccurrence {
  ValueId activation = kNoValue;   // the saved forward value dropped from the saved set
  std::vector<NodeId> subgraph;    // forward nodes cloned to recompute it, in forward order
  std::vector<ValueId> new_saved;  // strategy 2: forward values kept instead (empty for 1)
  int layer = -1;                  // transformer layer it lies in, -1 outside every layer
  bool enabled = false;
};

struct RecomputeOpportunity {
  std::string cluster;  // "BiasGelu+"
  int strategy = 1;
  std::vector<RecomputeOccurrence> occurrences;  // forward order
  SymExpr bytes_saved_each;   // activation bytes − new_saved bytes, per occurrence (symbolic)
  // Occurrences enabled (0 .. occurrences.size()).
  int64_t enabled_count() const;
};

struct RecomputeResult {
  std::vector<RecomputeOpportunity> opportunities;  // sorted by bytes saved, largest first
  int num_layers = 0;                               // transformer layers detected
  std::vector<ValueId> layer_boundaries;            // the residual-stream values kept
  int64_t nodes_cloned = 0;                         // recompute nodes added to backward
};

// The opportunities of a training graph (after the training pipeline), none enabled.
RecomputeResult analyze_recompute(const TrainingGraph& tg);

// Enables the opportunities `level` and `requests` select and rewrites tg (clones placed in
// backward before their first reader; backward reads the clones; num_forward_nodes unchanged).
// Throws std::invalid_argument naming a requested cluster that does not exist, with the list of
// valid cluster ids, or a strategy outside 0..2, or a count < -1.
RecomputeResult apply_recompute(TrainingGraph& tg, int level,
                                const std::vector<RecomputeRequest>& requests);

}  // namespace torch_ort
