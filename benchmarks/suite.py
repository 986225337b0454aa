"""Training-step benchmark suite (issue 6): eager PyTorch, torch.compile and ORTModule side by side,
each variant in its own process, on the cases below. Per variant: the first step (export or
compilation included) timed alone, then the median of --steps full steps (forward, backward,
optimizer) after --warmup, the peak RSS, and the last loss (a sanity check that all variants train
the same model). MFU = model FLOPs per step (6·N·tokens + 12·layers·width·context·tokens, N the
weights of Linear layers) / step time / the fp32 GEMM peak measured in the same run. Each child
gets an empty torch.compile cache, so its first step is a cold compile. Writes benchmarks/results/suite.{json,md}.

    .venv/bin/python benchmarks/suite.py [--cases tiny,baby,bert] [--variants ...] [--steps 10]

Status: a first version. Not yet: the PNG chart, a README-documented one-command run, GPT-2 small
measured (it is defined; torch.compile of it takes long on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The issue-6 cases; the GPT ones are nanoGPT (vocab 65: its Shakespeare characters) or GPT-2 small.
CASES = {
    "tiny": dict(kind="gpt", vocab=65, width=128, heads=4, layers=4, context=64, batch=12),
    "baby": dict(kind="gpt", vocab=65, width=384, heads=6, layers=6, context=256, batch=8),
    "gpt2": dict(kind="gpt", vocab=50257, width=768, heads=12, layers=12, context=1024, batch=1),
    "bert": dict(kind="bert", vocab=30522, width=256, heads=4, layers=4, context=128, batch=32),
}
VARIANTS = ("eager", "compile", "ortmodule", "ortmodule_fused")


def build(case: dict):
    """(model, make_batch(gen) -> (args, kwargs), loss_of(output))."""
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    import model_zoo
    if case["kind"] == "gpt":
        model = model_zoo.NanoGPT(vocab=case["vocab"], width=case["width"], heads=case["heads"],
                                  layers=case["layers"], positions=case["context"])

        def batch(gen):
            data = torch.randint(0, case["vocab"], (case["batch"], case["context"] + 1), generator=gen)
            return (data[:, :-1].contiguous(), data[:, 1:].contiguous()), {}
        return model, batch, lambda out: out[1]
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
    return model, batch, lambda out: out.loss


def child(case_name: str, variant: str, steps: int, warmup: int) -> dict:
    import torch
    torch.manual_seed(0)
    case = CASES[case_name]
    model, make_batch, loss_of = build(case)
    params = list(model.parameters())
    # The weights that multiply (Linear layers; GPT's tied head counts, embedding lookups do not).
    n_matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
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

    def step():
        args, kwargs = make_batch(gen)
        loss = loss_of(model(*args, **kwargs))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    start = time.perf_counter()
    loss = step()
    first = time.perf_counter() - start
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    n = sum(p.numel() for p in params)
    tokens = case["batch"] * case["context"]
    flops = 6 * n_matmul * tokens + 12 * case["layers"] * case["width"] * case["context"] * tokens
    return {"first_step_s": first, "median_step_s": statistics.median(times), "times_s": times,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "last_loss": loss, "parameters": n, "flops_per_step": flops}


def gemm_peak() -> dict:
    """Best of a few large fp32/bf16 products (square and transformer-shaped), in FLOP/s."""
    import torch
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        best = 0.0
        for m, k, n in ((2048, 2048, 2048), (2048, 768, 3072), (2048, 3072, 768)):
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            a @ b
            times = []
            for _ in range(5):
                start = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - start)
            best = max(best, 2 * m * k * n / min(times))
        out[str(dtype).replace("torch.", "")] = best
    return out


def run_child(args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=cache)
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True,
                              text=True, cwd=ROOT, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout)[-2000:]}
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="tiny,baby,bert")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("CASE", "VARIANT"))
    parser.add_argument("--gemm-peak", action="store_true")
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(*args.child, args.steps, args.warmup)))
        return
    if args.gemm_peak:
        print("RESULT " + json.dumps(gemm_peak()))
        return
    peak = run_child(["--gemm-peak"])
    rows = {}
    for case in args.cases.split(","):
        for variant in args.variants.split(","):
            rows[f"{case}/{variant}"] = run_child(["--child", case, variant, "--steps", str(args.steps),
                                                   "--warmup", str(args.warmup)])
    lines = [f"fp32 GEMM peak {peak.get('float32', 0) / 1e9:.0f} GFLOP/s, bf16 "
             f"{peak.get('bfloat16', 0) / 1e9:.0f} GFLOP/s; medians of {args.steps} steps after {args.warmup}",
             "| case | variant | first step | median step | vs eager | MFU (fp32 peak) | peak RSS | last loss |",
             "|---|---|---|---|---|---|---|---|"]
    for key, r in rows.items():
        case, variant = key.split("/")
        if "error" in r:
            lines.append(f"| {case} | {variant} | failed: {r['error'].splitlines()[-1][:80]} |||||||")
            continue
        eager = rows.get(f"{case}/eager", {}).get("median_step_s")
        ratio = f"{eager / r['median_step_s']:.2f}×" if eager else "-"
        mfu = r["flops_per_step"] / r["median_step_s"] / peak["float32"] if peak.get("float32") else 0
        lines.append(f"| {case} | {variant} | {r['first_step_s']:.2f} s | {r['median_step_s'] * 1e3:.0f} ms | "
                     f"{ratio} | {mfu:.0%} | {r['peak_rss_mb']:.0f} MB | {r['last_loss']:.4f} |")
    print("\n".join(lines))
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "suite.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d"), "gemm_peak_flops": peak, "rows": rows}, f, indent=1)
    with open(os.path.join(HERE, "results", "suite.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
