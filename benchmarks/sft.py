"""Supervised fine-tuning of a decoder LLM: eager PyTorch, torch.compile and ORTModule, where most
label positions are ignored (prompt and padding carry labels = -100) and the vocabulary is large.

The case: a Llama-family model of `transformers` with random init, vocab 128,256 (Llama-3's),
hidden 512, 4 layers, B8 T512, right padding on 25 % of the positions and a prompt on 35 %, so
40 % of the labels count; torch AdamW. Variants, each in its own process:
- eager, torch.compile (default mode);
- ORTModule (the default: label sparsity and the fused, chunked LM head and loss; the logits are
  returned, so the full product is computed once);
- ORTModule with ORTMODULE_SKIP_LOGITS=1 (no logits returned: the head runs on the valid rows only);
- the same with ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER=1 (the layers' token-wise work skips
  the padding);
- ORTModule with ORTMODULE_ENABLE_SPARSE_OPTIMIZER=0 (the head's loss over every row);
- ORTModule with the logits dropped under ORTMODULE_MEMORY_BUDGET=1.25GiB (BUDGET).
Per variant: the first step timed alone, the median of --steps steps after --warmup, the last
loss, the peak process RSS (the parent's watch over the whole process tree) and the step's own
memory: the largest RSS seen during the timed steps (sampled every 5 ms) minus the RSS before
them (the model, its AdamW state; less any buffers the engine's pool holds idle for the step,
which are the step's). Writes sft.{json,md,png} to --out (benchmarks/results/).

    .venv/bin/python benchmarks/sft.py [--steps 5 --warmup 2] [--variants eager,ortmodule]
    .venv/bin/python benchmarks/sft.py --small        # a quick case (vocab 32k, 2 layers, B4 T256)
    .venv/bin/python benchmarks/sft.py --fused-adamw  # every variant with AdamW(fused=True): sft_fused_adamw.*
    .venv/bin/python benchmarks/sft.py --from-json benchmarks/results/sft.json  # re-render only
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import RESULTS_DIR, cpu_model, machine, pooled_idle_bytes, run_watched, write_results  # noqa: E402

CASES = {
    "llama_sft": dict(vocab=128256, hidden=512, layers=4, heads=8, kv_heads=4, ffn=1376, batch=8, seq=512),
    "llama_sft_small": dict(vocab=32000, hidden=256, layers=2, heads=4, kv_heads=2, ffn=688, batch=4, seq=256),
}
PADDING, PROMPT = 0.25, 0.35  # shares of each sequence: right padding, then the prompt before the answer
VARIANTS = ("eager", "compile", "ortmodule", "ortmodule_skip_logits", "ortmodule_padding", "ortmodule_budget",
            "ortmodule_dense")
BUDGET = "1.25GiB"  # under the default plan's predicted 1.61 GiB (logits dropped): a 32 MiB chunk fits
LABELS = {"eager": "eager", "compile": "torch.compile", "ortmodule": "ORTModule (default: logits returned)",
          "ortmodule_skip_logits": "ORTModule, logits dropped (ORTMODULE_SKIP_LOGITS=1)",
          "ortmodule_padding": "ORTModule, logits dropped, padding eliminated "
                               "(ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER=1)",
          "ortmodule_budget": f"ORTModule, logits dropped, ORTMODULE_MEMORY_BUDGET={BUDGET}",
          "ortmodule_dense": "ORTModule, every row (ORTMODULE_ENABLE_SPARSE_OPTIMIZER=0)"}
ENV = {"ortmodule_dense": {"ORTMODULE_ENABLE_SPARSE_OPTIMIZER": "0"},
       "ortmodule_skip_logits": {"ORTMODULE_SKIP_LOGITS": "1"},
       "ortmodule_padding": {"ORTMODULE_SKIP_LOGITS": "1", "ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER": "1"},
       "ortmodule_budget": {"ORTMODULE_SKIP_LOGITS": "1", "ORTMODULE_MEMORY_BUDGET": BUDGET}}


def batch(case: dict, gen):
    """(input_ids, attention_mask, labels): answers counted, prompt and padding ignored."""
    import torch
    b, t = case["batch"], case["seq"]
    ids = torch.randint(0, case["vocab"], (b, t), generator=gen)
    mask = torch.ones(b, t, dtype=torch.long)
    labels = ids.clone()
    pad, prompt = int(t * PADDING), int(t * PROMPT)
    mask[:, t - pad:] = 0
    labels[:, t - pad:] = -100
    labels[:, :prompt] = -100
    return ids, mask, labels


def child(case_name: str, variant: str, steps: int, warmup: int, fused: bool) -> None:
    import psutil
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    case = CASES[case_name]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=case["vocab"], hidden_size=case["hidden"], num_hidden_layers=case["layers"],
                      num_attention_heads=case["heads"], num_key_value_heads=case["kv_heads"],
                      intermediate_size=case["ffn"], tie_word_embeddings=False, use_cache=False)
    model = LlamaForCausalLM(cfg)
    if variant == "compile":
        model = torch.compile(model)
    elif variant.startswith("ortmodule"):
        from torch_ort import ORTModule
        model = ORTModule(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if fused else None)
    gen = torch.Generator().manual_seed(1)
    batches = [batch(case, gen) for _ in range(2)]
    proc = psutil.Process()

    def step(i: int) -> float:
        ids, mask, labels = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        return loss.item()

    t0 = time.perf_counter()
    loss = step(0)
    first = time.perf_counter() - t0
    for i in range(warmup):
        step(i + 1)
    opt.zero_grad(set_to_none=True)
    base = proc.memory_info().rss - pooled_idle_bytes(model)  # the pool's idle buffers are the step's
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.005)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        loss = step(i)
        times.append(time.perf_counter() - t0)
    done.set()
    watcher.join()
    valid = float(sum((b[2] != -100).sum() for b in batches)) / sum(b[2].numel() for b in batches)
    stats = model.stats() if hasattr(model, "stats") else {}
    print("RESULT " + json.dumps(dict(
        first_step_s=first, median_step_s=statistics.median(times), steps_s=times, last_loss=loss,
        base_rss_mb=base / 2**20, step_own_mb=(peak[0] - base) / 2**20, label_density=valid,
        host_reads_forward=stats.get("host_reads_forward"), engine_label_density=stats.get("label_density"),
        memory_plan=str(stats["memory_plan"].plan_text()) if stats.get("memory_plan") else None,
        predicted_peak_mb=stats["memory_plan"].predicted / 2**20 if stats.get("memory_plan") else None,
        engine_peak_mb=model.memory_report().measured["peak"] / 2**20 if stats.get("memory_plan") else None)),
        flush=True)


def markdown(result: dict) -> list[str]:
    case = CASES[result["case"]]
    rows = result["variants"]
    lines = [f"# SFT: the LM head and its loss, {result['date']}", "",
             f"_{result['machine']}; {result['cpu']}_", "",
             f"Llama-family (`transformers`, random init): vocab {case['vocab']:,}, hidden {case['hidden']}, "
             f"{case['layers']} layers, B{case['batch']} T{case['seq']}; {PADDING:.0%} right padding, "
             f"{PROMPT:.0%} prompt: {result.get('label_density', 0):.0%} of labels counted; "
             f"{'AdamW(fused=True)' if result.get('fused_adamw') else 'AdamW'}. "
             f"Each variant its own process; median of {result['steps']} steps after {result['warmup']}.", "",
             "| variant | first step | median step | vs eager | vs torch.compile | step's own memory | vs eager | "
             "peak RSS (process tree) | last loss |",
             "|---|---|---|---|---|---|---|---|---|"]
    eager, comp = rows.get("eager", {}), rows.get("compile", {})

    def ratio(a, b, key):
        return f"{a[key] / b[key]:.2f}×" if a and b and "error" not in a and "error" not in b and b[key] else "-"
    for v in VARIANTS:
        r = rows.get(v)
        if r is None:
            continue
        if "error" in r:
            lines.append(f"| {LABELS[v]} | failed: {r['error'][:120]} | | | | | | | |")
            continue
        lines.append(f"| {LABELS[v]} | {r['first_step_s']:.1f} s | {r['median_step_s']:.2f} s | "
                     f"{ratio(eager, r, 'median_step_s')} | {ratio(comp, r, 'median_step_s')} | "
                     f"{r['step_own_mb']:,.0f} MiB | {ratio(r, eager, 'step_own_mb') if eager else '-'} | "
                     f"{r['peak_tree_rss_mb']:,.0f} MiB | {r['last_loss']:.5f} |")
    lines += ["", "Speed ratios: eager's (or torch.compile's) median ÷ the row's (> 1: the row is faster). "
              "Memory ratio: the row's own step memory ÷ eager's (< 1: the row holds less)."]
    for name, r in rows.items():
        if r.get("memory_plan"):
            lines += ["", f"{LABELS.get(name, name)}: the planner chose {r['memory_plan']}, predicted step "
                      f"peak {r['predicted_peak_mb']:,.0f} MiB; the engine measured {r['engine_peak_mb']:,.0f} MiB."]
    return lines


def chart(result: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [(LABELS[v].split(" (")[0].split(",")[0] + (" dense" if v == "ortmodule_dense" else ""), r)
            for v, r in result["variants"].items() if "error" not in r]
    if not rows:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    a.barh([n for n, _ in rows], [r["median_step_s"] for _, r in rows])
    a.set_xlabel("median step (s)")
    b.barh([n for n, _ in rows], [r["step_own_mb"] / 1024 for _, r in rows])
    b.set_xlabel("step's own memory (GiB)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--small", action="store_true", help="the quick case")
    parser.add_argument("--fused-adamw", action="store_true",
                        help="every variant with torch's AdamW(fused=True) instead of its default for-loop")
    parser.add_argument("--out", default=RESULTS_DIR)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--max-rss-gb", type=float, default=20)
    parser.add_argument("--from-json")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    case = "llama_sft_small" if args.small else "llama_sft"
    if args.child:
        child(args.child[0], args.child[1], args.steps, args.warmup, args.fused_adamw)
        return 0
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
    else:
        result = dict(case=case, steps=args.steps, warmup=args.warmup, date=time.strftime("%Y-%m-%d"),
                      machine=machine(), cpu=cpu_model(), fused_adamw=args.fused_adamw, variants={})
        for v in args.variants.split(","):
            r = run_watched(os.path.abspath(__file__), ["--child", case, v, "--steps", str(args.steps),
                                                        "--warmup", str(args.warmup)]
                            + (["--fused-adamw"] if args.fused_adamw else []),
                            args.max_rss_gb, args.timeout, ENV.get(v))
            result["variants"][v] = r
            result["label_density"] = r.get("label_density", result.get("label_density"))
            print(f"[sft] {v}: " + (r["error"] if "error" in r else
                                    f"{r['median_step_s']:.2f} s/step, own {r['step_own_mb']:.0f} MiB"), flush=True)
    stem = ("sft_small" if result["case"] == "llama_sft_small" else "sft") + (
        "_fused_adamw" if result.get("fused_adamw") else "")
    print("\n".join(write_results(result, args.out, stem, markdown, chart)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
