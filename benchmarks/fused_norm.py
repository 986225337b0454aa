"""Fused residual-add + LayerNorm (SkipLayerNorm) and bias + dropout + residual (BiasDropout)
kernels against the unfused ATen ops eager PyTorch runs, on the CPU, fp32, at two transformer
shapes: (8·256, 384) (baby GPT) and (32·128, 256) (BERT-mini). Each kernel runs as a one-node graph
through torch_ort._C.Engine (the engine's per-node cost included); the unfused rows are the same
math as direct ATen calls (no engine) and as the unfused graph through the engine (what the model
ran before the fusion). The fused op is timed on both CPU paths: AVX-512 (the loops of
kernels/cpu/layer_norm.cc) and "portable", where the op runs its ATen reference because a portable
scalar loop lost to ATen (0.4-0.8x when it existed) and was removed.
One thread (this machine's 2 cores are shared with builds): per call, the median of --steps·20
single calls after --warmup rounds, both as this thread's CPU time (what the kernel costs, robust
to other processes) and as wall time. glibc's malloc is pinned to its heap (no mmap/trim of large
blocks: the script re-executes itself with MALLOC_* set), otherwise every 3 MiB output of every
variant is page-faulted in anew on each call and the allocator, not the kernel, is measured.
Writes benchmarks/results/fused_norm.{json,md}.

    .venv/bin/python benchmarks/fused_norm.py [--steps 10] [--warmup 3]
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from common import Report, parse_args
from torch_ort import _C

aten = torch.ops.aten
SHAPES = [(8 * 256, 384), (32 * 128, 256)]
CALLS = 20
P = 0.1


MALLOC_ENV = dict(MALLOC_MMAP_THRESHOLD_="4294967295", MALLOC_TRIM_THRESHOLD_="4294967295",
                  MALLOC_TOP_PAD_="67108864")


def medians_ms(fn, steps: int, warmup: int) -> tuple[float, float]:
    """(median CPU ms of this thread, median wall ms) per call."""
    for _ in range(warmup * CALLS):
        fn()
    cpu, wall = [], []
    for _ in range(steps * CALLS):
        c0, w0 = time.thread_time(), time.perf_counter()
        fn()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu) * 1e3, statistics.median(wall) * 1e3


def model(nodes, inputs, outputs) -> bytes:
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "bench", [vi(n, t, s) for n, t, s in inputs], [vi(n, t, s) for n, t, s in outputs])
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.torch_ort", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def engine(nodes, inputs, outputs):
    return _C.Engine(model(nodes, inputs, outputs), False, [False] * len(inputs), [])


FL, BO = TensorProto.FLOAT, TensorProto.BOOL


def cases(rows: int, cols: int):
    """(name, fused engine call, unfused engine call or None, unfused ATen call)."""
    g = torch.Generator().manual_seed(0)
    x, skip, dy, dsum = (torch.randn(rows, cols, generator=g) for _ in range(4))
    gamma, beta, bias = (torch.randn(cols, generator=g) for _ in range(3))
    act, vec, st = [rows, cols], [cols], [rows, 1]
    ln_attrs = dict(axis=-1, epsilon=1e-5)
    out: list = []

    # --- forward: (x + bias) + skip, LayerNorm; outputs Y and the sum (pre-LN keeps it).
    fused = engine([helper.make_node("SkipLayerNorm", ["x", "skip", "g", "b", "bias"], ["y", "m", "r", "s"],
                                     domain="com.torch_ort", epsilon=1e-5)],
                   [("x", FL, act), ("skip", FL, act), ("g", FL, vec), ("b", FL, vec), ("bias", FL, vec)],
                   [("y", FL, act), ("m", FL, st), ("r", FL, st), ("s", FL, act)])
    unfused = engine([helper.make_node("Add", ["x", "bias"], ["xb"]), helper.make_node("Add", ["xb", "skip"], ["s"]),
                      helper.make_node("LayerNormalization", ["s", "g", "b"], ["y", "m", "r"], **ln_attrs)],
                     [("x", FL, act), ("skip", FL, act), ("g", FL, vec), ("b", FL, vec), ("bias", FL, vec)],
                     [("y", FL, act), ("m", FL, st), ("r", FL, st), ("s", FL, act)])
    feeds = [x, skip, gamma, beta, bias]

    def aten_fwd():
        s = (x + bias) + skip
        return aten.native_layer_norm(s, [cols], gamma, beta, 1e-5), s
    out.append(("SkipLayerNorm forward", lambda: fused.forward(feeds), lambda: unfused.forward(feeds), aten_fwd))

    # --- backward: dX (+ dSum), dGamma, dBeta, dBias from the forward's sum and statistics.
    s = (x + bias) + skip
    _, mean, rstd = aten.native_layer_norm(s, [cols], gamma, beta, 1e-5)
    grad = engine([helper.make_node("SkipLayerNormGrad", ["dy", "dsum", "s", "g", "m", "r"],
                                    ["dx", "dg", "db", "dbias"], domain="com.torch_ort")],
                  [("dy", FL, act), ("dsum", FL, act), ("s", FL, act), ("g", FL, vec), ("m", FL, st), ("r", FL, st)],
                  [("dx", FL, act), ("dg", FL, vec), ("db", FL, vec), ("dbias", FL, vec)])
    gfeeds = [dy, dsum, s, gamma, mean, rstd]

    def aten_bwd():  # what autograd runs for LN + the residual fan-out + the bias
        dx, dg, db = aten.native_layer_norm_backward(dy, s, [cols], mean, rstd, gamma, beta, [True] * 3)
        dx = dx + dsum
        return dx, dg, db, dx.sum(0)
    out.append(("SkipLayerNorm backward", lambda: grad.forward(gfeeds), None, aten_bwd))

    # --- BiasDropout: dropout(x + bias) + residual, training, p = 0.1 (the RNG draw included).
    ratio, mode = torch.tensor(P), torch.tensor(True)
    bd = engine([helper.make_node("BiasDropout", ["x", "bias", "res", "p", "t"], ["y", "mask"],
                                  domain="com.torch_ort")],
                [("x", FL, act), ("bias", FL, vec), ("res", FL, act), ("p", FL, []), ("t", BO, [])],
                [("y", FL, act), ("mask", BO, act)])
    bd_unfused = engine([helper.make_node("Add", ["x", "bias"], ["xb"]),
                         helper.make_node("Dropout", ["xb", "p", "t"], ["d", "mask"]),
                         helper.make_node("Add", ["d", "res"], ["y"])],
                        [("x", FL, act), ("bias", FL, vec), ("res", FL, act), ("p", FL, []), ("t", BO, [])],
                        [("y", FL, act), ("mask", BO, act)])
    bfeeds = [x, bias, skip, ratio, mode]
    out.append(("BiasDropout forward", lambda: bd.forward(bfeeds), lambda: bd_unfused.forward(bfeeds),
                lambda: F.dropout(x + bias, P, training=True) + skip))
    return out


def main():
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_ENV})
    args = parse_args(__doc__)
    torch.set_num_threads(1)
    rep = Report("fused_norm")
    paths = ["avx512", "portable"] if _C.optim_cpu_path() == "avx512" else ["portable"]
    rep.out("# Fused LayerNorm / dropout kernels vs unfused ATen (CPU fp32, 1 thread)\n")
    rep.out("Median ms per call, CPU time (wall time in brackets); ratio = unfused ATen CPU time / fused "
            "CPU time (> 1: the fused kernel is faster). Fused and unfused-engine rows include the engine's "
            "per-call cost; BiasDropout includes the random draw (bernoulli), the same in every variant.\n")
    rep.out("| shape | op | " + " | ".join(f"fused {p}" for p in paths) + " | unfused via engine | unfused ATen | "
            + " | ".join(f"ratio {p}" for p in paths) + " |")
    rep.out("|---|---|" + "---|" * (2 * len(paths) + 2))
    rows = []
    fmt = lambda cw: "-" if cw is None else f"{cw[0]:.3f} ({cw[1]:.3f})"  # noqa: E731
    with torch.no_grad():
        for shape in SHAPES:
            for name, fused, unfused, ref in cases(*shape):
                fused_ms = {}
                for p in paths:
                    _C.set_optim_cpu_path(p)
                    fused_ms[p] = medians_ms(fused, args.steps, args.warmup)
                _C.set_optim_cpu_path("auto")
                eng = medians_ms(unfused, args.steps, args.warmup) if unfused else None
                at = medians_ms(ref, args.steps, args.warmup)
                ratio = {p: at[0] / fused_ms[p][0] for p in paths}
                rows.append(dict(shape=list(shape), op=name, fused_cpu_wall_ms=fused_ms, unfused_engine_cpu_wall_ms=eng,
                                 unfused_aten_cpu_wall_ms=at, ratio_vs_aten=ratio))
                rep.out(f"| {shape[0]}x{shape[1]} | {name} | " + " | ".join(fmt(fused_ms[p]) for p in paths) +
                        f" | {fmt(eng)} | {fmt(at)} | " + " | ".join(f"{ratio[p]:.2f}x" for p in paths) + " |")
    rep.save(dict(threads=1, calls_per_step=CALLS, steps=args.steps, malloc_env=MALLOC_ENV, rows=rows))


if __name__ == "__main__":
    main()
