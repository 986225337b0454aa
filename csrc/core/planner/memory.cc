// Static memory estimate of a plan (see memory.h): byte formulas, the live-bytes timeline with
// the runtime's accounting, its peaks for one binding of the symbols, and readable formulas.
//
// The accounting follows what the executor's slots hold (runtime/executor.cc run_steps,
// runtime/engine.cc forward/backward): a step sets its output slots, is sampled, then drops its
// free_after slots; a buffer counts once while any slot holds a value living in it. Forward
// moves the saved values into the RunContext; backward starts from them (plus constants and the
// incoming gradients, which are not counted).
#include "csrc/core/planner/memory.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/limits.h"
#include "csrc/core/ir/op_traits.h"

namespace torch_ort {

bool value_bytes(const Graph& g, ValueId v, SymExpr* out) {
  const Value& val = g.value(v);
  if (!val.shape.rank_known) return false;
  SymExpr bytes = SymExpr::constant(dtype_size(val.dtype));
  try {
    for (const Dim& d : val.shape.dims) {
      auto e = SymExpr::of(d);
      if (!e) return false;
      bytes = bytes * *e;
    }
  } catch (const std::overflow_error& e) {  // SymExpr arithmetic is checked (sym_dim.cc)
    throw VerifyError("memory estimate: the bytes of value '" + val.name + "' " +
                      val.shape.to_string() + " overflow int64 (" + e.what() + ")");
  }
  *out = bytes;
  return true;
}

namespace {

// Buffers of the plan: per value, the value owning the buffer it lives in (views and in-place
// outputs resolved), whether that buffer is the engine's to count, and its bytes.
struct Buffers {
  std::vector<ValueId> base;
  std::vector<char> counted;  // per base: an activation (not an input, constant or dY)
  std::vector<char> constant; // per value: an initializer or a Constant node's output
  std::vector<SymExpr> bytes; // per base
  std::vector<std::string> unknown;

  ValueId of(ValueId v) const { return v == kNoValue ? kNoValue : base[v]; }
  bool counts(ValueId v) const { return v != kNoValue && counted[base[v]]; }
};

Buffers buffers_of(const Graph& g, const Plan& plan, const TrainingGraph* tg) {
  const std::vector<ValueLayout> layout = value_layouts(g);
  Buffers b;
  b.base.resize(g.num_values());
  for (ValueId v = 0; v < g.num_values(); ++v) b.base[v] = layout[v].base;
  // In-place: output 0 lives in the buffer of the input it overwrites, and so do its views.
  // Steps run in node order, so that input's buffer is already resolved when its reader comes.
  std::vector<ValueId> moved(g.num_values());  // per base: the buffer it ends up in
  for (ValueId v = 0; v < g.num_values(); ++v) moved[v] = v;
  for (const auto* steps : {&plan.forward, &plan.backward})
    for (const Step& s : *steps)
      if (s.inplace >= 0) {
        const Node& n = g.nodes[s.node];
        moved[n.outputs[0]] = moved[b.base[n.inputs[s.inplace]]];
      }
  for (ValueId v = 0; v < g.num_values(); ++v) b.base[v] = moved[b.base[v]];
  b.counted.assign(g.num_values(), 1);
  b.constant.assign(g.num_values(), 0);
  for (ValueId v : g.inputs) b.counted[v] = 0;
  // Host values and the runtime's cached uploads are not device activations.
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (plan.placement.on_host(v) || plan.placement.is_upload(v)) b.counted[v] = 0;
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (layout[v].constant) {
      b.counted[v] = 0;
      b.constant[v] = 1;
    }
  if (tg)
    for (ValueId v : tg->grad_of_outputs)
      if (v != kNoValue) b.counted[v] = 0;
  b.bytes.resize(g.num_values());
  for (const Node& n : g.nodes)  // (values no node produces any more are dead: never held)
    for (ValueId v : n.outputs)
      if (v != kNoValue && b.base[v] == v && b.counted[v] && !value_bytes(g, v, &b.bytes[v]))
        b.unknown.push_back(g.value(v).name);
  return b;
}

// Live bytes as slots are set and dropped: a running sum over buffer reference counts.
class LiveSet {
 public:
  explicit LiveSet(const Buffers& b) : b_(b), refs_(b.base.size(), 0) {}
  void hold(ValueId v) {
    if (b_.counts(v) && refs_[b_.of(v)]++ == 0) live_ = live_ + b_.bytes[b_.of(v)];
  }
  void drop(ValueId v) {
    if (b_.counts(v) && refs_[b_.of(v)] > 0 && --refs_[b_.of(v)] == 0)
      live_ = live_ - b_.bytes[b_.of(v)];
  }
  // One step: outputs set, sampled, free_after dropped. Returns the sample.
  SymExpr run(const Graph& g, const Step& s) {
    for (ValueId v : g.nodes[s.node].outputs) hold(v);
    SymExpr sample = live_;
    for (ValueId v : s.free_after) drop(v);
    return sample;
  }

 private:
  const Buffers& b_;
  std::vector<int> refs_;
  SymExpr live_;
};

// Bytes of the distinct counted buffers of `values` not already in `seen` (then added to it).
SymExpr unique_bytes(const Buffers& b, const std::vector<ValueId>& values, std::set<ValueId>* seen) {
  SymExpr total;
  for (ValueId v : values)
    if (b.counts(v) && seen->insert(b.of(v)).second) total = total + b.bytes[b.of(v)];
  return total;
}

}  // namespace

namespace {

MemoryTimeline timeline_of(const Graph& g, const Plan& plan, const TrainingGraph* tg) {
  const Buffers b = buffers_of(g, plan, tg);
  MemoryTimeline t;
  t.unknown = b.unknown;
  for (const auto& [v, data] : g.initializers)
    t.constants = t.constants + SymExpr::constant(static_cast<int64_t>(data.raw.size()));
  for (const Node& n : g.nodes)  // Constant nodes: evaluated once by the engine
    for (ValueId v : n.outputs)
      if (v != kNoValue && b.constant[v] && b.base[v] == v) {
        SymExpr e;
        if (value_bytes(g, v, &e)) t.constants = t.constants + e;
        else t.unknown.push_back(g.value(v).name);
      }

  LiveSet forward(b);
  for (const Step& s : plan.forward) t.forward_live.push_back(forward.run(g, s));
  // A graph output also saved is counted with the saved set (the runtime measures it so).
  std::set<ValueId> seen;
  t.saved = unique_bytes(b, plan.saved, &seen);
  t.outputs = unique_bytes(b, g.outputs, &seen);

  LiveSet backward(b);  // the RunContext's saved values (incoming gradients are not counted)
  for (ValueId v : plan.saved) backward.hold(v);
  for (const Step& s : plan.backward) t.backward_live.push_back(backward.run(g, s));
  return t;
}

}  // namespace

MemoryTimeline memory_timeline(const Graph& g, const Plan& plan, const TrainingGraph* tg) {
  try {
    return timeline_of(g, plan, tg);
  } catch (const std::overflow_error& e) {  // a sum of byte formulas: SymExpr checks it
    throw VerifyError(std::string("memory estimate: the live bytes overflow int64 (") + e.what() +
                      "); the graph's value sizes are too large");
  }
}

namespace {
// Index and value of the largest evaluation; false when one fails.
bool peak_of(const std::vector<SymExpr>& live, const std::map<std::string, int64_t>& env,
             int64_t* value, int64_t* step) {
  bool ok = true;
  for (size_t s = 0; s < live.size(); ++s) {
    const std::optional<int64_t> v = live[s].evaluate(env);
    if (!v) { ok = false; continue; }
    if (*step < 0 || *v > *value) { *value = *v; *step = static_cast<int64_t>(s); }
  }
  return ok;
}
}  // namespace

PeakEstimate evaluate_peak(const MemoryTimeline& t, const std::map<std::string, int64_t>& env,
                           const std::map<std::string, std::string>& names) {
  PeakEstimate p;
  p.complete = t.unknown.empty();
  auto eval = [&](const SymExpr& e) {
    const std::optional<int64_t> v = e.evaluate(env);
    if (!v) p.complete = false;
    return v.value_or(0);
  };
  p.saved = eval(t.saved);
  p.outputs = eval(t.outputs);
  p.constants = eval(t.constants);
  p.complete &= peak_of(t.forward_live, env, &p.forward_peak, &p.forward_peak_step);
  p.complete &= peak_of(t.backward_live, env, &p.backward_peak, &p.backward_peak_step);
  // Backward holds at least the saved set when it starts (before its first step).
  if (p.backward_peak_step < 0) p.backward_peak = p.saved;
  // The caller holds the outputs through backward; outputs also saved are in backward_peak.
  // Evaluation under run-time sizes: SymExpr::evaluate throws std::overflow_error naming the
  // formula and bindings rather than wrap; this sum is checked the same way.
  p.peak = std::max(p.forward_peak, checked_add(p.outputs, p.backward_peak, "peak memory estimate"));
  if (p.forward_peak_step >= 0)
    p.forward_formula = format_bytes_formula(t.forward_live[p.forward_peak_step], names);
  p.backward_formula = format_bytes_formula(
      p.backward_peak_step >= 0 ? t.backward_live[p.backward_peak_step] : t.saved, names);
  p.saved_formula = format_bytes_formula(t.saved, names);
  return p;
}

namespace {
// The symbol a dim names when it is a plain symbol ("s0", "batch"), else "".
std::string plain_symbol(const Dim& d) {
  if (!d.is_symbolic()) return {};
  const SymExpr e = SymExpr::parse(d.symbol);
  if (e.terms.size() != 1 || e.terms.begin()->second != 1 || e.terms.begin()->first.size() != 1)
    return {};
  return e.terms.begin()->first[0];
}
bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
}  // namespace

std::map<std::string, int64_t> binding_of(const Graph& g,
                                          const std::vector<std::vector<int64_t>>& sizes) {
  std::map<std::string, int64_t> env;
  for (size_t i = 0; i < g.inputs.size() && i < sizes.size(); ++i) {
    const Shape& s = g.value(g.inputs[i]).shape;
    if (!s.rank_known) continue;
    for (size_t k = 0; k < s.dims.size() && k < sizes[i].size(); ++k)
      if (std::string sym = plain_symbol(s.dims[k]); !sym.empty()) env.emplace(sym, sizes[i][k]);
  }
  // How many rows a step selects (OpTraits::selects_rows: the labels that count, the positions
  // that do) is data. Bound to its most, every element of what the rows are selected from, so
  // that a prediction made before the step never counts less than the step holds.
  for (const Node& n : g.nodes) {
    if (!op_traits(n).selects_rows || n.inputs.empty() || n.outputs.empty() || n.outputs[0] == kNoValue) continue;
    const Shape& rows = g.value(n.outputs[0]).shape;
    const std::string sym = rows.rank_known && rows.rank() == 1 ? plain_symbol(rows.dims[0]) : std::string();
    const DType from = g.value(n.inputs[0]).dtype;
    SymExpr bytes;
    if (sym.empty() || env.count(sym) || dtype_size(from) <= 0 || !value_bytes(g, n.inputs[0], &bytes)) continue;
    if (const auto b = bytes.evaluate(env)) env.emplace(sym, *b / dtype_size(from));
  }
  return env;
}

std::map<std::string, std::string> symbol_names(const Graph& g) {
  std::map<std::string, std::string> names;
  for (ValueId v : g.inputs) {
    const Value& val = g.value(v);
    if (!val.shape.rank_known) continue;
    std::string base = val.name;
    for (char& c : base)
      if (!ident_char(c)) c = '_';
    for (size_t k = 0; k < val.shape.dims.size(); ++k)
      if (std::string sym = plain_symbol(val.shape.dims[k]); !sym.empty())
        names.emplace(sym, base + "_dim" + std::to_string(k));
  }
  return names;
}

namespace {
// Renames the identifiers inside one atom ("s0", or an opaque "(s0-1)//2").
std::string rename_atom(const std::string& atom, const std::map<std::string, std::string>& names) {
  if (auto it = names.find(atom); it != names.end()) return it->second;
  std::string out;
  for (size_t i = 0; i < atom.size();) {
    const bool starts = std::isalpha(static_cast<unsigned char>(atom[i])) || atom[i] == '_';
    if (!starts) { out.push_back(atom[i++]); continue; }
    size_t j = i;
    while (j < atom.size() && (ident_char(atom[j]) || atom[j] == '.')) ++j;
    const std::string word = atom.substr(i, j - i);
    auto it = names.find(word);
    out += it == names.end() ? word : it->second;
    i = j;
  }
  return out;
}
}  // namespace

std::string format_bytes_formula(const SymExpr& e, const std::map<std::string, std::string>& names) {
  SymExpr renamed;
  for (const auto& [factors, c] : e.terms) {
    SymExpr term = SymExpr::constant(c);
    for (const std::string& f : factors) term = term * SymExpr::symbol(rename_atom(f, names));
    renamed = renamed + term;
  }
  // Terms joined by " + " / " - " (to_string has no spaces), the constant last.
  std::string out;
  auto emit = [&](const std::vector<std::string>& factors, int64_t c) {
    SymExpr one;
    one.terms[factors] = c < 0 ? -c : c;
    out += out.empty() ? (c < 0 ? "-" : "") : (c < 0 ? " - " : " + ");
    out += one.to_string();
  };
  for (const auto& [factors, c] : renamed.terms)
    if (!factors.empty()) emit(factors, c);
  if (const int64_t c = renamed.constant_value(); c != 0 || out.empty()) emit({}, c);
  return out;
}

}  // namespace torch_ort
