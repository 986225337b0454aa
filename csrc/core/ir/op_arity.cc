// The arity table (op_arity.h). ONNX rows are generated from the operator schemas (onnx.defs:
// min_input, max_input, min_output, max_output), one form per opset where they changed. Ours are
// the `arity` of each op's traits line (csrc/core/ops/<family>.cc), which follows the code that
// builds the node (the gradient rules, csrc/core/passes, the translations in
// torch_ort/ortmodule) and the kernel that reads it (csrc/runtime/kernels).
#include "csrc/core/ir/op_arity.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "csrc/core/ir/op_traits.h"

namespace torch_ort {
namespace {

constexpr int V = kVariadic;

// One form of an op, in force from opset `since` on (OpArity's fields).
struct Form {
  int64_t since;
  int min_in, max_in, min_out, max_out;
  uint32_t optional_in = 0, optional_out = 0;
};

struct Entry {
  const char* op;
  std::vector<Form> forms;  // ascending `since`
};

// ONNX, domain "" (ai.onnx): {since, min in, max in, min out, max out}, one form from each opset
// where a schema's counts changed. Generated at build time from the installed onnx's schemas
// (scripts/gen_op_arity.py, called by scripts/build_protobuf.py), as the message classes are.
const std::vector<Entry>& onnx_table() {
  static const std::vector<Entry> table = {
#include "onnx_op_arity.inc"
  };
  return table;
}

using Index = std::map<std::string, const std::vector<Form>*, std::less<>>;

const Index& index() {
  static const Index idx = [] {
    Index m;
    auto add = [&](const std::string& key, const Entry& e) {
      if (!m.emplace(key, &e.forms).second) throw std::logic_error("op_arity.cc: two entries for " + key);
    };
    for (const Entry& e : onnx_table()) add(std::string("::") + e.op, e);
    return m;
  }();
  return idx;
}

std::string count(int n, const char* what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

// The problem with one side (inputs or outputs) of a node, "" when none.
std::string slots_problem(const std::vector<ValueId>& ids, int min, int max, uint32_t optional,
                          const char* what) {
  const int n = static_cast<int>(ids.size());
  if (n < min) return "needs at least " + count(min, what) + ", has " + std::to_string(n);
  if (n > max) {
    return max == 0 ? "takes no " + std::string(what) + "s, has " + std::to_string(n)
                    : "takes at most " + count(max, what) + ", has " + std::to_string(n);
  }
  for (int i = 0; i < min; ++i) {
    const bool may_be_absent = i < 32 && (optional >> i & 1u);
    if (ids[static_cast<size_t>(i)] == kNoValue && !may_be_absent)
      return std::string(what) + " " + std::to_string(i) + " is required";
  }
  return "";
}

}  // namespace

std::optional<OpArity> find_op_arity(std::string_view domain, std::string_view op_type, int64_t opset) {
  if (domain == kOurDomain) {  // one version: the arity of the op's traits line
    const OpTraits* t = find_op(domain, op_type);
    return t ? t->arity : std::nullopt;
  }
  auto it = index().find(std::string(domain) + "::" + std::string(op_type));
  if (it == index().end()) return std::nullopt;
  const std::vector<Form>& forms = *it->second;
  // The form in force at `opset` (the last one since at or before it; the first one when the op
  // is newer than the graph's opset), joined with every later form.
  size_t first = 0;
  for (size_t k = 0; k < forms.size(); ++k)
    if (forms[k].since <= opset) first = k;
  OpArity a{forms[first].min_in, forms[first].max_in, forms[first].min_out, forms[first].max_out,
            forms[first].optional_in, forms[first].optional_out};
  for (size_t k = first + 1; k < forms.size(); ++k) {
    a.min_inputs = std::min(a.min_inputs, forms[k].min_in);
    a.max_inputs = std::max(a.max_inputs, forms[k].max_in);
    a.min_outputs = std::min(a.min_outputs, forms[k].min_out);
    a.max_outputs = std::max(a.max_outputs, forms[k].max_out);
    a.optional_inputs |= forms[k].optional_in;
    a.optional_outputs |= forms[k].optional_out;
  }
  return a;
}

std::string arity_problem(const Graph& g, const Node& n) {
  const std::string& domain = n.domain;
  auto it = g.opset_imports.find(domain);
  // A graph that imports no version of the domain: the defaults ShapeCtx::opset assumes.
  const int64_t opset = it != g.opset_imports.end() ? it->second : domain.empty() ? 20 : 1;
  const std::optional<OpArity> a = find_op_arity(domain, n.op_type, opset);
  if (!a) return "";
  std::string why = slots_problem(n.inputs, a->min_inputs, a->max_inputs, a->optional_inputs, "input");
  if (why.empty())
    why = slots_problem(n.outputs, a->min_outputs, a->max_outputs, a->optional_outputs, "output");
  return why;
}

std::vector<std::string> arity_ops() {
  std::vector<std::string> out;
  for (const auto& [key, _] : index()) out.push_back(key);
  const std::string ours = std::string(kOurDomain) + "::";
  for (const std::string& key : op_traits_ops())
    if (key.rfind(ours, 0) == 0 && find_op(kOurDomain, key.substr(ours.size()))->arity) out.push_back(key);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace torch_ort
