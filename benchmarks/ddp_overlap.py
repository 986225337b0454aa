"""The overlap benchmark: a 2-process DistributedDataParallel step (gloo, this machine's
cores split between the ranks) for eager PyTorch and ORTModule with gradient release off
(ORTMODULE_GRADIENT_RELEASE=0: every gradient reaches DDP when the engine's backward ends) and on
(the default: in groups of >= 1 MiB as soon as they are final), each in its own torchrun launch.

Per variant: median step and backward time (the slower rank's), when the first parameter
gradient and the first all-reduce bucket arrive as a share of backward, and the order gradients
arrive in. Writes benchmarks/results/ddp_overlap.{json,md,png}.

    .venv/bin/python benchmarks/ddp_overlap.py [--cases tiny,baby] [--steps 10] [--warmup 3]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import busy_cores, cpu_model, machine, write_results  # noqa: E402

VARIANTS = {  # name -> (label, engine, environment)
    "eager": ("eager DDP", "eager", {}),
    "ort_at_end": ("ORTModule DDP, gradients at the end", "ort", {"ORTMODULE_GRADIENT_RELEASE": "0"}),
    "ort_release": ("ORTModule DDP, gradient release", "ort", {}),
}
CASES = {"tiny": "tiny GPT", "baby": "baby GPT"}


# --- one rank --------------------------------------------------------------------------------------
def rank_main(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import suite
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    torch.manual_seed(0)
    case = dict(suite.CASES[args.case])
    case["batch"] = max(1, case["batch"] // world)  # the suite's batch is the global one
    model, make_batch, loss_of, _ = suite.build(case)
    names = {p: n for n, p in model.named_parameters()}
    if VARIANTS[args.child][1] == "ort":
        from torch_ort import ORTModule
        model = ORTModule(model)
    model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    clock = {"bwd_start": 0.0, "grads": [], "buckets": []}

    def on_grad(p):
        clock["grads"].append((time.perf_counter() - clock["bwd_start"], names[p]))

    for p in names:
        p.register_post_accumulate_grad_hook(on_grad)

    def allreduce(_, bucket):  # DDP's default hook, timed
        clock["buckets"].append((time.perf_counter() - clock["bwd_start"], bucket.buffer().numel() * 4))
        fut = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])
    model.register_comm_hook(None, allreduce)

    gen = torch.Generator().manual_seed(1 + rank)
    steps, backwards, first_grad, first_bucket, order = [], [], [], [], []
    for i in range(args.warmup + args.steps):
        a, kw = make_batch(gen)
        dist.barrier()
        t0 = time.perf_counter()
        loss = loss_of(model(*a, **kw))
        clock.update(bwd_start=time.perf_counter(), grads=[], buckets=[])
        loss.backward()
        t_bwd = time.perf_counter() - clock["bwd_start"]
        opt.step()
        opt.zero_grad(set_to_none=True)
        t_step = time.perf_counter() - t0
        if i >= args.warmup:
            steps.append(t_step)
            backwards.append(t_bwd)
            first_grad.append(clock["grads"][0][0] / t_bwd)
            first_bucket.append(clock["buckets"][0][0] / t_bwd)
            order = [n for _, n in clock["grads"]]
    mine = {"steps": steps, "backwards": backwards, "first_grad": first_grad,
            "first_bucket": first_bucket, "buckets": len(clock["buckets"]), "order": order,
            "params": sum(p.numel() for p in names)}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(gathered, f)
    # DDP's reducer holds the process group: free the model first, so that the group's gloo
    # threads end here and not during interpreter shutdown, where torch can abort the rank.
    del model, opt
    gc.collect()
    dist.destroy_process_group()


# --- the parent --------------------------------------------------------------------------------------
def launch(case: str, variant: str, steps: int, warmup: int, world: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ranks.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
               os.path.abspath(__file__), "--child", variant, "--case", case, "--steps", str(steps),
               "--warmup", str(warmup), "--out", out]
        env = {**os.environ, "ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE", **VARIANTS[variant][2]}
        load = busy_cores()
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
        with open(out) as f:
            ranks = json.load(f)
    slowest = [max(r["steps"][i] for r in ranks) for i in range(steps)]
    slowest_bwd = [max(r["backwards"][i] for r in ranks) for i in range(steps)]
    return {"case": case, "variant": variant, "label": VARIANTS[variant][0], "world": world,
            "step_median": statistics.median(slowest), "step_min": min(slowest),
            "backward_median": statistics.median(slowest_bwd),
            "first_grad": statistics.median(ranks[0]["first_grad"]),
            "first_bucket": statistics.median(ranks[0]["first_bucket"]),
            "buckets": ranks[0]["buckets"], "order": ranks[0]["order"], "params": ranks[0]["params"],
            "wall_s": time.perf_counter() - t0, "busy_cores_before": load}


def markdown(result: dict) -> list[str]:
    lines = [f"# DDP overlap benchmark, {result['date']}", "",
             f"Machine: {result['machine']}; {result['cpu']}. Command: `{result['command']}`. "
             f"{result['world']} processes (torchrun --standalone, gloo), the cores split between them; "
             f"AdamW; global batch = the suite's; median of {result['steps']} steps after "
             f"{result['warmup']} warm-up, each step timed on the slower rank.", ""]
    if max(r["busy_cores_before"] for r in result["rows"]) > 0.5:
        lines += ["**Other work was running** before some launches (up to "
                  f"{max(r['busy_cores_before'] for r in result['rows']):.1f} cores busy): times are skewed.", ""]
    lines += ["| case | variant | median step (fastest) | vs eager | median backward | first gradient at | "
              "first all-reduce at | buckets |", "|---|---|---|---|---|---|---|---|"]
    for case in result["cases"]:
        rows = [r for r in result["rows"] if r["case"] == case]
        eager = next((r for r in rows if r["variant"] == "eager"), None)
        for r in rows:
            vs = f"{eager['step_median'] / r['step_median']:.2f}×" if eager else "-"
            lines.append(f"| {CASES[case]} | {r['label']} | {r['step_median'] * 1e3:.0f} ms "
                         f"({r['step_min'] * 1e3:.0f} ms) | {vs} | {r['backward_median'] * 1e3:.0f} ms | "
                         f"{r['first_grad']:.0%} of backward | {r['first_bucket']:.0%} of backward | "
                         f"{r['buckets']} |")
    lines += ["", "Arrival order of parameter gradients (rank 0, last step): first five and last three.", ""]
    for r in result["rows"]:
        o = r["order"]
        lines.append(f"- {CASES[r['case']]}, {r['label']}: {', '.join(o[:5])} … {', '.join(o[-3:])} "
                     f"({len(o)} tensors)")
    return lines


def chart(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 3 + 0.3 * len(rows)))
    labels = [f"{CASES[r['case']]}: {r['label']}" for r in rows]
    ax.barh(labels, [r["step_median"] * 1e3 for r in rows], color="#bbb", label="step")
    ax.barh(labels, [r["backward_median"] * 1e3 for r in rows], color="#4477aa", label="backward")
    ax.set_xlabel("ms (median, slower rank)")
    ax.invert_yaxis()
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="tiny,baby")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return rank_main(args)
    cases = [c for c in args.cases.split(",") if c]
    rows = []
    for case in cases:
        for variant in args.variants.split(","):
            row = launch(case, variant, args.steps, args.warmup, args.world)
            print(f"[ddp] {case}/{variant}: step {row['step_median'] * 1e3:.0f} ms, backward "
                  f"{row['backward_median'] * 1e3:.0f} ms, first gradient at {row['first_grad']:.0%}, "
                  f"first bucket at {row['first_bucket']:.0%} ({row['wall_s']:.0f} s)", flush=True)
            rows.append(row)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
              "cpu": cpu_model(), "command": "benchmarks/ddp_overlap.py " + " ".join(sys.argv[1:]),
              "world": args.world, "steps": args.steps, "warmup": args.warmup, "cases": cases, "rows": rows}
    print("\n".join(write_results(result, args.out, "ddp_overlap", markdown, chart)))


if __name__ == "__main__":
    main()
