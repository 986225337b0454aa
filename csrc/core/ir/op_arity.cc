// The arity table (op_arity.h): one line per op. ONNX rows are generated from the operator schemas
// (onnx.defs: min_input, max_input, min_output, max_output), one form per opset where they
// changed; ours follow the code that builds each node (csrc/core/autodiff, csrc/core/passes, the
// translations in torch_ort/ortmodule) and the kernel that reads it (csrc/runtime/kernels).
#include "csrc/core/ir/op_arity.h"

#include <algorithm>
#include <initializer_list>
#include <map>
#include <stdexcept>

namespace torch_ort {
namespace {

constexpr int V = kVariadic;

// One form of an op, in force from opset `since` on (OpArity's fields).
struct Form {
  int64_t since;
  int min_in, max_in, min_out, max_out;
  uint32_t optional_in = 0, optional_out = 0;
};

constexpr uint32_t slots(std::initializer_list<int> ids) {
  uint32_t bits = 0;
  for (int i : ids) bits |= uint32_t{1} << i;
  return bits;
}

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

// Ours, domain com.torch_ort (one version): {1, min in, max in, min out, max out, optional
// required inputs, optional required outputs}. [X]: may be omitted; a gradient op with several
// outputs keeps a slot (kNoValue) for each gradient that is not needed.
const std::vector<Entry>& our_table() {
  static const std::vector<Entry> table = {
      // ATen fallback and PythonOp (aten_op.h): any arguments, any results. ATenOpGrad reads
      // (dY_k.., Y_k.., leaf_i..), each may be absent, and yields one gradient per needed input.
      {"ATenOp", {{1, 0, V, 0, V}}},
      {"PythonOp", {{1, 0, V, 0, V}}},
      {"ATenOpGrad", {{1, 0, V, 1, V}}},
      // Fused ops (csrc/core/passes) and their gradients (csrc/core/ops/attention.cc, fused.cc).
      {"Attention", {{1, 3, 4, 2, 3}}},     // (Q, K, V, [mask]) -> (Y, LogSumExp, [Backend])
      // ([dY], Q, K, V, Y, LogSumExp, [mask], [dLogSumExp], [Backend]) -> ([dQ], [dK], [dV])
      {"AttentionGrad", {{1, 6, 9, 3, 3, slots({0}), slots({0, 1, 2})}}},
      {"BiasDropout", {{1, 1, 5, 1, 2}}},   // (X, [Bias], [Residual], [ratio], [training]) -> (Y, [Mask])
      {"BiasGelu", {{1, 1, 2, 1, 1}}},      // (X, [b])
      {"BiasGeluGrad", {{1, 2, 3, 1, 1}}},  // (dY, X, [b])
      {"FusedElementwise", {{1, 1, V, 1, 1}}},                     // (X_i...)
      {"FusedElementwiseGrad", {{1, 2, V, 1, V, 0, slots({0})}}},  // (dY, X_i...) -> ([dX_i]...)
      {"FusedMatMul", {{1, 2, 3, 1, 1}}},                          // (A, B, [bias])
      {"SkipLayerNorm", {{1, 3, 5, 4, 4}}},  // (X, Skip, Gamma, [Beta], [Bias]) -> (Y, Mean, InvStdDev, Sum)
      // (dY, [dSum], Sum, Gamma, Mean, InvStdDev) -> ([dX], [dGamma], [dBeta], [dBias])
      {"SkipLayerNormGrad", {{1, 6, 6, 4, 4, slots({1}), slots({0, 1, 2, 3})}}},
      // Our translations (torch_ort/ortmodule/translations).
      // (X, [scale], [B], [mean], [var]) -> (Y, [mean], [var], [saved mean], [saved inv-std])
      {"BatchNormTraining", {{1, 1, 5, 1, 5}}},
      {"CrossEntropyLoss", {{1, 2, 3, 1, 2}}},  // (scores, labels, [weights]) -> (loss, [log_prob])
      {"Embedding", {{1, 2, 2, 1, 1}}},         // (weight, indices)
      // Gradient ops (their gradient rules in csrc/core/ops/<family>.cc).
      {"AveragePoolGrad", {{1, 2, 2, 1, 1}}},  // (dY, shape(X))
      // (dY, X, [scale], [mean], [var | inv-std]) -> ([dX], [dScale], [dB])
      {"BatchNormalizationGrad", {{1, 2, 5, 3, 3, 0, slots({0, 1, 2})}}},
      {"ConcatGrad", {{1, 2, V, 1, V, 0, slots({0})}}},                // (dY, shape(X_i)...) -> ([dX_i]...)
      {"ConvGrad", {{1, 3, 3, 3, 3, 0, slots({0, 1, 2})}}},            // (dY, X, W) -> ([dX], [dW], [dB])
      {"ConvTransposeGrad", {{1, 3, 3, 3, 3, 0, slots({0, 1, 2})}}},
      {"CrossEntropyLossGrad", {{1, 3, 4, 1, 1}}},         // (dLoss, log_prob, labels, [weights])
      {"DropoutGrad", {{1, 2, 4, 1, 1}}},                  // (dY, mask, [ratio], [training])
      {"EmbeddingGrad", {{1, 3, 3, 1, 1}}},                // (dY, indices, shape(W))
      {"ErfGrad", {{1, 2, 2, 1, 1}}},                      // (dY, X)
      {"GatherElementsGrad", {{1, 3, 3, 1, 1}}},           // (dY, shape(X), indices)
      {"GatherGrad", {{1, 3, 3, 1, 1}}},
      {"GatherNDGrad", {{1, 3, 3, 1, 1}}},
      {"GeluGrad", {{1, 2, 2, 1, 1}}},                     // (dY, X)
      {"GlobalMaxPoolGrad", {{1, 3, 3, 1, 1}}},            // (dY, X, Y)
      {"LayerNormalizationGrad", {{1, 5, 5, 1, 1}}},       // (dY, X, Scale, Mean, InvStdDev)
      {"LayerNormalizationScaleGrad", {{1, 5, 5, 1, 1}}},
      {"LogSoftmaxGrad", {{1, 2, 2, 1, 1}}},               // (dY, Y)
      {"MaxPoolGrad", {{1, 3, 3, 1, 1}}},                  // (dY, Indices, shape(X))
      {"MinMaxGrad", {{1, 3, V, 1, V, 0, slots({0})}}},    // (dY, Y, X_i...) -> ([dX_i]...)
      {"NegativeLogLikelihoodLossGrad", {{1, 3, 4, 1, 1}}},  // (dLoss, input, labels, [weights])
      {"ReduceMeanGrad", {{1, 2, 3, 1, 1}}},               // (dY, shape(X), [axes])
      {"ReduceSumGrad", {{1, 2, 3, 1, 1}}},
      {"ReluGrad", {{1, 2, 2, 1, 1}}},                     // (dY, Y)
      {"SigmoidGrad", {{1, 2, 2, 1, 1}}},
      {"SliceGrad", {{1, 2, 6, 1, 1}}},                    // (dY, shape(X), [starts], [ends], [axes], [steps])
      {"SoftmaxCrossEntropyLossGrad", {{1, 3, 4, 1, 1}}},  // (dLoss, log_prob, labels, [weights])
      {"SoftmaxGrad", {{1, 2, 2, 1, 1}}},
      {"SplitGrad", {{1, 3, V, 1, 1, slots({1, 2})}}},     // (shape(X), [split], [dY_0], [dY_i]...)
      {"SumToShape", {{1, 2, 2, 1, 1}}},                   // (dY, shape)
      {"TanhGrad", {{1, 2, 2, 1, 1}}},
      {"TileGrad", {{1, 2, 2, 1, 1}}},                     // (dY, shape(X))
      // Placement's crossings (csrc/core/planner/placement.h).
      {"ToDevice", {{1, 1, 1, 1, 1}}},
      {"ToHost", {{1, 1, 1, 1, 1}}},
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
    for (const Entry& e : our_table()) add(std::string(kOurDomain) + "::" + e.op, e);
    return m;
  }();
  return idx;
}

std::string domain_key(std::string_view domain) {
  return std::string(domain == "ai.onnx" ? std::string_view() : domain);
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
  auto it = index().find(domain_key(domain) + "::" + std::string(op_type));
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
  const std::string domain = domain_key(n.domain);
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
  return out;
}

}  // namespace torch_ort
