// The program of com.torch_ort::FusedElementwise and its gradient (fused_elementwise.cc): the
// instruction set elementwise_chain_fusion.cc writes (ops / operands / consts attributes), its
// parsing, and each instruction's forward and derivative formulas, written once as templates and
// instantiated on float (the tile loops) and on at::Tensor (the unfused ATen reference).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/erf.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/log.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/tanh.h>

#include "csrc/runtime/kernel.h"

namespace torch_ort::kernels::elementwise_program {

enum class Op { kAdd, kSub, kMul, kDiv, kPow, kNeg, kExp, kLog, kTanh, kSigmoid, kRelu, kSqrt, kErf, kReciprocal };

struct Instr {
  Op op;
  int64_t a, b;  // operands, encoded as in the pass: input, instruction (>= n_inputs), const (< 0)
  float p;       // Pow's constant exponent
};

struct Program {
  std::vector<Instr> code;
  std::vector<float> consts;
  int64_t n_inputs = 0;
};

inline bool is_unary(Op op) { return op >= Op::kNeg; }

// The program of a node's attributes, its operands checked (inputs, earlier results, constants);
// a bad program is a KernelError naming the instruction.
Program parse(const KernelCtx& c, int64_t n_inputs);

// ---- math on float and on at::Tensor, so each formula below is written once.
inline float m_exp(float x) { return std::exp(x); }
inline float m_log(float x) { return std::log(x); }
inline float m_tanh(float x) { return std::tanh(x); }
inline float m_sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float m_relu(float x) { return x > 0.0f ? x : 0.0f; }
inline float m_sqrt(float x) { return std::sqrt(x); }
inline float m_erf(float x) { return std::erf(x); }
inline float m_pow(float x, float p) { return p == 2.0f ? x * x : p == 3.0f ? x * x * x : std::pow(x, p); }
inline float m_pos(float x) { return x > 0.0f ? 1.0f : 0.0f; }
inline at::Tensor m_exp(const at::Tensor& x) { return at::exp(x); }
inline at::Tensor m_log(const at::Tensor& x) { return at::log(x); }
inline at::Tensor m_tanh(const at::Tensor& x) { return at::tanh(x); }
inline at::Tensor m_sigmoid(const at::Tensor& x) { return at::sigmoid(x); }
inline at::Tensor m_relu(const at::Tensor& x) { return at::relu(x); }
inline at::Tensor m_sqrt(const at::Tensor& x) { return at::sqrt(x); }
inline at::Tensor m_erf(const at::Tensor& x) { return at::erf(x); }
inline at::Tensor m_pow(const at::Tensor& x, float p) { return at::pow(x, p); }
inline at::Tensor m_pos(const at::Tensor& x) { return (x > 0).to(x.scalar_type()); }

constexpr float k2OverSqrtPi = 1.12837916709551257f;

// y = op(a, b)
template <Op op, typename T>
inline T fwd(const T& a, const T& b, float p) {
  if constexpr (op == Op::kAdd) return a + b;
  else if constexpr (op == Op::kSub) return a - b;
  else if constexpr (op == Op::kMul) return a * b;
  else if constexpr (op == Op::kDiv) return a / b;
  else if constexpr (op == Op::kPow) return m_pow(a, p);
  else if constexpr (op == Op::kNeg) return -a;
  else if constexpr (op == Op::kExp) return m_exp(a);
  else if constexpr (op == Op::kLog) return m_log(a);
  else if constexpr (op == Op::kTanh) return m_tanh(a);
  else if constexpr (op == Op::kSigmoid) return m_sigmoid(a);
  else if constexpr (op == Op::kRelu) return m_relu(a);
  else if constexpr (op == Op::kSqrt) return m_sqrt(a);
  else if constexpr (op == Op::kErf) return m_erf(a);
  else return 1.0f / a;  // Reciprocal
}

// Contributions of dY = g to da (and db for binary ops), given a, b and y = op(a, b); the
// formulas of PyTorch's derivatives where they read y (tanh, sigmoid, sqrt, exp, div).
template <Op op, typename T>
inline T grad_a(const T& g, const T& a, const T& b, const T& y, float p) {
  if constexpr (op == Op::kAdd || op == Op::kSub) return g;
  else if constexpr (op == Op::kMul) return g * b;
  else if constexpr (op == Op::kDiv) return g / b;
  else if constexpr (op == Op::kPow) return g * (p * m_pow(a, p - 1.0f));
  else if constexpr (op == Op::kNeg) return -g;
  else if constexpr (op == Op::kExp) return g * y;
  else if constexpr (op == Op::kLog) return g / a;
  else if constexpr (op == Op::kTanh) return g * (1.0f - y * y);
  else if constexpr (op == Op::kSigmoid) return g * ((1.0f - y) * y);
  else if constexpr (op == Op::kRelu) return g * m_pos(y);
  else if constexpr (op == Op::kSqrt) return g / (2.0f * y);
  else if constexpr (op == Op::kErf) return g * (k2OverSqrtPi * m_exp(-(a * a)));
  else return -g * (y * y);  // Reciprocal
}

template <Op op, typename T>
inline T grad_b(const T& g, const T& a, const T& b, const T& y) {
  if constexpr (op == Op::kAdd) return g;
  else if constexpr (op == Op::kSub) return -g;
  else if constexpr (op == Op::kMul) return g * a;
  else return -(g * y) / b;  // Div: -dY·Y / B
}

// Calls f(std::integral_constant-like tag) with the op as a template argument.
template <typename F>
void dispatch(Op op, const F& f) {
  switch (op) {
    case Op::kAdd: return f(std::integral_constant<Op, Op::kAdd>{});
    case Op::kSub: return f(std::integral_constant<Op, Op::kSub>{});
    case Op::kMul: return f(std::integral_constant<Op, Op::kMul>{});
    case Op::kDiv: return f(std::integral_constant<Op, Op::kDiv>{});
    case Op::kPow: return f(std::integral_constant<Op, Op::kPow>{});
    case Op::kNeg: return f(std::integral_constant<Op, Op::kNeg>{});
    case Op::kExp: return f(std::integral_constant<Op, Op::kExp>{});
    case Op::kLog: return f(std::integral_constant<Op, Op::kLog>{});
    case Op::kTanh: return f(std::integral_constant<Op, Op::kTanh>{});
    case Op::kSigmoid: return f(std::integral_constant<Op, Op::kSigmoid>{});
    case Op::kRelu: return f(std::integral_constant<Op, Op::kRelu>{});
    case Op::kSqrt: return f(std::integral_constant<Op, Op::kSqrt>{});
    case Op::kErf: return f(std::integral_constant<Op, Op::kErf>{});
    case Op::kReciprocal: return f(std::integral_constant<Op, Op::kReciprocal>{});
  }
}

}  // namespace torch_ort::kernels::elementwise_program
