#include "csrc/core/passes/rows.h"

#include <algorithm>

#include "csrc/core/ir/op_traits.h"
#include "csrc/core/ir/pattern.h"

namespace torch_ort {

bool elementwise_rows(const Node& n) {
  using namespace pattern;
  if (is_random(n)) return false;
  if (op_traits(n).fused != FusedInstr::kNone) return true;
  return is_onnx(n, "Cast") || is_onnx(n, "Identity") || is_onnx(n, "Where") ||
         is_ours(n, "FusedElementwise") || is_ours(n, "BiasGelu");
}

namespace {

// Negative axes over trailing dims only (B and T lead a rank-r value).
bool trailing_row_axes(const std::vector<int64_t>& axes, int64_t r) {
  return std::all_of(axes.begin(), axes.end(), [&](int64_t a) { return a < 0 && a >= -(r - 2); });
}

}  // namespace

std::optional<RowInputs> row_inputs(const Graph& g, const GraphIndex& idx, const Node& n,
                                    const std::function<bool(ValueId)>& is_rows) {
  using namespace pattern;
  if (n.outputs.empty() || !has_input(n, 0)) return std::nullopt;
  for (ValueId v : n.outputs)
    if (v != kNoValue && !is_rows(v)) return std::nullopt;
  const int64_t r = rank_of(g, n.outputs[0]);
  RowInputs in;
  if (is_onnx(n, "MatMul") || is_ours(n, "FusedMatMul")) {
    if (n.attrs.get_int("transA", 0) != 0 || !has_input(n, 1) || rank_of(g, n.inputs[1]) != 2 ||
        rank_of(g, n.inputs[0]) < 3)
      return std::nullopt;
    in = {{0}, {1}};
  } else if (is_onnx(n, "ReduceMean") || is_onnx(n, "ReduceSum") || is_onnx(n, "ReduceMax")) {
    if (!has_input(n, 1)) return std::nullopt;  // no axes: every dim
    const auto axes = constant_ints(g, idx, n.inputs[1]);
    if (!axes || axes->empty() || !trailing_row_axes(*axes, rank_of(g, n.inputs[0]))) return std::nullopt;
    in = {{0}, {1}};
  } else if (is_onnx(n, "Softmax") || is_onnx(n, "LayerNormalization")) {
    // Softmax before opset 13 defaults to axis 1 and flattens what follows: rows mixed.
    const auto opset = g.opset_imports.find("");
    if (is_onnx(n, "Softmax") && !n.attrs.has("axis") && (opset == g.opset_imports.end() || opset->second < 13))
      return std::nullopt;
    if (!trailing_row_axes({n.attrs.get_int("axis", -1)}, r)) return std::nullopt;
    in.rows = {0};
  } else if (elementwise_rows(n)) {
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k] != kNoValue && rank_of(g, n.inputs[k]) == r && is_rows(n.inputs[k]))
        in.rows.push_back(static_cast<int>(k));
  } else {
    return std::nullopt;
  }
  for (int k : in.rows)
    if (!has_input(n, k) || !is_rows(n.inputs[k])) return std::nullopt;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const int ki = static_cast<int>(k);
    if (n.inputs[k] == kNoValue || std::count(in.rows.begin(), in.rows.end(), ki) ||
        std::count(in.whole.begin(), in.whole.end(), ki))
      continue;
    const int64_t rank = rank_of(g, n.inputs[k]);
    if (rank < 0 || rank > r - 2) return std::nullopt;  // not read whole by each row
  }
  return in;
}

}  // namespace torch_ort
