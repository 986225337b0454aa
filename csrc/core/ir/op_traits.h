// Op traits: the properties of an op that the passes, the planner, autodiff and type inference
// ask about, one entry per op in one place (ops/<family>.cc, one line per op). A stage asks
// "is this op random?" here instead of keeping its own list of names. The family file that holds
// an op's traits line also holds its shape rule and its gradient rule (families.h).
//
// Layering: declared in the IR stage (it includes only ir/ headers), so every stage may read it
// (scripts/include_graph.py holds the stages to their order). The entries are the other way
// round: ops/<family>.cc, the registration units at the top of the core, define them, and
// ops/op_traits.cc indexes them; nothing below includes an ops/ header.
//
// An op without an entry has no traits (every flag false, every list empty): each stage then
// takes its conservative path (not fused, not recomputed, allocated, on the device, ...).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "csrc/core/ir/dtype.h"
#include "csrc/core/ir/graph.h"
#include "csrc/core/ir/op_arity.h"

namespace torch_ort {

// An instruction of a FusedElementwise program (elementwise_chain_fusion.cc; the runtime's
// kernels/fused_elementwise.cc runs exactly these).
enum class FusedInstr : uint8_t {
  kNone,
  kUnary,   // y = op(a)
  kBinary,  // y = op(a, b)
};

// How an output may share its input's buffer, as our runtime kernel lays it out. Each kind is
// one rule in planner/memory_layout.cc, which decides per node whether it is a view and with
// which strides.
enum class ViewRule : uint8_t {
  kNever,        // every output is a new buffer
  kInput0,        // Identity: input 0 itself
  kReshape,       // Reshape, Flatten: at::reshape (a view when the strides allow)
  kSqueeze,
  kUnsqueeze,
  kTranspose,     // a permuted view
  kExpand,        // a broadcast view (stride 0)
  kSlice,         // a narrowed view (not for a negative step)
  kSplit,         // narrowed views along `axis` (Split, ConcatGrad)
  kSameDtype,     // Cast/CastLike to the input's own dtype
  kDropout,       // X passed through when not training or ratio 0
  kBiasDropout,   // X passed through when it adds nothing and drops nothing
  kDropoutGrad,   // dY passed through when the forward passed X through
  kIfSameShape,   // SumToShape: dY when nothing is reduced
  kSpread,        // ReduceSumGrad: unsqueeze + expand of dY
  kReduceNoop,    // ReduceSum/ReduceMean with noop_with_empty_axes and no axes
  kSingleSum,     // Sum of one operand
  kAutogradOp,    // ATenOp/PythonOp: results and detached inputs (ir/aten_op.h)
};

struct OpTraits {
  FusedInstr fused = FusedInstr::kNone;  // an instruction FusedElementwise can run
  bool commutative = false;     // the result does not depend on the order of the inputs (cse)
  // Draws random numbers: two equal nodes differ (cse never merges them) and a clone draws anew
  // (recompute never clones them). Not DropoutGrad: it replays the forward's mask.
  bool random = false;
  // Draws random numbers only for some attributes (Attention with a `dropout` rate): is_random
  // asks it per node, and such a node is never recomputable, whatever `recomputable` says.
  bool (*random_when)(const Node& n) = nullptr;
  bool opaque = false;          // runs code we do not control (PythonOp, ATenOp): never merged
  // Reruns bit-identically, so planner/recompute.cc may clone it into backward instead of saving
  // its output: deterministic, stateless, free of side effects, vetted. Never `random` (a
  // dropout's output could be rebuilt from its mask only by another kernel, DropoutGrad, whose
  // rounding of 1/(1-p) need not match the forward's), never `opaque` (arbitrary code).
  bool recomputable = false;
  bool reads_metadata_only = false;  // reads only its input's sizes (Shape, Size)
  // Its kernel computes on the host when every input is there (shape arithmetic, placement.cc).
  bool host_computable = false;
  // Inputs the kernel reads as numbers on the host (KernelCtx::input_ints / input_scalar /
  // input_flag): placement keeps them there. Positions past a node's inputs are ignored.
  std::vector<int> host_inputs = {};
  // Operands the kernel may overwrite with its result (the elementwise kernels, GatherGrad's
  // accumulator), when the node has two or more operands; planner/memory_inplace.cc decides per
  // step and the kernel asks KernelCtx::may_overwrite_input.
  std::vector<int> inplace_inputs = {};
  ViewRule view = ViewRule::kNever;
  // Output k's dtype when the op fixes it (kUndefined or past the end: the data's dtype, see
  // ir/type_inference.cc). ONNX ops only; ours are typed by the code that builds them.
  std::vector<DType> output_dtypes = {};
  // Its gradient reads forward outputs the exporter may leave out (MaxPool's Indices,
  // Dropout's mask, LayerNormalization's statistics, the loss's log-probabilities): this adds
  // them to the node (a value per missing output), before autodiff builds gradients. Written in
  // the op's family file, beside its gradient rule; called only on a node with input 0 and
  // output 0 (autodiff/gradient_builder.cc).
  void (*add_outputs_for_gradient)(Graph& g, Node& n) = nullptr;
  // Our domain's ops only: how many inputs and outputs the op takes and which leading ones are
  // required, per the code that emits the node and the kernel that reads it; verify() holds every
  // node to it (ir/op_arity.h). ONNX ops get theirs from onnx's schemas, never here.
  std::optional<OpArity> arity = {};
  // Output 0 lists rows the data chooses among input 0's elements (LabelRows, PaddingRows): at
  // most that many, so the memory estimate made before a step bounds the count by it.
  bool selects_rows = false;

  // Hooks for what depends on the node, not only on the op (each null for most ops):
  // output k's dtype from an attribute or another input (Cast's `to`, Where's data); kUndefined
  // leaves it to the general rule (ir/type_inference.cc: the first input's dtype).
  DType (*output_dtype_of)(const Graph& g, const Node& n, size_t k) = nullptr;
  // Host inputs beyond `host_inputs`, from the node's arity or attributes (ConcatGrad's shapes,
  // ATenOp's numeric arguments); planner/placement.cc ignores positions past the node's inputs.
  void (*more_host_inputs)(const Node& n, std::vector<int>& out) = nullptr;
  // Outputs the kernel writes on the host (a scalar its backward reads); positions past the
  // node's outputs are ignored.
  std::vector<int> host_outputs = {};
  // The input whose layout a new output k copies (ATen's fused kernels allocate empty_like one
  // of their inputs), or -1 for a row-major buffer (planner/memory_layout.cc).
  int (*output_like_input)(const Graph& g, const Node& n, int k) = nullptr;
};

// One registry line: (domain, op) and its traits. domain "" is ONNX's default (ai.onnx).
struct OpEntry {
  std::string_view domain;
  std::string_view op_type;
  OpTraits traits;
};

// The traits of op_type in domain ("": ONNX's default, as the importer writes it), nullptr for an
// op without an entry.
const OpTraits* find_op(std::string_view domain, std::string_view op_type);

// The node's traits; an op without an entry gets the empty traits (every flag false).
const OpTraits& op_traits(const Node& n);

inline bool is_random(const Node& n) {
  const OpTraits& t = op_traits(n);
  return t.random || (t.random_when && t.random_when(n));
}
inline bool is_opaque(const Node& n) { return op_traits(n).opaque; }
inline bool is_recomputable(const Node& n) { return op_traits(n).recomputable && !is_random(n); }

// Every entry, as "domain::op" ("::Add", "com.torch_ort::BiasGelu"), sorted (for tests).
std::vector<std::string> op_traits_ops();

}  // namespace torch_ort
