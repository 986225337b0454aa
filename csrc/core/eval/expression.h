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

// v, one element computed from constants and shapes only, as a monomial; nullopt otherwise. It is
// evaluated three times, each unknown dim a Shape node reads given a trial size (one for the last
// dims, another for the rest); a value that depends on an unknown dim that is not last, or that
// is no power (a multiple of 1/4) of the last one, fails the fit.
std::optional<Monomial> monomial(const Graph& g, const GraphIndex& idx, ValueId v);

// v as a constant scalar (a monomial that read no unknown dim), or nullopt.
std::optional<double> scalar(const Graph& g, const GraphIndex& idx, ValueId v);

}  // namespace torch_ort::eval
