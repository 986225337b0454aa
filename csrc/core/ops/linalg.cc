// The linalg family: MatMul, Gemm, Einsum and Det, and our GroupedMatMul (the experts of a
// mixture-of-experts layer). Kernels: csrc/runtime/kernels/linalg.cc, grouped_matmul.cc. Our
// FusedMatMul is in fused.cc.
// One home per op: its traits line (linalg_ops() below), its shape rule (shapes/shape_rules.h) and
// its gradient rule or the reason it has none (autodiff/gradient_registry.h) are all here.
#include <algorithm>
#include <map>
#include <string>

#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/errors.h"
#include "csrc/core/ops/families.h"
#include "csrc/core/ops/linalg.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort::ops {

std::vector<OpEntry> linalg_ops() {
  return {
      {"", "Gemm", {.recomputable = true}},
      {"", "MatMul", {.recomputable = true}},
      // (X (S, K), W (E, K, N), offs (E)) -> Y (S, N): rows [offs[e-1], offs[e]) of X times W[e]
      {kOurDomain, "GroupedMatMul", {.host_inputs = {2}, .arity = OpArity{3, 3, 1, 1}}},
      // (dY, X, W, offs) -> ([dX], [dW])
      {kOurDomain, "GroupedMatMulGrad", {.host_inputs = {3}, .arity = OpArity{4, 4, 2, 2, 0, slots({0, 1})}}},
  };
}

}  // namespace torch_ort::ops

namespace torch_ort {
namespace {

// --- shape rules (shapes/shape_rules.h)

// Fails on two different known contraction sizes; a symbol may stand for anything.
void check_inner(const ShapeCtx& c, const Dim& k1, const Dim& k2, const Shape& a, const Shape& b) {
  if (k1.is_known() && k2.is_known() && k1.value != k2.value)
    c.fail("inner dimensions differ: " + a.to_string() + " · " + b.to_string());
}

// Numpy matmul: (..., M, K)·(..., K, N) -> (broadcast ..., M, N); a rank-1 operand is a row
// (first) or a column (second) whose dim the product drops.
void matmul_shape(ShapeCtx& c) {
  const Shape a = c.in(0), b = c.in(1);
  if (!a.rank_known || !b.rank_known || a.rank() < 1 || b.rank() < 1) return;
  const Dim& ka = a.dims.back();
  const Dim& kb = b.rank() == 1 ? b.dims[0] : b.dims[b.dims.size() - 2];
  check_inner(c, ka, kb, a, b);
  if (a.rank() == 1 && b.rank() == 1) return c.set(0, Shape::of({}));
  if (a.rank() == 1) {  // (K)·(..., K, N) -> (..., N)
    std::vector<Dim> out(b.dims.begin(), b.dims.end() - 2);
    out.push_back(b.dims.back());
    return c.set(0, Shape::of(std::move(out)));
  }
  if (b.rank() == 1) return c.set(0, Shape::of({a.dims.begin(), a.dims.end() - 1}));  // (..., M)
  Shape out = broadcast(c, Shape::of({a.dims.begin(), a.dims.end() - 2}),
                        Shape::of({b.dims.begin(), b.dims.end() - 2}));
  out.dims.push_back(a.dims[a.dims.size() - 2]);
  out.dims.push_back(b.dims.back());
  c.set(0, std::move(out));
}

// Gemm: A' (M, K) · B' (K, N) + C -> (M, N), with A' = transA ? Aᵀ : A (and B' likewise).
void gemm_shape(ShapeCtx& c) {
  const Shape a = c.in(0), b = c.in(1);
  if (a.rank() != 2 || b.rank() != 2) return;
  const bool ta = c.attrs().get_int("transA", 0) != 0, tb = c.attrs().get_int("transB", 0) != 0;
  check_inner(c, a.dims[ta ? 0 : 1], b.dims[tb ? 1 : 0], a, b);
  c.set(0, Shape::of({a.dims[ta ? 1 : 0], b.dims[tb ? 0 : 1]}));
}

// GroupedMatMul: X (S, K) · W (E, K, N) -> (S, N); offs holds one count per group (E).
void grouped_matmul_shape(ShapeCtx& c) {
  const Shape x = c.in(0), w = c.in(1), offs = c.in(2);
  if (!x.rank_known || !w.rank_known) return;
  if (x.rank() != 2 || w.rank() != 3)
    c.fail("X must be 2-D (rows, K) and W 3-D (groups, K, N), got " + x.to_string() + " and " + w.to_string());
  check_inner(c, x.dims[1], w.dims[1], x, w);
  if (offs.rank_known && offs.rank() == 1 && offs.dims[0].is_known() && w.dims[0].is_known() &&
      offs.dims[0].value != w.dims[0].value)
    c.fail("offs has " + offs.to_string() + " entries for " + w.to_string() + " groups");
  c.set(0, Shape::of({x.dims[0], w.dims[2]}));
}

// GroupedMatMulGrad(dY, X, W, offs) -> (dX like X, dW like W).
void grouped_matmul_grad_shape(ShapeCtx& c) {
  c.set(0, c.in(1));
  c.set(1, c.in(2));
}

// --- gradient rules (autodiff/gradient_registry.h)

Attributes gemm_attrs(bool ta, bool tb, float alpha) {
  Attributes at;
  at.set("transA", static_cast<int64_t>(ta));
  at.set("transB", static_cast<int64_t>(tb));
  if (alpha != 1.0f) at.set("alpha", alpha);
  return at;
}


ValueId unsqueeze(GradCtx& g, ValueId x, int64_t axis) { return g.op("Unsqueeze", {x, g.const_ints(std::vector<int64_t>{axis})}); }

// Numpy's rank-1 cases: a vector operand is a row (A) or a column (B) that the product drops.
//   A (K), B (..., K, N):  dA = Σ dY[..., None, :]·Bᵀ,     dB = A[:, None]·dY[..., None, :]
//   A (..., M, K), B (K):  dA = dY[..., None]·B,           dB = Σ dY[..., None, :]·A
//   A (K), B (K):          dA = dY·B,                      dB = dY·A
void matmul_vector_grad(GradCtx& g, int64_t ra, int64_t rb) {
  const ValueId a = g.in(0), b = g.in(1), dy = g.grad_out(0);
  if (ra == 1 && rb == 1) {
    if (g.needs(0)) g.set_grad(0, g.mul(dy, b));
    if (g.needs(1)) g.set_grad(1, g.mul(dy, a));
    return;
  }
  auto sum_to = [&](ValueId x, ValueId like) {
    return g.ours("SumToShape", {x, g.shape_of(like)}, {}, DType::kUndefined, g.info(like).shape);
  };
  if (ra == 1) {
    if (g.needs(0)) g.set_grad(0, sum_to(g.matmul(unsqueeze(g, dy, -2), g.transpose_last2(b)), a));
    if (g.needs(1)) g.set_grad(1, g.sum_to_shape_of(g.matmul(unsqueeze(g, a, -1), unsqueeze(g, dy, -2)), b));
  } else {
    if (g.needs(0)) g.set_grad(0, g.sum_to_shape_of(g.mul(unsqueeze(g, dy, -1), b), a));
    if (g.needs(1)) g.set_grad(1, sum_to(g.matmul(unsqueeze(g, dy, -2), a), b));
  }
}

ValueId flatten(GradCtx& g, ValueId x, int64_t axis) {
  Attributes at;
  at.set("axis", axis);
  return g.op("Flatten", {x}, std::move(at));
}

// Y = A·B with numpy batching/broadcasting.
//   dA = dY·Bᵀ, dB = Aᵀ·dY  (each summed over broadcast batch dims)
// A weight shared by every batch row (A (..., M, K), B (K, N), a Linear layer on 3-D input):
//   dB = Σ_i A_iᵀ·dY_i = flat(A)ᵀ·flat(dY), one (K, rows)·(rows, N) Gemm over the flattened rows,
//   rather than a batched product of per-batch (K, N) blocks summed afterwards.
void matmul_grad(GradCtx& g) {
  const int64_t ra = g.rank(g.in(0)), rb = g.rank(g.in(1));
  if (ra < 2 || rb < 2) return matmul_vector_grad(g, ra, rb);
  const ValueId dy = g.grad_out(0);
  if (g.needs(0)) g.set_grad(0, g.sum_to_shape_of(g.matmul(dy, g.transpose_last2(g.in(1))), g.in(0)));
  if (!g.needs(1)) return;
  if (rb == 2 && ra > 2) {
    g.set_grad(1, gemm(g, flatten(g, g.in(0), ra - 1), flatten(g, dy, ra - 1), true, false, 1.0f));
  } else {
    g.set_grad(1, g.sum_to_shape_of(g.matmul(g.transpose_last2(g.in(0)), dy), g.in(1)));
  }
}

// Y = alpha·A'·B' + beta·C, with A' = transA ? Aᵀ : A and B' = transB ? Bᵀ : B.
//   dA' = alpha·dY·B'ᵀ, dB' = alpha·A'ᵀ·dY, dC = beta·dY (summed to C's shape)
// Each is a single Gemm with transpose flags, so no Transpose node is materialised.
void gemm_grad(GradCtx& g) {
  const bool ta = g.attrs().get_int("transA", 0) != 0;
  const bool tb = g.attrs().get_int("transB", 0) != 0;
  const float alpha = g.attrs().get_float("alpha", 1.0f);
  const float beta = g.attrs().get_float("beta", 1.0f);
  const ValueId a = g.in(0), b = g.in(1), dy = g.grad_out(0);
  if (g.needs(0))
    g.set_grad(0, ta ? gemm(g, b, dy, tb, true, alpha)     // dA = B'·dYᵀ
                     : gemm(g, dy, b, false, !tb, alpha));  // dA = dY·B'ᵀ
  if (g.needs(1))
    g.set_grad(1, tb ? gemm(g, dy, a, true, ta, alpha)      // dB = dYᵀ·A'
                     : gemm(g, a, dy, !ta, false, alpha));  // dB = A'ᵀ·dY
  if (g.needs(2)) {
    ValueId d = dy;
    if (beta != 1.0f) d = g.mul(d, g.const_scalar(beta, g.info(dy).dtype));
    g.set_grad(2, g.sum_to_shape_of(d, g.in(2)));
  }
}

// Einsum(inputs...; equation): each output label takes the dim its first input operand gives it
// (a label that is 1 there and more elsewhere is left unknown: broadcast). Equations with "..." or
// without "->" are left to the kernel (unknown shape).
void einsum_shape(ShapeCtx& c) {
  const std::string eq = c.attrs().get_string("equation", "");
  const size_t arrow = eq.find("->");
  if (arrow == std::string::npos || eq.find("...") != std::string::npos) return;
  std::map<char, Dim> dims;
  size_t start = 0;
  for (int i = 0; i < c.num_inputs(); ++i) {
    const size_t end = std::min(eq.find(',', start), arrow);
    const Shape x = c.in(i);
    std::string labels;
    for (size_t k = start; k < end; ++k)
      if (eq[k] != ' ') labels += eq[k];
    if (!x.rank_known || x.rank() != static_cast<int64_t>(labels.size())) return;
    for (size_t k = 0; k < labels.size(); ++k) {
      const Dim& d = x.dims[k];
      auto [it, fresh] = dims.emplace(labels[k], d);
      if (!fresh && !(it->second == d)) it->second = it->second.is_known() && it->second.value == 1 ? d : Dim{};
    }
    start = end + 1;
  }
  std::vector<Dim> out;
  for (size_t k = arrow + 2; k < eq.size(); ++k) {
    if (eq[k] == ' ') continue;
    auto it = dims.find(eq[k]);
    if (it == dims.end()) return;  // the kernel reports the bad label
    out.push_back(it->second);
  }
  c.set(0, Shape::of(std::move(out)));
}

// Det(X): X's dims without the two innermost (one determinant per matrix).
void det_shape(ShapeCtx& c) {
  const Shape x = c.in(0);
  if (!x.rank_known || x.rank() < 2) return;
  c.set(0, Shape::of({x.dims.begin(), x.dims.end() - 2}));
}

// Y[rows of group e] = X[rows of group e]·W[e]:
//   dX[rows of e] = dY[rows of e]·W[e]ᵀ,  dW[e] = X[rows of e]ᵀ·dY[rows of e]
// in one GroupedMatMulGrad that emits only the gradients needed.
void grouped_matmul_grad(GradCtx& g) {
  const std::vector<ValueId> d =
      g.ours_multi("GroupedMatMulGrad", {g.grad_out(0), g.in(0), g.in(1), g.in(2)},
                   {g.needs(0) ? g.in(0) : kNoValue, g.needs(1) ? g.in(1) : kNoValue});
  g.set_grad(0, d[0]);
  g.set_grad(1, d[1]);
}

}  // namespace

REGISTER_SHAPE_RULE("MatMul", matmul_shape);
REGISTER_SHAPE_RULE("Gemm", gemm_shape);
REGISTER_SHAPE_RULE("Einsum", einsum_shape);
REGISTER_SHAPE_RULE("Det", det_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "GroupedMatMul", grouped_matmul_shape);
REGISTER_SHAPE_RULE_IN(kOurDomain, "GroupedMatMulGrad", grouped_matmul_grad_shape);

REGISTER_GRADIENT("MatMul", matmul_grad, {});
REGISTER_GRADIENT("Gemm", gemm_grad, {});
REGISTER_GRADIENT_IN(kOurDomain, "GroupedMatMul", grouped_matmul_grad, {2});  // offs: counts

ValueId gemm(GradCtx& g, ValueId a, ValueId b, bool ta, bool tb, float alpha) {
  return g.op("Gemm", {a, b}, gemm_attrs(ta, tb, alpha));
}

ValueId fused_matmul(GradCtx& g, ValueId a, ValueId b, bool ta, bool tb, float alpha) {
  return g.ours("FusedMatMul", {a, b}, gemm_attrs(ta, tb, alpha));
}

}  // namespace torch_ort
