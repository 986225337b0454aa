// Symbolic dimension arithmetic: a dim is an integer polynomial over named sizes ("batch*seq").
//
// Decision: derived dims are *named symbols whose name is a canonical expression*, so
// that the IR keeps one Dim type and equality stays a string compare (Dim::same_as):
//   product   batch·seq        -> "batch*seq"      (factors sorted, coefficient first: "2*seq")
//   sum       past + seq       -> "past+seq"       (terms sorted, constant last: "seq-1")
//   floor div seq // 2         -> "(seq//2)"       (opaque atom, the exporter's own spelling)
//   anything larger than kMaxTerms terms or kMaxChars characters -> unknown (Dim{}).
// The exporter's sympy spellings ("48 - 2*s20", "(s20//2)") parse into the same canonical form.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "csrc/core/ir/shape.h"

namespace torch_ort {

// Σ coeff · Π factors. A factor is an identifier ("s0", "batch") or an opaque atom ("s20//2").
struct SymExpr {
  std::map<std::vector<std::string>, int64_t> terms;  // sorted factors -> coefficient (never 0)

  static SymExpr constant(int64_t c);
  static SymExpr symbol(const std::string& name);
  // Known dim -> constant; symbolic -> parsed symbol; unknown -> nullopt.
  static std::optional<SymExpr> of(const Dim& d);
  // Parses "2*s0 + s1 - 1"; text it cannot read becomes one opaque atom.
  static SymExpr parse(const std::string& text);

  bool is_constant() const {
    return terms.empty() || (terms.size() == 1 && terms.begin()->first.empty());
  }
  int64_t constant_value() const;  // 0 when there is no constant term
  std::string to_string() const;   // canonical
  Dim to_dim() const;              // known when constant (>= 0), symbolic otherwise, unknown if too big
  // The atoms this expression reads (for binding symbols to sizes at run time).
  std::vector<std::string> atoms() const;
  // Value under `env` (atom -> size); nullopt when an atom is unbound. Atoms "e//k" evaluate
  // their inner expression when it is bound.
  std::optional<int64_t> evaluate(const std::map<std::string, int64_t>& env) const;
};

SymExpr operator+(const SymExpr& a, const SymExpr& b);
SymExpr operator-(const SymExpr& a, const SymExpr& b);
SymExpr operator*(const SymExpr& a, const SymExpr& b);

// Dim arithmetic; any unknown operand (or an inexpressible result) gives an unknown Dim.
Dim dim_add(const Dim& a, const Dim& b);
Dim dim_sub(const Dim& a, const Dim& b);
Dim dim_mul(const Dim& a, const Dim& b);
// Exact division (e.g. the -1 of a Reshape: total / known); unknown when not provably exact.
Dim dim_div_exact(const Dim& a, const Dim& b);
// Integer floor division of a non-negative size by a positive size (shape arithmetic, pooling).
// Inexact symbolic results become the opaque atom "(a//b)".
Dim dim_floordiv(const Dim& a, const Dim& b);
Dim dim_product(const std::vector<Dim>& dims);  // 1 for an empty list
// Re-spells a symbolic dim canonically ("s0 * s1" -> "s0*s1"); known/unknown dims unchanged.
Dim canonical(const Dim& d);

}  // namespace torch_ort
