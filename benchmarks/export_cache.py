"""First-step time with and without ORTMODULE_CACHE_DIR: each run is its own process, the first
one against an empty cache (it exports and stores), the second against the filled cache (it skips
export). Prints a markdown table and writes benchmarks/results/export_cache.json.

    .venv/bin/python benchmarks/export_cache.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

CHILD = textwrap.dedent("""
    import json, sys, time, torch
    sys.path.insert(0, "tests/python")
    import model_zoo
    from torch_ort import ORTModule
    torch.manual_seed(0)
    name = sys.argv[1]
    model = {"gpt2": model_zoo.gpt2, "bert": model_zoo.bert_mlm}[name]()
    make = {"gpt2": model_zoo.lm_batch, "bert": model_zoo.mlm_batch}[name]
    ours = ORTModule(model)
    batch = make(4, 32, torch.Generator().manual_seed(0))
    start = time.perf_counter()
    args, kwargs = batch
    out = ours(*args, **kwargs)
    model_zoo.loss_of(out).backward()
    first = time.perf_counter() - start
    print(json.dumps({"first_step_s": first, "exports": ours.export_count, "hits": ours.cache_hit_count}))
""")


def run(name: str, cache: str) -> dict:
    env = dict(os.environ, ORTMODULE_CACHE_DIR=cache)
    out = subprocess.run([sys.executable, "-c", CHILD, name], env=env, capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = {}
    for name in ("gpt2", "bert"):
        cold, warm = [], []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as cache:
                a, b = run(name, cache), run(name, cache)
            assert a["exports"] >= 1 and b["exports"] == 0 and b["hits"] == 1, (a, b)
            cold.append(a["first_step_s"])
            warm.append(b["first_step_s"])
        rows[name] = {"cold_median_s": statistics.median(cold), "cached_median_s": statistics.median(warm),
                      "saved_s": statistics.median(cold) - statistics.median(warm), "cold": cold, "cached": warm}
    print("| model (tiny HF config) | first step, empty cache | first step, cached | saved |")
    print("|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['cold_median_s']:.2f} s | {r['cached_median_s']:.2f} s | "
              f"{r['saved_s']:.2f} s ({r['cold_median_s'] / r['cached_median_s']:.1f}x) |")
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "export_cache.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
