// Symbolic tensor shapes: each dimension is a known size, a named symbol ("batch"), or unknown.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torch_ort {

struct Dim {
  int64_t value = -1;  // >= 0 when the size is known
  std::string symbol;  // non-empty when the size is a named symbol (dynamic)

  static Dim known(int64_t v) { return Dim{v, {}}; }
  static Dim symbolic(std::string s) { return Dim{-1, std::move(s)}; }
  bool is_known() const { return value >= 0; }
  bool is_symbolic() const { return value < 0 && !symbol.empty(); }
  bool operator==(const Dim& o) const { return value == o.value && symbol == o.symbol; }
  // Two dims are provably equal when both known and equal, or the same symbol.
  bool same_as(const Dim& o) const {
    return is_known() ? (o.is_known() && value == o.value) : (is_symbolic() && symbol == o.symbol);
  }
};

struct Shape {
  bool rank_known = false;  // false: nothing is known, not even the rank
  std::vector<Dim> dims;    // valid when rank_known

  static Shape unknown() { return Shape{}; }
  static Shape of(std::vector<Dim> d) { return Shape{true, std::move(d)}; }
  int64_t rank() const { return rank_known ? static_cast<int64_t>(dims.size()) : -1; }
  // Provably the same shape (used to skip broadcast reductions in gradients).
  bool same_as(const Shape& o) const;
  std::string to_string() const;  // "[batch,784]" or "[?]"
};

}  // namespace torch_ort
