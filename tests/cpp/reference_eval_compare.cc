// Reference evaluator: comparisons and logic, variadic Max/Min and their gradient op,
// Trilu and Range, in double with numpy broadcasting.
#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>

#include "tests/cpp/reference_eval.h"

namespace torch_ort::ref {
namespace {

#define X(i) (*in.at(i))
OpFn binary(DType dt, double (*f)(double, double)) {
  return [dt, f](const Node& n, const Ins& in) -> Outs {
    return {nary(n, {in.at(0), in.at(1)}, dt, [f](const double* v) { return f(v[0], v[1]); })};
  };
}

const bool kRegistered = [] {
  const auto reg = [](const char* op, OpFn f) { register_op("", op, std::move(f)); };
  const auto ours = [](const char* op, OpFn f) { register_op(kOurDomain, op, std::move(f)); };
  reg("Trilu", [](const Node& n, const Ins& in) -> Outs {
    const int64_t k = in.size() > 1 && in[1] ? ints_of(n, *in[1]).at(0) : 0, r = X(0).shape.size();
    const bool upper = n.attrs.get_int("upper", 1) != 0;
    Tensor y = X(0);
    for (int64_t i = 0; i < y.numel(); ++i) {
      Dims idx = unravel(i, y.shape);
      const int64_t off = idx[r - 1] - idx[r - 2];  // column - row
      if (upper ? off < k : off > k) set(y, i, 0);
    }
    return {y};
  });
  reg("Range", [](const Node&, const Ins& in) -> Outs {
    const double s = get(X(0), 0), l = get(X(1), 0), d = get(X(2), 0);
    Tensor r = zeros(X(0).dtype, {std::max<int64_t>(int64_t(std::ceil((l - s) / d)), 0)});
    for (int64_t i = 0; i < r.numel(); ++i) set(r, i, s + i * d);
    return {r};
  });
  for (const bool is_max : {true, false})
    reg(is_max ? "Max" : "Min", [is_max](const Node& n, const Ins& in) -> Outs {
      return {nary(n, in, X(0).dtype, [is_max, k = in.size()](const double* v) {
        return is_max ? *std::max_element(v, v + k) : *std::min_element(v, v + k); })};
    });
  ours("MinMaxGrad", [](const Node& n, const Ins& in) -> Outs {  // (dY, Y, X_0, ...) -> dX_i
    const Tensor &dy = X(0), &y = X(1);
    Outs r;
    for (size_t i = 2; i < in.size(); ++i) r.push_back(zeros(dy.dtype, X(i).shape));
    for (int64_t j = 0; j < y.numel(); ++j) {
      auto at = [&](size_t i) { return bcast_offset(j, y.shape, X(i).shape); };
      int64_t ties = 0;
      for (size_t i = 2; i < in.size(); ++i) ties += X(i).reals[at(i)] == y.reals[j];
      if (ties == 0) fail(n, "Y is none of the inputs");
      for (size_t i = 2; i < in.size(); ++i)
        if (X(i).reals[at(i)] == y.reals[j]) r[i - 2].reals[at(i)] += dy.reals[j] / ties;
    }
    return r;
  });
  reg("GreaterOrEqual", binary(DType::kBool, [](double a, double b) { return double(a >= b); }));
  reg("LessOrEqual", binary(DType::kBool, [](double a, double b) { return double(a <= b); }));
  reg("And", binary(DType::kBool, [](double a, double b) { return double(a != 0 && b != 0); }));
  reg("Or", binary(DType::kBool, [](double a, double b) { return double(a != 0 || b != 0); }));
  reg("Xor", binary(DType::kBool, [](double a, double b) { return double((a != 0) != (b != 0)); }));
  reg("IsNaN", [](const Node& n, const Ins& in) -> Outs {
    return {nary(n, {in.at(0)}, DType::kBool, [](const double* v) { return double(std::isnan(v[0])); })};
  });
  reg("IsInf", [](const Node& n, const Ins& in) -> Outs {
    const bool pos = n.attrs.get_int("detect_positive", 1), neg = n.attrs.get_int("detect_negative", 1);
    return {nary(n, {in.at(0)}, DType::kBool, [=](const double* v) {
      return double(std::isinf(v[0]) && (v[0] > 0 ? pos : neg)); })};
  });
  return true;
}();
#undef X

}  // namespace
}  // namespace torch_ort::ref
