// Symbolic dim arithmetic: canonical spellings, exporter forms, division, evaluation.
#include <gtest/gtest.h>

#include "csrc/core/shapes/sym_dim.h"

namespace torch_ort {
namespace {

Dim k(int64_t v) { return Dim::known(v); }
Dim sym(const char* s) { return Dim::symbolic(s); }
std::string str(const Dim& d) { return Shape::of({d}).to_string(); }

TEST(SymDim, ProductsAreCanonicalWhateverTheOrder) {
  EXPECT_EQ(str(dim_mul(sym("batch"), sym("seq"))), "[batch*seq]");
  EXPECT_EQ(str(dim_mul(sym("seq"), sym("batch"))), "[batch*seq]");
  EXPECT_TRUE(dim_mul(sym("seq"), sym("batch")).same_as(dim_mul(sym("batch"), sym("seq"))));
  EXPECT_EQ(str(dim_mul(k(768), dim_mul(sym("seq"), sym("batch")))), "[768*batch*seq]");
  EXPECT_EQ(str(dim_mul(sym("n"), sym("n"))), "[n*n]");
  EXPECT_EQ(str(dim_product({k(2), k(3), k(4)})), "[24]");
  EXPECT_EQ(str(dim_product({})), "[1]");
}

TEST(SymDim, SumsCollectLikeTermsAndPutTheConstantLast) {
  EXPECT_EQ(str(dim_add(sym("seq"), sym("past"))), "[past+seq]");
  EXPECT_EQ(str(dim_add(sym("seq"), sym("seq"))), "[2*seq]");
  EXPECT_EQ(str(dim_sub(sym("seq"), k(1))), "[seq-1]");
  EXPECT_EQ(str(dim_sub(dim_add(sym("seq"), k(1)), k(1))), "[seq]");
  EXPECT_EQ(str(dim_sub(sym("seq"), sym("seq"))), "[0]") << "a symbol minus itself is a known 0";
  EXPECT_EQ(str(dim_add(k(2), k(3))), "[5]");
}

TEST(SymDim, ExactDivisionUndoesAProduct) {
  const Dim total = dim_product({sym("batch"), sym("seq"), k(768)});
  EXPECT_EQ(str(dim_div_exact(total, k(768))), "[batch*seq]");
  EXPECT_EQ(str(dim_div_exact(total, dim_mul(sym("seq"), k(768)))), "[batch]");
  EXPECT_EQ(str(dim_div_exact(dim_add(dim_mul(k(2), sym("a")), k(4)), k(2))), "[a+2]");
  EXPECT_EQ(str(dim_div_exact(total, k(5))), "[?]") << "768 is not a multiple of 5";
  EXPECT_EQ(str(dim_div_exact(total, sym("heads"))), "[?]");
  EXPECT_EQ(str(dim_div_exact(sym("a"), dim_add(sym("a"), sym("b")))), "[?]") << "only monomials divide";
  EXPECT_EQ(str(dim_div_exact(k(12), k(4))), "[3]");
}

TEST(SymDim, FloorDivisionOfASymbolIsTheExportersAtom) {
  EXPECT_EQ(str(dim_floordiv(sym("s20"), k(2))), "[(s20//2)]");
  EXPECT_TRUE(canonical(sym("(s20//2)")).same_as(dim_floordiv(sym("s20"), k(2))))
      << "the exporter spells it '(s20//2)'; ours must compare equal";
  EXPECT_EQ(str(dim_floordiv(dim_mul(k(4), sym("h")), k(2))), "[2*h]") << "exact stays a polynomial";
  EXPECT_EQ(str(dim_floordiv(dim_add(sym("h"), k(1)), k(2))), "[((h+1)//2)]");
  EXPECT_EQ(str(dim_floordiv(k(7), k(2))), "[3]");
  EXPECT_EQ(str(dim_floordiv(sym("h"), sym("w"))), "[?]");
}

TEST(SymDim, ExporterSpellingsParseToTheCanonicalForm) {
  EXPECT_EQ(str(canonical(sym("s0 * s1"))), "[s0*s1]");
  EXPECT_EQ(str(canonical(sym("s1*s0"))), "[s0*s1]");
  EXPECT_EQ(str(canonical(sym("48 - 2*s20"))), "[-2*s20+48]");
  EXPECT_EQ(str(canonical(sym("2*(a + b)"))), "[2*a+2*b]");
  EXPECT_EQ(str(canonical(sym("3*4"))), "[12]") << "a constant expression is a known size";
  // What the parser cannot read stays one opaque symbol, compared by its text.
  EXPECT_EQ(str(canonical(sym("Max(s0, 2)"))), "[(Max(s0, 2))]");
  EXPECT_EQ(str(dim_mul(sym("batch"), canonical(sym("Max(s0, 2)")))), "[(Max(s0, 2))*batch]");
  EXPECT_TRUE(canonical(sym("batch*(Max(s0, 2))")).same_as(dim_mul(sym("batch"), sym("Max(s0, 2)"))));
  EXPECT_EQ(str(canonical(k(3))), "[3]");
  EXPECT_EQ(str(canonical(Dim{})), "[?]");
}

TEST(SymDim, UnknownOperandsAndOversizedExpressionsGiveUnknown) {
  EXPECT_EQ(str(dim_mul(sym("a"), Dim{})), "[?]");
  EXPECT_EQ(str(dim_add(Dim{}, k(1))), "[?]");
  EXPECT_EQ(str(dim_sub(k(1), k(2))), "[?]") << "a negative size is no size";
  Dim big = sym("a0");
  for (const char* name : {"a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a10"})
    big = dim_add(big, sym(name));
  EXPECT_EQ(str(big), "[?]") << "more terms than are worth naming";
}

TEST(SymDim, EvaluatesUnderBindingsIncludingFloorDivAtoms) {
  const std::map<std::string, int64_t> env{{"batch", 4}, {"seq", 7}, {"s20", 16}};
  EXPECT_EQ(SymExpr::parse("batch*seq").evaluate(env), 28);
  EXPECT_EQ(SymExpr::parse("2*seq-1").evaluate(env), 13);
  EXPECT_EQ(SymExpr::parse("(s20//2)").evaluate(env), 8);
  EXPECT_EQ(SymExpr::parse("((seq+1)//2)+1").evaluate(env), 5);
  EXPECT_EQ(SymExpr::parse("heads*seq").evaluate(env), std::nullopt) << "heads is unbound";
  const auto atoms = SymExpr::parse("batch*seq+seq").atoms();
  EXPECT_EQ(atoms, (std::vector<std::string>{"batch", "seq"}));
}

}  // namespace
}  // namespace torch_ort
