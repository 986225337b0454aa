// Static memory estimate of a plan: bytes of every value as a formula in the graph's symbolic
// dims, which values share one buffer (views), the live bytes after every step, and the peaks of
// the forward, the saved activations and the backward — known before anything runs and evaluated
// for the sizes of a concrete call.
//
// What is counted ("activation bytes"): buffers the engine allocates while it runs — outputs of
// forward and backward nodes, the gradients it returns included. Not counted: graph inputs (the
// user's tensors and parameters), constants (engine-owned, reported apart), the incoming output
// gradients (autograd's), and kernels' internal scratch (not values of the graph).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "csrc/core/autodiff/gradient_builder.h"
#include "csrc/core/planner/plan.h"
#include "csrc/core/shapes/sym_dim.h"

namespace torch_ort {

// Ops whose kernels return a view of an input (no new buffer): output `output` aliases input
// `input`. One table for the planner and its tests; it must match the runtime kernels
// (tests/python/test_memory_plan.py measures it).
struct AliasRule {
  int output = 0;
  int input = 0;
};
// The alias rule of node `n`'s output `output_index`, or nullptr when that output is a new buffer.
const AliasRule* alias_rule(const Node& n, int output_index);

// In-place candidates: inputs of node `n` whose buffer its output 0 could take over (same dtype,
// provably the output's shape, and an op whose kernel can write over that operand), in order of
// preference; empty when none. plan_training/plan_inference set Step::inplace to the first
// candidate that is safe there: its buffer dies at this step and is no graph input, constant,
// saved value, graph output, or a view of one. The runtime checks again that nothing else holds
// the buffer before it reuses it.
std::vector<int> inplace_candidates(const Graph& g, const Node& n);

struct MemoryTimeline {
  // Per step of plan.forward / plan.backward: activation bytes live while the step runs (its
  // outputs allocated, its inputs not yet freed).
  std::vector<SymExpr> forward_live;
  std::vector<SymExpr> backward_live;
  SymExpr saved;        // activations kept from forward for backward (unique buffers)
  SymExpr outputs;      // graph outputs (held by the caller through backward)
  SymExpr constants;    // initializers and Constant nodes (engine-owned, not activations)
  std::vector<std::string> unknown;  // values whose size has no formula (counted as 0), by name
};

// The timeline of a training plan (plan_training over tg) or an inference plan (tg == nullptr,
// `g` the forward graph). A step with Step::inplace >= 0 allocates nothing for its output 0.
MemoryTimeline memory_timeline(const Graph& g, const Plan& plan, const TrainingGraph* tg);

struct PeakEstimate {
  int64_t forward_peak = 0;   // max over forward steps
  int64_t saved = 0;          // activations alive between forward and backward
  int64_t outputs = 0;        // graph outputs
  int64_t backward_peak = 0;  // max over backward steps (saved included, outputs not)
  int64_t peak = 0;           // max(forward_peak, outputs + backward_peak): the step's peak
  int64_t constants = 0;
  int64_t forward_peak_step = -1, backward_peak_step = -1;  // index into plan.forward/backward
  // Formulas (canonical SymExpr text, symbols renamed by `names`): the live bytes at the peak
  // steps for this binding, and the saved bytes.
  std::string forward_formula, saved_formula, backward_formula;
  bool complete = true;  // false: a symbol was unbound or a value had no formula
};

// Evaluates a timeline for `env` (symbol -> size, e.g. from binding_of). `names` renames symbols
// in the formulas ("s75" -> "input_ids_dim0"); symbols not in it keep their name.
PeakEstimate evaluate_peak(const MemoryTimeline& t, const std::map<std::string, int64_t>& env,
                           const std::map<std::string, std::string>& names = {});

// Binds the symbols of the graph inputs' dims to a call's sizes (first occurrence wins); `sizes`
// has one entry per graph input.
std::map<std::string, int64_t> binding_of(const Graph& g,
                                          const std::vector<std::vector<int64_t>>& sizes);
// Readable names for the graph inputs' symbols: "<input name>_dim<k>" at their first occurrence.
std::map<std::string, std::string> symbol_names(const Graph& g);

// Bytes of value v as a formula (dtype size × Π dims); false when a dim is unknown.
bool value_bytes(const Graph& g, ValueId v, SymExpr* out);

// Renders a byte formula with renamed symbols ("4*input_ids_dim0*input_ids_dim1*384").
std::string format_bytes_formula(const SymExpr& e, const std::map<std::string, std::string>& names);

}  // namespace torch_ort
