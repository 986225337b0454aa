"""Partial acceleration: a GPT with one data-dependent branch, which no graph capture can take
whole, trained by eager PyTorch, torch.compile (which breaks the graph at the branch) and ORTModule
(which runs the model's forward eagerly and its largest capturable submodules in the engine).

The model is nanoGPT at the suite's "baby" size (6 blocks of width 384, context 256, vocab 65,
batch 8) with the branch placed by --where: "loop" (one block rescales its residual stream when
it grows), "top" or "bottom" (a rescaling module after the embeddings or before the final norm).
Each variant runs in its own process with cold caches (common.run_watched): the first step timed
alone (export or compilation included),
then the median of --steps full steps (forward, backward, AdamW) after --warmup; the last loss (all
variants train the same model from the same seed on the same batches). For ORTModule also where
each submodule runs and the share of the step's FLOPs (torch.utils.flop_counter, forward and
backward, counted in eager) spent in the submodules that run in the engine.
"ortmodule" runs with ORTMODULE_EXPORT_DECISIONS_FROM_VALUES=0 (partial acceleration);
"ortmodule_whole" is the default, where the branch's decision is taken from the values and checked
on every call, and the model exports whole (one export per outcome the training meets).
Writes benchmarks/results/partial.{json,md}.

    .venv/bin/python benchmarks/partial.py [--where loop,top,bottom] [--steps 10] [--warmup 3]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import warnings

import torch
from torch.utils.flop_counter import FlopCounterMode

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))
import model_zoo  # noqa: E402
from common import Report, cpu_model, machine, run_watched  # noqa: E402
from torch_ort import ORTModule, ORTModuleFallbackWarning  # noqa: E402

GPT = dict(vocab=65, width=384, heads=6, layers=6, positions=256)
BATCH, CONTEXT = 8, 256
VARIANTS = ("eager", "compile", "ortmodule", "ortmodule_whole")


def batches(n: int):
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        data = torch.randint(0, GPT["vocab"], (BATCH, CONTEXT + 1), generator=gen)
        out.append((data[:, :-1].contiguous(), data[:, 1:].contiguous()))
    return out


def flop_share(model, engine_names) -> tuple[float, int]:
    counter = FlopCounterMode(display=False)
    idx, targets = batches(1)[0]
    with counter:
        model(idx, targets).backward()
    model.zero_grad(set_to_none=True)
    counts = counter.get_flop_counts()
    total = sum(counts["Global"].values())
    root = type(model).__name__
    inside = sum(sum(counts[f"{root}.{n}"].values()) for n in engine_names)
    return inside / total, total


def run(variant: str, where: str, steps: int, warmup: int) -> dict:
    torch.manual_seed(0)
    base = model_zoo.BranchyGPT(where, **GPT)
    model = copy.deepcopy(base)
    if variant == "compile":
        model = torch.compile(model)
    elif variant == "ortmodule":
        # Partial acceleration is what is measured: the branch's decision taken from values
        # (ORTMODULE_EXPORT_DECISIONS_FROM_VALUES, on by default) would export the model whole.
        os.environ["ORTMODULE_EXPORT_DECISIONS_FROM_VALUES"] = "0"
        model = ORTModule(model)
    elif variant == "ortmodule_whole":  # the default: the decision taken from values, checked each call
        model = ORTModule(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = batches(1 + warmup + steps)
    times, loss = [], None
    for i, (idx, targets) in enumerate(data):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    row = {"first_step_s": times[0], "median_step_s": statistics.median(times[1 + warmup:]),
           "last_loss": loss.item()}
    if variant == "ortmodule":
        status = model.fallback
        row["submodules"] = [[s.name, s.runs] for s in status.submodules]
        row["engine_flop_share"], row["step_flops"] = flop_share(base, status.engine_submodules)
    elif variant == "ortmodule_whole":
        if model.fallback is not None:
            raise SystemExit(f"ortmodule_whole fell back: {model.fallback}")
        st = model.stats()
        row.update(engine_flop_share=1.0, exports=st["exports"], decisions=st["decisions"],
                   decision_flips=st["decision_flips"])
    return row


POLICY = {"ORTMODULE_FALLBACK_POLICY": "FALLBACK_UNSUPPORTED_TORCH_MODEL"}  # the branch, nothing else


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--where", default="loop,top,bottom")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("WHERE", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        warnings.simplefilter("ignore", ORTModuleFallbackWarning)
        print("RESULT " + json.dumps(run(args.child[1], args.child[0], args.steps, args.warmup)))
        return
    report = Report("partial")
    report.out("# Partial acceleration: a GPT with one data-dependent branch (CPU fp32)\n")
    report.out(f"{time.strftime('%Y-%m-%d')}, {cpu_model()}, {machine()}.\n")
    report.out(f"nanoGPT {GPT['layers']}x{GPT['width']}, context {CONTEXT}, batch {BATCH}, AdamW; "
               f"median of {args.steps} steps after {args.warmup}; ratio = eager step time / the "
               "variant's (> 1: faster than eager).\n")
    report.out("| branch at | variant | first step (s) | median step (s) | × eager | last loss | FLOPs in the engine |")
    report.out("|---|---|---|---|---|---|---|")
    result = {"model": dict(GPT, batch=BATCH, context=CONTEXT), "steps": args.steps,
              "warmup": args.warmup, "cases": {}}
    for where in args.where.split(","):
        rows = {}
        for v in VARIANTS:
            rows[v] = run_watched(os.path.abspath(__file__),
                                  ["--child", where, v, "--steps", str(args.steps), "--warmup", str(args.warmup)],
                                  max_rss_gb=16, timeout_s=1800, env_extra=POLICY)
            if "error" in rows[v]:
                raise SystemExit(f"{where} {v}: {rows[v]['error']}\n{rows[v]['log_tail']}")
        result["cases"][where] = rows
        for v in VARIANTS:
            r = rows[v]
            share = f"{r['engine_flop_share']:.1%}" if "engine_flop_share" in r else ""
            report.out(f"| {where} | {v} | {r['first_step_s']:.2f} | {r['median_step_s']:.3f} | "
                       f"{rows['eager']['median_step_s'] / r['median_step_s']:.2f} | "
                       f"{r['last_loss']:.4f} | {share} |")
    report.out("")
    for where, rows in result["cases"].items():
        split = rows["ortmodule"]["submodules"]
        whole = rows["ortmodule_whole"]
        report.out(f"- {where}: ortmodule: in the engine: {', '.join(n for n, r in split if r == 'engine')}; "
                   f"eager: {', '.join(n for n, r in split if r != 'engine') or 'nothing else'}. ortmodule_whole: "
                   f"{whole['decisions']} decision check(s), {whole['exports']} export(s), "
                   f"{whole['decision_flips']} flip(s)")
    report.save(result)


if __name__ == "__main__":
    main()
