// Reference evaluator (test oracle): runs an IR graph node by node in double precision, torch-free.
// Covers the forward ops of MLP models and every op our gradient rules emit; slow and simple on
// purpose. It computes on the core evaluator's tensor (csrc/core/eval/tensor.h): integers exact in
// `ints`, floating types in double in `reals`, NOT rounded to their dtype (float and double compute
// alike). The ops of the core evaluator (csrc/core/eval/eval.h: shape arithmetic, Cast,
// Add/Sub/Mul/Div, Gather, Slice, ...) are not written here: eval_node hands them to it, which
// constant folding uses too, so their meaning is written once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <limits>
#include <map>
#include <vector>

#include "csrc/core/eval/tensor.h"
#include "csrc/core/ir/graph.h"

namespace torch_ort::ref {

using Tensor = eval::Tensor;
using Dims = eval::Dims;
using Ins = std::vector<const Tensor*>;  // nullptr for an omitted optional input
using Outs = std::vector<Tensor>;

// Zeros of any dtype (in `ints` or `reals` as the dtype says), and a 1-D int64 tensor.
Tensor zeros(DType dtype, Dims shape);
Tensor ints(const Dims& v);
// Element i read / written as a double, for loops that serve every dtype; written to an integral
// dtype it is truncated (bool: v != 0) and saturates at the int64 range. Bounds-checked: eval_node
// reports an index out of range as an error of the node.
double get(const Tensor& t, int64_t i);
void set(Tensor& t, int64_t i, double v);
// t[i] = f(t[i]) for every element.
void apply(Tensor& t, const std::function<double(double)>& f);

// Shared by every op file of the oracle: an error naming the op and node, and a product of dims.
[[noreturn]] void fail(const Node& n, const std::string& why);
int64_t prod(const Dims& s, size_t begin = 0, size_t end = SIZE_MAX);
// Row-major multi-index <-> linear offset within shape s.
Dims unravel(int64_t lin, const Dims& s);
int64_t ravel(const Dims& idx, const Dims& s);
// The elements of a shape, index or axes input; fails naming the node unless it is integral.
const Dims& ints_of(const Node& n, const Tensor& t);
// Numpy broadcasting: the offset in a tensor of shape `in` of element `lin` of one of shape
// `out`; the shape of xs broadcast together (fails naming the node); and
// out[i] = f(the inputs at i), in `dtype`.
int64_t bcast_offset(int64_t lin, const Dims& out, const Dims& in);
Dims bcast_shape(const Node& n, const Dims& a, const Dims& b);
Tensor nary(const Node& n, const Ins& xs, DType dtype, const std::function<double(const double*)>& f);

// Runs one node on its inputs (nullptr for an omitted optional input). Returns one tensor per
// output the op defines (callers drop those the node omits). Throws std::runtime_error naming the
// op and node for unknown ops or bad inputs.
Outs eval_node(const Node& n, const Ins& in);

// Ops added from other files (one file per op family), looked up after the built-in tables:
//   static const bool kReg = ref::register_op("", "Gelu", [](const Node& n, const Ins& in) {...});
using OpFn = std::function<Outs(const Node&, const Ins&)>;
bool register_op(const std::string& domain, const std::string& op, OpFn fn);

// Evaluates g.nodes[0, max_nodes) in order. `feeds` binds graph inputs (or any other value, e.g.
// gradient inputs of a training graph); initializers are read from g. Returns every value known
// at the end: feeds, initializers and all node outputs.
std::map<ValueId, Tensor> evaluate(const Graph& g, const std::map<ValueId, Tensor>& feeds,
                                   size_t max_nodes = std::numeric_limits<size_t>::max());

}  // namespace torch_ort::ref
