"""Mixture-of-experts training steps: eager PyTorch, torch.compile and ORTModule on `transformers`'
Mixtral and Qwen2-MoE (random init), CPU fp32.

Cases: Mixtral with its experts through transformers' grouped_mm operator (the default), the same
model with the eager experts loop (`config._experts_implementation = "eager"`: a Python loop over
the experts hit, each decision checked in the engine on every call), and Qwen2-MoE (shared expert,
grouped_mm). Sizes: hidden 256, 4 layers, 8 experts of width 512 (Qwen2-MoE: 8 of 256 and a shared
one of 512), top-2 routing with the load-balancing loss, vocab 8,192, B4 T256; torch AdamW.
Each variant runs in its own process with cold caches (common.run_watched), --rounds times, the
variants taking turns (a step here is a fraction of a second, and this machine's speed drifts
over minutes): the first step timed alone (export or compilation included), then --steps full
steps after --warmup; the median over every round's steps, the last loss (the same model, seed and
batches everywhere), and for ORTModule its exports, decision checks and flips. Writes
benchmarks/results/moe.{json,md}.

    .venv/bin/python benchmarks/moe.py [--cases mixtral,mixtral_eager,qwen2_moe] [--steps 10] [--warmup 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import Report, cpu_model, machine, run_watched  # noqa: E402

CASES = ("mixtral", "mixtral_eager", "qwen2_moe")
VARIANTS = ("eager", "compile", "ortmodule")
SIZE = dict(vocab=8192, hidden=256, layers=4, heads=8, kv_heads=4, experts=8, top_k=2, batch=4, seq=256)


def build(case: str):
    import transformers as tf
    s = SIZE
    common = dict(vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                  num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"], num_experts_per_tok=s["top_k"],
                  output_router_logits=True, use_cache=False, tie_word_embeddings=False)
    if case.startswith("mixtral"):
        model = tf.MixtralForCausalLM(tf.MixtralConfig(intermediate_size=512, num_local_experts=s["experts"],
                                                       router_aux_loss_coef=0.02, **common))
        if case == "mixtral_eager":
            model.config._experts_implementation = "eager"
        return model
    return tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(
        intermediate_size=512, moe_intermediate_size=256, shared_expert_intermediate_size=512,
        num_experts=s["experts"], decoder_sparse_step=1, **common))


def run(case: str, variant: str, steps: int, warmup: int) -> dict:
    import torch
    torch.manual_seed(0)
    model = build(case)
    if variant == "compile":
        model = torch.compile(model)
    elif variant == "ortmodule":
        from torch_ort import ORTModule
        model = ORTModule(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1)
    times, loss = [], None
    for _ in range(1 + warmup + steps):
        ids = torch.randint(0, SIZE["vocab"], (SIZE["batch"], SIZE["seq"]), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    row = {"first_step_s": times[0], "median_step_s": statistics.median(times[1 + warmup:]),
           "steps_s": times[1 + warmup:], "last_loss": loss.item()}
    if variant == "ortmodule":
        st = model.stats()
        if st["fallback"] is not None:
            raise SystemExit(f"{case}: ORTModule fell back: {st['fallback']}")
        row.update(exports=st["exports"], decisions=st["decisions"], decision_flips=st["decision_flips"],
                   host_reads=st["host_reads_forward"] + st["host_reads_backward"],
                   aten_fallback_ops=st["aten_fallback_ops"])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", nargs=2, metavar=("CASE", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(run(args.child[0], args.child[1], args.steps, args.warmup)))
        return
    report = Report("moe")
    report.out("# Mixture-of-experts training steps (CPU fp32)\n")
    report.out(f"{time.strftime('%Y-%m-%d')}, {cpu_model()}, {machine()}.\n")
    report.out(f"hidden {SIZE['hidden']}, {SIZE['layers']} layers, {SIZE['experts']} experts top-{SIZE['top_k']}, "
               f"vocab {SIZE['vocab']:,}, B{SIZE['batch']} T{SIZE['seq']}, AdamW; each variant its own process; "
               f"{args.rounds} rounds, the variants taking turns; median of the rounds' {args.steps} steps after "
               f"{args.warmup} each (first step: the rounds' median); × eager = eager's median ÷ the variant's "
               "(> 1: faster).\n")
    report.out("| case | variant | first step (s) | median step (s) | × eager | × torch.compile | last loss | "
               "exports, decision checks, flips |")
    report.out("|---|---|---|---|---|---|---|---|")
    result = {"size": SIZE, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "cases": {}}
    for case in args.cases.split(","):
        rounds = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):
            for v in VARIANTS:
                r = run_watched(os.path.abspath(__file__),
                                ["--child", case, v, "--steps", str(args.steps), "--warmup", str(args.warmup)],
                                max_rss_gb=16, timeout_s=1800,
                                env_extra={"ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE"})
                if "error" in r:  # recorded, not hidden: the table says it failed and how
                    print(f"[moe] {case} {v}: {r['error']}\n{r['log_tail'][-2000:]}", file=sys.stderr)
                rounds[v].append(r)
        rows = {}
        for v, runs in rounds.items():
            failed = [r for r in runs if "error" in r]
            if failed:
                rows[v] = {"error": failed[0]["error"]}
                continue
            rows[v] = dict(runs[0], first_step_s=statistics.median(r["first_step_s"] for r in runs),
                           steps_s=[t for r in runs for t in r["steps_s"]])
            rows[v]["median_step_s"] = statistics.median(rows[v]["steps_s"])
        result["cases"][case] = rows
        for v in VARIANTS:
            r = rows[v]
            if "error" in r or "error" in rows["eager"] or "error" in rows["compile"]:
                report.out(f"| {case} | {v} | failed: {r.get('error', '')[:200]} | | | | | |")
                continue
            extra = f"{r['exports']}, {r['decisions']}, {r['decision_flips']}" if v == "ortmodule" else ""
            report.out(f"| {case} | {v} | {r['first_step_s']:.2f} | {r['median_step_s']:.3f} | "
                       f"{rows['eager']['median_step_s'] / r['median_step_s']:.2f} | "
                       f"{rows['compile']['median_step_s'] / r['median_step_s']:.2f} | {r['last_loss']:.4f} | "
                       f"{extra} |")
    report.save(result)


if __name__ == "__main__":
    main()
