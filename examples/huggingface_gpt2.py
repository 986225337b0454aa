"""Train a small Hugging Face GPT-2 with ORTModule on the Python standard library's own source.

No download: the text is the interpreter's `*.py` files, read byte-level (vocab 256), so any
machine with Python has it. The training loop is plain Hugging Face + PyTorch; the one torch_ort
line is `ORTModule(model)`. `--eager` trains the same model, same batches, without it.

    scripts/run_example.sh                              # installs what it needs, then runs this
    .venv/bin/python examples/huggingface_gpt2.py --eager
    .venv/bin/python examples/huggingface_gpt2.py --steps 2000 --width 256 --layers 6 --seq 256
"""
from __future__ import annotations

import argparse
import math
import sysconfig
import time
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

import torch_ort


def load_stdlib_bytes(max_mb: float) -> tuple[torch.Tensor, int, Path]:
    """The standard library's top-level *.py files, concatenated as bytes (sorted: reproducible)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, size, files = [], 0, 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        size += len(data)
        files += 1
        if size >= max_mb * 2**20:
            break
    if not chunks:
        raise SystemExit(f"no Python sources under {root}")
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8), files, root


def batches(data: torch.Tensor, batch: int, seq: int, gen: torch.Generator):
    """Random windows of `seq` bytes, forever."""
    while True:
        starts = torch.randint(0, len(data) - seq, (batch,), generator=gen)
        yield torch.stack([data[s:s + seq] for s in starts.tolist()]).long()  # (B, T)


def build_model(args) -> torch.nn.Module:
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        vocab_size=256, n_positions=args.seq, n_embd=args.width, n_layer=args.layers, n_head=args.heads,
        resid_pdrop=args.dropout, embd_pdrop=args.dropout, attn_pdrop=args.dropout,
        bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
    return transformers.GPT2LMHeadModel(config)  # lm_head tied to the token embedding


@torch.no_grad()
def evaluate(model, data: torch.Tensor, args) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(args.seed + 1)
    losses = [model(input_ids=x, labels=x).loss.item()
              for x, _ in zip(batches(data, args.batch, args.seq, gen), range(args.eval_batches))]
    model.train()
    return sum(losses) / len(losses)


def lr_at(step: int, args) -> float:
    warmup = max(1, args.steps // 20)
    if step < warmup:
        return args.lr * (step + 1) / warmup
    return args.lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eager", action="store_true", help="plain PyTorch, no ORTModule (for comparison)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--data-mb", type=float, default=4.0, help="how much of the stdlib to read")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    data, files, root = load_stdlib_bytes(args.data_mb)
    split = int(0.95 * len(data))
    train_data, val_data = data[:split], data[split:]
    print(f"data: {files} files from {root} ({len(data) / 2**20:.1f} MiB, byte-level, vocab 256); "
          f"{len(val_data) / 2**10:.0f} KiB held out")

    torch.manual_seed(args.seed)
    model = build_model(args)
    n_params = sum(p.numel() for p in model.parameters())
    if not args.eager:
        model = torch_ort.ORTModule(model)
    mode = "eager PyTorch" if args.eager else "ORTModule"
    print(f"model: GPT-2, {args.layers} layers x {args.width} wide, {args.heads} heads, "
          f"{n_params / 1e6:.2f} M parameters; batch {args.batch} x {args.seq} tokens; {mode}")

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    tokens_per_step = args.batch * args.seq
    losses, first_step_s, exports_first = [], 0.0, 0
    window_start, window_tokens = time.perf_counter(), 0
    bar = tqdm(zip(range(args.steps), batches(train_data, args.batch, args.seq, gen)), total=args.steps,
               desc=mode, unit="step", dynamic_ncols=True)
    start = time.perf_counter()
    for step, x in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        loss = model(input_ids=x, labels=x).loss  # GPT-2 shifts the labels itself
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step == 0:  # includes the export and engine build under ORTModule
            first_step_s = time.perf_counter() - start
            exports_first = getattr(model, "export_count", 0)
            window_start, window_tokens = time.perf_counter(), 0
            continue
        window_tokens += tokens_per_step
        rate = window_tokens / max(time.perf_counter() - window_start, 1e-9)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{rate:,.0f}")
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            tqdm.write(f"step {step + 1:5d}  loss {losses[-1]:.4f}  tokens/s {rate:,.0f}")
            window_start, window_tokens = time.perf_counter(), 0
    total_s = time.perf_counter() - start
    bar.close()
    exports_trained = getattr(model, "export_count", 0)

    val = evaluate(model, val_data, args)
    steady = (total_s - first_step_s) / max(1, args.steps - 1)
    print(f"done: {args.steps} steps in {total_s:.1f} s (first step {first_step_s:.2f} s, then "
          f"{steady * 1e3:.1f} ms/step = {tokens_per_step / max(steady, 1e-9):,.0f} tokens/s); "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; held-out loss {val:.4f}")
    if not args.eager:
        # The first step may export more than once (ops found for the ATen fallback); after it,
        # only the evaluation (eval mode, no gradients: its own graph) exports again.
        print(f"ORTModule exports: {exports_first} in the first step, {exports_trained} after "
              f"{args.steps} steps, {model.export_count} after evaluation; "
              f"engines built: {model.engine_build_count}")
        if model.engine_build_count == 0:
            print("ORTModule fell back to eager PyTorch (the warning above says why)")


if __name__ == "__main__":
    main()
