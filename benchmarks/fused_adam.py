"""AdamW over GPT-2-small-sized fp32 parameters (~124M): torch_ort.optim.FusedAdam against
torch.optim.AdamW (default, foreach=True, fused=True), with the memory-bandwidth floor measured in
the same run: a STREAM-like triad (a = b + s·c over arrays far larger than the caches) gives the
bandwidth, and one AdamW step must move 28 bytes per fp32 parameter (read p, g, m, v; write p, m, v).
Medians of --steps steps after --warmup. Writes benchmarks/results/fused_adam.json and prints a
markdown table.

    .venv/bin/python benchmarks/fused_adam.py [--steps 10] [--warmup 3]
"""
from __future__ import annotations

import ctypes
import os
import statistics
import subprocess
import tempfile
import time

import torch

from common import Report, parse_args
from torch_ort.optim import AdamWMode, FusedAdam



def gpt2_small_shapes():
    """GPT-2 small's parameter shapes: 124.4M parameters in 148 tensors."""
    d, layers = 768, 12
    shapes = [(50257, d), (1024, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,),
                   (4 * d, d), (d,)]
    return shapes + [(d,), (d,)]


def build_triad():
    """A callable running triad.c (a = b + s·c on torch's thread count) once on 3 × 512 MiB fp32
    arrays; .bytes is what it moves, 12 bytes per element as STREAM counts."""
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        lib_path = os.path.join(tmp, "triad.so")
        subprocess.run(["gcc", "-O3", "-march=native", "-pthread", "-shared", "-fPIC",
                        os.path.join(here, "triad.c"), "-o", lib_path], check=True)
        lib = ctypes.CDLL(lib_path)
    lib.triad.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_float, ctypes.c_int64, ctypes.c_int]
    n = 128 * 1024 * 1024
    a, b, c = torch.zeros(n), torch.rand(n), torch.rand(n)

    def run():
        lib.triad(a.data_ptr(), b.data_ptr(), c.data_ptr(), 3.0, n, torch.get_num_threads())
    run.bytes = 3 * 4 * n
    return run


def main() -> None:
    args = parse_args(__doc__)
    report = Report("fused_adam")
    out = report.out
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in gpt2_small_shapes()]
    for p in params:
        p.grad = torch.randn(p.shape) * 1e-3
    numel = sum(p.numel() for p in params)

    triad = build_triad()
    variants = {
        "torch AdamW (default)": lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01),
        "torch AdamW foreach=True": lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01, foreach=True),
        "torch AdamW fused=True": lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01, fused=True),
        "torch_ort FusedAdam (ADAMW_TORCH)": lambda ps: FusedAdam(ps, lr=1e-4, weight_decay=0.01,
                                                                  adam_w_mode=AdamWMode.ADAMW_TORCH),
    }
    steps = {name: make(params).step for name, make in variants.items()}
    steps["triad"] = triad
    # Round robin: every round times each variant once, so that drift in the machine's speed (a
    # shared host) reaches all of them alike; medians over rounds.
    times = {name: [] for name in steps}
    for r in range(args.warmup + args.steps):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            if r >= args.warmup:
                times[name].append(time.perf_counter() - start)
    rows = {name: {"median_s": statistics.median(ts), "times_s": ts} for name, ts in times.items()}
    triad_s = rows.pop("triad")["median_s"]
    # STREAM counts 12 bytes per triad element; the processor also reads `a` before writing it
    # (write-allocate), 16 bytes in all. An AdamW step writes only what it has read (p, m, v), so
    # the 16-byte bandwidth is the one its 28 bytes per parameter move at: that floor is the fair
    # one, the 12-byte one a looser bound reported beside it.
    bandwidth = triad.bytes / triad_s
    floor = 28 * numel / (bandwidth * 16 / 12)
    floor_stream = 28 * numel / bandwidth
    fused = rows["torch AdamW fused=True"]["median_s"]
    ours = rows["torch_ort FusedAdam (ADAMW_TORCH)"]["median_s"]
    result = {
        "cpu_path": __import__("torch_ort")._C.optim_cpu_path(),
        "parameters": numel, "steps": args.steps, "warmup": args.warmup,
        "triad_GBps_stream_count": bandwidth / 1e9, "triad_GBps_with_write_allocate": bandwidth * 16 / 12 / 1e9,
        "floor_s": floor, "floor_stream_count_s": floor_stream, "variants": rows,
        "fused_adam_vs_torch_fused": fused / ours, "fused_adam_vs_floor": ours / floor,
    }
    out(f"AdamW step over {numel / 1e6:.1f}M fp32 parameters, medians of {args.steps} rounds after "
        f"{args.warmup}; triad {bandwidth * 16 / 12 / 1e9:.1f} GB/s with write-allocate "
        f"({bandwidth / 1e9:.1f} GB/s as STREAM counts): floor {floor * 1e3:.0f} ms "
        f"({floor_stream * 1e3:.0f} ms) for 28 B/parameter")
    out("| optimizer | median step | vs torch fused=True | vs bandwidth floor |")
    out("|---|---|---|---|")
    for name, r in rows.items():
        out(f"| {name} | {r['median_s'] * 1e3:.0f} ms | {fused / r['median_s']:.2f}× | "
            f"{r['median_s'] / floor:.2f}× floor |")
    report.save(result)


if __name__ == "__main__":
    main()
