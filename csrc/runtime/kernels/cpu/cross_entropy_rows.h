// The row loop of LinearCrossEntropy on the CPU (kernels/linear_cross_entropy.cc): per row of a
// chunk of logits, its cross-entropy with label smoothing and, when asked, its gradient written
// over the row. AVX-512 or AVX2 (simd.h's use_avx512 / use_avx2, which set_optim_cpu_path narrows):
// it returns false without either, and the caller runs the same formulas as ATen ops.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace torch_ort::kernels::cpu {

struct CrossEntropyRows {
  const int64_t* labels;  // one per row
  int64_t ignore_index;   // rows with this label add nothing and get a zero gradient
  bool has_ignore_index;
  double smoothing;       // ε: the target is (1 − ε)·onehot + ε/V
  float grad_scale;       // the gradient's factor (1/count for a mean, 1 for a sum); 0: no gradient
};

// logits: (rows, V), contiguous, float, bfloat16 or half. Writes each row's loss into
// row_loss[rows] (0 where ignored), and with grad_scale != 0 the gradient
// grad_scale·(softmax − (1 − ε)·onehot − ε/V) over the row, in the logits' dtype, rounded once.
// The caller has checked the labels: one outside [0, V) gives its row a NaN loss and a zero
// gradient, never a read out of the row. False (nothing done) without AVX-512 or AVX2, or for
// another dtype.
bool cross_entropy_rows(at::Tensor& logits, const CrossEntropyRows& args, double* row_loss);

}  // namespace torch_ort::kernels::cpu
