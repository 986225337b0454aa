// The row loop of cross_entropy_rows, written once over a vector of float lanes: included by
// cross_entropy_rows.cc once per instruction set, inside that set's target pragma and its own
// namespace, with `Lanes` naming the set's vector operations (width, load/store from float, half
// and bfloat16 memory, max/add/sub/mul, exp, horizontal max and sum). No #pragma once: each
// inclusion compiles it for another instruction set.
//
// Three passes over each row, the row in L2 meanwhile (V = 128k fp32 is 512 KiB): the maximum
// (and the row's sum, for label smoothing), then e = exp(l − max) into a per-thread float scratch
// with its sum S, then the gradient e/S·scale − ε/V·scale (− (1 − ε)·scale at the label) stored
// over the row. loss = lse − (1 − ε)·l_y − ε/V·Σl with lse = max + log S: PyTorch's
// cross_entropy with label smoothing, written through the log-sum-exp.

// One row of V logits of type T; e: V floats of scratch. Returns the row's loss.
template <typename T>
double row(T* l, int64_t v, int64_t label, const CrossEntropyRows& a, float* e) {
  using V = typename Lanes::V;
  constexpr int64_t w = Lanes::kWidth;
  const int64_t body = v - v % w;
  V vmax = Lanes::set1(-std::numeric_limits<float>::infinity());
  V vsum = Lanes::zero();
  for (int64_t j = 0; j < body; j += w) {
    const V x = Lanes::load(l + j);
    vmax = Lanes::max(vmax, x);
    vsum = Lanes::add(vsum, x);
  }
  float m = Lanes::reduce_max(vmax);
  double total = Lanes::reduce_add(vsum);
  for (int64_t j = body; j < v; ++j) {
    m = std::max(m, static_cast<float>(l[j]));
    total += static_cast<float>(l[j]);
  }
  // An all -inf row (or a NaN) gives NaN as eager's log-softmax does; a finite max keeps exp finite.
  const V mm = Lanes::set1(m);
  V vs = Lanes::zero();
  for (int64_t j = 0; j < body; j += w) {
    const V x = Lanes::exp(Lanes::sub(Lanes::load(l + j), mm));
    Lanes::store(e + j, x);
    vs = Lanes::add(vs, x);
  }
  double s = Lanes::reduce_add(vs);
  for (int64_t j = body; j < v; ++j) {
    e[j] = std::exp(static_cast<float>(l[j]) - m);
    s += e[j];
  }
  const double lse = m + std::log(s);
  const double eps = a.smoothing;
  const double loss = lse - (1.0 - eps) * static_cast<float>(l[label]) - (eps > 0 ? eps / v * total : 0.0);
  if (a.grad_scale != 0.0f) {
    const float scale = a.grad_scale;
    const float inv = static_cast<float>(scale / s);
    const float shift = static_cast<float>(scale * eps / v);
    const V vinv = Lanes::set1(inv), vshift = Lanes::set1(shift);
    for (int64_t j = 0; j < body; j += w)
      Lanes::store(l + j, Lanes::sub(Lanes::mul(Lanes::load(e + j), vinv), vshift));
    for (int64_t j = body; j < v; ++j) l[j] = static_cast<T>(e[j] * inv - shift);
    // The label's entry from its float value: one rounding, as eager's softmax − onehot.
    l[label] = static_cast<T>(e[label] * inv - shift - static_cast<float>(scale * (1.0 - eps)));
  }
  return loss;
}

template <typename T>
void rows(T* data, int64_t n, int64_t v, const CrossEntropyRows& a, double* row_loss) {
  const bool grad = a.grad_scale != 0.0f;
  at::parallel_for(0, n, 1, [&](int64_t b, int64_t end) {
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(v));
    for (int64_t i = b; i < end; ++i) {
      T* l = data + i * v;
      const int64_t y = a.labels[i];
      if (a.has_ignore_index && y == a.ignore_index) {
        row_loss[i] = 0.0;
        if (grad) std::fill(l, l + v, T(0));
        continue;
      }
      if (y < 0 || y >= v) {
        row_loss[i] = std::numeric_limits<double>::quiet_NaN();
        if (grad) std::fill(l, l + v, T(0));
        continue;
      }
      row_loss[i] = row(l, v, y, a, scratch.data());
    }
  });
}

// logits: (n, V), contiguous, on the CPU. False for a dtype other than float, bfloat16 and half.
inline bool run(at::Tensor& logits, const CrossEntropyRows& args, double* row_loss) {
  const int64_t n = logits.size(0), v = logits.size(1);
  switch (logits.scalar_type()) {
    case at::kFloat: rows(logits.data_ptr<float>(), n, v, args, row_loss); return true;
    case at::kBFloat16: rows(logits.data_ptr<c10::BFloat16>(), n, v, args, row_loss); return true;
    case at::kHalf: rows(logits.data_ptr<c10::Half>(), n, v, args, row_loss); return true;
    default: return false;
  }
}
