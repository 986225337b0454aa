// The torch-free evaluator of ONNX ops on concrete data: what an op means on values, written once.
// Constant folding (passes/constant_folding.cc) folds with it, adding its own policy (what may be
// folded, size bounds, rounding to the dtype); the C++ tests' oracle (tests/cpp/reference_eval.h)
// delegates the ops listed here to it. Simple loops, no speed goals: it runs on small constants
// and on test-sized tensors.
//
// Ops (default domain): Identity, Shape, Cast, CastLike, Sqrt, Add, Sub, Mul, Div, Concat,
// Squeeze, Unsqueeze, Reshape, Expand, Gather, Slice.
// Integers are exact: integer arithmetic that overflows its dtype (int64, int32), integer division
// by zero, and a float -> int Cast of a non-finite or out-of-range value throw. Floating results
// are computed in double and NOT rounded to their dtype (round_to_dtype does that).
#pragma once

#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "csrc/core/eval/tensor.h"
#include "csrc/core/ir/graph.h"

namespace torch_ort::eval {

// Every failure: a bad input, an unsupported op, a result over Options::max_elements.
struct EvalError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  // Largest result an op may build; a larger one throws before it is allocated.
  int64_t max_elements = std::numeric_limits<int64_t>::max();
};

using Ins = std::vector<const Tensor*>;  // nullptr for an omitted optional input

bool has_op(const std::string& domain, const std::string& op_type);
// Runs one node on its inputs; one tensor per output. Throws EvalError.
std::vector<Tensor> eval_node(const Node& n, const Ins& in, const Options& opts = {});

// [begin, end) of the dims a Shape node with these attributes returns for a rank-`rank` input.
std::pair<int64_t, int64_t> shape_range(const Attributes& attrs, int64_t rank);

// The positions Slice picks along each axis of `shape` (all of an axis it does not slice), from
// its (starts, ends, axes, steps); empty axes / steps mean 0.. / 1s. Throws EvalError.
std::vector<Dims> slice_picks(const Node& n, const Dims& shape, const Dims& starts, const Dims& ends,
                              Dims axes, Dims steps);

}  // namespace torch_ort::eval
