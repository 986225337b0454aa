// Expressions over constants and shapes: what a graph value is, computed by the evaluator from
// initializers, Constant nodes and the dims Shape nodes read, for passes that must know a scalar
// the graph computes (an attention scale, a dropout ratio) however the exporter wrote it.
#pragma once

#include <optional>
#include <vector>

#include "csrc/core/ir/graph.h"

namespace torch_ort::eval {

// coef · D^power, D the last dim of the values in dim_of, unknown when the graph was built: SDPA's
// default scale 1/√D read from Shape(Q)[-1] with a dynamic head size.
struct Monomial {
  double coef = 1.0, power = 0.0;
  std::vector<ValueId> dim_of;
};

// v, one element computed from constants and shapes only, as a monomial; nullopt otherwise.
// Every unknown dim a Shape node reads gets a size of its own (one per symbol); v may depend on
// one of them only, the last dim of the values in dim_of, as a power that is a multiple of 1/4,
// checked on sizes where no rounding hides another function. A constant may be infinite (a mask's
// fill); a monomial of a dim is finite and positive.
std::optional<Monomial> monomial(const Graph& g, const GraphIndex& idx, ValueId v);

// v as a constant scalar (a monomial that read no unknown dim), or nullopt.
std::optional<double> scalar(const Graph& g, const GraphIndex& idx, ValueId v);

}  // namespace torch_ort::eval
