// Engine debug facility: inferred shapes as strings, and a run checking each tensor against them.
//
// Symbols bind to the sizes of the values that meet them first (inputs first); derived dims
// like "s0*s1" or "(s20//2)" are evaluated under those bindings.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <map>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/ones_like.h>

#include "csrc/core/ir/errors.h"
#include "csrc/core/shapes/infer_shapes.h"
#include "csrc/core/shapes/sym_dim.h"
#include "csrc/runtime/engine.h"

namespace torch_ort {
namespace {

// Values in the order they come to exist: graph inputs, then per node its not-yet-seen inputs
// (constants, output gradients) and its outputs. Symbols bind in this order.
std::vector<ValueId> definition_order(const Graph& g) {
  std::vector<char> seen(g.num_values(), 0);
  std::vector<ValueId> order;
  auto visit = [&](ValueId v) {
    if (v != kNoValue && !seen[v]) { seen[v] = 1; order.push_back(v); }
  };
  for (ValueId v : g.inputs) visit(v);
  for (const Node& n : g.nodes) {
    for (ValueId v : n.inputs) visit(v);
    for (ValueId v : n.outputs) visit(v);
  }
  return order;
}

std::string sizes_text(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

std::string bindings_text(const Shape& shape, const std::map<std::string, int64_t>& env) {
  std::string out;
  for (const Dim& d : shape.dims) {
    if (!d.is_symbolic()) continue;
    for (const std::string& a : SymExpr::parse(d.symbol).atoms()) {
      auto it = env.find(a);
      if (it == env.end() || out.find(" " + a + "=") != std::string::npos) continue;
      out += " " + a + "=" + std::to_string(it->second);
    }
  }
  return out.empty() ? "" : " (with" + out + ")";
}

// Compares one tensor with its value's shape; binds the symbols it is the first to meet.
ValueShapeCheck check_one(const Graph& g, const GraphIndex& index, ValueId v, const at::Tensor& t,
                          std::map<std::string, int64_t>& env) {
  const Value& val = g.value(v);
  ValueShapeCheck row{val.name, val.shape.to_string(), t.sizes().vec(), 0, val.shape.rank_known};
  if (!val.shape.rank_known) return row;
  const NodeId p = index.producer[v];
  const auto mismatch = [&](const std::string& detail) {
    throw VerifyError("shape check: value '" + val.name + "'" +
                      (p >= 0 ? " (produced by " + g.nodes[p].describe() + ")"
                              : std::string(" (a graph input)")) +
                      " was inferred " + val.shape.to_string() + bindings_text(val.shape, env) +
                      ", but the run produced " + sizes_text(t.sizes()) + detail);
  };
  if (t.dim() != val.shape.rank()) mismatch(": the rank differs");
  for (int64_t d = 0; d < t.dim(); ++d) {
    const Dim& dim = val.shape.dims[d];
    const int64_t size = t.size(d);
    if (dim.is_known()) {
      if (dim.value != size) mismatch(" (dim " + std::to_string(d) + ")");
      continue;
    }
    if (!dim.is_symbolic()) { ++row.unchecked_dims; continue; }
    const SymExpr e = SymExpr::parse(dim.symbol);
    if (auto want = e.evaluate(env)) {
      if (*want != size)
        mismatch(" (dim " + std::to_string(d) + ": " + dim.symbol + " = " + std::to_string(*want) + ")");
      continue;
    }
    const bool plain =
        e.terms.size() == 1 && e.terms.begin()->first.size() == 1 && e.terms.begin()->second == 1;
    if (plain) env[e.terms.begin()->first[0]] = size;  // first sighting: this symbol is `size`
    else ++row.unchecked_dims;
  }
  return row;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> Engine::value_shapes() const {
  const Graph& g = exec_graph();
  std::vector<std::pair<std::string, std::string>> out;
  for (ValueId v : values_in_graph(g)) out.emplace_back(g.value(v).name, g.value(v).shape.to_string());
  return out;
}

std::vector<ValueShapeCheck> Engine::check_shapes(const std::vector<at::Tensor>& inputs) const {
  check_inputs(inputs);
  at::NoGradGuard no_grad;
  const Graph& g = exec_graph();
  const c10::Device device = inputs.empty() ? c10::Device(c10::kCPU) : inputs[0].device();
  std::vector<at::Tensor> slots(g.num_values());
  for (const auto& [v, t] : constants_on(device)) slots[v] = t;
  for (size_t i = 0; i < inputs.size(); ++i) slots[g.inputs[i]] = inputs[i];
  const auto keep_everything = [](std::vector<CompiledStep> steps) {
    for (CompiledStep& s : steps) s.free_after.clear();
    return steps;
  };
  run_steps(keep_everything(forward_steps_), slots, device);
  if (tg_) {
    for (size_t i = 0; i < g.outputs.size(); ++i)
      if (tg_->grad_of_outputs[i] != kNoValue)
        slots[tg_->grad_of_outputs[i]] = at::ones_like(slots[g.outputs[i]]);
    run_steps(keep_everything(backward_steps_), slots, device);
  }
  const GraphIndex index(g);
  std::map<std::string, int64_t> env;  // symbol -> size in this run
  std::vector<ValueShapeCheck> rows;
  for (ValueId v : definition_order(g))
    if (slots[v].defined()) rows.push_back(check_one(g, index, v, slots[v], env));
  return rows;
}

}  // namespace torch_ort
