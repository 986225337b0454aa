// bias_gelu_fusion: Add(x, bias) -> GELU becomes one com.torch_ort::BiasGelu(x, bias) (one pass over
// memory forward and backward). GELU is matched as the ONNX Gelu op (approximate none / tanh) and as
// the two decomposed forms exporters emit:
//   tanh (HF gelu_new):  0.5·x · (1 + tanh(√(2/π)·(x + 0.044715·x³)))    x³ = x·x·x or Pow(x, 3)
//   erf  (BERT, older):  0.5·x · (1 + erf(x / √2))                       or erf(x · (1/√2))
// Products are matched as trees of Mul (any association and operand order), so 0.5·(x·(1+t)) and
// (x·0.5)·(1+t) both match. A GELU without a foldable bias becomes BiasGelu(x) without one: the
// bias is folded when x = Add(z, bias) with bias 1-D over the last dim and every reader of x in
// the GELU.
#include <cmath>
#include <string>

#include "csrc/core/passes/pass.h"
#include "csrc/core/ir/pattern.h"
#include "csrc/core/passes/rewrite.h"

namespace torch_ort {
namespace {

using namespace rewrite;

constexpr double kTol = 1e-5;  // relative, for the decomposed forms' rounded constants

enum class Form { kOp, kTanh, kErf };

NodePattern decomposed(Form form, Input x) {
  NodePattern f;
  if (form == Form::kTanh) {
    const Input cube = one_of({from(product({val("x"), val("x"), val("x")}, 0.044715, kTol)),
                               from(product({from(op("Pow").in({val("x"), num(3.0)}))}, 0.044715, kTol))});
    f = op("Tanh").in({from(product({from(op("Add").commutative().in({val("x"), cube}))}, std::sqrt(2.0 / M_PI), kTol))});
  } else {
    f = op("Erf").in({one_of({from(op("Div").in({val("x"), num(std::sqrt(2.0), kTol)})),
                              from(product({val("x")}, std::sqrt(0.5), kTol))})});
  }
  return product({std::move(x), from(op("Add").commutative().in({num(1.0, kTol), from(std::move(f))}))}, 0.5, kTol)
      .with_outputs(1);
}

// The GELU's approximation: the Gelu op's attribute, or the decomposed form's.
std::string approximation(const Graph& g, const Match& m, Form form) {
  if (form == Form::kTanh) return "tanh";
  if (form == Form::kErf) return "none";
  try {
    return g.nodes[m.node("gelu")].attrs.get_string("approximate", "none");
  } catch (const std::exception&) {
    return "";  // a malformed attribute: the Gelu kernel names it
  }
}

Rule gelu_rule(Form form, bool fold_bias) {
  // x = Add(z, bias), every reader of x inside the GELU.
  Input x = fold_bias ? inside(op("Add").commutative().in({val("z"), val("bias")}), "x") : val("x");
  NodePattern root = form == Form::kOp ? op("Gelu").as("gelu").with_outputs(1).in({std::move(x)})
                                       : decomposed(form, std::move(x));
  const char* names[] = {"Gelu", "tanh GELU", "erf GELU"};
  return Rule{std::string(names[static_cast<int>(form)]) + (fold_bias ? "(z + bias)" : "(x)") + " -> BiasGelu",
              std::move(root),
              [form, fold_bias](const Graph& g, const Match& m) {
                const std::string approximate = approximation(g, m, form);
                const Value& x = g.value(m.value("x"));
                if ((approximate != "none" && approximate != "tanh") || !is_floating(x.dtype)) return false;
                if (!fold_bias) return true;
                const ValueId z = m.value("z");
                return g.value(z).dtype == x.dtype && g.value(z).shape.same_as(x.shape) &&
                       pattern::is_bias_of(g, m.value("bias"), z);
              },
              [form, fold_bias](Graph& g, const Match& m, const Node& root) {
                Attributes a;
                a.set("approximate", approximation(g, m, form));
                std::vector<ValueId> ins{m.value("x")};
                if (fold_bias) ins = {m.value("z"), m.value("bias")};
                return Node{kOurDomain, "BiasGelu", "", std::move(ins), {root.outputs[0]}, std::move(a)};
              }};
}

class BiasGeluFusion final : public Pass {
 public:
  std::string_view name() const override { return "bias_gelu_fusion"; }
  bool run(Graph& g) override {
    std::vector<Rule> rules;
    for (Form form : {Form::kOp, Form::kTanh, Form::kErf})
      for (bool fold_bias : {true, false}) rules.push_back(gelu_rule(form, fold_bias));
    return rewrite::apply(g, rules);
  }
};

}  // namespace

std::unique_ptr<Pass> make_bias_gelu_fusion_pass() { return std::make_unique<BiasGeluFusion>(); }

}  // namespace torch_ort
