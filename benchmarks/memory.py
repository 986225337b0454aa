"""The memory benchmark: eager PyTorch, torch.compile and ORTModule at recompute levels 0, 1
and 2 (ORTMODULE_MEMORY_OPT_LEVEL), on baby GPT and GPT-2 small, AdamW throughout.

Per case, variant and batch size (--batches), in a process of its own (memory_measure.py says how
each figure is taken): peak RSS, the activation memory of a steady-state step measured from RSS
and from torch's allocator, ORTModule's predicted and engine-measured peak, and the median step
time. Then the largest batch under a fixed memory cap (--cap-gb): doubling, then bisection, each
probe a process that runs two steps and fits iff its peak RSS stays under the cap (it is killed as
it passes it); at most --max-probes new processes per variant. Writes memory.{json,md,png} to --out.

Every child runs with MALLOC_MMAP_THRESHOLD_=65536 (--malloc mmap, the default): glibc then maps
each block of 64 KiB or more on its own and returns it on free, so RSS follows the allocator;
with glibc's default (--malloc default) freed activations stay resident and a step's RSS rise
shows a fraction of them. Same setting for every variant.

    .venv/bin/python benchmarks/memory.py                       # baby and gpt2, everything
    .venv/bin/python benchmarks/memory.py --cases baby --cap-gb baby=4 --batches baby=4,8,16
    .venv/bin/python benchmarks/memory.py --quick               # tiny GPT, ~1 minute
    .venv/bin/python benchmarks/memory.py --from-json a.json [b.json ...]  # re-render (and merge)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import cpu_model, machine, run_watched  # noqa: E402
from suite import CASES  # noqa: E402

VARIANTS = ("eager", "compile", "ort0", "ort1", "ort2")
# Per case: the batch sizes measured, the memory cap of the largest-batch search, the timed steps
# and warm-up steps, and the variants the search skips (torch.compile recompiles per batch size:
# minutes per probe on GPT-2 small). GPT-2 small's cap: its eager step holds ~1.2 GiB of
# activations per sequence over a ~2.1 GiB baseline (weights, AdamW state, torch), so 6 GiB lets
# eager reach batch 3; a probe at batch 6 takes minutes on 2 cores.
PLANS = {
    "tiny": dict(batches=(4, 8), cap_gb=1.5, steps=2, warmup=0, cap_skip=()),
    "baby": dict(batches=(4, 8, 16), cap_gb=4.0, steps=5, warmup=1, cap_skip=()),
    "gpt2": dict(batches=(1, 2), cap_gb=6.0, steps=2, warmup=0, cap_skip=("compile",)),
}
MALLOC = {"mmap": {"MALLOC_MMAP_THRESHOLD_": "65536"}, "default": {}}


# --- child ---------------------------------------------------------------------------------------
def child(case: str, variant: str, batch: int, steps: int, warmup: int, profile: bool) -> dict:
    from memory_measure import measure
    return measure(dict(CASES[case], batch=batch), variant, steps, warmup, profile)


# --- parent: the batch sweep, then the largest batch under the cap ----------------------------------
class Runner:
    """Starts children with the run's shared settings."""

    def __init__(self, args):
        self.malloc = MALLOC[args.malloc]
        self.max_rss_gb, self.timeout = args.max_rss_gb, args.timeout

    def run(self, case, variant, batch, steps, warmup, profile=True, cap_gb=None) -> dict:
        argv = ["--child", case, variant, str(batch), "--steps", str(steps), "--warmup", str(warmup)]
        r = run_watched(os.path.join(HERE, "memory.py"), argv + ([] if profile else ["--no-profile"]),
                        self.max_rss_gb, self.timeout, env_extra=self.malloc, own_rss_cap_gb=cap_gb)
        r["batch"] = batch
        if "error" in r:  # the last line of a log: may be a whole ONNX graph's repr
            r["error"] = r["error"][:300]
        return r


def _summary(r: dict) -> str:
    if "error" in r:
        return r["error"]
    alloc = r["allocator"]["peak_mib"] if r.get("allocator") else None
    predicted = ((r.get("ort") or {}).get("predicted") or {}).get("peak")
    return (f"peak RSS {r['process_peak_rss_mib']:.0f} MiB, activations: RSS "
            f"{r['rss']['activation_mib']:.0f} MiB" + (f", allocator {alloc:.0f} MiB" if alloc else "")
            + (f", predicted {predicted / 2**20:.0f} MiB" if predicted else "")
            + (f", step {r['median_step_s']:.2f} s" if r.get("median_step_s") else ""))


def sweep(runner: Runner, case: str, variants: list[str], batches: list[int], plan: dict) -> dict:
    out = {}
    for variant in variants:
        out[variant] = {}
        for batch in batches:
            print(f"[memory] {case}/{variant} batch {batch}:", end=" ", flush=True)
            r = out[variant][str(batch)] = runner.run(case, variant, batch, plan["steps"], plan["warmup"])
            print(f"{_summary(r)} ({r['wall_s']:.0f} s)", flush=True)
    return out


def largest_batch(runner: Runner, case: str, variant: str, cap_gb: float, known: dict,
                  max_probes: int) -> dict:
    """Doubling from the largest known fit, then bisection. known: batch -> peak RSS (MiB) of the
    sweep's processes, reused as free probes. A probe fits iff its peak RSS ≤ cap_gb."""
    cap_mib = cap_gb * 1024
    fits = {b: peak <= cap_mib for b, peak in known.items()}
    probes = []

    def probe(b: int) -> bool:
        if b not in fits:
            if len(probes) >= max_probes:
                raise StopIteration
            print(f"[memory] {case}/{variant} cap {cap_gb:g} GiB, batch {b}:", end=" ", flush=True)
            r = runner.run(case, variant, b, 0, 0, profile=False, cap_gb=cap_gb)
            if "error" in r and not r["error"].startswith("killed: RSS"):
                probes.append({"batch": b, "error": r["error"], "wall_s": r["wall_s"]})
                print(r["error"], flush=True)
                raise RuntimeError(r["error"])
            peak = r.get("process_peak_rss_mib")
            fits[b] = "error" not in r and peak <= cap_mib
            probes.append({"batch": b, "peak_rss_mib": peak, "fits": fits[b], "wall_s": r["wall_s"],
                           **({"killed": r["error"]} if "error" in r else {})})
            print(("fits" if fits[b] else "does not fit") + (f", peak RSS {peak:.0f} MiB" if peak else "")
                  + f" ({r['wall_s']:.0f} s)", flush=True)
        return fits[b]

    lo = max([b for b, ok in fits.items() if ok], default=0)
    hi = min([b for b, ok in fits.items() if not ok and b > lo], default=None)
    error = None
    try:
        while hi is None:
            b = max(1, 2 * lo)
            if probe(b):
                lo = b
            else:
                hi = b
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if probe(mid):
                lo = mid
            else:
                hi = mid
    except StopIteration:
        error = f"probe limit ({max_probes}) reached"
    except RuntimeError as e:
        error = str(e)
    exact = hi is not None and hi - lo == 1
    if error and not lo and hi is None:
        lo = None  # no probe ran to its end: unknown, not 0
    return {"largest": lo, "first_not_fitting": hi, "exact": exact,
            "probes": probes, "known_from_sweep": known, **({"stopped": error} if error else {})}


def earlier_probes(path: str, case: str, variant: str) -> dict:
    """batch -> peak RSS (MiB; inf for a probe killed past its cap) of an earlier run's sweep and
    probes of this case and variant, for --known-from (same cap, or the kills mean nothing)."""
    with open(path) as f:
        entry = json.load(f)["cases"].get(case, {})
    search = (entry.get("cap") or {}).get(variant, {})
    known = {int(b): peak for b, peak in search.get("known_from_sweep", {}).items()}
    for p in search.get("probes", []):
        if "peak_rss_mib" in p or "killed" in p:
            known[p["batch"]] = p["peak_rss_mib"] if p.get("peak_rss_mib") else float("inf")
    return known


def save_partial(result: dict, out_dir: str) -> None:
    """memory.partial.json: what ran so far, for --from-json should a later process take it down."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "memory.partial.json"), "w") as f:
        json.dump(result, f, indent=1)


# --- main ----------------------------------------------------------------------------------------
def _per_case(values: list[str], convert) -> dict:
    """["baby=4,8", ...] -> {"baby": convert("4,8")}."""
    out = {}
    for v in values or []:
        case, _, rest = v.partition("=")
        out[case] = convert(rest)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="baby,gpt2", help="comma list of tiny, baby, gpt2")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma list, default: all")
    parser.add_argument("--batches", action="append", help="CASE=B1,B2,... (default: PLANS)")
    parser.add_argument("--cap-gb", action="append", help="CASE=GiB: the cap of the largest-batch search")
    parser.add_argument("--cap-variants", help="comma list searched (default: all but PLANS' cap_skip)")
    parser.add_argument("--max-probes", type=int, default=6, help="new processes per variant and cap")
    parser.add_argument("--no-cap", action="store_true", help="skip the largest-batch search")
    parser.add_argument("--known-from", help="a memory.json whose probes and sweep seed the search")
    parser.add_argument("--steps", type=int, help="timed steps (default: PLANS, 5 baby, 2 gpt2)")
    parser.add_argument("--warmup", type=int, help="warm-up steps after the first")
    parser.add_argument("--malloc", choices=sorted(MALLOC), default="mmap", help="glibc setting")
    parser.add_argument("--quick", action="store_true", help="tiny GPT, eager and level 0, 2 steps")
    parser.add_argument("--max-rss-gb", type=float, default=None, help="kill past it (default 80%% RAM)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per process")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="where memory.* go")
    parser.add_argument("--from-json", nargs="+", help="only re-render (merging) memory.json files")
    parser.add_argument("--child", nargs=3, metavar=("CASE", "VARIANT", "BATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--no-profile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from memory_render import merge, write
    if args.child:
        case, variant, batch = args.child
        print("RESULT " + json.dumps(child(case, variant, int(batch), args.steps or 0, args.warmup or 0,
                                           not args.no_profile)))
        return
    if args.from_json:
        results = []
        for path in args.from_json:
            with open(path) as f:
                results.append(json.load(f))
        print("\n".join(write(merge(results), args.out)))
        return
    if args.quick:
        args.cases, args.variants, args.max_probes = "tiny", "eager,ort0", min(args.max_probes, 1)
    cases, variants = args.cases.split(","), args.variants.split(",")
    for names, known in ((cases, PLANS), (variants, VARIANTS)):
        unknown = [n for n in names if n not in known]
        if unknown:
            parser.error(f"unknown {unknown}; choose from {','.join(known)}")
    batches = _per_case(args.batches, lambda s: [int(b) for b in s.split(",") if b])  # baby= : none
    caps = _per_case(args.cap_gb, float)
    import psutil
    args.max_rss_gb = args.max_rss_gb or 0.8 * psutil.virtual_memory().total / 2**30
    runner = Runner(args)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
              "cpu": cpu_model(), "cores": os.cpu_count(), "malloc": runner.malloc,
              "command": " ".join(["benchmarks/memory.py", *sys.argv[1:]]), "cases": {}}
    for case in cases:
        plan = dict(PLANS[case])
        plan.update({k: v for k, v in (("steps", args.steps), ("warmup", args.warmup)) if v is not None})
        plan["batches"] = batches.get(case, list(plan["batches"]))
        plan["cap_gb"] = caps.get(case, plan["cap_gb"])
        plan["case_batch"] = CASES[case]["batch"]  # the step-time goal's batch
        cap_variants = (args.cap_variants.split(",") if args.cap_variants else
                        [v for v in variants if v not in plan["cap_skip"]])
        entry = result["cases"][case] = {"config": {k: v for k, v in CASES[case].items() if k != "batch"},
                                         "plan": plan, "cap_variants": cap_variants}
        entry["sweep"] = sweep(runner, case, variants, plan["batches"], plan)
        save_partial(result, args.out)
        if args.no_cap:
            continue
        entry["cap"] = {}
        for variant in cap_variants:
            rows = entry["sweep"].get(variant)
            if rows and all("error" in r for r in rows.values()):
                entry["cap"][variant] = {"largest": None, "first_not_fitting": None, "exact": False,
                                         "probes": [], "known_from_sweep": {},
                                         "stopped": "not searched: every sweep process failed"}
                continue
            known = {int(b): r["process_peak_rss_mib"] for b, r in entry["sweep"].get(variant, {}).items()
                     if "error" not in r}
            if args.known_from:
                known = {**earlier_probes(args.known_from, case, variant), **known}
            entry["cap"][variant] = largest_batch(runner, case, variant, plan["cap_gb"], known,
                                                  args.max_probes)
            print(f"[memory] {case}/{variant}: largest batch under {plan['cap_gb']:g} GiB "
                  f"{entry['cap'][variant]['largest']}", flush=True)
            save_partial(result, args.out)
    print("\n".join(write(result, args.out)))
    os.remove(os.path.join(args.out, "memory.partial.json"))


if __name__ == "__main__":
    main()
