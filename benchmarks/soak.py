"""The soak benchmark: does memory stay flat over a long run?

Each variant runs in its own process (common.run_watched) and samples its resident set size (RSS)
every --every steps:
  eager      nanoGPT "tiny" (benchmarks/suite.py) with torch.optim.AdamW, --steps steps
  ortmodule  the same model through ORTModule with torch_ort's FusedAdam, --steps steps
  churn      ORTModule whose input schema changes every step (a float argument cycling through
             --schemas values, each one a new export and engine), --churn-steps steps: the plan
             cache (ORTMODULE_MAX_CACHED_GRAPHS) must keep memory bounded while it evicts
Drift = RSS at the end − RSS after the warm-up (--settle steps; allocator pools and the first
exports fill up there), and the least-squares slope over the samples after the warm-up, in MiB
per 1,000 steps. Also the run contexts alive at the end (torch_ort._C.live_runs: 0 expected).
Writes benchmarks/results/soak.{json,md,png}.

    .venv/bin/python benchmarks/soak.py [--steps 2000] [--churn-steps 300]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import cpu_model, machine, run_watched, write_results  # noqa: E402

VARIANTS = {"eager": "eager + AdamW", "ortmodule": "ORTModule + FusedAdam",
            "churn": "ORTModule, new input schema every step"}


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(args) -> dict:
    import torch

    import suite
    torch.manual_seed(0)
    model, make_batch, loss_of, _ = suite.build(dict(suite.CASES["tiny"]))
    params = list(model.parameters())
    steps, variant = args.steps, args.child
    call = model
    if variant == "eager":
        opt = torch.optim.AdamW(params, lr=1e-4)
    else:
        from torch_ort import ORTModule
        from torch_ort.optim import FusedAdam
        opt = FusedAdam(params, lr=1e-4)
        if variant == "churn":
            steps = args.churn_steps

            class Scaled(torch.nn.Module):
                """The schema includes non-tensor arguments' values: each temperature re-exports."""

                def __init__(self, inner):
                    super().__init__()
                    self.inner = inner

                def forward(self, idx, targets, temperature: float):
                    logits, _ = self.inner(idx)
                    return torch.nn.functional.cross_entropy(
                        (logits / temperature).flatten(0, 1), targets.flatten())
            model = Scaled(model)
            call = ORTModule(model)
            loss_of = lambda out: out  # noqa: E731
        else:
            call = ORTModule(model)
    gen = torch.Generator().manual_seed(0)
    samples, start = [], time.perf_counter()
    for step in range(steps):
        (args_, kwargs) = make_batch(gen)
        if variant == "churn":
            kwargs = dict(kwargs, temperature=1.0 + (step % args.schemas) / 100)
        loss = loss_of(call(*args_, **kwargs))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % args.every == 0 or step == 0:
            samples.append([step + 1, _rss_mib(), time.perf_counter() - start])
    result = {"samples": samples, "steps": steps, "last_loss": float(loss)}
    if variant != "eager":
        import torch_ort
        del loss
        result["live_runs_at_end"] = list(torch_ort._C.live_runs())
        result["exports"] = call.export_count
        result["cached_graphs"] = len(call._runners)
    return result


def drift(samples: list, settle: int) -> dict:
    after = [(s, r) for s, r, _ in samples if s >= settle]
    if len(after) < 2:
        return {}
    xs, ys = [s for s, _ in after], [r for _, r in after]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(sum((x - mx) ** 2 for x in xs), 1)
    return {"rss_settled_mib": ys[0], "rss_end_mib": ys[-1], "rss_max_mib": max(ys),
            "drift_mib": ys[-1] - ys[0], "drift_pct": 100 * (ys[-1] - ys[0]) / ys[0],
            "slope_mib_per_1000_steps": slope * 1000, "from_step": xs[0], "to_step": xs[-1]}


def markdown(result: dict) -> list[str]:
    lines = [f"# Soak: RSS over a long run ({result['date']})", "",
             f"{result['machine']}; {result['cpu']}. tiny nanoGPT (suite.py), RSS sampled every "
             f"{result['every']} steps, drift measured after step {result['settle']}.", "",
             "| variant | steps | RSS after warm-up (MiB) | RSS at end (MiB) | drift (MiB) | drift | "
             "slope (MiB / 1,000 steps) | run contexts alive at end | exports | wall (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, row in result["variants"].items():
        if "error" in row:
            lines.append(f"| {VARIANTS[name]} | error: {row['error']} |")
            continue
        d = row["drift"]
        live = row.get("live_runs_at_end")
        lines.append(f"| {VARIANTS[name]} | {row['steps']} | {d['rss_settled_mib']:.0f} | "
                     f"{d['rss_end_mib']:.0f} | {d['drift_mib']:+.1f} | {d['drift_pct']:+.1f}% | "
                     f"{d['slope_mib_per_1000_steps']:+.1f} | {live if live is not None else '—'} | "
                     f"{row.get('exports', '—')} | {row['wall_s']:.0f} |")
    churn = result["variants"].get("churn", {})
    if "cached_graphs" in churn:
        lines += ["", f"Churn: {churn['exports']} exports over {churn['steps']} steps cycling "
                  f"{result['schemas']} schemas; {churn['cached_graphs']} graphs cached at the end "
                  f"(ORTMODULE_MAX_CACHED_GRAPHS={result['max_cached_graphs']})."]
    return lines


def chart(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, row in result["variants"].items():
        if "samples" in row:
            ax = axes[1] if name == "churn" else axes[0]
            ax.plot([s for s, _, _ in row["samples"]], [r for _, r, _ in row["samples"]], label=VARIANTS[name])
    for ax, title in zip(axes, ("steady training", "a new input schema every step")):
        ax.set_xlabel("step"), ax.set_ylabel("RSS (MiB)"), ax.set_title(title), ax.legend()
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--churn-steps", type=int, default=300)
    parser.add_argument("--schemas", type=int, default=48, help="distinct schemas the churn cycles")
    parser.add_argument("--every", type=int, default=50, help="RSS sample period (steps)")
    parser.add_argument("--settle", type=int, default=200, help="warm-up steps before drift counts")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    from torch_ort.ortmodule.policy.variables import Settings
    result = {"every": args.every, "settle": args.settle, "schemas": args.schemas,
              "max_cached_graphs": getattr(Settings.from_env(), "max_cached_graphs", None),
              "cpu": cpu_model(), "machine": machine(), "date": time.strftime("%Y-%m-%d"),
              "variants": {}}
    for name in args.variants.split(","):
        argv = ["--child", name, "--steps", str(args.steps), "--churn-steps", str(args.churn_steps),
                "--schemas", str(args.schemas), "--every", str(args.every)]
        row = run_watched(os.path.abspath(__file__), argv, max_rss_gb=8, timeout_s=3600)
        if "samples" in row:
            settle = args.settle if name != "churn" else min(args.settle, row["steps"] // 3)
            row["drift"] = drift(row["samples"], settle)
        result["variants"][name] = row
        print(name, json.dumps({k: v for k, v in row.items() if k != "samples"}), flush=True)
    for line in write_results(result, args.out, "soak", markdown, chart):
        print(line)


if __name__ == "__main__":
    main()
