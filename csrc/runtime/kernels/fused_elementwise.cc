// Kernels of com.torch_ort::FusedElementwise(inputs...) and FusedElementwiseGrad(dY, inputs...):
// the small program elementwise_chain_fusion.cc writes (fused_elementwise_program.h: its
// instructions and their formulas), run tile by tile. Forward keeps every intermediate of a tile
// in a per-thread buffer (kTile floats per instruction) and writes only the result; backward
// recomputes the tile's intermediates, then walks the program backwards accumulating adjoints,
// and writes only the requested input gradients (broadcast inputs summed to their shapes
// afterwards); with a `join` attribute (passes/split_grad_join.cc) the listed inputs' gradients
// are written side by side along the last dim into one buffer, output join[0], where a SplitGrad
// would have concatenated them (tiles then stay within a row). Non-fp32 dtypes and non-CPU
// devices run the unfused ATen reference (the formulas on at::Tensor).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include "csrc/runtime/kernel.h"
#include "csrc/runtime/kernels/cpu/gelu.h"

// The project builds with -O2, whose "very cheap" vectoriser leaves these variable-length tile loops
// scalar; O3's vectoriser turns the arithmetic instructions' loops into SSE code.
#pragma GCC optimize("O3")
// After the pragma: the program's formulas, inlined into those loops, are defined under it too.
#include "csrc/runtime/kernels/fused_elementwise_program.h"

namespace torch_ort::kernels {
namespace {

constexpr int64_t kTile = 2048;  // floats per buffer: 8 KiB, a program's buffers stay in L1/L2
// The narrowest row whose joined gradients are written in place (a tile per row at least): at 4
// floats per row the row-bound tiles took 10x the flat loop; at 64 (32k rows), 5.6 ms against
// 6.5 ms for the flat loop and its concatenation.
constexpr int64_t kJoinedRowMin = 64;

using namespace elementwise_program;  // Op, Instr, Program, parse and the formulas

// ---- operands at run time
// kRows: the output's shape as rows of its last dim, `ld` floats apart (a Split's half of a
// fused gate/up projection) — read in place instead of copied whole.
enum class Kind { kFull, kRow, kScalar, kRows };
struct Operand {
  Kind kind;
  const float* data;  // fp32, contiguous but for kRows' row stride
  int64_t ld = 0;
};

// The row stride of t read as (rows, last dim) with contiguous rows, or 0 when it is not such a
// view (its leading dims do not collapse into one stride).
int64_t row_stride(const at::Tensor& t) {
  if (t.dim() < 2 || t.stride(-1) != 1) return 0;
  int64_t ld = 0, step = 0;  // the rows' stride; the stride the next dim out must have
  for (int64_t i = t.dim() - 2; i >= 0; --i) {
    if (t.size(i) == 1) continue;
    if (ld == 0) ld = t.stride(i);
    else if (t.stride(i) != step) return 0;
    step = t.stride(i) * t.size(i);
  }
  return ld >= t.size(-1) ? ld : 0;
}

// Shape of the broadcast of every input.
std::vector<int64_t> out_shape(const KernelCtx& c, const std::vector<at::Tensor>& ins) {
  std::vector<int64_t> s;
  for (const at::Tensor& t : ins) {
    try {
      s = at::infer_size(s, t.sizes());
    } catch (const std::exception&) {
      c.fail("inputs do not broadcast together: " + c10::str(at::IntArrayRef(s)) + " and " + c10::str(t.sizes()));
    }
  }
  return s;
}

// fp32 contiguous views of the inputs for the tile loop: the output's shape, a last-dim row, or
// one element; any other broadcast is expanded to the full shape first.
std::vector<at::Tensor> tile_inputs(const std::vector<at::Tensor>& ins, at::IntArrayRef out,
                                    std::vector<Operand>& ops) {
  const int64_t c = out.empty() ? 1 : out.back();
  std::vector<at::Tensor> keep;
  for (const at::Tensor& t : ins) {
    if (t.sizes() == out && !t.is_contiguous()) {
      if (const int64_t ld = row_stride(t)) {
        keep.push_back(t);
        ops.push_back({Kind::kRows, t.data_ptr<float>(), ld});
        continue;
      }
    }
    at::Tensor f = t.contiguous();
    Kind k;
    if (t.sizes() == out) {
      k = Kind::kFull;
    } else if (t.numel() == 1) {
      k = Kind::kScalar;
    } else if (t.numel() == c && t.dim() >= 1 && t.size(-1) == c) {
      k = Kind::kRow;
    } else {
      f = t.expand(out).contiguous();
      k = Kind::kFull;
    }
    keep.push_back(f);
    ops.push_back({k, f.data_ptr<float>()});
  }
  return keep;
}

// Pointer to `n` values of operand o for elements [begin, begin + n): straight into a full input,
// else filled into `stage` (rows wrap at c; scalars and constants repeat).
const float* fetch(const Program& p, const std::vector<Operand>& ins, const std::vector<float*>& regs,
                   int64_t o, int64_t begin, int64_t n, int64_t c, float* stage) {
  if (o >= p.n_inputs) return regs[o - p.n_inputs];
  if (o < 0) {
    std::fill(stage, stage + n, p.consts[-o - 1]);
    return stage;
  }
  const Operand& in = ins[o];
  if (in.kind == Kind::kFull) return in.data + begin;
  if (in.kind == Kind::kScalar) {
    std::fill(stage, stage + n, in.data[0]);
    return stage;
  }
  if (in.kind == Kind::kRows) {
    int64_t r = begin / c, k = begin % c;
    if (k + n <= c) return in.data + r * in.ld + k;  // inside one row
    for (int64_t j = 0; j < n; k = 0, ++r) {
      const int64_t m = std::min(n - j, c - k);
      std::copy(in.data + r * in.ld + k, in.data + r * in.ld + k + m, stage + j);
      j += m;
    }
    return stage;
  }
  int64_t k = begin % c;
  for (int64_t j = 0; j < n; ++j) {
    stage[j] = in.data[k];
    if (++k == c) k = 0;
  }
  return stage;
}

// The transcendental ops cpu/gelu.cc vectorises (AVX-512); libm's scalar calls otherwise.
std::optional<cpu::UnaryFn> vector_fn(Op op) {
  switch (op) {
    case Op::kExp: return cpu::UnaryFn::kExp;
    case Op::kTanh: return cpu::UnaryFn::kTanh;
    case Op::kErf: return cpu::UnaryFn::kErf;
    case Op::kSigmoid: return cpu::UnaryFn::kSigmoid;
    default: return std::nullopt;
  }
}

// Forward of one tile: every instruction's result into regs[k].
void run_tile(const Program& p, const std::vector<Operand>& ins, const std::vector<float*>& regs, float* stage_a,
              float* stage_b, int64_t begin, int64_t n, int64_t c) {
  for (size_t k = 0; k < p.code.size(); ++k) {
    const Instr& in = p.code[k];
    const float* a = fetch(p, ins, regs, in.a, begin, n, c, stage_a);
    const float* b = is_unary(in.op) ? a : fetch(p, ins, regs, in.b, begin, n, c, stage_b);
    float* __restrict y = regs[k];
    if (const auto fn = vector_fn(in.op); fn && cpu::unary_loop(*fn, a, y, n)) continue;
    dispatch(in.op, [&](auto tag) {
      constexpr Op op = decltype(tag)::value;
      const float* __restrict ra = a;
      const float* __restrict rb = b;
      for (int64_t j = 0; j < n; ++j) y[j] = fwd<op, float>(ra[j], rb[j], in.p);
    });
  }
}

std::vector<at::Tensor> inputs_from(const KernelCtx& c, int first) {
  std::vector<at::Tensor> ins;
  for (int i = first; i < c.num_inputs(); ++i) ins.push_back(c.input(i));
  if (ins.empty()) c.fail("needs at least one input");
  for (const at::Tensor& t : ins)
    if (!t.is_floating_point() || t.scalar_type() != ins[0].scalar_type() || t.device() != ins[0].device())
      c.fail("inputs must share one float dtype and device, got " + std::string(c10::toString(t.scalar_type())) +
             " beside " + std::string(c10::toString(ins[0].scalar_type())));
  return ins;
}

bool tile_path(const std::vector<at::Tensor>& ins) {
  return ins[0].device().is_cpu() && ins[0].scalar_type() == at::kFloat;
}

// ---- the unfused ATen reference: every instruction a whole-tensor ATen op.
std::vector<at::Tensor> reference_values(const Program& p, const std::vector<at::Tensor>& ins) {
  std::vector<at::Tensor> v;
  auto get = [&](int64_t o) -> at::Tensor {
    if (o < 0) return at::full({}, p.consts[-o - 1], ins[0].options());
    return o < p.n_inputs ? ins[o] : v[o - p.n_inputs];
  };
  for (const Instr& in : p.code) {
    const at::Tensor a = get(in.a), b = is_unary(in.op) ? a : get(in.b);
    dispatch(in.op, [&](auto tag) { v.push_back(fwd<decltype(tag)::value, at::Tensor>(a, b, in.p)); });
  }
  return v;
}

void fused_elementwise_kernel(KernelCtx& c) {
  const std::vector<at::Tensor> ins = inputs_from(c, 0);
  const Program p = parse(c, static_cast<int64_t>(ins.size()));
  const std::vector<int64_t> shape = out_shape(c, ins);
  if (!tile_path(ins)) return c.set_output(0, reference_values(p, ins).back());
  std::vector<Operand> ops;
  const std::vector<at::Tensor> keep = tile_inputs(ins, shape, ops);
  at::Tensor y = at::empty(shape, ins[0].options());
  float* out = y.data_ptr<float>();
  const int64_t n = y.numel(), cols = shape.empty() ? 1 : std::max<int64_t>(shape.back(), 1);
  const int64_t tiles = (n + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 1, [&](int64_t tb, int64_t te) {
    std::vector<float> buf((p.code.size() + 2) * kTile);
    std::vector<float*> regs;
    for (size_t k = 0; k < p.code.size(); ++k) regs.push_back(buf.data() + k * kTile);
    float* stage_a = buf.data() + p.code.size() * kTile;
    for (int64_t t = tb; t < te; ++t) {
      const int64_t begin = t * kTile, len = std::min(kTile, n - begin);
      regs.back() = out + begin;  // the last instruction writes the output directly
      run_tile(p, ops, regs, stage_a, stage_a + kTile, begin, len, cols);
    }
  });
  c.set_output(0, y);
}

// Which instructions' adjoints matter: those through which a wanted input gradient flows.
std::vector<char> adjoint_needed(const Program& p, const std::vector<char>& want_input) {
  std::vector<char> need(p.code.size(), 0);
  auto flows = [&](int64_t o) {
    return o >= 0 && (o < p.n_inputs ? want_input[o] != 0 : need[o - p.n_inputs] != 0);
  };
  for (size_t k = 0; k < p.code.size(); ++k)
    need[k] = flows(p.code[k].a) || (!is_unary(p.code[k].op) && flows(p.code[k].b));
  return need;
}

// The `join` attribute: input positions whose gradients go side by side along the last dim, in
// this order, into output join[0] (the others' outputs are absent). Each position once, at least
// two, every one of the output's full shape (no broadcast input).
std::vector<int64_t> joined_inputs(const KernelCtx& c, const std::vector<at::Tensor>& ins,
                                   const std::vector<int64_t>& shape) {
  const std::vector<int64_t> join = c.attrs.get_ints("join", {});
  if (join.empty()) return join;
  std::vector<char> seen(ins.size(), 0);
  for (int64_t j : join) {
    if (j < 0 || j >= static_cast<int64_t>(ins.size()) || seen[j])
      c.fail("join " + c10::str(c10::IntArrayRef(join)) + " must name distinct inputs of the " +
             std::to_string(ins.size()));
    seen[j] = 1;
    if (shape.empty() || ins[j].sizes() != at::IntArrayRef(shape))
      c.fail("join: input " + std::to_string(j) + " of shape " + c10::str(ins[j].sizes()) +
             " is not of the output's shape " + c10::str(at::IntArrayRef(shape)) + " (rank 1 or more)");
  }
  if (join.size() < 2) c.fail("join must name two inputs or more, got " + c10::str(c10::IntArrayRef(join)));
  return join;
}

void fused_elementwise_grad_kernel(KernelCtx& c) {
  const std::vector<at::Tensor> ins = inputs_from(c, 1);
  const Program p = parse(c, static_cast<int64_t>(ins.size()));
  const std::vector<int64_t> shape = out_shape(c, ins);
  at::Tensor dy = c.input(0);
  if (dy.sizes() != at::IntArrayRef(shape) || dy.scalar_type() != ins[0].scalar_type())
    c.fail("dY " + c10::str(dy.sizes()) + " must have the output's shape " + c10::str(at::IntArrayRef(shape)) +
           " and the inputs' dtype");
  const std::vector<int64_t> join = joined_inputs(c, ins, shape);
  std::vector<int64_t> join_slot(ins.size(), -1);  // per input: its place in `join`, -1 if none
  for (size_t q = 0; q < join.size(); ++q) join_slot[join[q]] = static_cast<int64_t>(q);
  std::vector<char> want(ins.size(), 0);
  for (size_t i = 0; i < ins.size(); ++i) want[i] = c.output_wanted(static_cast<int>(i)) || join_slot[i] >= 0;
  const std::vector<char> need = adjoint_needed(p, want);
  const size_t last = p.code.size() - 1;

  if (!tile_path(ins) || !dy.device().is_cpu()) {  // reference: ATen ops over whole tensors
    const std::vector<at::Tensor> v = reference_values(p, ins);
    std::vector<at::Tensor> adj(p.code.size());
    std::vector<at::Tensor> gin(ins.size());
    adj[last] = dy;
    auto add_to = [&](int64_t o, const at::Tensor& g) {
      if (o < 0) return;
      at::Tensor& slot = o < p.n_inputs ? gin[o] : adj[o - p.n_inputs];
      if (o < p.n_inputs && !want[o]) return;
      slot = slot.defined() ? slot + g : g;
    };
    for (size_t k = p.code.size(); k-- > 0;) {
      if (!need[k] || !adj[k].defined()) continue;
      const Instr& in = p.code[k];
      const at::Tensor a = in.a < 0 ? at::full({}, p.consts[-in.a - 1], ins[0].options())
                                    : in.a < p.n_inputs ? ins[in.a] : v[in.a - p.n_inputs];
      const at::Tensor b = is_unary(in.op) ? a
                           : in.b < 0      ? at::full({}, p.consts[-in.b - 1], ins[0].options())
                           : in.b < p.n_inputs ? ins[in.b] : v[in.b - p.n_inputs];
      dispatch(in.op, [&](auto tag) {
        constexpr Op op = decltype(tag)::value;
        add_to(in.a, grad_a<op, at::Tensor>(adj[k], a, b, v[k], in.p));
        if constexpr (op <= Op::kDiv && op != Op::kPow)
          if (in.op != Op::kPow) add_to(in.b, grad_b<op, at::Tensor>(adj[k], a, b, v[k]));
      });
    }
    std::vector<at::Tensor> pieces(join.size());
    for (size_t i = 0; i < ins.size(); ++i) {
      if (!want[i]) continue;
      at::Tensor g = gin[i].defined() ? gin[i] : at::zeros(shape, ins[i].options());
      g = g.sizes() == ins[i].sizes() ? g : g.sum_to_size(ins[i].sizes());
      if (join_slot[i] >= 0) pieces[join_slot[i]] = std::move(g);
      else c.set_output(static_cast<int>(i), std::move(g));
    }
    if (!join.empty()) c.set_output(static_cast<int>(join[0]), at::cat(pieces, -1));
    return;
  }

  std::vector<Operand> ops;
  const std::vector<at::Tensor> keep = tile_inputs(ins, shape, ops);
  dy = dy.contiguous();
  const float* dyp = dy.data_ptr<float>();
  const int64_t n = dy.numel(), cols = shape.empty() ? 1 : std::max<int64_t>(shape.back(), 1);
  // The joined gradients, in place: rows of join.size()·cols, piece q at column q·cols. Their
  // tiles then never cross a row, so each piece of a tile is one run of the joint buffer. Rows
  // narrower than kJoinedRowMin would make too many small tiles: those pieces are computed as
  // any gradient and concatenated after.
  const bool in_place = !join.empty() && cols >= kJoinedRowMin;
  const auto placed = [&](size_t i) { return in_place && join_slot[i] >= 0; };
  // Full-shape gradient per wanted input; broadcast ones are summed to their shapes below.
  std::vector<at::Tensor> gfull(ins.size());
  std::vector<float*> gptr(ins.size(), nullptr);
  for (size_t i = 0; i < ins.size(); ++i)
    if (want[i] && !placed(i)) {
      gfull[i] = at::empty(shape, ins[i].options());
      gptr[i] = gfull[i].data_ptr<float>();
    }
  at::Tensor joint;
  if (in_place) {
    std::vector<int64_t> sizes = shape;
    sizes.back() *= static_cast<int64_t>(join.size());
    joint = at::empty(sizes, ins[join[0]].options());
  }
  float* const joint_ptr = joint.defined() ? joint.data_ptr<float>() : nullptr;
  const int64_t joint_ld = cols * static_cast<int64_t>(join.size());
  const int64_t per_row = (cols + kTile - 1) / kTile;  // joined: a row's tiles
  const int64_t tiles = in_place ? n / cols * per_row : (n + kTile - 1) / kTile;
  const size_t nk = p.code.size();
  at::parallel_for(0, tiles, 1, [&](int64_t tb, int64_t te) {
    // regs (nk), adjoints (nk), two staging buffers for operands.
    std::vector<float> buf((2 * nk + 2) * kTile);
    std::vector<float*> regs, adj;
    for (size_t k = 0; k < nk; ++k) regs.push_back(buf.data() + k * kTile);
    for (size_t k = 0; k < nk; ++k) adj.push_back(buf.data() + (nk + k) * kTile);
    float* stage_a = buf.data() + 2 * nk * kTile;
    float* stage_b = stage_a + kTile;
    std::vector<float*> pieces(in_place ? join.size() : 0);  // this tile's run of each joined gradient
    for (int64_t t = tb; t < te; ++t) {
      const int64_t begin = in_place ? t / per_row * cols + t % per_row * kTile : t * kTile;
      const int64_t len = in_place ? std::min(kTile, cols - begin % cols) : std::min(kTile, n - begin);
      run_tile(p, ops, regs, stage_a, stage_b, begin, len, cols);
      for (size_t k = 0; k < nk; ++k)
        if (need[k]) std::fill(adj[k], adj[k] + len, 0.0f);
      std::copy(dyp + begin, dyp + begin + len, adj[last]);
      for (size_t i = 0; i < ins.size(); ++i)
        if (gptr[i]) std::fill(gptr[i] + begin, gptr[i] + begin + len, 0.0f);
      for (size_t q = 0; q < pieces.size(); ++q) {
        pieces[q] = joint_ptr + begin / cols * joint_ld + static_cast<int64_t>(q) * cols + begin % cols;
        std::fill(pieces[q], pieces[q] + len, 0.0f);
      }
      // Where operand o's adjoint accumulates: a register, a gradient output (or its piece), or nowhere.
      auto sink = [&](int64_t o) -> float* {
        if (o < 0) return nullptr;
        if (o < p.n_inputs && placed(o)) return pieces[join_slot[o]];
        if (o < p.n_inputs) return want[o] ? gptr[o] + begin : nullptr;
        return need[o - p.n_inputs] ? adj[o - p.n_inputs] : nullptr;
      };
      for (size_t k = nk; k-- > 0;) {
        if (!need[k]) continue;
        const Instr& in = p.code[k];
        // Operands are fetched again (staged ones were overwritten by later instructions).
        const float* a = fetch(p, ops, regs, in.a, begin, len, cols, stage_a);
        const float* b = is_unary(in.op) ? a : fetch(p, ops, regs, in.b, begin, len, cols, stage_b);
        const float* y = regs[k];
        const float* g = adj[k];
        float* da = sink(in.a);
        float* db = is_unary(in.op) || in.op == Op::kPow ? nullptr : sink(in.b);
        // Erf's derivative needs exp(−a²): vectorised into the free second staging buffer.
        if (in.op == Op::kErf && da && cpu::unary_loop(cpu::UnaryFn::kExpNegSquare, a, stage_b, len)) {
          for (int64_t j = 0; j < len; ++j) da[j] += g[j] * (k2OverSqrtPi * stage_b[j]);
          continue;
        }
        if (db == da && da) {  // the same value on both sides (x·x): add both contributions
          dispatch(in.op, [&](auto tag) {
            constexpr Op op = decltype(tag)::value;
            if constexpr (op <= Op::kDiv && op != Op::kPow)
              for (int64_t j = 0; j < len; ++j)
                da[j] += grad_a<op, float>(g[j], a[j], b[j], y[j], in.p) + grad_b<op, float>(g[j], a[j], b[j], y[j]);
          });
          continue;
        }
        dispatch(in.op, [&](auto tag) {
          constexpr Op op = decltype(tag)::value;
          if (da)
            for (int64_t j = 0; j < len; ++j) da[j] += grad_a<op, float>(g[j], a[j], b[j], y[j], in.p);
          if constexpr (op <= Op::kDiv && op != Op::kPow)
            if (db)
              for (int64_t j = 0; j < len; ++j) db[j] += grad_b<op, float>(g[j], a[j], b[j], y[j]);
        });
      }
    }
  });
  for (size_t i = 0; i < ins.size(); ++i)
    if (gptr[i] && join_slot[i] < 0)
      c.set_output(static_cast<int>(i),
                   gfull[i].sizes() == ins[i].sizes() ? gfull[i] : gfull[i].sum_to_size(ins[i].sizes()));
  if (joint.defined()) {
    c.set_output(static_cast<int>(join[0]), joint);
  } else if (!join.empty()) {  // narrow rows: the pieces (full-shape, joined_inputs checked) concatenated
    std::vector<at::Tensor> parts;
    for (int64_t j : join) parts.push_back(gfull[j]);
    c.set_output(static_cast<int>(join[0]), at::cat(parts, -1));
  }
}

}  // namespace

REGISTER_KERNEL_IN(kOurDomain, "FusedElementwise", fused_elementwise_kernel);
REGISTER_KERNEL_IN(kOurDomain, "FusedElementwiseGrad", fused_elementwise_grad_kernel);

}  // namespace torch_ort::kernels
