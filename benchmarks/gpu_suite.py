"""GPU training-step suite: eager PyTorch, torch.compile and ORTModule side by side on one GPU.

Cases (CASES below): nanoGPT-124M (B8 T1024), Hugging Face GPT2LMHeadModel-124M (B8 T512),
BertForSequenceClassification-base (B32 S128, padded) and a small GPT (4 layers, width 256, B16
T256), all under bf16 autocast with fp32 weights, random init, nothing downloaded (nanoGPT's own
vocabulary size, 50304; the Hugging Face models keep their configs' dropout of 0.1). Variants, each
in its own process with cold caches: eager, torch.compile (default mode), torch.compile
(mode="reduce-overhead"), ORTModule, ORTModule with ORTMODULE_USE_CUDA_GRAPH=1, ORTModule with
torch_ort's FusedAdam. Every other variant steps torch.optim.AdamW(fused=True); FusedAdam runs
AdamWMode.ADAMW_TORCH, the same rule. ORTModule variants run with FALLBACK_DISABLE: a failure is a
failed row, never eager timed as ours.

Per variant: the first step (export or compilation) timed alone; then --warmup steps; then
--steps steps, each between two CUDA events, with no host synchronization between steps (a
training loop that reads its loss only now and then), and the median reported; peak GPU memory
(torch.cuda.max_memory_allocated) over the timed steps (reset after the warm-up) and over the whole
process; the last loss (all variants train the same model on the same batches); for ORTModule
variants model.stats() after the timed steps (host reads of one step, CUDA-graph replays).
MFU = model FLOPs per step (6 per weight of a matmul per row it multiplies + 12·layers·width·
context per token for attention) ÷ median step ÷ the best bf16 GEMM rate measured in this run
(a large square product and the cases' own GEMM shapes).

--device cpu runs the same code on tiny models (perf_counter timing, peak RSS instead of GPU
memory) to check the code where there is no GPU; its figures say nothing about the goals.
Writes gpu_suite.{json,md} to --out after every variant (a run stopped at --stop-at keeps what it
measured) and gpu_suite.png at the end (skipped, with a message, without matplotlib).

    python3 benchmarks/gpu_suite.py                                   # on the GPU machine
    .venv/bin/python benchmarks/gpu_suite.py --device cpu --steps 3 --warmup 1 --out runs/gpu_suite
    python3 benchmarks/gpu_suite.py --from-json benchmarks/results/gpu_suite.json   # re-render
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from common import (DRY_RUN_MARK, cpu_model, measured_row, percent_text, ratio, run_watched,  # noqa: E402
                    times_text, write_results)

CASES = {
    "nanogpt": dict(kind="nanogpt", label="nanoGPT-124M", vocab=50304, width=768, heads=12, layers=12,
                    positions=1024, context=1024, batch=8),
    "gpt2": dict(kind="hf_gpt2", label="HF GPT2LMHeadModel-124M", vocab=50257, width=768, heads=12,
                 layers=12, positions=1024, context=512, batch=8),
    "bert": dict(kind="hf_bert", label="HF BertForSequenceClassification-base", vocab=30522, width=768,
                 heads=12, layers=12, positions=512, context=128, batch=32),
    "small": dict(kind="nanogpt", label="small GPT 4L/256", vocab=65, width=256, heads=4, layers=4,
                  positions=256, context=256, batch=16),
}
CHART_LABELS = {"nanogpt": "nanoGPT-124M", "gpt2": "HF GPT-2 124M", "bert": "HF BERT-base", "small": "small GPT"}
TINY = dict(vocab=96, width=32, heads=2, layers=1, positions=32, context=32, batch=2)  # --device cpu
# Run order: the variants the goals need first, so that a run cut short still judges most of them.
VARIANTS = {"eager": "eager", "ortmodule": "ORTModule", "compile": "torch.compile",
            "ortmodule_cg": "ORTModule + CUDA graphs", "compile_ro": "torch.compile reduce-overhead",
            "ortmodule_fused": "ORTModule + FusedAdam"}
SPEEDUP_GOALS = [("nanogpt", "eager", 1.3), ("nanogpt", "compile", 1.0), ("gpt2", "eager", 1.2),
                 ("bert", "eager", 1.3)]  # ORTModule's step: reference's time ÷ ours ≥ target
FIRST_STEP_GOAL = 0.30  # ORTModule's first step ÷ torch.compile's
DRIFT = 0.02  # a last loss this far from eager's (relative) is flagged


def sizes(case_name: str, device: str) -> dict:
    """A case's sizes; the tiny ones on the CPU and in a dry run (scripts/gpu_dry_run.py), where
    the models are built only to reach the first CUDA call."""
    tiny = device == "cpu" or os.environ.get("TORCH_ORT_GPU_DRY_RUN") == "1"
    return dict(CASES[case_name], **(TINY if tiny else {}))


# --- child: one variant of one case, in a process of its own ---------------------------------------
def build(case: dict):
    """(model, make_batch(gen) -> (args, kwargs) on the CPU, loss_of(output), per-sequence prefixes)."""
    import torch
    if case["kind"] == "nanogpt":
        sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
        import model_zoo
        model = model_zoo.NanoGPT(vocab=case["vocab"], width=case["width"], heads=case["heads"],
                                  layers=case["layers"], positions=case["positions"])

        def batch(gen):
            data = torch.randint(0, case["vocab"], (case["batch"], case["context"] + 1), generator=gen)
            return (data[:, :-1].contiguous(), data[:, 1:].contiguous()), {}
        return model, batch, lambda out: out[1], ()
    import transformers as tf
    tf.logging.set_verbosity_error()
    if case["kind"] == "hf_gpt2":  # the library's defaults (dropout 0.1) at the given size
        model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=case["vocab"], n_embd=case["width"],
                                                 n_head=case["heads"], n_layer=case["layers"],
                                                 n_positions=case["positions"], loss_type="ForCausalLM"))

        def batch(gen):  # packed pre-training text: no padding, labels are the inputs (HF shifts)
            ids = torch.randint(0, case["vocab"], (case["batch"], case["context"]), generator=gen)
            return (), {"input_ids": ids, "labels": ids}
        return model, batch, lambda out: out.loss, ()
    model = tf.BertForSequenceClassification(tf.BertConfig(
        vocab_size=case["vocab"], hidden_size=case["width"], num_attention_heads=case["heads"],
        num_hidden_layers=case["layers"], intermediate_size=4 * case["width"],
        max_position_embeddings=case["positions"], num_labels=2))

    def batch(gen):  # right padding to lengths between half and all of the context
        b, s = case["batch"], case["context"]
        lengths = torch.randint(s // 2, s + 1, (b,), generator=gen)
        mask = (torch.arange(s)[None, :] < lengths[:, None]).long()
        ids = torch.randint(1, case["vocab"], (b, s), generator=gen) * mask
        return (), {"input_ids": ids, "attention_mask": mask,
                    "labels": torch.randint(0, 2, (b,), generator=gen)}
    # The pooler and the classifier see one token per sequence ([CLS]), not every token.
    return model, batch, lambda out: out.loss, ("bert.pooler", "classifier")


def model_flops(model, case: dict, per_sequence: tuple) -> int:
    """Training FLOPs of one step: 6 per matmul weight per row it multiplies, plus attention."""
    import torch
    tokens = case["batch"] * case["context"]
    flops = 12 * case["layers"] * case["width"] * case["context"] * tokens  # QKᵀ and PV, fwd + bwd
    for name, m in model.named_modules():  # HF GPT-2's projections are transformers' Conv1D
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D":
            flops += 6 * m.weight.numel() * (case["batch"] if name.startswith(per_sequence) else tokens)
    return flops


class Clock:
    """Marks between steps: CUDA events read once after the loop (no host synchronization in it),
    or perf_counter on the CPU, whose kernels finish before they return."""

    def __init__(self, device: str):
        self.cuda, self.marks = device == "cuda", []

    def mark(self) -> None:
        import torch
        if self.cuda:
            self.marks.append(torch.cuda.Event(enable_timing=True))
            self.marks[-1].record()
        else:
            self.marks.append(time.perf_counter())

    def intervals(self) -> list[float]:
        """Seconds between consecutive marks."""
        import torch
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def environment(device: str) -> dict:
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__, "cpu": cpu_model(),
           "cores": os.cpu_count(), "device": device}
    if device == "cuda":
        env.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    return env


def child(case_name: str, variant: str, device: str, steps: int, warmup: int, probe: bool = False) -> dict:
    import torch
    if variant.startswith("ortmodule"):  # imported before anything touches the device (a dry run stops there)
        from torch_ort import ORTModule
        from torch_ort.optim import AdamWMode, FusedAdam
    case = sizes(case_name, device)
    torch.manual_seed(0)
    model, make_batch, loss_of, per_sequence = build(case)
    model.to(device)
    params = list(model.parameters())
    flops = model_flops(model, case, per_sequence)
    if variant == "compile":
        model = torch.compile(model)
    elif variant == "compile_ro":
        model = torch.compile(model, mode="reduce-overhead")
    elif variant.startswith("ortmodule"):
        model = ORTModule(model)
    if variant == "ortmodule_fused":
        opt = FusedAdam(params, lr=1e-4, weight_decay=0.01, adam_w_mode=AdamWMode.ADAMW_TORCH)
    else:
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=device == "cuda")
    gen = torch.Generator().manual_seed(1)
    batches = []  # on the device before anything is timed; a few, cycled
    for _ in range(min(8, 1 + warmup + steps)):
        args, kwargs = make_batch(gen)
        batches.append(([a.to(device) for a in args], {k: v.to(device) for k, v in kwargs.items()}))
    # reduce-overhead replays CUDA graphs: a new step must be announced, and an output copied
    # before the next replay overwrites it.
    step_begin = torch.compiler.cudagraph_mark_step_begin if variant == "compile_ro" else (lambda: None)

    loss_dtypes = []

    def step(i: int):
        args, kwargs = batches[i % len(batches)]
        step_begin()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = loss_of(model(*args, **kwargs))
        loss_dtypes[:] = [str(loss.dtype).replace("torch.", "")]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().float().clone()  # read after the loop: no synchronization per step

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    first_loss = step(0).item()
    first = time.perf_counter() - start
    for i in range(warmup):
        step(1 + i)
    sync()
    peak_before = torch.cuda.max_memory_allocated() if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    clock, losses = Clock(device), []
    clock.mark()
    for i in range(steps):
        losses.append(step(1 + warmup + i))
        clock.mark()
    times = clock.intervals()
    losses = torch.stack(losses).tolist()
    if cuda:
        steady = torch.cuda.max_memory_allocated()
        whole = max(peak_before, steady)
    else:  # the process's peak RSS stands for both
        steady = whole = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {"first_step_s": first, "median_step_s": statistics.median(times), "times_s": times,
           "mean_step_s": sum(times) / len(times), "peak_steady_bytes": steady, "peak_whole_bytes": whole,
           "first_loss": first_loss, "last_loss": losses[-1], "losses": losses, "loss_dtype": loss_dtypes[0],
           "parameters": sum(p.numel() for p in params), "flops_per_step": flops, "env": environment(device)}
    if variant.startswith("ortmodule"):
        stats = getattr(model, "stats", None)
        out["stats"] = (json.loads(json.dumps(stats(), default=str)) if callable(stats)
                        else {"error": "this ORTModule has no stats()"})
    if probe:
        out["probe"] = probe_step(step, device, 1 + warmup + steps)
    return out


# Attention's kernels and operators, fused or not (a softmax that is not the loss's log-softmax).
ATTENTION = re.compile(r"attention|attn|fmha|flash|sdpa|(?<!log)(?<!log_)softmax(?!_backward_data)", re.IGNORECASE)
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
ENGINE_NODES = 12  # the probe's costliest engine node types, kept per variant


def probe_step(step, device: str, i: int) -> dict:
    """What one steady step does, beyond its time: the attention operators and kernels the profiler
    saw, its device-to-host copies and host synchronizations, then two more steps under
    torch.cuda.set_sync_debug_mode("error") (a synchronizing call raises, naming itself)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        step(i)
    ops, kernels, copies, syncs, nodes = {}, {}, 0, {}, []
    for e in prof.key_averages():
        if e.key.startswith("torch_ort::"):  # the engine's nodes (one profiler range each)
            device_us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            nodes.append(dict(node=e.key[len("torch_ort::"):][:120], count=e.count,
                              cpu_ms=e.cpu_time_total / 1e3, device_ms=device_us / 1e3))
            continue
        on_device = "CUDA" in str(getattr(e, "device_type", ""))
        if on_device and "Memcpy DtoH" in e.key:
            copies += e.count
        elif e.key in SYNCS:
            syncs[e.key] = e.count
        elif ATTENTION.search(e.key) and not e.key.startswith("autograd::"):
            (kernels if on_device else ops)[e.key[:160]] = e.count
    nodes.sort(key=lambda n: n["device_ms" if cuda else "cpu_ms"], reverse=True)
    out = {"attention_ops": ops, "attention_kernels": kernels, "d2h_copies": copies, "syncs": syncs,
           "engine_nodes": nodes[:ENGINE_NODES]}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for k in range(2):
                step(i + 1 + k)
            out["sync_debug"] = "no synchronizing call in 2 steps"
        except RuntimeError as e:
            out["sync_debug"] = f"raised: {str(e).splitlines()[0][:300]}"
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return out


# --- child: the bf16 GEMM peak, on a large square and on the cases' own shapes --------------------
def gemm_shapes(case_names: list[str], device: str) -> list[dict]:
    """C(m×n) = A(m×k)·B(k×n): a large square, then the forward GEMMs of each case's layers."""
    side = 8192 if device == "cuda" else 256
    shapes = [dict(label="large square", case="", m=side, k=side, n=side)]
    for name in case_names:
        c = sizes(name, device)
        t, w = c["batch"] * c["context"], c["width"]
        if c["kind"] == "hf_bert":  # separate query/key/value/output Linears
            rows = [("q/k/v/out", w, w), ("mlp up", w, 4 * w), ("mlp down", 4 * w, w)]
        else:
            rows = [("qkv", w, 3 * w), ("attn out", w, w), ("mlp up", w, 4 * w), ("mlp down", 4 * w, w),
                    ("lm head", w, c["vocab"])]
        shapes += [dict(label=label, case=name, m=t, k=k, n=n) for label, k, n in rows]
    return shapes


def gemm_peak(case_names: list[str], device: str) -> dict:
    """bf16 FLOP/s of each shape (the best of several timed batches of products)."""
    import torch
    shapes = gemm_shapes(case_names, device)
    for s in shapes:
        a = torch.randn(s["m"], s["k"], device=device, dtype=torch.bfloat16)
        b = torch.randn(s["k"], s["n"], device=device, dtype=torch.bfloat16)
        c = torch.empty(s["m"], s["n"], device=device, dtype=torch.bfloat16)
        torch.mm(a, b, out=c)  # the library picks its kernel
        best = float("inf")
        for _ in range(5):
            clock = Clock(device)
            clock.mark()
            for _ in range(10):
                torch.mm(a, b, out=c)
            clock.mark()
            best = min(best, clock.intervals()[0] / 10)
        s["bfloat16"] = 2 * s["m"] * s["k"] * s["n"] / best
    return {"shapes": shapes, "peak": max(s["bfloat16"] for s in shapes), "env": environment(device)}


# --- report ------------------------------------------------------------------------------------------
def _seconds(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


def _tflops(v: float) -> str:
    return f"{v / 1e12:.1f}" if v >= 1e12 else f"{v / 1e12:.4f}"


def _label(case: str) -> str:
    return CASES[case]["label"]


def _env(result: dict) -> dict:
    """The environment a child reported (the GEMM child's, else any variant's), over the parent's."""
    found = [result.get("gemm", {}).get("env")] + [r.get("env") for c in result["cases"].values()
                                                   for r in c["variants"].values()]
    return dict(result.get("env", {}), **next((e for e in found if e), {}))


def stamp(result: dict) -> str:
    e = _env(result)
    where = e.get("gpu") or f"CPU ({e.get('cpu', 'unknown')}, {e.get('cores', '?')} cores)"
    return f"{result['date']} · {where} · torch {e.get('torch', '?')} · Python {e.get('python', '?')}"


def goals(result: dict) -> list[tuple[str, str, str, bool | None]]:
    """(goal, measured, target, met) for the cases that were run; met is None where a figure it
    needs was not measured (a variant failed, or was not run)."""
    rows = []  # (case, goal, measured, target, met)
    for case, ref, target in SPEEDUP_GOALS:
        ours, fused = ratio(result, case, ref, "ortmodule"), ratio(result, case, ref, "ortmodule_fused")
        measured = times_text(ours) + (f" (FusedAdam {times_text(fused)})" if fused else "")
        rows.append((case, f"{_label(case)}: ORTModule step vs {VARIANTS[ref]}", measured, f"≥ {target:.1f}×",
                     None if ours is None else ours >= target))
    graphs = ratio(result, "small", "compile_ro", "ortmodule_cg")
    rows.append(("small", f"{_label('small')}: ORTModule + CUDA graphs vs torch.compile reduce-overhead",
                 times_text(graphs), "≥ 1.00×", None if graphs is None else graphs >= 1.0))
    for case in CASES:
        share = ratio(result, case, "ortmodule", "compile", "first_step_s")
        rows.append((case, f"{_label(case)}: ORTModule first step ÷ torch.compile's", percent_text(share),
                     f"≤ {FIRST_STEP_GOAL:.0%}", None if share is None else share <= FIRST_STEP_GOAL))
    for case in CASES:
        mem = ratio(result, case, "ortmodule", "eager", "peak_steady_bytes")
        rows.append((case, f"{_label(case)}: ORTModule peak memory (timed steps) ÷ eager's", times_text(mem),
                     "≤ 1.00×", None if mem is None else mem <= 1.0))
    return [row[1:] for row in rows if row[0] in result["cases"]]


def _host_reads(r: dict) -> str:
    stats = r.get("stats")
    if stats is None:
        return ""
    if "host_reads_forward" not in stats:
        return stats.get("error", "not in stats()")
    return f"{stats['host_reads_forward']} + {stats['host_reads_backward']}"


def _case_table(result: dict, case: str) -> list[str]:
    rows, c = result["cases"][case]["variants"], sizes(case, result["device"])
    params = next((r["parameters"] for r in rows.values() if "parameters" in r), None)
    memory = "peak GPU memory" if result["device"] == "cuda" else "peak RSS"
    lines = ["", f"## {_label(case)}", "", f"_{stamp(result)}_", "",
             f"{c['layers']} layers, {c['heads']} heads, width {c['width']}, batch {c['batch']} × "
             f"context {c['context']}, vocab {c['vocab']}, bf16 autocast"
             + (f"; {params / 1e6:.1f}M parameters" if params and params >= 1e5 else
                f"; {params:,} parameters" if params else "")
             + f"; median of {result['steps']} steps after {result['warmup']} warm-up.", "",
             f"| variant | first step | median step | vs eager | vs compile | vs reduce-overhead "
             f"| first step ÷ compile's | MFU | {memory}: timed / whole run | host reads per step "
             "(fwd + bwd) | CUDA graph captures / replays | last loss |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    eager, peak = measured_row(result, case, "eager"), result.get("gemm", {}).get("peak")
    for variant, r in rows.items():
        if "error" in r:
            what = r["error"] if r["error"].startswith("not run") else f"failed: {r['error']}"
            lines.append(f"| {VARIANTS[variant]} | {what[:170].replace('|', '/')} | | | | | | | | | | |")
            continue
        drift = eager and abs(r["last_loss"] - eager["last_loss"]) > DRIFT * abs(eager["last_loss"])
        stats = r.get("stats") or {}
        graphs = (f"{stats['cuda_graph_captures']} / {stats['cuda_graph_replays']}"
                  if "cuda_graph_replays" in stats else "")
        cells = [VARIANTS[variant], _seconds(r["first_step_s"]), _seconds(r["median_step_s"]),
                 *(times_text(ratio(result, case, ref, variant)) for ref in ("eager", "compile", "compile_ro")),
                 percent_text(ratio(result, case, variant, "compile", "first_step_s")),
                 percent_text(r["flops_per_step"] / r["median_step_s"] / peak) if peak else "-",
                 f"{_gib(r['peak_steady_bytes'])} / {_gib(r['peak_whole_bytes'])}", _host_reads(r), graphs,
                 f"{r['last_loss']:.4f}" + (" (≠ eager)" if drift else "")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _gemm_table(result: dict) -> list[str]:
    gemm = result.get("gemm", {})
    if not gemm.get("shapes"):
        return ["", "## bf16 GEMM peak", "", f"Not measured: {gemm.get('error', 'not run')}"]
    lines = ["", "## bf16 GEMM peak", "", f"_{stamp(result)}_", "",
             "C(m×n) = A(m×k)·B(k×n), torch.mm into a preallocated output, best of 5 batches of 10; "
             "the cases' shapes are their layers' forward products (m = batch·context).", "",
             "| shape | case | m × k × n | bf16 TFLOP/s |", "|---|---|---|---|"]
    for s in gemm["shapes"]:
        lines.append(f"| {s['label']} | {s['case'] or '-'} | {s['m']} × {s['k']} × {s['n']} | "
                     f"{_tflops(s['bfloat16'])} |")
    return lines + [f"| **peak** | | | **{_tflops(gemm['peak'])}** |"]


def _probe_table(result: dict) -> list[str]:
    """One row per variant that ran with --probe: what its steady step did besides taking time."""
    rows = [(case, v, r) for case, c in result["cases"].items() for v, r in c["variants"].items()
            if "probe" in r]
    if not rows:
        return []
    lines = ["", "## Probe: one steady step, looked into", "", f"_{stamp(result)}_", "",
             "| case | variant | median step | loss dtype, first → last | host reads (fwd + bwd) | "
             "device→host copies | synchronizations | sync debug mode \"error\" | attention (ops; kernels) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for case, variant, r in rows:
        p = r["probe"]
        counted = lambda d: ", ".join(f"{k} ×{n}" for k, n in d.items()) or "none"  # noqa: E731
        cells = [_label(case), VARIANTS[variant], _seconds(r["median_step_s"]),
                 f"{r.get('loss_dtype', '?')}, {r['first_loss']:.4f} → {r['last_loss']:.4f}", _host_reads(r),
                 str(p["d2h_copies"]), counted(p["syncs"]), p.get("sync_debug", "-"),
                 f"{counted(p['attention_ops'])}; {counted(p['attention_kernels'])}"]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return lines + _engine_nodes_table(rows)


def _engine_nodes_table(rows) -> list[str]:
    """Per ORTModule variant probed: the engine's node types that cost most in its profiled step
    (device time on a GPU: the kernels launched inside each node's range)."""
    rows = [(case, v, r["probe"]["engine_nodes"]) for case, v, r in rows if r["probe"].get("engine_nodes")]
    if not rows:
        return []
    lines = ["", "Where the engine's profiled step went, by node type (its torch_ort::<op> ranges: device "
             "ms / host ms over the step, × calls):", "", "| case | variant | costliest nodes |", "|---|---|---|"]
    for case, variant, nodes in rows:
        cells = "; ".join(f"{n['node']} {n['device_ms']:.2f} / {n['cpu_ms']:.2f} ms ×{n['count']}" for n in nodes)
        lines.append(f"| {_label(case)} | {VARIANTS[variant]} | {cells.replace('|', '/')} |")
    return lines


def markdown(result: dict) -> list[str]:
    e, peak = _env(result), result.get("gemm", {}).get("peak")
    lines = [f"# GPU training-step suite, {result['date']}", "", f"_{stamp(result)}_", "",
             f"Device {result['device']}"
             + (f": {e['gpu']}, CUDA {e.get('cuda')}, cuDNN {e.get('cudnn')}" if e.get("gpu") else "")
             + f"; transformers {e.get('transformers', '-')}; CPU {e.get('cpu', '?')}, {e.get('cores', '?')} "
             "cores. Each variant in its own process with cold caches; the first step (export or "
             "compilation) timed alone, then the median of the timed steps (forward, backward, optimizer "
             "step) after the warm-up, "
             + ("CUDA events, no synchronization between steps. " if result["device"] == "cuda" else
                "perf_counter. ")
             + "Ratios are within "
             "this run: the reference's time ÷ the row's (> 1: the row is faster). MFU against the "
             f"measured bf16 GEMM peak ({f'{_tflops(peak)} TFLOP/s' if peak else 'not measured'}). "
             "Goals are judged on ORTModule with the same optimizer as eager's (AdamW fused).", ""]
    if result["device"] != "cuda":
        lines += ["**CPU check run** (tiny models, perf_counter, peak RSS): it shows that the code runs; "
                  "its figures say nothing about the goals.", ""]
    verdict = {True: "met", False: "not met", None: "not measured"}
    lines += ["## Goals", "", f"_{stamp(result)}_", "", "| goal | measured | target | met |", "|---|---|---|---|"]
    for goal, measured, target, ok in goals(result):
        shown = verdict[ok] if result["device"] == "cuda" or ok is None else f"({verdict[ok]}: CPU check)"
        lines.append(f"| {goal} | {measured} | {target} | {shown} |")
    lines += _probe_table(result)
    for case in result["cases"]:
        lines += _case_table(result, case)
    return lines + _gemm_table(result)


def chart(result: dict, path: str) -> None:
    """Per case, bars per variant: speed-up over eager, first step (log), peak memory."""
    try:
        import matplotlib
    except ImportError:
        print(f"[gpu_suite] matplotlib is not installed: no {os.path.basename(path)}")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = list(result["cases"])
    variants = [v for v in VARIANTS if any(v in result["cases"][c]["variants"] for c in cases)]
    panels = [("speed-up over eager (×, higher is faster)", lambda c, v: ratio(result, c, "eager", v)),
              ("first step, s (log scale)", lambda c, v: (measured_row(result, c, v) or {}).get("first_step_s")),
              ("peak memory over the timed steps, GiB",
               lambda c, v: (measured_row(result, c, v) or {}).get("peak_steady_bytes", 0) / 2**30 or None)]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5))
    width = 0.8 / max(len(variants), 1)
    for ax, (title, value) in zip(axes, panels):
        for i, variant in enumerate(variants):
            xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(cases))]
            ys = [value(c, variant) for c in cases]
            bars = ax.bar([x for x, y in zip(xs, ys) if y], [y for y in ys if y], width,
                          label=VARIANTS[variant], color=f"C{i}")
            ax.bar_label(bars, fmt="%.2g", fontsize=6)
            for x, c in zip(xs, cases):  # a failed row is marked, not silently absent
                if variant in result["cases"][c]["variants"] and not measured_row(result, c, variant):
                    ax.text(x, 0.02, "failed", rotation=90, fontsize=6, ha="center", va="bottom",
                            transform=ax.get_xaxis_transform())
        ax.set_xticks(range(len(cases)), [CHART_LABELS[c] for c in cases], fontsize=8)
        ax.set_title(title, fontsize=9)
    axes[0].axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    if any(b.get_height() > 0 for b in axes[1].patches):
        axes[1].set_yscale("log")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(variants), fontsize=8)
    fig.suptitle(f"torch_ort GPU training-step suite: {stamp(result)}", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: dict, out_dir: str, with_chart: bool = True) -> list[str]:
    """<name>.json, <name>.md (and <name>.png) in out_dir; returns the markdown lines."""
    return write_results(result, out_dir, result.get("name", "gpu_suite"), markdown,
                         chart if with_chart else (lambda r, p: None))


# --- parent ------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the same code on tiny models, to check it where there is no GPU")
    parser.add_argument("--cases", default=",".join(CASES), help="comma list, default: all")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma list, default: all")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (the median is reported)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps after the first")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per variant process")
    parser.add_argument("--stop-at", type=float, default=0,
                        help="Unix time: start no variant after it, and stop a running one there")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="where <name>.* go")
    parser.add_argument("--name", default="gpu_suite", help="the results' file name (default gpu_suite)")
    parser.add_argument("--probe", action="store_true",
                        help="also profile one steady step per variant (attention kernels, copies, "
                             "synchronizations) and run two under torch.cuda.set_sync_debug_mode('error')")
    parser.add_argument("--no-gemm", action="store_true", help="skip the bf16 GEMM peak (no MFU)")
    parser.add_argument("--from-json", help="only re-render the markdown and chart of a gpu_suite.json")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument("--gemm-peak", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases, variants = args.cases.split(","), args.variants.split(",")
    if args.child:
        print("RESULT " + json.dumps(child(*args.child, args.device, args.steps, args.warmup, args.probe)))
        return
    if args.gemm_peak:
        print("RESULT " + json.dumps(gemm_peak(cases, args.device)))
        return
    if args.from_json:
        with open(args.from_json) as f:
            print("\n".join(write(json.load(f), args.out)))
        return
    for names, known in ((cases, CASES), (variants, VARIANTS)):
        unknown = [n for n in names if n not in known]
        if unknown:
            parser.error(f"unknown {unknown}; choose from {','.join(known)}")
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA GPU here; --device cpu runs the same code on tiny models")
    ram_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    result = {"name": args.name, "date": time.strftime("%Y-%m-%d"), "device": args.device, "steps": args.steps,
              "warmup": args.warmup, "cases": {c: {"variants": {}} for c in cases},
              "env": {"python": platform.python_version(), "torch": torch.__version__, "cpu": cpu_model(),
                      "cores": os.cpu_count()}}

    dry_run = os.environ.get("TORCH_ORT_GPU_DRY_RUN") == "1"  # scripts/gpu_dry_run.py
    dry_failures, checked_cases, checked_variants = [], set(), set()

    def run(argv: list[str], env_extra: dict | None = None) -> dict:
        left = args.stop_at - time.time() if args.stop_at else args.timeout
        if left <= 0:
            return {"error": "not run: the --stop-at time had passed"}
        r = run_watched(os.path.abspath(__file__), [*argv, "--device", args.device], 0.8 * ram_gb,
                        min(args.timeout, left), env_extra)
        if dry_run:  # a child must get as far as its first CUDA call
            if DRY_RUN_MARK in r.get("log_tail", ""):
                return {"error": "dry run: reached its first CUDA call"}
            dry_failures.append(f"{' '.join(argv)}: {r.get('error', 'finished without a CUDA call')}")
        return r

    if not args.no_gemm:
        print(f"[gpu_suite] bf16 GEMM peak ({args.device}):", end=" ", flush=True)
        result["gemm"] = gemm = run(["--gemm-peak", "--cases", ",".join(cases)])
        print(gemm["error"] if "error" in gemm else f"{_tflops(gemm['peak'])} TFLOP/s ({gemm['wall_s']:.0f} s)",
              flush=True)
    for variant in variants:  # variant by variant: a run cut short has the first ones for every case
        env = {}
        if variant.startswith("ortmodule"):
            env = {"ORTMODULE_FALLBACK_POLICY": "FALLBACK_DISABLE",
                   "ORTMODULE_USE_CUDA_GRAPH": "1" if variant == "ortmodule_cg" else "0"}
        # A dry run checks each case and each variant once, pairing a new variant with a new case:
        # max(cases, variants) children instead of all of them.
        last = variant == variants[-1]
        todo = [c for c in cases if c not in checked_cases] or cases[:1]
        for case in cases:
            if dry_run and (variant in checked_variants or case != todo[0]) and not (last and case in todo):
                result["cases"][case]["variants"][variant] = {"error": "not run: a dry run checks each "
                                                              "case and each variant once"}
                continue
            checked_cases.add(case)
            checked_variants.add(variant)
            print(f"[gpu_suite] {case}/{variant}:", end=" ", flush=True)
            argv = ["--child", case, variant, "--steps", str(args.steps), "--warmup", str(args.warmup)]
            argv += ["--probe"] if args.probe else []
            r = result["cases"][case]["variants"][variant] = run(argv, env)
            print(r["error"] if "error" in r else
                  f"first {_seconds(r['first_step_s'])}, median {_seconds(r['median_step_s'])}, "
                  f"peak {_gib(r['peak_steady_bytes'])} ({r['wall_s']:.0f} s in all)", flush=True)
            write(result, args.out, with_chart=False)
    print("\n".join(write(result, args.out)))
    rows = [r for c in result["cases"].values() for r in c["variants"].values()]
    judged = [ok for *_, ok in goals(result) if ok is not None]
    print(f"[gpu_suite] {len(rows)} variants: {sum('error' not in r for r in rows)} measured, "
          f"{sum(r.get('error', '').startswith('not run') for r in rows)} not run, "
          f"{sum('error' in r and not r['error'].startswith('not run') for r in rows)} failed; "
          f"goals met: {sum(judged)} of {len(judged)} measured ({args.device}); written to {args.out}")
    if dry_failures:
        sys.exit("[gpu_suite] dry run: these children failed before their first CUDA call:\n  "
                 + "\n  ".join(dry_failures))


if __name__ == "__main__":
    main()
