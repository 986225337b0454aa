// Reference evaluator, CNN family: convolutions, pools, batch normalization and their gradient
// ops as plain loops over output positions and kernel offsets, in double. Pads are resolved here
// again from the ONNX attributes (independently of the runtime's cnn_spatial.cc).
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <stdexcept>

#include "tests/cpp/reference_eval.h"

namespace torch_ort::ref {
namespace {

// Calls f(index) for every multi-index of `shape`, row-major.
void for_each(const Dims& shape, const std::function<void(const Dims&)>& f) {
  Dims i(shape.size(), 0);
  for (int64_t k = 0, n = prod(shape); k < n; ++k) {
    f(i);
    for (int64_t d = int64_t(shape.size()) - 1; d >= 0 && ++i[d] == shape[d]; --d) i[d] = 0;
  }
}
int64_t at(const Dims& shape, const Dims& idx) {  // row-major offset
  int64_t off = 0;
  for (size_t d = 0; d < shape.size(); ++d) off = off * shape[d] + idx[d];
  return off;
}

// Kernel geometry of one node: sizes per spatial dim (n = rank − 2).
struct Geo {
  Dims k, s, d, pb, pe, in, out;
};

Geo geometry(const Node& n, const Dims& x, Dims k, bool transposed) {
  const size_t r = k.size();
  if (x.size() != r + 2) fail(n, "input rank does not match the kernel");
  Geo g{k, n.attrs.get_ints("strides", Dims(r, 1)), n.attrs.get_ints("dilations", Dims(r, 1)), {}, {},
        Dims(x.begin() + 2, x.end()), {}};
  const Dims pads = n.attrs.get_ints("pads", Dims(2 * r, 0));
  const std::string ap = n.attrs.get_string("auto_pad", "NOTSET");
  Dims oshape = n.attrs.get_ints("output_shape", {});
  if (oshape.size() == r + 2) oshape.erase(oshape.begin(), oshape.begin() + 2);
  const Dims op = transposed ? n.attrs.get_ints("output_padding", Dims(r, 0)) : Dims(r, 0);
  for (size_t i = 0; i < r; ++i) {
    const int64_t span = (k[i] - 1) * g.d[i] + 1;
    int64_t b = pads[i], e = pads[i + r];
    if (ap == "VALID") b = e = 0;
    if (ap == "SAME_UPPER" || ap == "SAME_LOWER" || (transposed && !oshape.empty())) {
      int64_t total;
      if (transposed) {
        const int64_t out = oshape.empty() ? g.in[i] * g.s[i] : oshape[i];
        total = g.s[i] * (g.in[i] - 1) + op[i] + span - out;
      } else {
        const int64_t out = (g.in[i] + g.s[i] - 1) / g.s[i];
        total = std::max<int64_t>(0, (out - 1) * g.s[i] + span - g.in[i]);
      }
      b = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      e = total - b;
    }
    g.pb.push_back(b), g.pe.push_back(e);
    if (transposed) {
      g.out.push_back(g.s[i] * (g.in[i] - 1) + op[i] + span - b - e);
    } else {
      const int64_t room = g.in[i] + b + e - span;
      int64_t o = (n.attrs.get_int("ceil_mode", 0) ? (room + g.s[i] - 1) / g.s[i] : room / g.s[i]) + 1;
      if (n.attrs.get_int("ceil_mode", 0) && (o - 1) * g.s[i] >= g.in[i] + b) --o;  // ATen's rule
      g.out.push_back(o);
    }
  }
  return g;
}
// Input position of output `o` at kernel offset `kk` (forward conv / pool); false when outside X.
bool source(const Geo& g, const Dims& o, const Dims& kk, Dims& xi) {
  for (size_t i = 0; i < o.size(); ++i) {
    xi[i] = o[i] * g.s[i] - g.pb[i] + kk[i] * g.d[i];
    if (xi[i] < 0 || xi[i] >= g.in[i]) return false;
  }
  return true;
}
Dims cat(std::initializer_list<int64_t> head, const Dims& tail) {
  Dims r(head);
  r.insert(r.end(), tail.begin(), tail.end());
  return r;
}

// Conv / ConvTranspose and their gradients in one loop over (n, input channel, output channel in
// the group, output position, kernel offset): every (x, w, y) triple that meets once.
struct ConvIo {
  const Tensor *x, *w;
  Geo g;
  int64_t N, C, M, groups;
  bool transposed;
};
ConvIo conv_io(const Node& n, const Tensor& x, const Tensor& w, bool transposed) {
  const int64_t groups = n.attrs.get_int("group", 1);
  ConvIo io{&x, &w, geometry(n, x.shape, Dims(w.shape.begin() + 2, w.shape.end()), transposed), x.shape[0],
            x.shape[1], transposed ? w.shape[1] * groups : w.shape[0], groups, transposed};
  return io;
}
void conv_triples(const ConvIo& io, const std::function<void(int64_t xo, int64_t wo, int64_t yo, int64_t m)>& f) {
  const int64_t cg = io.C / io.groups, mg = io.M / io.groups;
  const Dims wk(io.w->shape.begin() + 2, io.w->shape.end());
  const Dims ys = cat({io.N, io.M}, io.g.out), xs = cat({io.N, io.C}, io.g.in);
  Dims xi(wk.size()), oi(wk.size());
  for_each(cat({io.N, io.groups, cg, mg}, io.transposed ? io.g.in : io.g.out), [&](const Dims& a) {
    const int64_t c = a[1] * cg + a[2], m = a[1] * mg + a[3];
    const Dims pos(a.begin() + 4, a.end());
    for_each(wk, [&](const Dims& kk) {
      if (io.transposed) {  // input position pos scatters to output i·s − pb + k·d
        for (size_t i = 0; i < pos.size(); ++i) {
          oi[i] = pos[i] * io.g.s[i] - io.g.pb[i] + kk[i] * io.g.d[i];
          if (oi[i] < 0 || oi[i] >= io.g.out[i]) return;
        }
        f(at(xs, cat({a[0], c}, pos)), at(io.w->shape, cat({c, a[3]}, kk)), at(ys, cat({a[0], m}, oi)), m);
      } else {
        if (!source(io.g, pos, kk, xi)) return;
        f(at(xs, cat({a[0], c}, xi)), at(io.w->shape, cat({m, a[2]}, kk)), at(ys, cat({a[0], m}, pos)), m);
      }
    });
  });
}
Outs conv(const Node& n, const Ins& in, bool transposed) {
  ConvIo io = conv_io(n, *in.at(0), *in.at(1), transposed);
  Tensor y = zeros(in[0]->dtype, cat({io.N, io.M}, io.g.out));
  conv_triples(io, [&](int64_t xo, int64_t wo, int64_t yo, int64_t) { y.reals[yo] += in[0]->reals[xo] * in[1]->reals[wo]; });
  if (in.size() > 2 && in[2])
    for (int64_t i = 0; i < y.numel(); ++i) y.reals[i] += in[2]->reals[(i / prod(io.g.out)) % io.M];
  return {y};
}
Outs conv_grad(const Node& n, const Ins& in, bool transposed) {  // (dY, X, W) -> (dX, dW, dB)
  const Tensor& dy = *in.at(0);
  ConvIo io = conv_io(n, *in.at(1), *in.at(2), transposed);
  Tensor dx = zeros(dy.dtype, io.x->shape), dw = zeros(dy.dtype, io.w->shape), db = zeros(dy.dtype, {io.M});
  conv_triples(io, [&](int64_t xo, int64_t wo, int64_t yo, int64_t) {
    dx.reals[xo] += dy.reals[yo] * io.w->reals[wo];
    dw.reals[wo] += dy.reals[yo] * io.x->reals[xo];
  });
  for (int64_t i = 0; i < dy.numel(); ++i) db.reals[(i / prod(io.g.out)) % io.M] += dy.reals[i];
  return {dx, dw, db};
}

// Pools: f(output offset, input offset or −1 for a padded cell inside the window).
void pool_windows(const Geo& g, int64_t planes, const std::function<void(int64_t, int64_t)>& f) {
  const int64_t po = prod(g.out), pi = prod(g.in);
  Dims xi(g.k.size());
  for (int64_t p = 0; p < planes; ++p)
    for_each(g.out, [&](const Dims& o) {
      for_each(g.k, [&](const Dims& kk) {
        if (source(g, o, kk, xi)) return f(p * po + at(g.out, o), p * pi + at(g.in, xi));
        for (size_t i = 0; i < o.size(); ++i)  // a pad cell, not past the end pads (ceil_mode)
          if (o[i] * g.s[i] - g.pb[i] + kk[i] * g.d[i] >= g.in[i] + g.pe[i]) return;
        f(p * po + at(g.out, o), -1);
      });
    });
}
Geo pool_geo(const Node& n, const Dims& x) { return geometry(n, x, n.attrs.get_ints("kernel_shape", {}), false); }

Outs max_pool(const Node& n, const Ins& in) {
  const Tensor& x = *in.at(0);
  const Geo g = pool_geo(n, x.shape);
  const Dims ys = cat({x.shape[0], x.shape[1]}, g.out);
  Tensor y = zeros(x.dtype, ys), idx = zeros(DType::kInt64, ys);
  std::fill(y.reals.begin(), y.reals.end(), -INFINITY);
  pool_windows(g, x.shape[0] * x.shape[1], [&](int64_t o, int64_t i) {
    if (i >= 0 && x.reals[i] > y.reals[o]) y.reals[o] = x.reals[i], idx.ints[o] = i;
  });
  return {y, idx};
}
Outs average_pool(const Node& n, const Ins& in, const Tensor* dy_for_grad, const Dims& x_shape) {
  const Geo g = pool_geo(n, x_shape);
  const bool with_pads = n.attrs.get_int("count_include_pad", 0) != 0;
  const int64_t planes = x_shape[0] * x_shape[1];
  std::vector<double> count(size_t(planes * prod(g.out)), 0.0);
  pool_windows(g, planes, [&](int64_t o, int64_t i) { count[o] += (i >= 0 || with_pads) ? 1 : 0; });
  if (dy_for_grad) {  // dX[i] += dY[o] / count[o]
    Tensor dx = zeros(dy_for_grad->dtype, x_shape);
    pool_windows(g, planes, [&](int64_t o, int64_t i) { if (i >= 0) dx.reals[i] += dy_for_grad->reals[o] / count[o]; });
    return {dx};
  }
  Tensor y = zeros(in[0]->dtype, cat({x_shape[0], x_shape[1]}, g.out));
  pool_windows(g, planes, [&](int64_t o, int64_t i) { if (i >= 0) y.reals[o] += in[0]->reals[i] / count[o]; });
  return {y};
}

// Batch norm over (N, spatial) per channel: c of flat index i is (i / inner) % C.
struct Channels {
  int64_t C, inner, count;
  int64_t of(int64_t i) const { return (i / inner) % C; }
};
Channels channels(const Tensor& x) {
  const int64_t inner = prod(Dims(x.shape.begin() + 2, x.shape.end()));
  return {x.shape.at(1), inner, x.shape[0] * inner};
}
void batch_stats(const Tensor& x, std::vector<double>& mean, std::vector<double>& var) {
  const Channels ch = channels(x);
  mean.assign(ch.C, 0), var.assign(ch.C, 0);
  for (int64_t i = 0; i < x.numel(); ++i) mean[ch.of(i)] += x.reals[i] / ch.count;
  for (int64_t i = 0; i < x.numel(); ++i) var[ch.of(i)] += std::pow(x.reals[i] - mean[ch.of(i)], 2) / ch.count;
}
double param(const Ins& in, size_t k, int64_t c, double dflt) {
  return in.size() > k && in[k] ? in[k]->reals[c] : dflt;
}
Tensor normalize(const Ins& in, const std::vector<double>& mean, const std::vector<double>& var, double eps) {
  const Tensor& x = *in[0];
  const Channels ch = channels(x);
  Tensor y = x;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t c = ch.of(i);
    y.reals[i] = (x.reals[i] - mean[c]) / std::sqrt(var[c] + eps) * param(in, 1, c, 1) + param(in, 2, c, 0);
  }
  return y;
}
Tensor per_channel(DType t, const std::vector<double>& v) { return Tensor::of_reals(t, {int64_t(v.size())}, v); }

const bool kRegistered = [] {
  register_op("", "Conv", [](const Node& n, const Ins& in) { return conv(n, in, false); });
  register_op("", "ConvTranspose", [](const Node& n, const Ins& in) { return conv(n, in, true); });
  register_op(kOurDomain, "ConvGrad", [](const Node& n, const Ins& in) { return conv_grad(n, in, false); });
  register_op(kOurDomain, "ConvTransposeGrad", [](const Node& n, const Ins& in) { return conv_grad(n, in, true); });
  register_op("", "MaxPool", max_pool);
  register_op(kOurDomain, "MaxPoolGrad", [](const Node& n, const Ins& in) {  // (dY, Indices, shape(X))
    Tensor dx = zeros(in[0]->dtype, ints_of(n, *in.at(2)));
    const Dims& idx = ints_of(n, *in.at(1));
    for (int64_t j = 0; j < in[0]->numel(); ++j) dx.reals.at(size_t(idx.at(j))) += in[0]->reals[j];
    return Outs{dx};
  });
  register_op("", "AveragePool", [](const Node& n, const Ins& in) { return average_pool(n, in, nullptr, in.at(0)->shape); });
  register_op(kOurDomain, "AveragePoolGrad", [](const Node& n, const Ins& in) {  // (dY, shape(X))
    return average_pool(n, in, in.at(0), ints_of(n, *in.at(1)));
  });
  auto global = [](bool max) {
    return [max](const Node&, const Ins& in) {
      const Tensor& x = *in.at(0);
      Dims s = x.shape;
      std::fill(s.begin() + 2, s.end(), 1);
      Tensor y = zeros(x.dtype, s);
      const int64_t inner = x.numel() / y.numel();
      for (int64_t i = 0; i < x.numel(); ++i)
        y.reals[i / inner] = max ? (i % inner ? std::max(y.reals[i / inner], x.reals[i]) : x.reals[i])
                                : y.reals[i / inner] + x.reals[i] / inner;
      return Outs{y};
    };
  };
  register_op("", "GlobalAveragePool", global(false));
  register_op("", "GlobalMaxPool", global(true));
  register_op(kOurDomain, "GlobalMaxPoolGrad", [](const Node&, const Ins& in) {  // (dY, X, Y): ties share
    const Tensor &dy = *in.at(0), &x = *in.at(1), &y = *in.at(2);
    Tensor dx = zeros(x.dtype, x.shape);
    const int64_t inner = x.numel() / y.numel();
    std::vector<double> ties(size_t(y.numel()), 0);
    for (int64_t i = 0; i < x.numel(); ++i) ties[i / inner] += x.reals[i] == y.reals[i / inner];
    for (int64_t i = 0; i < x.numel(); ++i)
      if (x.reals[i] == y.reals[i / inner]) dx.reals[i] = dy.reals[i / inner] / ties[i / inner];
    return Outs{dx};
  });
  // ONNX: inference with the given statistics, or training_mode=1 with batch statistics and
  // running = input·momentum + batch·(1 − momentum), the variance biased.
  register_op("", "BatchNormalization", [](const Node& n, const Ins& in) {
    const double eps = n.attrs.get_float("epsilon", 1e-5f), m = n.attrs.get_float("momentum", 0.9f);
    if (!n.attrs.get_int("training_mode", 0))
      return Outs{normalize(in, in.at(3)->reals, in.at(4)->reals, eps)};
    std::vector<double> mean, var, rm(in.at(3)->reals), rv(in.at(4)->reals);
    batch_stats(*in[0], mean, var);
    for (size_t c = 0; c < mean.size(); ++c) rm[c] = rm[c] * m + mean[c] * (1 - m), rv[c] = rv[c] * m + var[c] * (1 - m);
    return Outs{normalize(in, mean, var, eps), per_channel(in[3]->dtype, rm), per_channel(in[4]->dtype, rv)};
  });
  // Ours: PyTorch's training step (running variance from the unbiased batch variance).
  register_op(kOurDomain, "BatchNormTraining", [](const Node& n, const Ins& in) {
    const double eps = n.attrs.get_float("epsilon", 1e-5f), m = n.attrs.get_float("momentum", 0.1f);
    std::vector<double> mean, var, inv_std;
    batch_stats(*in.at(0), mean, var);
    const double count = double(channels(*in[0]).count);
    std::vector<double> rm(mean.size()), rv(mean.size());
    for (size_t c = 0; c < mean.size(); ++c) {
      inv_std.push_back(1 / std::sqrt(var[c] + eps));
      rm[c] = (1 - m) * param(in, 3, c, 0) + m * mean[c];
      rv[c] = (1 - m) * param(in, 4, c, 1) + m * var[c] * count / (count - 1);
    }
    const DType t = in[0]->dtype;
    return Outs{normalize(in, mean, var, eps), per_channel(t, rm), per_channel(t, rv), per_channel(t, mean),
                per_channel(t, inv_std)};
  });
  // (dY, X, [scale], [mean], [inv_std | var]) -> (dX, dScale, dB)
  register_op(kOurDomain, "BatchNormalizationGrad", [](const Node& n, const Ins& in) {
    const Tensor &dy = *in.at(0), &x = *in.at(1);
    const double eps = n.attrs.get_float("epsilon", 1e-5f);
    const bool training = n.attrs.get_int("training", 1) != 0;
    const Channels ch = channels(x);
    std::vector<double> mean, inv_std, var;
    if (in.size() > 4 && in[3] && in[4]) {
      mean = in[3]->reals;
      for (double v : in[4]->reals) inv_std.push_back(training ? v : 1 / std::sqrt(v + eps));
    } else {
      batch_stats(x, mean, var);
      for (double v : var) inv_std.push_back(1 / std::sqrt(v + eps));
    }
    Tensor dx = zeros(x.dtype, x.shape), ds = zeros(x.dtype, {ch.C}), db = zeros(x.dtype, {ch.C});
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t c = ch.of(i);
      db.reals[c] += dy.reals[i];
      ds.reals[c] += dy.reals[i] * (x.reals[i] - mean[c]) * inv_std[c];
    }
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t c = ch.of(i);
      const double k = param(in, 2, c, 1) * inv_std[c];
      const double xhat = (x.reals[i] - mean[c]) * inv_std[c];
      dx.reals[i] = training ? k * (dy.reals[i] - db.reals[c] / ch.count - xhat * ds.reals[c] / ch.count) : k * dy.reals[i];
    }
    return Outs{dx, ds, db};
  });
  return true;
}();

}  // namespace
}  // namespace torch_ort::ref
