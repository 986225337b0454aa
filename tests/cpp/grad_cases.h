// The vocabulary of numeric gradient-check cases, shared by test_gradients.cc and the per-family
// case files (test_gradients_<family>.cc), which add their cases with REGISTER_GRAD_CASES.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "csrc/core/ir/graph.h"
#include "tests/cpp/reference_eval.h"

namespace torch_ort::gradcheck {

using ref::Tensor;
using Dims = std::vector<int64_t>;
using I = int64_t;  // int attributes in the tables: {"axis", I{1}}

inline constexpr double kEps = 1e-6, kRtol = 1e-5, kAtol = 1e-7;

enum class Kind { kGrad, kNoGrad, kPositive, kPositiveNoGrad, kBool, kLabels, kConstInts, kConstScalar, kOmitted };
struct In {
  Kind kind;
  Dims shape;                  // graph inputs; ignored for constants
  std::vector<int64_t> ints;   // label values (kLabels) or the constant (kConstInts)
  double scalar = 0;           // kConstScalar value (a double initializer)
};
inline In G(Dims s) { return {Kind::kGrad, std::move(s), {}}; }            // random, requires grad
inline In N(Dims s) { return {Kind::kNoGrad, std::move(s), {}}; }          // random, no grad
inline In P(Dims s) { return {Kind::kPositive, std::move(s), {}}; }        // in [0.5, 2], requires grad
inline In W(Dims s) { return {Kind::kPositiveNoGrad, std::move(s), {}}; }  // in [0.5, 2], no grad (loss weights)
inline In B(Dims s) { return {Kind::kBool, std::move(s), {}}; }
inline In L(Dims s, std::vector<int64_t> v) { return {Kind::kLabels, std::move(s), std::move(v)}; }
inline In K(std::vector<int64_t> v) { return {Kind::kConstInts, {}, std::move(v)}; }
inline In S(double v) { return {Kind::kConstScalar, {}, {}, v}; }
inline In Omit() { return {Kind::kOmitted, {}, {}}; }
inline bool wants_grad(Kind k) { return k == Kind::kGrad || k == Kind::kPositive; }

using Builder = std::function<std::vector<ValueId>(Graph&, const std::vector<ValueId>&)>;
struct Case {
  std::string name;      // gtest-safe: letters, digits, '_'
  std::string op;        // the op whose rule this covers (for the registry coverage test)
  std::vector<In> ins;
  Attributes attrs = {};
  int num_outputs = 1;
  Builder build = nullptr;  // a small graph instead of one `op` node
};
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

inline Attributes A(std::initializer_list<std::pair<const char*, Attribute>> kv) {
  Attributes a;
  for (const auto& [k, v] : kv) a.set(k, v);
  return a;
}
inline std::vector<ValueId> add_node(Graph& g, const std::string& op, std::vector<ValueId> ins, Attributes attrs = {},
                              int num_outputs = 1) {
  std::vector<ValueId> outs;
  for (int i = 0; i < num_outputs; ++i) outs.push_back(g.new_value(op + "_out", DType::kUndefined, Shape::unknown()));
  g.nodes.push_back(Node{"", op, g.unique_node_name("/" + op), std::move(ins), outs, std::move(attrs)});
  return outs;
}
inline ValueId add1(Graph& g, const std::string& op, std::vector<ValueId> ins, Attributes attrs = {}) {
  return add_node(g, op, std::move(ins), std::move(attrs))[0];
}
inline const std::string kMean = "mean", kSum = "sum", kNone = "none";
inline constexpr int64_t kF = int64_t(DType::kFloat), kD = int64_t(DType::kDouble);


// Cases added from other files; test_gradients.cc runs them with its own table.
std::vector<Case>& registered_cases();
inline bool register_cases(std::vector<Case> cs) {
  for (auto& c : cs) registered_cases().push_back(std::move(c));
  return true;
}
#define GRADCHECK_CONCAT_INNER(a, b) a##b
#define GRADCHECK_CONCAT(a, b) GRADCHECK_CONCAT_INNER(a, b)
#define REGISTER_GRAD_CASES(...) \
  static const bool GRADCHECK_CONCAT(kGradCases_, __COUNTER__) = ::torch_ort::gradcheck::register_cases(__VA_ARGS__)

}  // namespace torch_ort::gradcheck
