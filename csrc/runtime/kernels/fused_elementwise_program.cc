// FusedElementwise's program (fused_elementwise_program.h): the instruction table, checked
// against the ops' FusedInstr traits, and the parsing of a node's program.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "csrc/core/ir/op_traits.h"
#include "csrc/runtime/kernels/fused_elementwise_program.h"

namespace torch_ort::kernels::elementwise_program {
namespace {

// Each instruction's formulas, by name. Which ops are instructions, and which take one operand,
// is their FusedInstr trait (csrc/core/ops/elementwise.cc), which elementwise_chain_fusion
// emits; checked once against this table, so a trait line without formulas here (or the other
// way round) fails on the first program instead of at an unlucky fusion.
const std::vector<std::pair<const char*, Op>>& instructions() {
  static const std::vector<std::pair<const char*, Op>> names = [] {
    std::vector<std::pair<const char*, Op>> t{
        {"Add", Op::kAdd},   {"Sub", Op::kSub},   {"Mul", Op::kMul},         {"Div", Op::kDiv},
        {"Pow", Op::kPow},   {"Neg", Op::kNeg},   {"Exp", Op::kExp},         {"Log", Op::kLog},
        {"Tanh", Op::kTanh}, {"Sigmoid", Op::kSigmoid}, {"Relu", Op::kRelu}, {"Sqrt", Op::kSqrt},
        {"Erf", Op::kErf},   {"Reciprocal", Op::kReciprocal}};
    for (const auto& [name, op] : t) {
      const OpTraits* traits = find_op("", name);
      const FusedInstr want = is_unary(op) ? FusedInstr::kUnary : FusedInstr::kBinary;
      if (!traits || traits->fused != want)
        throw std::logic_error(std::string("FusedElementwise: ") + name + "'s FusedInstr trait (csrc/core/ops/) "
                               "does not match the kernel's formulas");
    }
    size_t with_trait = 0;
    for (const std::string& key : op_traits_ops())
      if (key.rfind("::", 0) == 0 && find_op("", key.substr(2))->fused != FusedInstr::kNone) ++with_trait;
    if (with_trait != t.size())
      throw std::logic_error("FusedElementwise: an op has a FusedInstr trait (csrc/core/ops/) but no formulas here");
    return t;
  }();
  return names;
}

}  // namespace

Program parse(const KernelCtx& c, int64_t n_inputs) {
  const std::vector<std::pair<const char*, Op>>& names = instructions();
  Program p;
  p.n_inputs = n_inputs;
  p.consts = c.attrs.get_floats("consts", {});
  const std::vector<std::string> ops = c.attrs.get_strings("ops", {});
  const std::vector<int64_t> operands = c.attrs.get_ints("operands", {});
  if (ops.empty() || operands.size() != 2 * ops.size())
    c.fail("needs a program: 'ops' (n > 0 names) and 'operands' (2n ints), got " + std::to_string(ops.size()) +
           " ops and " + std::to_string(operands.size()) + " operands");
  for (size_t k = 0; k < ops.size(); ++k) {
    auto it = std::find_if(names.begin(), names.end(), [&](const auto& e) { return ops[k] == e.first; });
    if (it == names.end()) c.fail("instruction " + std::to_string(k) + ": unsupported op '" + ops[k] + "'");
    Instr in{it->second, operands[2 * k], operands[2 * k + 1], 0.0f};
    const int64_t limit = n_inputs + static_cast<int64_t>(k);  // inputs and earlier results only
    auto check = [&](int64_t o) {
      if (o >= limit || (o < 0 && -o - 1 >= static_cast<int64_t>(p.consts.size())))
        c.fail("instruction " + std::to_string(k) + " (" + ops[k] + "): operand " + std::to_string(o) +
               " is neither an input, an earlier result nor a constant");
    };
    check(in.a);
    if (!is_unary(in.op)) check(in.b);
    if (in.op == Op::kPow) {
      if (in.b >= 0) c.fail("instruction " + std::to_string(k) + ": Pow's exponent must be a constant");
      in.p = p.consts[-in.b - 1];
    }
    p.code.push_back(in);
  }
  return p;
}

}  // namespace torch_ort::kernels::elementwise_program
