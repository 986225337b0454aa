"""The training-step suite: eager PyTorch, torch.compile and ORTModule, side by side.

Each variant of each case (CASES below) runs in its own process; torch.compile in default mode.

Per variant: the first step (export or compilation included, caches cold) timed alone, then the
median of --steps full steps (forward, backward, optimizer) after --warmup, the peak RSS and the
last loss (a sanity check that all variants train the same model). Every variant uses
torch.optim.AdamW; ORTModule has a second row with torch_ort's FusedAdam. GPT-2 small takes
--steps-gpt2 / --warmup-gpt2 (a step is seconds, its torch.compile minutes).
MFU = model FLOPs per step (6·N·tokens + 12·layers·width·context·tokens; N the weights of Linear
layers, BERT's pooler and classifier counted per sequence; embedding lookups do no matmul FLOPs)
/ step time / the fp32 GEMM peak measured in the same run (the best of a large square product and
the transformer GEMM shapes of the cases run).
A parent process watches each child's RSS (its compile workers included) and kills it past
--max-rss-gb, or past --timeout. Writes suite.{json,md,png} to --out (benchmarks/results/).

    .venv/bin/python benchmarks/suite.py [--cases tiny,baby,gpt2,bert] [--variants ...] [--steps 10]
    .venv/bin/python benchmarks/suite.py --from-json benchmarks/results/suite.json  # re-render only
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from common import cpu_model, machine, run_watched, write_results  # noqa: E402
from common import measured_row as _row, percent_text as _pct, ratio as _ratio, times_text as _x  # noqa: E402

# The cases; the GPT ones are nanoGPT (vocab 65: its Shakespeare characters) or GPT-2 small.
CASES = {
    "tiny": dict(kind="gpt", vocab=65, width=128, heads=4, layers=4, context=64, batch=12),
    "baby": dict(kind="gpt", vocab=65, width=384, heads=6, layers=6, context=256, batch=8),
    "gpt2": dict(kind="gpt", vocab=50257, width=768, heads=12, layers=12, context=1024, batch=1),
    "bert": dict(kind="bert", vocab=30522, width=256, heads=4, layers=4, context=128, batch=32),
}
CASE_LABELS = {"tiny": "tiny GPT", "baby": "baby GPT", "gpt2": "GPT-2 small (124M)",
               "bert": "BERT-mini classifier (HF)"}
VARIANTS = ("eager", "compile", "ortmodule", "ortmodule_fused")
VARIANT_LABELS = {"eager": "eager + AdamW", "compile": "torch.compile + AdamW",
                  "ortmodule": "ORTModule + AdamW", "ortmodule_fused": "ORTModule + FusedAdam"}
OURS = "ortmodule"  # the goal figures compare like with like: the same optimizer class as eager's
SPEEDUP_GOALS = {"tiny": 2.0, "baby": 1.4, "gpt2": 1.3, "bert": 1.3}  # × eager, the goals set for this suite
MFU_GOALS = {"baby": 0.70}
FIRST_STEP_GOAL = 0.25  # ours ÷ torch.compile's first step


# --- child: one variant of one case, in a process of its own ---------------------------------------
def build(case: dict):
    """(model, make_batch(gen) -> (args, kwargs), loss_of(output), per-sequence Linear prefixes)."""
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    import model_zoo
    if case["kind"] == "gpt":
        model = model_zoo.NanoGPT(vocab=case["vocab"], width=case["width"], heads=case["heads"],
                                  layers=case["layers"], positions=case["context"])

        def batch(gen):
            data = torch.randint(0, case["vocab"], (case["batch"], case["context"] + 1), generator=gen)
            return (data[:, :-1].contiguous(), data[:, 1:].contiguous()), {}
        return model, batch, lambda out: out[1], ()
    import transformers as tf
    config = tf.BertConfig(vocab_size=case["vocab"], hidden_size=case["width"],
                           num_attention_heads=case["heads"], num_hidden_layers=case["layers"],
                           intermediate_size=4 * case["width"], num_labels=2,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # same losses
    model = tf.BertForSequenceClassification(config)

    def batch(gen):
        ids = torch.randint(1, case["vocab"], (case["batch"], case["context"]), generator=gen)
        labels = torch.randint(0, 2, (case["batch"],), generator=gen)
        return (), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    # The pooler and the classifier see one token per sequence ([CLS]), not every token.
    return model, batch, lambda out: out.loss, ("bert.pooler", "classifier")


def model_flops(model, case: dict, per_sequence: tuple) -> int:
    """Training FLOPs of one step: 6 per weight per token it multiplies, plus attention."""
    import torch
    tokens = case["batch"] * case["context"]
    flops = 12 * case["layers"] * case["width"] * case["context"] * tokens  # QKᵀ and PV, fwd + bwd
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):  # GPT's tied head is a Linear: counted once, as a matmul
            flops += 6 * m.weight.numel() * (case["batch"] if name.startswith(per_sequence) else tokens)
    return flops


def child(case_name: str, variant: str, steps: int, warmup: int) -> dict:
    import torch
    torch.manual_seed(0)
    case = CASES[case_name]
    model, make_batch, loss_of, per_sequence = build(case)
    params = list(model.parameters())
    flops = model_flops(model, case, per_sequence)
    if variant == "compile":
        model = torch.compile(model)
    elif variant.startswith("ortmodule"):
        from torch_ort import ORTModule
        model = ORTModule(model)
    if variant == "ortmodule_fused":
        from torch_ort.optim import AdamWMode, FusedAdam
        opt = FusedAdam(params, lr=1e-4, weight_decay=0.01, adam_w_mode=AdamWMode.ADAMW_TORCH)
    else:
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1)

    def step() -> tuple[float, float]:
        args, kwargs = make_batch(gen)  # outside the timed region
        start = time.perf_counter()
        loss = loss_of(model(*args, **kwargs))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()  # waits for the step on an asynchronous device
        return time.perf_counter() - start, value

    first, loss = step()
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        seconds, loss = step()
        times.append(seconds)
    import resource
    return {"first_step_s": first, "median_step_s": statistics.median(times), "times_s": times,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "last_loss": loss, "parameters": sum(p.numel() for p in params),
            "flops_per_step": flops, "threads": torch.get_num_threads()}


# --- child: the GEMM peak, on a large square and on the cases' own matmul shapes ------------------
def gemm_shapes(case_names: list[str]) -> list[dict]:
    """(label, case, m, k, n) of C(m×n) = A(m×k)·B(k×n): the forward GEMMs of each case's layers."""
    shapes = [dict(label="large square", case="", m=4096, k=4096, n=4096)]
    for name in case_names:
        c = CASES[name]
        t, w = c["batch"] * c["context"], c["width"]
        if c["kind"] == "gpt":
            rows = [("qkv", w, 3 * w), ("attn out", w, w), ("mlp up", w, 4 * w), ("mlp down", 4 * w, w),
                    ("lm head", w, c["vocab"])]
        else:  # HF BERT: separate query/key/value/output Linears; its classifier head is 2 wide
            rows = [("q/k/v/out", w, w), ("mlp up", w, 4 * w), ("mlp down", 4 * w, w)]
        shapes += [dict(label=label, case=name, m=t, k=k, n=n) for label, k, n in rows]
    return shapes


def gemm_peak(case_names: list[str]) -> dict:
    """FLOP/s of each shape in fp32 and bf16 (best repetition); the peak is the best shape's."""
    import torch
    shapes = gemm_shapes(case_names)
    for s in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.randn(s["m"], s["k"], dtype=dtype)
            b = torch.randn(s["k"], s["n"], dtype=dtype)
            c = torch.empty(s["m"], s["n"], dtype=dtype)
            torch.mm(a, b, out=c)
            times = []
            while len(times) < 3 or (sum(times) < 0.3 and len(times) < 50):
                start = time.perf_counter()
                torch.mm(a, b, out=c)
                times.append(time.perf_counter() - start)
            s[str(dtype).replace("torch.", "")] = 2 * s["m"] * s["k"] * s["n"] / min(times)
    return {"shapes": shapes, "peak": {d: max(s[d] for s in shapes) for d in ("float32", "bfloat16")}}


# --- parent: each child in its own process, watched for memory and time ----------------------------
def run_child(argv: list[str], max_rss_gb: float, timeout_s: float) -> dict:
    """Runs `suite.py argv` with cold caches; returns its RESULT dict or {"error": ...}."""
    return run_watched(os.path.abspath(__file__), argv, max_rss_gb, timeout_s)


# --- report: ratios, the goals table, markdown and the chart ---------------------------------------
def _mfu(result: dict, r: dict) -> float | None:
    peak = result.get("gemm", {}).get("peak", {}).get("float32")
    return r["flops_per_step"] / r["median_step_s"] / peak if peak else None


def _seconds(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s"


def goals(result: dict) -> list[tuple[str, str, str, bool | None]]:
    """(goal, measured, target, met) per goal figure; met is None when not measured."""
    rows = []
    for case, target in SPEEDUP_GOALS.items():
        ours, fused = _ratio(result, case, "eager", OURS), _ratio(result, case, "eager", "ortmodule_fused")
        measured = _x(ours) + (f" (FusedAdam {_x(fused)})" if fused else "")
        rows.append((f"{CASE_LABELS[case]}: step vs eager", measured, f"≥ {target:.1f}×",
                     None if ours is None else ours >= target))
    for case, target in MFU_GOALS.items():
        r = _row(result, case, OURS)
        mfu = _mfu(result, r) if r else None
        rows.append((f"{CASE_LABELS[case]}: MFU (fp32 GEMM peak)", _pct(mfu), f"≥ {target:.0%}",
                     None if mfu is None else mfu >= target))
    for case in CASES:
        ratio = _ratio(result, case, "compile", OURS)
        rows.append((f"{CASE_LABELS[case]}: step vs torch.compile", _x(ratio), "≥ 1.00× (not slower)",
                     None if ratio is None else ratio >= 1.0))
    for case in CASES:
        share = _ratio(result, case, OURS, "compile", "first_step_s")
        rows.append((f"{CASE_LABELS[case]}: first step ÷ torch.compile's", _pct(share),
                     f"≤ {FIRST_STEP_GOAL:.0%}", None if share is None else share <= FIRST_STEP_GOAL))
    return rows


def _case_table(result: dict, case: str) -> list[str]:
    entry, c = result["cases"][case], CASES[case]
    params = next((r["parameters"] for r in entry["variants"].values() if "parameters" in r), None)
    few = " (below the 10 the goals ask for)" if entry["steps"] < 10 and case != "gpt2" else ""
    lines = ["", f"## {CASE_LABELS[case]}", "",
             f"{c['layers']} layers, {c['heads']} heads, width {c['width']}, context {c['context']}, "
             f"batch {c['batch']}, vocab {c['vocab']}, fp32; "
             + (f"{params / 1e6:.1f}M parameters; " if params else "")
             + f"median of {entry['steps']} steps{few} after {entry['warmup']} warm-up.", "",
             "| variant | first step | median step | vs eager | vs compile | first step ÷ compile's "
             "| MFU | peak RSS | last loss |", "|---|---|---|---|---|---|---|---|---|"]
    eager = _row(result, case, "eager")
    for variant, r in entry["variants"].items():
        name = VARIANT_LABELS[variant]
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:120].replace('|', '/')} | | | | | | | |")
            continue
        drift = eager and abs(r["last_loss"] - eager["last_loss"]) > 0.01 * abs(eager["last_loss"])
        cells = [name, _seconds(r["first_step_s"]), _seconds(r["median_step_s"]),
                 _x(_ratio(result, case, "eager", variant)), _x(_ratio(result, case, "compile", variant)),
                 _pct(_ratio(result, case, variant, "compile", "first_step_s")), _pct(_mfu(result, r)),
                 f"{r['peak_rss_mb']:.0f} MB", f"{r['last_loss']:.4f}" + (" (≠ eager)" if drift else "")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _gemm_table(gemm: dict) -> list[str]:
    if not gemm.get("shapes"):
        return ["", "## GEMM peak", "", f"Not measured: {gemm.get('error', 'not run')}"]
    lines = ["", "## GEMM peak", "",
             "C(m×n) = A(m×k)·B(k×n) with torch.mm into a preallocated output, best repetition; the "
             "cases' shapes are their layers' forward products (m = batch·context tokens).", "",
             "| shape | case | m × k × n | fp32 GFLOP/s | bf16 GFLOP/s | bf16 ÷ fp32 |",
             "|---|---|---|---|---|---|"]
    for s in gemm["shapes"]:
        lines.append(f"| {s['label']} | {s['case'] or '-'} | {s['m']} × {s['k']} × {s['n']} | "
                     f"{s['float32'] / 1e9:.0f} | {s['bfloat16'] / 1e9:.0f} | "
                     f"{s['bfloat16'] / s['float32']:.2f}× |")
    peak = gemm["peak"]
    lines.append(f"| **peak** | | | **{peak['float32'] / 1e9:.0f}** | **{peak['bfloat16'] / 1e9:.0f}** | |")
    return lines


def markdown(result: dict) -> list[str]:
    gemm = result.get("gemm", {})
    fp32 = gemm.get("peak", {}).get("float32")
    lines = [f"# Training-step suite, {result['date']}", "",
             f"Machine: {result['machine']}; {result['cpu']}. Each variant in its own process; the first "
             "step (export or compilation, cold caches) is timed alone, then the median of the timed "
             "full steps (forward, backward, optimizer) after the warm-up steps. Ratios are within this "
             "run: eager's (or torch.compile's) time ÷ the row's, so > 1 is faster. MFU = model FLOPs "
             "per step ÷ median step ÷ the measured fp32 GEMM peak "
             f"({f'{fp32 / 1e9:.0f} GFLOP/s' if fp32 else 'not measured'}). Goal figures are judged "
             f"on {VARIANT_LABELS[OURS]} (the optimizer class of the other variants).", "",
             "## Goals", "", "| goal | measured | target | met |", "|---|---|---|---|"]
    loads = [r.get("load_before", 0) for e in result["cases"].values() for r in e["variants"].values()]
    loads.append(gemm.get("load_before", 0))
    if result.get("cores") and max(loads) > 0.5 * result["cores"]:
        lines[4:4] = [f"**Other work was running**: other processes kept {max(loads):.1f} of "
                      f"{result['cores']} cores busy just before a variant started; these figures are "
                      "skewed.", ""]
    verdict = {True: "met", False: "not met", None: "not measured"}
    lines += [f"| {g} | {m} | {t} | {verdict[ok]} |" for g, m, t, ok in goals(result)]
    for case in result["cases"]:
        lines += _case_table(result, case)
    return lines + _gemm_table(gemm)


def chart(result: dict, path: str) -> None:
    """Per case, bars per variant: step time ÷ eager's, and first-step time (log scale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = list(result["cases"])
    variants = [v for v in VARIANTS if any(v in result["cases"][c]["variants"] for c in cases)]
    fig, (rel, first) = plt.subplots(1, 2, figsize=(13, 5))
    width = 0.8 / max(len(variants), 1)
    for i, variant in enumerate(variants):
        xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(cases))]
        ratios = [_ratio(result, c, variant, "eager") for c in cases]
        firsts = [(_row(result, c, variant) or {}).get("first_step_s") for c in cases]
        bars = rel.bar([x for x, v in zip(xs, ratios) if v], [v for v in ratios if v], width,
                       label=VARIANT_LABELS[variant], color=f"C{i}")
        rel.bar_label(bars, fmt="%.2f", fontsize=7)
        bars = first.bar([x for x, v in zip(xs, firsts) if v], [v for v in firsts if v], width, color=f"C{i}")
        first.bar_label(bars, fmt="%.2g", fontsize=7)
        for x, c in zip(xs, cases):  # a failed row is marked, not silently absent
            if variant in result["cases"][c]["variants"] and not _row(result, c, variant):
                for ax, y in ((rel, 0.02), (first, 0.02)):
                    ax.text(x, y, "failed", rotation=90, fontsize=7, ha="center", va="bottom",
                            transform=ax.get_xaxis_transform())
    for ax in (rel, first):
        ax.set_xticks(range(len(cases)), [CASE_LABELS[c] for c in cases], fontsize=8)
    rel.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    rel.set_ylabel("median step time ÷ eager's (lower is faster)")
    rel.set_title("steady-state step")
    if any(b.get_height() > 0 for b in first.patches):  # a log axis needs one positive value
        first.set_yscale("log")
    first.set_ylabel("first step, s (log scale)")
    first.set_title("first step (export / compilation, cold caches)")
    rel.set_ylim(0, 1.15 * max([1.0, *(b.get_height() for b in rel.patches)]))
    fig.legend(*rel.get_legend_handles_labels(), loc="lower center", ncol=len(variants), fontsize=9)
    fig.suptitle(f"torch_ort training-step suite, {result['date']}: {result['machine']}; {result['cpu']}",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(result: dict, out_dir: str) -> list[str]:
    """suite.json, suite.md and suite.png in out_dir; returns the markdown lines."""
    return write_results(result, out_dir, "suite", markdown, chart)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma list, default: all")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma list, default: all")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (the median is reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after the first")
    parser.add_argument("--steps-gpt2", type=int, default=3, help="timed steps of GPT-2 small")
    parser.add_argument("--warmup-gpt2", type=int, default=1, help="warm-up steps of GPT-2 small")
    parser.add_argument("--max-rss-gb", type=float, default=None,
                        help="kill a variant whose processes pass this RSS (default: 80%% of RAM)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per variant process")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="where suite.* go")
    parser.add_argument("--from-json", help="only re-render the markdown and chart of a suite.json")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument("--gemm-peak", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(*args.child, args.steps, args.warmup)))
        return
    cases, variants = args.cases.split(","), args.variants.split(",")
    if args.gemm_peak:
        print("RESULT " + json.dumps(gemm_peak(cases)))
        return
    if args.from_json:
        with open(args.from_json) as f:
            print("\n".join(write(json.load(f), args.out)))
        return
    for name, known in ((cases, CASES), (variants, VARIANTS)):
        unknown = [n for n in name if n not in known]
        if unknown:
            parser.error(f"unknown {unknown}; choose from {','.join(known)}")
    import psutil
    max_rss = args.max_rss_gb or 0.8 * psutil.virtual_memory().total / 2**30
    result = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "cpu": cpu_model(),
              "cores": os.cpu_count(), "max_rss_gb": max_rss, "cases": {}}
    print(f"[suite] GEMM peak ({', '.join(cases)} shapes):", end=" ", flush=True)
    result["gemm"] = gemm = run_child(["--gemm-peak", "--cases", ",".join(cases)], max_rss, args.timeout)
    print(gemm["error"] if "error" in gemm else f"fp32 {gemm['peak']['float32'] / 1e9:.0f} GFLOP/s, "
          f"bf16 {gemm['peak']['bfloat16'] / 1e9:.0f} GFLOP/s ({gemm['wall_s']:.0f} s)", flush=True)
    for case in cases:
        steps, warmup = (args.steps_gpt2, args.warmup_gpt2) if case == "gpt2" else (args.steps, args.warmup)
        entry = result["cases"][case] = {"steps": steps, "warmup": warmup, "variants": {}}
        for variant in variants:
            print(f"[suite] {case}/{variant}:", end=" ", flush=True)
            argv = ["--child", case, variant, "--steps", str(steps), "--warmup", str(warmup)]
            r = entry["variants"][variant] = run_child(argv, max_rss, args.timeout)
            summary = r["error"] if "error" in r else (
                f"first {_seconds(r['first_step_s'])}, median {_seconds(r['median_step_s'])}, "
                f"peak RSS {r['peak_rss_mb']:.0f} MB")
            print(f"{summary} ({r['wall_s']:.0f} s in all)", flush=True)
    print("\n".join(write(result, args.out)))


if __name__ == "__main__":
    main()
