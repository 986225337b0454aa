// Output dtype rules per op family; shapes stay as the exporter gave them (symbolic dims).
#include "csrc/core/ir/type_inference.h"

#include <string>
#include <vector>

#include "csrc/core/ir/errors.h"
#include "csrc/core/ir/op_traits.h"

namespace torch_ort {
namespace {

DType constant_dtype(const Node& n) {
  if (const TensorData* t = n.attrs.get_tensor("value")) return t->dtype;
  if (n.attrs.has("value_float") || n.attrs.has("value_floats")) return DType::kFloat;
  if (n.attrs.has("value_int") || n.attrs.has("value_ints")) return DType::kInt64;
  return DType::kUndefined;
}

DType output_dtype(const Graph& g, const Node& n, size_t out_index) {
  if (!n.domain.empty()) return DType::kUndefined;  // ours are typed when built
  const std::string& op = n.op_type;
  if (op == "Constant") return constant_dtype(n);
  if (op == "Cast") return static_cast<DType>(n.attrs.get_int("to", 0));
  if (op == "CastLike" && n.inputs.size() > 1 && n.inputs[1] != kNoValue) return g.value(n.inputs[1]).dtype;
  if (op == "ConstantOfShape") {
    const TensorData* t = n.attrs.get_tensor("value");
    return t ? t->dtype : DType::kFloat;
  }
  // Comparisons and logic give bool, Shape/ArgMax/... int64, Dropout's mask bool, MaxPool's
  // Indices int64: the op's output_dtypes trait (csrc/core/ops/).
  const std::vector<DType>& fixed = op_traits(n).output_dtypes;
  if (out_index < fixed.size() && fixed[out_index] != DType::kUndefined) return fixed[out_index];
  if (op == "Where" && n.inputs.size() > 1 && n.inputs[1] != kNoValue) return g.value(n.inputs[1]).dtype;
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
