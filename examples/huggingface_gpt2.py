"""Train a small Hugging Face GPT-2 with ORTModule, checkpoint it, then fine-tune it on a second text.

No download. Pre-training text: the Python standard library's own source (its top-level *.py
files). Fine-tuning text: Python's reference documentation as the interpreter ships it
(pydoc_data.topics, English prose). Both byte-level (vocab 256). The loop is plain Hugging Face +
PyTorch with the README's two-line change: `ORTModule(model)` and torch_ort's `FusedAdam` in
place of `torch.optim.AdamW` (same arguments, same update); the eager run keeps torch.optim.AdamW.

Steps: pre-train on code -> checkpoint (save_pretrained + optimizer state) -> perplexity on
held-out documentation -> a fresh model loaded from the checkpoint -> fine-tune on the
documentation -> perplexity again. By default this runs twice, each in its own process — ORTModule
and eager PyTorch, same seeds, same batches — then prints tokens/s, peak memory and perplexities
side by side and draws both loss curves (PNG).

    scripts/run_example.sh                                       # installs what it needs, then this
    .venv/bin/python examples/huggingface_gpt2.py --steps 400 --finetune-steps 200 --width 128
    .venv/bin/python examples/huggingface_gpt2.py --mode ortmodule   # one process, no comparison
    .venv/bin/python examples/huggingface_gpt2.py --no-eager         # only ORTModule (--eager: only eager)
    .venv/bin/python examples/huggingface_gpt2.py --device cuda      # on a GPU (default: the CPU)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

import torch_ort
from torch_ort.optim import FusedAdam

MODES = ("ortmodule", "eager")


# --- data ------------------------------------------------------------------------------------------
def stdlib_source(max_mb: float) -> torch.Tensor:
    """The standard library's top-level *.py files, concatenated as bytes (sorted: reproducible)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(root.glob("*.py")):
        chunks.append(path.read_bytes())
        size += len(chunks[-1])
        if size >= max_mb * 2 ** 20:
            break
    if not chunks:
        raise SystemExit(f"no Python sources under {root}")
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


def python_docs(max_mb: float) -> torch.Tensor:
    """Python's reference documentation topics (pydoc_data ships them with the interpreter)."""
    from pydoc_data.topics import topics
    text = "\n\n".join(topics[k] for k in sorted(topics)).encode()[:int(max_mb * 2 ** 20)]
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


def split(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cut = int(0.95 * len(data))
    return data[:cut], data[cut:]


def batches(data: torch.Tensor, batch: int, seq: int, gen: torch.Generator):
    """Random windows of `seq` bytes, forever."""
    while True:
        starts = torch.randint(0, len(data) - seq, (batch,), generator=gen)
        yield torch.stack([data[s:s + seq] for s in starts.tolist()]).long()  # (B, T)


# --- model and training -------------------------------------------------------------------------
def build_model(args) -> torch.nn.Module:
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        vocab_size=256, n_positions=args.seq, n_embd=args.width, n_layer=args.layers, n_head=args.heads,
        resid_pdrop=args.dropout, embd_pdrop=args.dropout, attn_pdrop=args.dropout,
        bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
    return transformers.GPT2LMHeadModel(config)  # lm_head tied to the token embedding


@torch.no_grad()
def perplexity(model, data: torch.Tensor, args) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(args.seed + 1)
    # No key/value cache: perplexity needs none, and torch 2.11's exporter fails on one returned
    # under no_grad.
    losses = [model(input_ids=x.to(args.device), labels=x.to(args.device), use_cache=False).loss.item()
              for x, _ in zip(batches(data, args.batch, args.seq, gen), range(args.eval_batches))]
    model.train()
    return math.exp(sum(losses) / len(losses))


def train(model, opt, data, steps, lr, args, label) -> dict:
    """`steps` steps of cosine-decayed AdamW (FusedAdam or torch's); the losses and the steady tokens/s (first step apart)."""
    gen = torch.Generator().manual_seed(args.seed)
    warmup = max(1, steps // 20)
    losses, first_s, start = [], 0.0, time.perf_counter()
    bar = tqdm(zip(range(steps), batches(data, args.batch, args.seq, gen)), total=steps, desc=label,
               unit="step", dynamic_ncols=True, disable=args.quiet)
    for step, x in bar:
        x = x.to(args.device)
        for group in opt.param_groups:
            group["lr"] = lr * min((step + 1) / warmup, 0.5 * (1 + math.cos(math.pi * step / steps)))
        loss = model(input_ids=x, labels=x).loss  # GPT-2 shifts the labels itself
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step == 0:  # includes the export and engine build under ORTModule
            first_s = time.perf_counter() - start
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    total = time.perf_counter() - start
    steady = (total - first_s) / max(1, steps - 1)
    return {"losses": losses, "first_step_s": first_s, "tokens_per_s": args.batch * args.seq / max(steady, 1e-9)}


def run_mode(args) -> dict:
    """One mode, start to end, in this process."""
    ours = args.mode == "ortmodule"
    code_train, _ = split(stdlib_source(args.data_mb))
    docs_train, docs_val = split(python_docs(args.data_mb))
    wrap = torch_ort.ORTModule if ours else (lambda m: m)  # torch_ort line 1
    adamw = FusedAdam if ours else torch.optim.AdamW      # torch_ort line 2: FusedAdam makes AdamW's update
    torch.manual_seed(args.seed)
    model = wrap(build_model(args).to(args.device))
    opt = adamw(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    out = {"mode": args.mode, "parameters": sum(p.numel() for p in model.parameters())}
    out["pretrain"] = train(model, opt, code_train, args.steps, args.lr, args, f"{args.mode}: pre-train on code")
    exports = getattr(model, "export_count", 0)
    fallbacks = [model.fallback] if ours else []

    # Checkpoint as a Hugging Face model (ORTModule.module is the GPT2LMHeadModel) + optimizer.
    ckpt = Path(args.out_dir) / f"checkpoint-{args.mode}"
    (model.module if ours else model).save_pretrained(ckpt)
    torch.save(opt.state_dict(), ckpt / "optimizer.pt")
    out["perplexity_before"] = perplexity(model, docs_val, args)
    out["exports_pretrain"], out["exports_after_eval"] = exports, getattr(model, "export_count", 0)

    # A new job: the model from the checkpoint, then fine-tuning with a fresh optimizer.
    model = wrap(transformers.GPT2LMHeadModel.from_pretrained(ckpt).to(args.device))
    out["perplexity_loaded"] = perplexity(model, docs_val, args)
    opt = adamw(model.parameters(), lr=args.finetune_lr, betas=(0.9, 0.95), weight_decay=0.1)
    out["finetune"] = train(model, opt, docs_train, args.finetune_steps, args.finetune_lr, args,
                            f"{args.mode}: fine-tune on docs")
    out["perplexity_after"] = perplexity(model, docs_val, args)
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.device.startswith("cuda"):
        out["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    # ORTModule.fallback: None while the engine runs, else the policy flag and the reason
    fallbacks += [model.fallback] if ours else []
    out["fell_back"] = "; ".join(f"{f.flag}: {f.reason}" for f in fallbacks if f is not None)
    return out


# --- the comparison ----------------------------------------------------------------------------
def report(results: dict, args) -> None:
    rows = [("parameters", lambda r: f"{r['parameters'] / 1e6:.2f} M"),
            ("pre-training loss (first -> last)", lambda r: f"{r['pretrain']['losses'][0]:.3f} -> {r['pretrain']['losses'][-1]:.3f}"),
            ("pre-training tokens/s", lambda r: f"{r['pretrain']['tokens_per_s']:,.0f}"),
            ("first step (export + build)", lambda r: f"{r['pretrain']['first_step_s']:.2f} s"),
            ("docs perplexity: pre-trained", lambda r: f"{r['perplexity_before']:.2f}"),
            ("docs perplexity: loaded from checkpoint", lambda r: f"{r['perplexity_loaded']:.2f}"),
            ("fine-tuning tokens/s", lambda r: f"{r['finetune']['tokens_per_s']:,.0f}"),
            ("docs perplexity: fine-tuned", lambda r: f"{r['perplexity_after']:.2f}"),
            ("peak RSS of the process", lambda r: f"{r['peak_rss_mib']:,.0f} MiB")]
    if all("peak_gpu_mib" in r for r in results.values()):
        rows.append(("peak GPU memory (allocated)", lambda r: f"{r['peak_gpu_mib']:,.0f} MiB"))
    modes = list(results)
    print("\n| | " + " | ".join(modes) + " |\n|---|" + "---|" * len(modes))
    for name, cell in rows:
        print(f"| {name} | " + " | ".join(cell(results[m]) for m in modes) + " |")
    if "ortmodule" in results and "eager" in results:
        o, e = results["ortmodule"], results["eager"]
        print(f"ORTModule vs eager: pre-training {o['pretrain']['tokens_per_s'] / e['pretrain']['tokens_per_s']:.2f}x "
              f"tokens/s, fine-tuning {o['finetune']['tokens_per_s'] / e['finetune']['tokens_per_s']:.2f}x, "
              f"peak RSS {o['peak_rss_mib'] / e['peak_rss_mib']:.2f}x; max |loss difference| "
              f"{max(abs(a - b) for a, b in zip(o['pretrain']['losses'], e['pretrain']['losses'])):.1e}")
    if "ortmodule" in results:
        o = results["ortmodule"]
        print(f"ORTModule exports: {o['exports_pretrain']} while pre-training, "
              f"{o['exports_after_eval']} after evaluation"
              + (f"; it FELL BACK to eager PyTorch ({o['fell_back']})" if o["fell_back"] else ""))


def plot(results: dict, path: Path) -> bool:
    """Both loss curves in one PNG; False (nothing drawn) where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    for mode, r in results.items():
        pre, ft = r["pretrain"]["losses"], r["finetune"]["losses"]
        ax.plot(range(len(pre) + len(ft)), pre + ft, label=mode, alpha=0.8)
    n = len(next(iter(results.values()))["pretrain"]["losses"])
    ax.axvline(n - 0.5, color="gray", linestyle="--")
    ax.text(n, ax.get_ylim()[1] * 0.95, " fine-tuning on the docs", va="top", color="gray")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_title("GPT-2 byte-level: pre-training on stdlib code, then fine-tuning")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=MODES, help="run one mode in this process (default: both, compared)")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--no-eager", action="store_true", help="compare nothing: only the ORTModule process")
    only.add_argument("--eager", action="store_true", help="compare nothing: only the eager PyTorch process")
    p.add_argument("--steps", type=int, default=200, help="pre-training steps")
    p.add_argument("--finetune-steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--finetune-lr", type=float, default=1e-3)
    p.add_argument("--data-mb", type=float, default=4.0, help="how much of each text to read")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="runs/huggingface_gpt2", help="checkpoints and the loss plot")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--device", default="cpu", help="cpu, or cuda to train on the GPU")
    p.add_argument("--result", help=argparse.SUPPRESS)  # a child writes its JSON here
    args = p.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.mode:
        result = run_mode(args)
        if args.result:
            Path(args.result).write_text(json.dumps(result))
        else:
            report({args.mode: result}, args)
        return

    print(f"GPT-2, {args.layers} layers x {args.width} wide; batch {args.batch} x {args.seq} bytes; "
          f"{args.steps} pre-training + {args.finetune_steps} fine-tuning steps; each mode in its own process")
    results = {}
    passed = [a for a in sys.argv[1:] if a not in ("--no-eager", "--eager")]
    modes = MODES[:1] if args.no_eager else MODES[1:] if args.eager else MODES
    for mode in modes:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            subprocess.run([sys.executable, os.path.abspath(__file__), "--mode", mode, "--result", f.name,
                            *passed], check=True)
            results[mode] = json.loads(Path(f.name).read_text())
    report(results, args)
    png = Path(args.out_dir) / "loss.png"
    drawn = plot(results, png)
    print(f"loss curves: {png if drawn else 'not drawn (matplotlib is not installed)'}; "
          f"checkpoints: {args.out_dir}/checkpoint-*")


if __name__ == "__main__":
    main()
