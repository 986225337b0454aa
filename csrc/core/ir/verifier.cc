// IR invariant checks (SSA, def-before-use, types, attribute kinds, op arity, graph outputs) and a
// stable topological sort.
#include "csrc/core/ir/verifier.h"

#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <set>
#include <string>
#include <vector>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/limits.h"
#include "csrc/core/ir/op_arity.h"
#include "csrc/core/ir/op_traits.h"

namespace torch_ort {

namespace {

enum class Def : uint8_t { kNone, kInput, kInitializer, kNode };

std::string quoted(const Graph& g, ValueId v) { return "'" + g.value(v).name + "'"; }

void check_typed(const Graph& g, ValueId v, const std::string& where) {
  if (g.value(v).dtype == DType::kUndefined) {
    throw VerifyError("value " + quoted(g, v) + " (" + where + ") has no dtype");
  }
  // The importer and shape inference hold shapes to limits.h; a pass must not break that either.
  if (std::string why = limits::check_shape(g.value(v).shape); !why.empty()) {
    throw VerifyError("value " + quoted(g, v) + " (" + where + ") has " + why);
  }
}

// The kind of every attribute read by a fixed name anywhere in csrc/ (grep get_int("...") etc.);
// one kind per name, as in the ONNX operator specs. A name read with a new kind goes here too.
const std::map<std::string, std::string>& attribute_kinds() {
  static const std::map<std::string, std::string> kinds = [] {
    std::map<std::string, std::string> m;
    for (const char* n : {"allowzero", "axis", "batch_dims", "causal", "ceil_mode", "count_include_pad",
                          "detect_negative", "detect_positive", "end", "func_id", "group", "ignore_index",
                          "keepdims", "noop_with_empty_axes", "num_outputs", "num_results", "padding_idx",
                          "scale_grad_by_freq", "stash_type", "start", "storage_order", "to", "training",
                          "training_mode", "transA", "transB", "upper", "value_int"})
      m[n] = "int";
    for (const char* n : {"alpha", "beta", "epsilon", "label_smoothing", "ratio", "scale", "value_float"})
      m[n] = "float";
    for (const char* n : {"approximate", "aten_op", "auto_pad", "name", "reduction"}) m[n] = "string";
    for (const char* n : {"axes", "dilations", "ends", "kernel_shape", "operands", "output_padding",
                          "output_shape", "pads", "perm", "split", "starts", "strides", "value_ints"})
      m[n] = "ints";
    for (const char* n : {"consts", "value_floats"}) m[n] = "floats";
    for (const char* n : {"arg_kinds", "ops", "value_strings"}) m[n] = "strings";
    m["value"] = "tensor";
    return m;
  }();
  return kinds;
}

}  // namespace

std::string attribute_kind_problem(const Node& n) {
  // Our opaque ops (ATenOp, ATenOpGrad, PythonOp: ops/aten.cc) carry the wrapped call's
  // arguments under their own names and kinds.
  const bool opaque = n.domain == kOurDomain && op_traits(n).opaque;
  static const std::set<std::string> kOpaqueOwn = {"aten_op", "arg_kinds", "func_id", "num_results", "name"};
  for (const auto& [name, a] : n.attrs.all()) {
    if (opaque && !kOpaqueOwn.count(name)) continue;
    auto it = attribute_kinds().find(name);
    if (it != attribute_kinds().end() && it->second != attribute_kind_name(a))
      return "attribute '" + name + "' is of kind " + attribute_kind_name(a) + ", expected " + it->second;
  }
  // Cast's `to` becomes its output's element type: one dtype.h knows, or nothing downstream (type
  // inference, the planner's byte counts, the kernel) can size it.
  if (n.op_type == "Cast" && n.domain.empty()) {
    if (!n.attrs.has("to")) return "attribute 'to' is required";
    const int64_t to = n.attrs.get_int("to", 0);  // of kind int: checked above
    if (to < 0 || to > INT32_MAX || !is_valid_dtype(static_cast<int32_t>(to)))
      return "attribute 'to' is " + std::to_string(to) + ", not an element type this engine knows";
  }
  return "";
}

void verify(const Graph& g) {
  const int32_t nv = g.num_values();
  const auto in_range = [&](ValueId v) { return v >= 0 && v < nv; };
  std::vector<Def> def(static_cast<size_t>(nv), Def::kNone);
  std::vector<NodeId> producer(static_cast<size_t>(nv), -1);  // first producing node

  for (ValueId v : g.inputs) {
    if (!in_range(v)) throw VerifyError("graph input id " + std::to_string(v) + " is out of range");
    if (def[v] != Def::kNone) throw VerifyError("graph input " + quoted(g, v) + " is listed twice");
    def[v] = Def::kInput;
    check_typed(g, v, "graph input");
  }
  for (const auto& [v, data] : g.initializers) {
    if (!in_range(v)) throw VerifyError("initializer id " + std::to_string(v) + " is out of range");
    // One definition per value: a parameter moved to the inputs must leave the initializers.
    if (def[v] == Def::kInput) {
      throw VerifyError("value " + quoted(g, v) + " is both a graph input and an initializer");
    }
    def[v] = Def::kInitializer;
    check_typed(g, v, "initializer");
    if (data.dtype != g.value(v).dtype) {
      throw VerifyError("initializer " + quoted(g, v) + " holds " + std::string(dtype_name(data.dtype)) +
                        " data but the value is " + std::string(dtype_name(g.value(v).dtype)));
    }
    std::string why;
    const std::optional<int64_t> numel = limits::bounded_numel(data.dims, &why);
    if (!numel) throw VerifyError("initializer " + quoted(g, v) + ": " + why);
    const int64_t bytes = dtype_size(data.dtype) * *numel;  // <= 16 * 2^48: no overflow
    if (bytes != static_cast<int64_t>(data.raw.size())) {
      throw VerifyError("initializer " + quoted(g, v) + " has " + std::to_string(data.raw.size()) +
                        " bytes, expected " + std::to_string(bytes));
    }
  }
  // Producers first, so that a use-before-def message can name the late producer.
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodes.size()); ++n) {
    for (ValueId v : g.nodes[n].outputs) {
      if (in_range(v) && producer[v] < 0) producer[v] = n;
    }
  }

  for (NodeId n = 0; n < static_cast<NodeId>(g.nodes.size()); ++n) {
    const Node& node = g.nodes[n];
    const std::string who = "node " + node.describe();
    if (node.op_type.empty()) throw VerifyError(who + " has an empty op_type");
    // The importer spells ONNX's default domain "" (onnx_import.cc); every later stage compares
    // with "" alone, so a node spelling it out would be taken for an op of another domain.
    if (node.domain == "ai.onnx")
      throw VerifyError(who + ": domain 'ai.onnx' must be written \"\" (the importer normalizes it)");
    if (std::string why = attribute_kind_problem(node); !why.empty()) throw VerifyError(who + ": " + why);
    // Every later reader may take a known op's required inputs/outputs by position.
    if (std::string why = arity_problem(g, node); !why.empty()) throw VerifyError(who + ": " + why);
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId v = node.inputs[i];
      if (v == kNoValue) continue;
      if (!in_range(v)) {
        throw VerifyError(who + ": input " + std::to_string(i) + " has out-of-range value id " +
                          std::to_string(v));
      }
      if (def[v] == Def::kNone) {
        const NodeId p = producer[v];
        throw VerifyError(who + " reads value " + quoted(g, v) + " before it is defined" +
                          (p >= 0 ? " (it is produced later by node " + g.nodes[p].describe() + ")"
                                  : " (no node produces it and it is no graph input or initializer)"));
      }
      check_typed(g, v, "input " + std::to_string(i) + " of " + who);
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const ValueId v = node.outputs[i];
      if (v == kNoValue) continue;
      if (!in_range(v)) {
        throw VerifyError(who + ": output " + std::to_string(i) + " has out-of-range value id " +
                          std::to_string(v));
      }
      if (def[v] == Def::kInput || def[v] == Def::kInitializer) {
        throw VerifyError(who + " produces value " + quoted(g, v) + ", which is already a graph " +
                          (def[v] == Def::kInput ? "input" : "initializer"));
      }
      if (def[v] == Def::kNode || producer[v] != n) {
        throw VerifyError("value " + quoted(g, v) + " is produced twice (SSA): by node " +
                          g.nodes[producer[v]].describe() + " and by " + who);
      }
      def[v] = Def::kNode;
      check_typed(g, v, "output " + std::to_string(i) + " of " + who);
    }
  }

  for (ValueId v : g.outputs) {
    if (!in_range(v)) throw VerifyError("graph output id " + std::to_string(v) + " is out of range");
    if (def[v] == Def::kNone) {
      throw VerifyError("graph output " + quoted(g, v) +
                        " is not defined (no node produces it and it is no graph input or initializer)");
    }
  }
}

void topological_sort(Graph& g) {
  const auto num_nodes = static_cast<NodeId>(g.nodes.size());
  const GraphIndex index(g);
  // One edge per (producer, consumer input slot), counted the same way on both sides.
  std::vector<int32_t> pending(static_cast<size_t>(num_nodes), 0);
  std::vector<std::vector<NodeId>> succ(static_cast<size_t>(num_nodes));
  for (NodeId n = 0; n < num_nodes; ++n) {
    for (ValueId v : g.nodes[n].inputs) {
      if (v < 0 || v >= g.num_values() || index.producer[v] < 0) continue;
      ++pending[n];
      succ[index.producer[v]].push_back(n);
    }
  }
  // Stable Kahn: always emit the ready node that came first, so a valid order is kept as is.
  std::priority_queue<NodeId, std::vector<NodeId>, std::greater<>> ready;
  for (NodeId n = 0; n < num_nodes; ++n) {
    if (pending[n] == 0) ready.push(n);
  }
  std::vector<NodeId> order;
  order.reserve(static_cast<size_t>(num_nodes));
  while (!ready.empty()) {
    const NodeId n = ready.top();
    ready.pop();
    order.push_back(n);
    for (NodeId s : succ[n]) {
      if (--pending[s] == 0) ready.push(s);
    }
  }
  if (static_cast<NodeId>(order.size()) != num_nodes) {
    // Every unsorted node waits on another unsorted node: walking producers must loop.
    NodeId n = 0;
    while (pending[n] == 0) ++n;
    std::vector<int32_t> seen_at(static_cast<size_t>(num_nodes), -1);
    std::vector<NodeId> path;
    while (seen_at[n] < 0) {
      seen_at[n] = static_cast<int32_t>(path.size());
      path.push_back(n);
      for (ValueId v : g.nodes[n].inputs) {
        if (v < 0 || v >= g.num_values()) continue;
        const NodeId p = index.producer[v];
        if (p >= 0 && pending[p] > 0) { n = p; break; }
      }
    }
    std::string cycle;
    for (size_t i = path.size(); i-- > static_cast<size_t>(seen_at[n]);) {
      cycle += g.nodes[path[i]].describe() + " -> ";
    }
    throw VerifyError("graph has a cycle through node " + g.nodes[n].describe() + ": " + cycle +
                      g.nodes[path.back()].describe());
  }
  std::vector<Node> sorted;
  sorted.reserve(g.nodes.size());
  for (NodeId n : order) sorted.push_back(std::move(g.nodes[n]));
  g.nodes = std::move(sorted);
}

}  // namespace torch_ort
