// The recompute memory optimizer (ORTMODULE_MEMORY_OPT_LEVEL / ORTMODULE_MEMORY_OPT_CONFIG):
// instead of keeping a forward activation for backward, clone the small forward subgraph that
// computes it into backward, just before its first backward reader, and drop it from the saved
// set. Clones run the same kernels on the same inputs, so gradients are bit-identical.
//
// Opportunities are clustered by the op types of their subgraph, ORT style: "BiasGelu+",
// "FusedMatMul+Reshape+" (each op followed by '+', in a topological order: farthest from the
// activation first, ties by op type — the same in every layer). A cluster has one occurrence
// per forward node whose saved outputs it recomputes (typically one per transformer layer).
// Candidates: saved outputs of forward nodes, except graph outputs (the caller holds them
// anyway), returned gradients, layer boundaries, small integer tensors (shapes) and views of
// buffers that stay kept (memory.h's value_layouts: dropping them frees nothing). Subgraphs
// hold at most 15 nodes of recomputable ops (their trait, csrc/core/ops/); random ops (Dropout,
// BiasDropout) are never cloned, so their outputs and masks stay saved.
//   strategy 1 (recompute): the subgraph's inputs are values backward keeps anyway (saved values
//     not being dropped, graph inputs and outputs, constants, shape tensors); the activation's
//     bytes are saved in full.
//   strategy 2 (recompute with compromise): the subgraph needs forward values that were not kept;
//     they are kept instead (smaller: the 16-bit input of a Cast to fp32, or a bool mask — walks
//     never recompute through integer/bool values), and only the difference is saved. Offered
//     when it provably saves at least half the activation's bytes; the activation's own node
//     alone is preferred to the longer subgraph the walk found.
// Transformer layers: residual adds (an Add whose sum a layer norm reads, or a SkipLayerNorm) mark
// the residual stream — their sums and the summands that fork into a block. Those boundary values
// split the forward into layers, one per residual branch (attention and MLP of a block are two).
// Levels: 0 only ORTMODULE_MEMORY_OPT_CONFIG's plans; 1 every strategy-1 opportunity inside a
// detected transformer layer (layer-boundary values — the residual stream — stay saved, so a
// layer's backward recomputes that layer only; an occurrence whose subgraph reads an activation
// another layer drops stays off, e.g. a pre-LN SkipLayerNorm's normalised output, which needs the
// previous layer's branch), and every strategy-1 opportunity outside the layers whose subgraph
// reads only graph inputs, constants and graph outputs (the loss's log-probabilities, recomputed
// from the logits the caller holds anyway); 2 also the strategy-2 ones. A config entry decides its cluster alone,
// whatever the level: strategy 0 turns it off, 1 or 2 turns on the first `count` occurrences of
// that strategy. An activation gets one plan: strategy 1 over 2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "csrc/core/ir/training_graph.h"
#include "csrc/core/shapes/sym_dim.h"

namespace torch_ort {

// One ORTMODULE_MEMORY_OPT_CONFIG entry: "<cluster>:<strategy>:<count>".
struct RecomputeRequest {
  std::string cluster;
  int strategy = 1;   // 0 off, 1 recompute, 2 recompute with compromise
  int64_t count = -1; // the first `count` occurrences in forward order; -1 all
};

struct RecomputeOccurrence {
  // The saved forward value dropped from the saved set: the first such output of the subgraph's
  // last node. Its other saved outputs go with it (a clone recomputes all of a node's outputs).
  ValueId activation = kNoValue;
  std::vector<ValueId> more_activations;  // a LayerNorm's mean and inv_std, Attention's logsumexp
  std::vector<NodeId> subgraph;    // forward nodes cloned to recompute it, in forward order
  std::vector<ValueId> new_saved;  // strategy 2: forward values kept instead (empty for 1)
  int layer = -1;                  // transformer layer it lies in, -1 outside every layer
  // Outside the layers, reading only graph inputs, constants and graph outputs: nothing to chain
  // through, so levels >= 1 take it like a layer's.
  bool standalone = false;
  bool enabled = false;
};

struct RecomputeOpportunity {
  std::string cluster;  // "BiasGelu+"
  int strategy = 1;
  std::vector<RecomputeOccurrence> occurrences;  // forward order
  // Activation bytes − new_saved bytes of one occurrence (symbolic). Occurrences of a cluster in
  // different layers of a transformer have the same formula; where they differ, the first's.
  SymExpr bytes_saved_each;
  // Occurrences enabled (0 .. occurrences.size()).
  int64_t enabled_count() const;
};

struct RecomputeResult {
  // Sorted by the bytes all occurrences save (every symbol at 1024), largest first.
  std::vector<RecomputeOpportunity> opportunities;
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
