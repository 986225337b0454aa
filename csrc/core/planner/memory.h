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
#include <optional>
#include <string>
#include <vector>

#include "csrc/core/ir/training_graph.h"
#include "csrc/core/planner/plan.h"
#include "csrc/core/shapes/sym_dim.h"

namespace torch_ort {

// --- Views: which buffer each value lives in (memory_layout.cc, with the approximations).
//
// How a value lies in memory as our kernels produce it. A value that allocates is its own base;
// a view (Transpose, Slice, Expand, Identity, a Reshape at::reshape can view, ...) has the base of
// the value it views. Graph inputs, initializers and Constant outputs are their own bases.
struct ValueLayout {
  ValueId base = kNoValue;  // the value owning the buffer this one lives in (itself: it allocates)
  bool contiguous = true;   // row-major strides (at::Tensor::is_contiguous)
  bool whole = true;        // from offset 0 over all of base's elements (in-place reuse needs it)
  std::optional<std::vector<SymExpr>> strides;  // in elements, when provable (decides Reshape)
  bool constant = false;    // an initializer or a Constant node's output: bound by the engine
  const TensorData* data = nullptr;  // its values, when an initializer or a Constant's tensor
};

// A node output that is a view of (shares the buffer of) one of the node's inputs — or, for
// ATenOp/PythonOp, of another of its outputs.
struct AliasRule {
  int input = 0;            // index into the node's inputs (or outputs, when of_output)
  bool of_output = false;   // ATenOp/PythonOp: the recorded result shares the detached one's buffer
  bool contiguous = true;   // the view's layout (contiguous is recomputed from strides if known)
  bool whole = true;
  std::optional<std::vector<SymExpr>> strides;
};
// The alias rule of node `n`'s output `output`, given the layouts of its inputs (and of the
// outputs before `output`); nullopt when that output is a new buffer. One line per op in
// memory_layout.cc; it must match the runtime kernels (tests/python/test_memory.py measures it).
std::optional<AliasRule> alias_rule(const Graph& g, const Node& n, int output,
                                    const std::vector<ValueLayout>& layout);
// The layout of every value of `g`, nodes in order (in-place reuse is not applied here).
std::vector<ValueLayout> value_layouts(const Graph& g);

// --- In-place reuse (memory_inplace.cc).
//
// In-place candidates: inputs of node `n` whose buffer its output 0 could take over (same dtype,
// provably the output's shape, a floating output, and an op whose kernel can write over that
// operand: Add and Mul either operand, Sub, Div and Sum operand 0), in order of preference;
// empty when none. The runtime (kernels/elementwise.cc) honours exactly these.
std::vector<int> inplace_candidates(const Graph& g, const Node& n);

// Sets Step::inplace of `steps` (one phase of a plan, free_after filled) to the first candidate
// whose buffer dies at that step: every value living in it (views included) is last used there,
// none is `pinned` (values that outlive the phase or are not the engine's: graph inputs, saved
// values, graph outputs, incoming and returned gradients) or a constant, the candidate is
// contiguous over its whole buffer, and no other input of the node reads that buffer. The runtime
// checks again that nothing else holds the buffer before it reuses it.
void choose_inplace(const Graph& g, std::vector<Step>& steps, const std::vector<char>& pinned);

// --- The live-bytes timeline (memory.cc).

struct MemoryTimeline {
  // Per step of plan.forward / plan.backward: activation bytes live while the step runs (its
  // outputs allocated, its inputs not yet freed). Views add nothing; an output nobody reads
  // counts during its own step (many kernels compute it anyway); backward starts from the saved
  // buffers and keeps the returned gradients to its end.
  std::vector<SymExpr> forward_live;
  std::vector<SymExpr> backward_live;
  SymExpr saved;        // activations kept from forward for backward (unique buffers)
  // Graph outputs not also saved (held by the caller through backward; a saved one is counted in
  // backward_live until its last backward use, and not after: the runtime measures it so too).
  SymExpr outputs;
  SymExpr constants;    // initializers and Constant nodes (engine-owned, not activations)
  std::vector<std::string> unknown;  // values whose size has no formula (counted as 0), by name
};

// The timeline of a training plan (plan_training over tg) or an inference plan (tg == nullptr,
// `g` the forward graph). A step with Step::inplace >= 0 allocates nothing for its output 0.
MemoryTimeline memory_timeline(const Graph& g, const Plan& plan, const TrainingGraph* tg);

struct PeakEstimate {
  int64_t forward_peak = 0;   // max over forward steps
  int64_t saved = 0;          // activations alive between forward and backward
  int64_t outputs = 0;        // graph outputs not also saved
  int64_t backward_peak = 0;  // max over backward steps (saved included, outputs not); `saved`
                              // when backward has no step
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
// has one entry per graph input. A count of rows selected from data (OpTraits::selects_rows) is
// bound to its most: the element count of what they are selected from.
std::map<std::string, int64_t> binding_of(const Graph& g,
                                          const std::vector<std::vector<int64_t>>& sizes);
// Readable names for the graph inputs' symbols: "<input name>_dim<k>" at their first occurrence.
std::map<std::string, std::string> symbol_names(const Graph& g);

// Bytes of value v as a formula (dtype size × Π dims); false when a dim is unknown.
bool value_bytes(const Graph& g, ValueId v, SymExpr* out);

// Renders a byte formula with renamed symbols ("4*input_ids_dim0*input_ids_dim1*384").
std::string format_bytes_formula(const SymExpr& e, const std::map<std::string, std::string>& names);

}  // namespace torch_ort
