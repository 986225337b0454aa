// Output dtype rules per op family; shapes stay as the exporter gave them (symbolic dims).
#include "csrc/core/ir/type_inference.h"

#include <vector>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/op_traits.h"

namespace torch_ort {
namespace {

DType output_dtype(const Graph& g, const Node& n, size_t out_index) {
  if (!n.domain.empty()) return DType::kUndefined;  // ours are typed when built
  const OpTraits& traits = op_traits(n);
  // Cast's `to`, a Constant's value, Where's data: the op's own rule (csrc/core/ops/).
  if (traits.output_dtype_of) {
    const DType t = traits.output_dtype_of(g, n, out_index);
    if (t != DType::kUndefined) return t;
  }
  // Comparisons and logic give bool, Shape/ArgMax/... int64, Dropout's mask bool, MaxPool's
  // Indices int64: the op's output_dtypes trait.
  const std::vector<DType>& fixed = traits.output_dtypes;
  if (out_index < fixed.size() && fixed[out_index] != DType::kUndefined) return fixed[out_index];
  // Everything else computes in the type of its first (data) input.
  for (ValueId in : n.inputs)
    if (in != kNoValue) return g.value(in).dtype;
  return DType::kUndefined;
}

}  // namespace

void infer_missing_dtypes(Graph& g) {
  for (const Node& n : g.nodes) {
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      ValueId o = n.outputs[k];
      if (o == kNoValue || g.value(o).dtype != DType::kUndefined) continue;
      const DType t = output_dtype(g, n, k);
      if (t == DType::kUndefined)
        throw VerifyError("cannot infer the dtype of '" + g.value(o).name + "' (output " +
                          std::to_string(k) + " of " + n.describe() + ")");
      g.value(o).dtype = t;
    }
  }
}

}  // namespace torch_ort
