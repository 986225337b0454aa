// The registry template behind the shape-rule, gradient and kernel tables (ir/op_registry.h).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "csrc/core/autodiff/gradient_registry.h"
#include "csrc/core/ir/op_registry.h"
#include "csrc/core/shapes/shape_rules.h"

namespace torch_ort {
namespace {

TEST(OpRegistry, KeysAreDomainAndOpAndASecondRegistrationThrows) {
  OpRegistry<int> reg("thing");
  EXPECT_TRUE(reg.add("", "Add", 1));
  EXPECT_TRUE(reg.add("com.torch_ort", "Add", 2));  // another domain: another op
  ASSERT_NE(reg.entry("", "Add"), nullptr);
  EXPECT_EQ(*reg.entry("", "Add"), 1);
  EXPECT_EQ(*reg.entry("com.torch_ort", "Add"), 2);
  EXPECT_EQ(reg.entry("", "Sub"), nullptr);
  EXPECT_EQ(reg.ops(), (std::vector<std::string>{"::Add", "com.torch_ort::Add"}));
  try {
    reg.add("", "Add", 3);
    FAIL() << "a second registration must throw";
  } catch (const std::logic_error& e) {
    EXPECT_EQ(std::string(e.what()), "thing for '::Add' registered twice");
  }
  EXPECT_EQ(*reg.entry("", "Add"), 1);  // the first one stays
}

TEST(OpRegistry, TheProcessTablesAreFilledAtLoad) {
  EXPECT_NE(ShapeRegistry::instance().find("", "MatMul"), nullptr);
  EXPECT_EQ(ShapeRegistry::instance().find("", "NoSuchOp"), nullptr);
  ASSERT_NE(GradientRegistry::instance().find("", "MatMul"), nullptr);
  EXPECT_TRUE(GradientRegistry::instance().find("", "MatMul")->rule);
  EXPECT_FALSE(GradientRegistry::instance().find("", "Shape")->rule);  // declared: no gradient
}

}  // namespace
}  // namespace torch_ort
