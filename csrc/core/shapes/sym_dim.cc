// Canonical symbolic dims: polynomial arithmetic, a small parser for exporter spellings, printing.
#include "csrc/core/shapes/sym_dim.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "csrc/core/ir/limits.h"

namespace torch_ort {
namespace {

constexpr size_t kMaxTerms = 8;   // beyond this a dim is not worth naming: unknown
constexpr size_t kMaxChars = 96;

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  });
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// Recursive descent over "expr := term (('+'|'-') term)*, term := factor ('*' factor)*".
// A parenthesized group it cannot read becomes an atom named by its contents ("(s20//2)").
struct Parser {
  const std::string& s;
  size_t i = 0;
  bool ok = true;

  void skip() { while (i < s.size() && s[i] == ' ') ++i; }
  SymExpr expr() {
    skip();
    SymExpr out = SymExpr::constant(0);
    bool neg = false;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
    out = neg ? out - term() : term();
    for (skip(); ok && i < s.size() && (s[i] == '+' || s[i] == '-'); skip()) {
      const char op = s[i++];
      out = op == '+' ? out + term() : out - term();
    }
    return out;
  }
  SymExpr term() {
    SymExpr out = factor();
    for (skip(); ok && i < s.size() && s[i] == '*' && (i + 1 >= s.size() || s[i + 1] != '*'); skip()) {
      ++i;
      out = out * factor();
    }
    return out;
  }
  SymExpr factor() {
    skip();
    if (i >= s.size()) return fail();
    if (std::isdigit(static_cast<unsigned char>(s[i]))) {
      int64_t v = 0;
      for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
        if (v > (INT64_MAX - 9) / 10) return fail();
        v = v * 10 + (s[i] - '0');
      }
      return SymExpr::constant(v);
    }
    if (s[i] == '(') {
      int depth = 0;
      size_t j = i;
      for (; j < s.size(); ++j) {
        depth += s[j] == '(' ? 1 : s[j] == ')' ? -1 : 0;
        if (depth == 0) break;
      }
      if (j >= s.size()) return fail();
      const std::string inner = s.substr(i + 1, j - i - 1);
      i = j + 1;
      Parser sub{inner};
      SymExpr e = sub.expr();
      return sub.ok && sub.i == inner.size() ? e : SymExpr::symbol(trim(inner));
    }
    const size_t b = i;
    while (i < s.size() &&
           (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_' || s[i] == '.'))
      ++i;
    if (b == i || (i < s.size() && s[i] == '(')) return fail();  // a function call: opaque
    return SymExpr::symbol(s.substr(b, i - b));
  }
  SymExpr fail() {
    ok = false;
    return SymExpr::constant(0);
  }
};

// Appends are spelled out: GCC 12 warns falsely (-Wrestrict) on "(" + s + ")".
std::string parenthesized(const std::string& s) {
  std::string out(1, '(');
  out.append(s).push_back(')');
  return out;
}

std::string factor_text(const std::string& f) { return is_identifier(f) ? f : parenthesized(f); }

// "lhs//k" at paren depth 0 (an atom made by dim_floordiv or spelled so by the exporter).
bool split_floordiv(const std::string& atom, std::string& lhs, std::string& rhs) {
  int depth = 0;
  for (size_t k = 0; k + 1 < atom.size(); ++k) {
    depth += atom[k] == '(' ? 1 : atom[k] == ')' ? -1 : 0;
    if (depth == 0 && atom[k] == '/' && atom[k + 1] == '/') {
      lhs = atom.substr(0, k);
      rhs = atom.substr(k + 2);
      return true;
    }
  }
  return false;
}

}  // namespace

SymExpr SymExpr::constant(int64_t c) {
  SymExpr e;
  if (c != 0) e.terms[{}] = c;
  return e;
}

SymExpr SymExpr::symbol(const std::string& name) {
  SymExpr e;
  e.terms[{name}] = 1;
  return e;
}

std::optional<SymExpr> SymExpr::of(const Dim& d) {
  if (d.is_known()) return constant(d.value);
  if (d.is_symbolic()) return parse(d.symbol);
  return std::nullopt;
}

SymExpr SymExpr::parse(const std::string& text) {
  if (is_identifier(text)) return symbol(text);  // the common case: "s77", "batch"
  Parser p{text};
  SymExpr e = p.expr();
  if (p.ok && p.i == text.size()) return e;
  std::string atom = trim(text);
  if (atom.size() > 1 && atom.front() == '(' && atom.back() == ')')
    atom = trim(atom.substr(1, atom.size() - 2));
  return symbol(atom);
}

int64_t SymExpr::constant_value() const {
  auto it = terms.find({});
  return it == terms.end() ? 0 : it->second;
}

std::string SymExpr::to_string() const {
  std::string out;
  auto emit = [&](const std::vector<std::string>& f, int64_t c) {
    if (!out.empty() || c < 0) out += c < 0 ? "-" : "+";
    const uint64_t a = c < 0 ? 0 - static_cast<uint64_t>(c) : static_cast<uint64_t>(c);  // INT64_MIN too
    std::string t = f.empty() || a != 1 ? std::to_string(a) : "";
    for (const std::string& x : f) {
      if (!t.empty()) t.push_back('*');
      t.append(factor_text(x));
    }
    out += t;
  };
  for (const auto& [f, c] : terms)
    if (!f.empty()) emit(f, c);
  if (const int64_t c = constant_value(); c != 0 || out.empty()) emit({}, c);
  return out;
}

Dim SymExpr::to_dim() const {
  if (is_constant()) return constant_value() >= 0 ? Dim::known(constant_value()) : Dim{};
  std::string s = to_string();
  if (terms.size() > kMaxTerms || s.size() > kMaxChars) return Dim{};
  return Dim::symbolic(std::move(s));
}

std::vector<std::string> SymExpr::atoms() const {
  std::vector<std::string> out;
  for (const auto& [f, c] : terms)
    for (const std::string& x : f)
      if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
  return out;
}

// Run-time sizes are bound here, so an overflow is an error (std::overflow_error naming the
// expression and the bindings), never a wrapped size.
std::optional<int64_t> SymExpr::evaluate(const std::map<std::string, int64_t>& env) const {
  int64_t total = 0;
  bool overflow = false;
  for (const auto& [f, c] : terms) {
    int64_t t = c;
    for (const std::string& x : f) {
      auto it = env.find(x);
      std::optional<int64_t> v = it != env.end() ? std::optional<int64_t>(it->second) : std::nullopt;
      std::string lhs, rhs;
      if (!v && split_floordiv(x, lhs, rhs)) {
        auto a = parse(lhs).evaluate(env), b = parse(rhs).evaluate(env);
        // floor(a / b) for b > 0; for a < 0 as -ceil(-a / b) = -((-a - 1) / b + 1), no overflow.
        if (a && b && *b > 0) v = *a >= 0 ? *a / *b : -((-(*a + 1)) / *b) - 1;
      }
      if (!v) return std::nullopt;
      overflow = overflow || __builtin_mul_overflow(t, *v, &t);
    }
    overflow = overflow || __builtin_add_overflow(total, t, &total);
  }
  if (overflow) {
    std::string bound;
    for (const std::string& a : atoms()) {
      auto it = env.find(a);
      if (it != env.end()) bound += (bound.empty() ? "" : ", ") + a + "=" + std::to_string(it->second);
    }
    throw std::overflow_error("symbolic size " + to_string() + " overflows int64 when evaluated with " +
                              (bound.empty() ? std::string("its bindings") : bound));
  }
  return total;
}

// Coefficient arithmetic is checked: an overflow throws std::overflow_error. dim_add/dim_mul and
// shape rules turn it into an unknown dim (a valid answer for symbolic shapes: a size that does
// not fit int64 cannot exist at run time anyway); the planner reports it as an error.
SymExpr operator+(const SymExpr& a, const SymExpr& b) {
  SymExpr out = a;
  for (const auto& [f, c] : b.terms) {
    int64_t& sum = out.terms[f];
    sum = checked_add(sum, c, "symbolic size arithmetic");
    if (sum == 0) out.terms.erase(f);
  }
  return out;
}

SymExpr operator-(const SymExpr& a, const SymExpr& b) { return a + SymExpr::constant(-1) * b; }

SymExpr operator*(const SymExpr& a, const SymExpr& b) {
  SymExpr out;
  for (const auto& [fa, ca] : a.terms)
    for (const auto& [fb, cb] : b.terms) {
      std::vector<std::string> f = fa;
      f.insert(f.end(), fb.begin(), fb.end());
      std::sort(f.begin(), f.end());
      int64_t& sum = out.terms[f];
      sum = checked_add(sum, checked_mul(ca, cb, "symbolic size arithmetic"), "symbolic size arithmetic");
      if (sum == 0) out.terms.erase(f);
    }
  return out;
}

namespace {
template <typename F>
Dim lift(const Dim& a, const Dim& b, F f) {
  auto x = SymExpr::of(a), y = SymExpr::of(b);
  try {
    return x && y ? f(*x, *y).to_dim() : Dim{};
  } catch (const std::overflow_error&) {
    return Dim{};  // unknown: see operator+
  }
}
}  // namespace

Dim dim_add(const Dim& a, const Dim& b) { return lift(a, b, [](auto& x, auto& y) { return x + y; }); }
Dim dim_sub(const Dim& a, const Dim& b) { return lift(a, b, [](auto& x, auto& y) { return x - y; }); }
Dim dim_mul(const Dim& a, const Dim& b) { return lift(a, b, [](auto& x, auto& y) { return x * y; }); }

Dim dim_div_exact(const Dim& a, const Dim& b) {
  auto x = SymExpr::of(a), y = SymExpr::of(b);
  if (!x || !y || y->terms.size() != 1) return Dim{};  // only a monomial divides cheaply
  const auto& [fy, cy] = *y->terms.begin();
  SymExpr out;
  if (cy == -1) return Dim{};  // INT64_MIN / -1 overflows; a negative divisor is no size anyway
  for (const auto& [f, c] : x->terms) {
    if (c % cy != 0) return Dim{};
    std::vector<std::string> rest = f;
    for (const std::string& s : fy) {
      auto it = std::find(rest.begin(), rest.end(), s);
      if (it == rest.end()) return Dim{};
      rest.erase(it);
    }
    out.terms[rest] = c / cy;
  }
  return out.to_dim();
}

Dim dim_floordiv(const Dim& a, const Dim& b) {
  if (a.is_known() && b.is_known()) return b.value > 0 ? Dim::known(a.value / b.value) : Dim{};
  if (Dim exact = dim_div_exact(a, b); exact.is_known() || exact.is_symbolic()) return exact;
  auto x = SymExpr::of(a);
  if (!x || !b.is_known() || b.value <= 0) return Dim{};
  const bool simple = x->terms.size() == 1 && x->terms.begin()->second == 1;
  std::string atom = simple ? x->to_string() : parenthesized(x->to_string());
  atom.append("//").append(std::to_string(b.value));
  return SymExpr::symbol(atom).to_dim();
}

Dim dim_product(const std::vector<Dim>& dims) {
  Dim out = Dim::known(1);
  for (const Dim& d : dims) out = dim_mul(out, d);
  return out;
}

Dim canonical(const Dim& d) { return d.is_symbolic() ? SymExpr::parse(d.symbol).to_dim() : d; }

}  // namespace torch_ort
