"""Fused elementwise kernels against their unfused ATen references, on this machine's CPU.

    .venv/bin/python benchmarks/fused_kernels.py [--reps 50] [--threads N]

Writes benchmarks/results/fused_kernels.{json,md}: median wall time per call (ms) and the ratio
reference / fused (> 1: the fused kernel is faster), for
  * BiasGelu (gelu(x + b), one pass) vs eager F.gelu(x + b) (two passes), and BiasGeluGrad vs
    aten.gelu_backward(dy, x + b), on (8·256, 1536) (baby GPT's MLP) and (12·64, 512) (tiny GPT's),
    both approximations, on each CPU path (AVX-512 / portable);
  * FusedElementwise running GPT-2's decomposed gelu_new (8 ops) vs the 8 eager ops, forward and
    backward (autograd of the eager ops);
and the accuracy of BiasGelu over x in [-10, 10] (max |error| against float64 GELU) for ours and for
ATen's fp32 kernel. Fused kernels run through a one-node torch_ort._C.Engine (a few µs of dispatch
included); the unfused "engine" rows run Add + Gelu through the same engine for a like-for-like
comparison.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cpu_model  # noqa: E402
from op_table import OURS, Case, single_node_model  # noqa: E402
from op_table.fused import GELU_NEW, program_grads, run_program  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from torch_ort import _C  # noqa: E402

aten = torch.ops.aten
SHAPES = {"baby_gpt_mlp": (8 * 256, 1536), "tiny_gpt_mlp": (12 * 64, 512)}


def median_ms(fn, reps):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def one_node(op, inputs, attrs, out_like, n_out=1):
    case = Case(op, inputs, None, attrs=attrs, domain=OURS, n_out=n_out)
    model, feeds = single_node_model(case, out_like)
    engine = _C.Engine(model, False, [False] * len(feeds))
    return lambda: engine.forward(feeds)[0]


def add_gelu_engine(x, b, approx):
    """Add + Gelu (ONNX ops, ATen kernels) through the engine: the unfused graph the pass rewrites."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Add", ["x", "b"], ["z"]), helper.make_node("Gelu", ["z"], ["y"], approximate=approx)]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, list(x.shape)),
                                           vi("b", TensorProto.FLOAT, list(b.shape))],
                              [vi("y", TensorProto.FLOAT, list(x.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    engine = _C.Engine(model.SerializeToString(), False, [False, False])
    return lambda: engine.forward([x, b])[0]


def bias_gelu_rows(reps, paths):
    rows = []
    gen = torch.Generator().manual_seed(0)
    for shape_name, (n, c) in SHAPES.items():
        x, b, dy = (torch.randn(n, c, generator=gen), torch.randn(c, generator=gen), torch.randn(n, c, generator=gen))
        for approx in ("none", "tanh"):
            eager_f = median_ms(lambda: F.gelu(x + b, approximate=approx), reps)
            eager_b = median_ms(lambda: aten.gelu_backward(dy, x + b, approximate=approx), reps)
            engine_f = median_ms(add_gelu_engine(x, b, approx), reps)
            for path in paths:
                _C.set_optim_cpu_path(path)
                y = F.gelu(x + b, approximate=approx)
                fused_f = median_ms(one_node("BiasGelu", [x, b], dict(approximate=approx), [y]), reps)
                fused_b = median_ms(one_node("BiasGeluGrad", [dy, x, b], dict(approximate=approx), [y]), reps)
                label = path if path == "avx512" else "no AVX-512: ATen reference"
                if path == "avx512" and approx == "none" and n * c < (1 << 20):
                    label = "avx512 (exact below 1M elements: ATen reference)"
                rows.append(dict(kernel="BiasGelu", shape=shape_name, dims=[n, c], approximate=approx, path=label,
                                 fused_fwd_ms=fused_f, eager_fwd_ms=eager_f, engine_unfused_fwd_ms=engine_f,
                                 fused_bwd_ms=fused_b, eager_bwd_ms=eager_b,
                                 fwd_ratio=eager_f / fused_f, bwd_ratio=eager_b / fused_b))
            _C.set_optim_cpu_path("auto")
    return rows


def chain_rows(reps):
    rows = []
    gen = torch.Generator().manual_seed(1)
    for shape_name, (n, c) in SHAPES.items():
        x, dy = torch.randn(n, c, generator=gen), torch.randn(n, c, generator=gen)
        y = run_program(GELU_NEW, x)
        fused_f = median_ms(one_node("FusedElementwise", [x], GELU_NEW, [y]), reps)
        fused_b = median_ms(one_node("FusedElementwiseGrad", [dy, x], GELU_NEW, [x]), reps)
        eager_f = median_ms(lambda: run_program(GELU_NEW, x), reps)
        eager_b = median_ms(lambda: program_grads(GELU_NEW)(dy, x), reps)
        rows.append(dict(kernel="FusedElementwise(gelu_new, 8 ops)", shape=shape_name, dims=[n, c], path="tile loop",
                         fused_fwd_ms=fused_f, eager_fwd_ms=eager_f, fused_bwd_ms=fused_b,
                         eager_bwd_ms=eager_b, fwd_ratio=eager_f / fused_f, bwd_ratio=eager_b / fused_b))
    return rows


def accuracy(paths):
    x = torch.linspace(-10, 10, (1 << 20) + 1).reshape(1, -1)  # >= 1M: the exact form runs the loop too
    dy = torch.ones_like(x)
    out = []
    for path in paths:
        _C.set_optim_cpu_path(path)
        for approx in ("none", "tanh"):
            y64 = F.gelu(x.double(), approximate=approx)
            g64 = aten.gelu_backward(dy.double(), x.double(), approximate=approx)
            y_aten, g_aten = F.gelu(x, approximate=approx), aten.gelu_backward(dy, x, approximate=approx)
            y_ours = one_node("BiasGelu", [x], dict(approximate=approx), [y_aten])()[0]
            g_ours = one_node("BiasGeluGrad", [dy, x], dict(approximate=approx), [g_aten])()[0]
            err = lambda a, ref: (a.double() - ref).abs().max().item()  # noqa: E731
            out.append(dict(path=path, approximate=approx, fwd_ours=err(y_ours, y64), fwd_aten=err(y_aten, y64),
                            bwd_ours=err(g_ours, g64), bwd_aten=err(g_aten, g64),
                            fwd_ours_vs_aten=err(y_ours, y_aten.double()), bwd_ours_vs_aten=err(g_ours, g_aten.double())))
    _C.set_optim_cpu_path("auto")
    return out


def markdown(result):
    lines = [f"# Fused elementwise kernels vs unfused ATen ({result['date']}, {result['machine']}, "
             f"{result['threads']} threads)", "",
             "Median ms per call; ratio = eager / fused (> 1: fused faster).", "",
             "| kernel | shape | approx | path | fwd fused | fwd eager | fwd ratio | bwd fused | bwd eager | bwd ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["timings"]:
        lines.append(f"| {r['kernel']} | {r['shape']} {tuple(r['dims'])} | {r.get('approximate', 'tanh')} | {r['path']} | "
                     f"{r['fused_fwd_ms']:.3f} | {r['eager_fwd_ms']:.3f} | {r['fwd_ratio']:.2f} | "
                     f"{r['fused_bwd_ms']:.3f} | {r['eager_bwd_ms']:.3f} | {r['bwd_ratio']:.2f} |")
    lines += ["", "Accuracy over x in [-10, 10] (max |error| against float64 GELU / GELU'):", "",
              "| path | approx | fwd ours | fwd ATen fp32 | bwd ours | bwd ATen fp32 | fwd ours−ATen | bwd ours−ATen |",
              "|---|---|---|---|---|---|---|---|"]
    for a in result["accuracy"]:
        lines.append(f"| {a['path']} | {a['approximate']} | {a['fwd_ours']:.2e} | {a['fwd_aten']:.2e} | "
                     f"{a['bwd_ours']:.2e} | {a['bwd_aten']:.2e} | {a['fwd_ours_vs_aten']:.2e} | {a['bwd_ours_vs_aten']:.2e} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    paths = ["avx512", "portable"] if _C.optim_cpu_path() == "avx512" else ["portable"]
    result = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  machine=cpu_model(), threads=torch.get_num_threads(),
                  torch=torch.__version__, reps=args.reps,
                  timings=bias_gelu_rows(args.reps, paths) + chain_rows(args.reps), accuracy=accuracy(paths))
    out = os.path.join(ROOT, "benchmarks", "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "fused_kernels.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    md = markdown(result)
    with open(os.path.join(out, "fused_kernels.md"), "w") as fh:
        fh.write(md)
    print(md)


if __name__ == "__main__":
    main()
