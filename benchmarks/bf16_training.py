"""A full training step of a baby GPT (6 layers, 6 heads, width 384, context 256, batch 8; nanoGPT's
Shakespeare-char size) under torch.autocast("cpu", bfloat16): ORTModule + FusedAdam against eager
PyTorch + AdamW, with eager fp32 beside them for scale. All variants live in one process and are
timed round robin (each round runs one step of each), so drift on a shared machine reaches all
alike; medians over rounds after warm-up. Writes benchmarks/results/bf16_training.json and prints a
markdown table.

    .venv/bin/python benchmarks/bf16_training.py [--steps 10] [--warmup 3]
"""
from __future__ import annotations

import contextlib
import copy
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import model_zoo  # noqa: E402
from common import Report, parse_args  # noqa: E402
from torch_ort import ORTModule  # noqa: E402
from torch_ort.optim import AdamWMode, FusedAdam  # noqa: E402

CONFIG = dict(vocab=65, width=384, heads=6, layers=6, positions=256)
BATCH, CONTEXT = 8, 256


def variant(model, opt, bf16: bool):
    def step(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return step


def main() -> None:
    args = parse_args(__doc__)
    report = Report("bf16_training")
    out = report.out
    torch.manual_seed(0)
    base = model_zoo.NanoGPT(**CONFIG)
    models = {name: copy.deepcopy(base) for name in ("ours", "eager", "eager_fused", "fp32")}
    ours = ORTModule(models["ours"])
    lr = 3e-4
    steps = {
        "ORTModule + FusedAdam, bf16 autocast": variant(
            ours, FusedAdam(ours.parameters(), lr=lr, weight_decay=0.1, adam_w_mode=AdamWMode.ADAMW_TORCH), True),
        "eager + AdamW, bf16 autocast": variant(
            models["eager"], torch.optim.AdamW(models["eager"].parameters(), lr=lr, weight_decay=0.1), True),
        "eager + AdamW(fused=True), bf16 autocast": variant(
            models["eager_fused"], torch.optim.AdamW(models["eager_fused"].parameters(), lr=lr,
                                                     weight_decay=0.1, fused=True), True),
        "eager + AdamW, fp32": variant(
            models["fp32"], torch.optim.AdamW(models["fp32"].parameters(), lr=lr, weight_decay=0.1), False),
    }
    gen = torch.Generator().manual_seed(1)
    times = {name: [] for name in steps}
    losses = {name: [] for name in steps}
    for r in range(args.warmup + args.steps):
        (x, y), _ = model_zoo.nanogpt_batch(BATCH, CONTEXT, gen)
        x, y = x % CONFIG["vocab"], y % CONFIG["vocab"]
        for name, step in steps.items():
            start = time.perf_counter()
            losses[name].append(step(x, y))
            if r >= args.warmup:
                times[name].append(time.perf_counter() - start)
    rows = {name: {"median_s": statistics.median(ts), "times_s": ts, "losses": losses[name]}
            for name, ts in times.items()}
    baseline = rows["eager + AdamW, bf16 autocast"]["median_s"]
    result = {
        "config": dict(CONFIG, batch=BATCH, context=CONTEXT), "steps": args.steps, "warmup": args.warmup,
        "variants": rows,
        "speedup_vs_eager_bf16": baseline / rows["ORTModule + FusedAdam, bf16 autocast"]["median_s"],
    }
    tokens = BATCH * CONTEXT
    out(f"baby GPT training step ({sum(p.numel() for p in base.parameters()) / 1e6:.1f}M parameters, "
        f"{tokens} tokens); medians of {args.steps} rounds after {args.warmup}")
    out("| variant | median step | tokens/s | vs eager bf16 | loss at last step |")
    out("|---|---|---|---|---|")
    for name, row in rows.items():
        out(f"| {name} | {row['median_s'] * 1e3:.0f} ms | {tokens / row['median_s']:.0f} | "
            f"{baseline / row['median_s']:.2f}× | {row['losses'][-1]:.4f} |")
    report.save(result)


if __name__ == "__main__":
    main()
