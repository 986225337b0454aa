"""BERT pre-training in the shape of NVIDIA's recipe: masked LM + next-sentence prediction, LAMB
(torch_ort's FusedLamb), gradient accumulation, linear warm-up then polynomial decay, bf16 mixed
precision, checkpoints that resume exactly, throughput in sequences/s — through ORTModule, on one
process or several (torchrun; gloo on CPU, NCCL on GPUs).

No download: the text is Python's reference documentation as the interpreter ships it
(pydoc_data.topics), split into sentences; a WordPiece vocabulary is trained on it first (the
`tokenizers` package, a second or two).

    .venv/bin/python examples/bert_pretraining.py --steps 100
    .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 examples/bert_pretraining.py
    .venv/bin/python examples/bert_pretraining.py --steps 200 --resume      # from the last checkpoint

--device cuda|cpu (default: cuda where a GPU is visible); with several processes the backend
follows it (nccl, gloo).
"""
from __future__ import annotations

import argparse
import gc
import contextlib
import os
import re
import time
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_ort
from torch_ort.optim import FusedLamb


# --- data: sentence pairs, 50% consecutive; 15% of tokens masked (80% [MASK], 10% random, 10% kept)
def sentences() -> list[list[str]]:
    """Documents (one per topic) as lists of sentences."""
    from pydoc_data.topics import topics
    docs = []
    for key in sorted(topics):
        text = re.sub(r"\s+", " ", topics[key])
        docs.append([s for s in re.split(r"(?<=[.!?])\s+", text) if len(s) > 20])
    return [d for d in docs if len(d) > 1]


def wordpiece(docs, vocab_size: int, path: Path, rank: int, distributed: bool):
    """The WordPiece vocabulary at `path`, trained there first (by rank 0) if it is missing.
    Training is not deterministic from run to run, so the file — kept beside the checkpoints — is
    what every rank and every resumed run reads."""
    from tokenizers import BertWordPieceTokenizer
    if rank == 0 and not path.exists():
        tok = BertWordPieceTokenizer(lowercase=True)
        tok.train_from_iterator((s for d in docs for s in d), vocab_size=vocab_size, min_frequency=2,
                                show_progress=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        tok.save_model(str(path.parent), path.stem)  # writes <stem>-vocab.txt
        os.replace(path.parent / f"{path.stem}-vocab.txt", path)
    if distributed:
        dist.barrier()
    return BertWordPieceTokenizer(str(path), lowercase=True)


class Pairs:
    """Endless (ids, token_type_ids, attention_mask, mlm labels, nsp label) batches, seeded."""

    def __init__(self, docs, tok, seq: int, batch: int, rank: int, world: int, seed: int):
        self.docs = [[tok.encode(s, add_special_tokens=False).ids for s in d] for d in docs]
        self.seq, self.batch, self.vocab = seq, batch, tok.get_vocab_size()
        self.special = {n: tok.token_to_id(n) for n in ("[CLS]", "[SEP]", "[MASK]", "[PAD]")}
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank)  # each rank its own stream

    def rand(self, n: int) -> int:
        return int(torch.randint(0, n, (), generator=self.gen))

    def pair(self):
        d = self.docs[self.rand(len(self.docs))]
        i = self.rand(len(d) - 1)
        a = d[i]
        if self.rand(2):  # the next sentence
            b, label = d[i + 1], 0
        else:  # a random sentence of a random document
            other = self.docs[self.rand(len(self.docs))]
            b, label = other[self.rand(len(other))], 1
        room = self.seq - 3
        a, b = a[:room - min(len(b), room // 2)], b[:room // 2]
        return a, b, label

    def next_batch(self):
        S = self.special
        ids = torch.full((self.batch, self.seq), S["[PAD]"], dtype=torch.long)
        types = torch.zeros_like(ids)
        nsp = torch.zeros(self.batch, dtype=torch.long)
        for row in range(self.batch):
            a, b, nsp[row] = self.pair()
            tokens = [S["[CLS]"], *a, S["[SEP]"], *b, S["[SEP]"]]
            ids[row, :len(tokens)] = torch.tensor(tokens)
            types[row, len(a) + 2:len(tokens)] = 1
        mask = (ids != S["[PAD]"]).long()
        special = (ids == S["[CLS]"]) | (ids == S["[SEP]"]) | (ids == S["[PAD]"])
        chosen = (torch.rand(ids.shape, generator=self.gen) < 0.15) & ~special
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        roll = torch.rand(ids.shape, generator=self.gen)
        masked = ids.clone()
        masked[chosen & (roll < 0.8)] = S["[MASK]"]
        swap = chosen & (roll >= 0.8) & (roll < 0.9)
        masked[swap] = torch.randint(0, self.vocab, (int(swap.sum()),), generator=self.gen)
        return masked, types, mask, labels, nsp


# --- schedule: NVIDIA's PolyWarmUpScheduler shape ------------------------------------------------
def lr_at(step: int, args) -> float:
    warm = max(1, int(args.warmup * args.steps))
    if step < warm:
        return args.lr * (step + 1) / warm
    return args.lr * max(0.0, 1 - step / args.steps) ** 0.5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eager", action="store_true", help="plain PyTorch (no ORTModule), for comparison")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps")
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--batch", type=int, default=16, help="sequences per micro-batch and process")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4000)
    p.add_argument("--vocab-file", default="", help="a WordPiece vocab.txt to use (default: "
                   "checkpoint-dir/vocab.txt, trained on the text when missing)")
    p.add_argument("--lr", type=float, default=4e-3)
    p.add_argument("--warmup", type=float, default=0.1, help="share of the steps spent warming up")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16", help="bf16 autocast or none")
    p.add_argument("--checkpoint-dir", default="runs/bert_pretraining")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--resume", action="store_true", help="continue from checkpoint-dir/last.pt")
    p.add_argument("--stop-after", type=int, default=0, help="end (checkpointed) after this step, as a "
                   "preempted job would; the schedule still spans --steps")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda where a GPU is visible")
    args = p.parse_args()

    distributed = "RANK" in os.environ
    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))

    docs = sentences()
    vocab_file = Path(args.vocab_file) if args.vocab_file else Path(args.checkpoint_dir) / "vocab.txt"
    tok = wordpiece(docs, args.vocab, vocab_file, rank, distributed)
    data = Pairs(docs, tok, args.seq, args.batch, rank, world, args.seed)
    torch.manual_seed(args.seed)
    transformers.logging.set_verbosity_error()
    config = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=args.hidden,
                                     num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64),
                                     intermediate_size=4 * args.hidden, max_position_embeddings=args.seq)
    model = transformers.BertForPreTraining(config).to(device)
    inner = model if args.eager else torch_ort.ORTModule(model)
    model = DDP(inner, device_ids=[device.index] if cuda else None) if distributed else inner
    decay = [p for n, p in inner.named_parameters() if not n.endswith("bias") and "LayerNorm" not in n]
    rest = [p for n, p in inner.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    opt = FusedLamb([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=args.lr)

    ckpt = Path(args.checkpoint_dir) / "last.pt"
    start = 0
    if args.resume and ckpt.exists():  # model, optimizer, step, and every rank's data/RNG state
        state = torch.load(ckpt, map_location=device, weights_only=False)
        inner.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
        data.gen.set_state(state["data_rng"][rank])
        torch.set_rng_state(state["torch_rng"][rank])
        if rank == 0:
            print(f"resumed from {ckpt} at step {start}")

    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    if rank == 0:
        print(f"BERT {args.layers}x{args.hidden}, vocab {tok.get_vocab_size()}, seq {args.seq}; "
              f"{world} process(es), {args.batch} x {args.accum} sequences per process and step "
              f"({args.batch * args.accum * world} global); {args.precision}; "
              f"{'eager PyTorch' if args.eager else 'ORTModule'} + FusedLamb")
    window_t, window_steps = time.perf_counter(), 0
    total = None  # stays None when the checkpoint is already at --steps (nothing left to train)
    for step in range(start, args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        total = 0.0
        for micro in range(args.accum):
            ids, types, mask, labels, nsp = (t.to(device) for t in data.next_batch())
            sync = not distributed or micro == args.accum - 1
            with (model.no_sync() if not sync else contextlib.nullcontext()), amp:
                out = model(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels,
                            next_sentence_label=nsp)
                loss = out.loss / args.accum
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        window_steps += 1
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
            elapsed = time.perf_counter() - window_t
            seqs = window_steps * args.batch * args.accum * world / elapsed
            print(f"step {step + 1:5d}  loss {total:.4f}  lr {lr_at(step, args):.2e}  {seqs:7.1f} sequences/s")
            window_t, window_steps = time.perf_counter(), 0
        stopping = step + 1 == args.steps or step + 1 == args.stop_after
        if (step + 1) % args.checkpoint_every == 0 or stopping:
            rngs = [None] * world
            mine = (data.gen.get_state(), torch.get_rng_state())
            if distributed:
                dist.all_gather_object(rngs, mine)
            else:
                rngs = [mine]
            if rank == 0:
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                torch.save({"model": inner.state_dict(), "optimizer": opt.state_dict(), "step": step + 1,
                            "data_rng": [r[0] for r in rngs], "torch_rng": [r[1] for r in rngs]}, ckpt)
        if stopping:
            break
    if rank == 0:
        print(f"final loss {total:.4f}; checkpoint {ckpt}" if total is not None else
              f"nothing to train: {ckpt} is at step {start} of --steps {args.steps}")
    if distributed:
        # DDP's reducer holds the process group: free the model first, so that the group's gloo
        # threads end here and not during interpreter shutdown, where torch can abort the rank.
        del model, opt, inner
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
