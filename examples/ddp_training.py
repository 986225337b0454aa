"""Distributed data-parallel training: DistributedDataParallel(ORTModule(model)) with FusedAdam and
the load-balancing samplers, one process per core (CPU, gloo) or per GPU (NCCL).

Data: the Python standard library's source, cut into paragraphs (blocks between blank lines) of
very different lengths, read byte-level (vocab 256) — no download. LoadBalancingDistributedSampler
gives every rank paragraphs of similar length at every step, and LoadBalancingDistributedBatchSampler
packs them into batches under a token budget with the same batch count on every rank, so no rank
waits on another holding the long ones. Gradients reach DDP while the engine's backward still runs
(ORTMODULE_GRADIENT_RELEASE), so its buckets all-reduce during backward.

    # one machine, two processes (CPU: gloo; GPUs: one process each, NCCL)
    .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 examples/ddp_training.py
    # one process (no torchrun needed); --eager: the same without ORTModule
    .venv/bin/python examples/ddp_training.py --steps 50
    # --device cuda|cpu (default: cuda where a GPU is visible); the backend follows it: nccl, gloo
    # several machines: see the README ("Distributed training")
"""
from __future__ import annotations

import argparse
import gc
import os
import re
import statistics
import sysconfig
import time
from pathlib import Path

import torch
import torch.distributed as dist
import transformers
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_ort
from torch_ort.optim import FusedAdam
from torch_ort.utils.data import LoadBalancingDistributedBatchSampler, LoadBalancingDistributedSampler


class Paragraphs(torch.utils.data.Dataset):
    """Blocks of the stdlib's *.py files between blank lines, as byte tensors of 16..max_len."""

    def __init__(self, max_len: int, max_mb: float):
        root = Path(sysconfig.get_paths()["stdlib"])
        self.items, size = [], 0
        for path in sorted(root.glob("*.py")):
            for block in re.split(rb"\n\s*\n", path.read_bytes()):
                if len(block) >= 16:
                    self.items.append(torch.frombuffer(bytearray(block[:max_len]), dtype=torch.uint8))
                    size += len(self.items[-1])
            if size >= max_mb * 2 ** 20:
                break

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def token_budget(dataset: Paragraphs, budget: int):
    """batch_fn: consecutive indices (similar lengths) packed while batch * longest <= budget."""
    def batch_fn(indices):
        batches, current, longest = [], [], 0
        for i in indices:
            n = len(dataset[i])
            if current and max(longest, n) * (len(current) + 1) > budget:
                batches.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, n)
        return batches + ([current] if current else [])
    return batch_fn


def collate(samples):
    """Right-padded (B, T) ids, the attention mask, and labels -100 on padding."""
    T = max(len(s) for s in samples)
    ids = torch.zeros(len(samples), T, dtype=torch.long)
    mask = torch.zeros(len(samples), T, dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, :len(s)] = s.long()
        mask[row, :len(s)] = 1
    return ids, mask, torch.where(mask.bool(), ids, torch.full_like(ids, -100))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--eager", action="store_true", help="plain PyTorch (no ORTModule), for comparison")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--tokens", type=int, default=2048, help="token budget per batch and rank")
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--data-mb", type=float, default=2.0)
    p.add_argument("--checkpoint", default="", help="rank 0 saves model + optimizer here at the end")
    p.add_argument("--resume", default="", help="every rank loads this checkpoint first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda where a GPU is visible")
    args = p.parse_args()

    distributed = "RANK" in os.environ  # set by torchrun
    cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:  # the cores are shared out among this machine's ranks
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))

    data = Paragraphs(args.max_len, args.data_mb)
    sampler = LoadBalancingDistributedSampler(data, complexity_fn=len, world_size=world, rank=rank,
                                              seed=args.seed)
    batches = LoadBalancingDistributedBatchSampler(sampler, token_budget(data, args.tokens))
    loader = torch.utils.data.DataLoader(data, batch_sampler=batches, collate_fn=collate)

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts them)
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(vocab_size=256, n_positions=args.max_len, n_embd=args.width,
                                     n_layer=args.layers, n_head=4, bos_token_id=0, eos_token_id=0,
                                     loss_type="ForCausalLM")
    model = transformers.GPT2LMHeadModel(config).to(device)
    if not args.eager:
        model = torch_ort.ORTModule(model)  # wrap first, then DDP
    inner = model  # checkpoints hold the original module's keys: loadable at any process count
    if distributed:
        model = DDP(model, device_ids=[local_rank] if cuda else None)
    opt = FusedAdam(model.parameters(), lr=args.lr, weight_decay=0.01)
    if args.resume:  # every rank reads the same file
        state = torch.load(args.resume, map_location=device)
        inner.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])

    if rank == 0:
        print(f"{world} process(es) on {'CUDA/NCCL' if cuda else 'CPU/gloo'}; "
              f"{'eager PyTorch' if args.eager else 'ORTModule'}; {len(data)} paragraphs, "
              f"{len(batches)} batches per rank and epoch under {args.tokens} tokens")
    step, epoch, times, skew = 0, 0, [], []
    while step < args.steps:
        batches.set_epoch(epoch)
        for ids, mask, labels in loader:
            ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
            t0 = time.perf_counter()
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces gradients as they arrive
            opt.step()
            elapsed = time.perf_counter() - t0
            # On the model's device: NCCL moves CUDA tensors only (gloo here runs on the CPU).
            tokens = torch.tensor([float(mask.sum()), loss.item()], device=device)
            if distributed:  # this step's real tokens on every rank, and the mean loss
                every = [torch.zeros(2, device=device) for _ in range(world)]
                dist.all_gather(every, tokens)
                counts = [float(t[0]) for t in every]
                skew.append(max(counts) / max(min(counts), 1.0))
                mean_loss = sum(float(t[1]) for t in every) / world
            else:
                mean_loss = loss.item()
            step += 1
            if step > 1:
                times.append(elapsed)  # the first step includes export and engine build
            if rank == 0 and (step % 10 == 0 or step == 1 or step == args.steps):
                print(f"step {step:4d}  loss {mean_loss:.4f}  step {elapsed * 1e3:7.1f} ms")
            if step >= args.steps:
                break
        epoch += 1

    if rank == 0:
        balance = f"; real tokens per step, max/min over ranks: median {statistics.median(skew):.2f}" if skew else ""
        if times:
            print(f"median step {statistics.median(times) * 1e3:.1f} ms over {len(times)} steps "
                  f"after the first{balance}")
        if args.checkpoint:  # rank 0 writes (the parameters are the same on every rank)
            torch.save({"model": inner.state_dict(), "optimizer": opt.state_dict()}, args.checkpoint)
            print(f"saved {args.checkpoint}")
    if distributed:
        dist.barrier(device_ids=[local_rank] if cuda else None)
        # DDP's reducer holds the process group: free the model first, so that the group's gloo
        # threads end here and not during interpreter shutdown, where torch can abort the rank.
        del model, opt, inner
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
