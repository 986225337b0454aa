"""One rank of a DistributedDataParallel training run, launched by torchrun (or alone for the
single-process reference): `python -m torch.distributed.run --nproc_per_node 2 ddp_worker.py ...`.

Every step takes one *global* batch from a seeded generator, identical on every rank; rank r
trains on rows [r*B/W, (r+1)*B/W), so W processes and one process see the same global batches.
Rank 0 writes the per-step global losses, the final parameters and buffers, and the order in
which parameter gradients arrived to --out (JSON)."""
import argparse
import contextlib
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo  # noqa: E402


class MLP(nn.Module):
    def __init__(self, unused: bool = False):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(12, 32), nn.Linear(32, 32), nn.Linear(32, 5)
        self.spare = nn.Linear(32, 32) if unused else None  # never called: find_unused_parameters

    def forward(self, x, labels):
        h = torch.tanh(self.fc2(torch.relu(self.fc1(x))))
        return F.cross_entropy(self.fc3(h), labels)


class CNN(nn.Module):
    """BatchNorm in training mode: DDP broadcasts rank 0's running statistics every forward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 4)

    def forward(self, x, labels):
        h = torch.relu(self.bn(self.conv(x)))
        return F.cross_entropy(self.fc(h.flatten(1)), labels)


class GPTLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.gpt = model_zoo.nanogpt()

    def forward(self, idx, targets):
        return self.gpt(idx, targets)[1]


def build(name: str) -> nn.Module:
    return {"mlp": lambda: MLP(), "unused": lambda: MLP(unused=True), "cnn": CNN,
            "nanogpt": GPTLoss, "branchy": lambda: model_zoo.BranchyGPT("loop")}[name]()


def global_batch(name: str, size: int, gen: torch.Generator):
    if name in ("mlp", "unused"):
        return torch.randn(size, 12, generator=gen), torch.randint(0, 5, (size,), generator=gen)
    if name == "cnn":
        return torch.randn(size, 3, 8, 8, generator=gen), torch.randint(0, 4, (size,), generator=gen)
    (idx, targets), _ = model_zoo.nanogpt_batch(size, 32 if name == "nanogpt" else 16, gen)
    return idx, targets


def make_optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-2)
    from torch_ort.optim import FusedAdam
    return FusedAdam(params, lr=1e-2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=("ort", "eager"), default="ort")
    ap.add_argument("--model", choices=("mlp", "unused", "cnn", "nanogpt", "branchy"), default="mlp")
    ap.add_argument("--optim", choices=("sgd", "adamw", "fused_adam"), default="adamw")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per step (no_sync)")
    ap.add_argument("--batch", type=int, default=8, help="global micro-batch size")
    ap.add_argument("--find-unused", action="store_true")
    ap.add_argument("--checkpoint-at", type=int, default=0,
                    help="rank 0 saves after this step; every rank rebuilds and loads it")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)

    seen_buffers: dict = {}  # the buffers the last forward started from (after DDP's broadcast)

    def snapshot(module, inputs):
        seen_buffers.update({n: b.detach().tolist() for n, b in module.named_buffers()})

    def fresh():
        model = build(args.model)
        if args.engine == "ort":
            from torch_ort import ORTModule
            model = ORTModule(model)
        model.register_forward_pre_hook(snapshot)
        if world > 1:
            model = DDP(model, find_unused_parameters=args.find_unused)
        return model, make_optimizer(args.optim, model.parameters())

    torch.manual_seed(0)
    model, opt = fresh()
    named = list(model.named_parameters())
    order: list = []  # names, in the order the first step's gradients arrived
    hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: order.append(n)) for n, p in named]

    gen = torch.Generator().manual_seed(1234)
    share = args.batch // world
    losses = []
    for step in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for micro in range(args.accum):
            x, y = global_batch(args.model, args.batch, gen)
            x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
            syncing = world == 1 or micro == args.accum - 1
            ctx = model.no_sync() if not syncing else contextlib.nullcontext()
            with ctx:
                loss = model(x, y) / args.accum
                loss.backward()
            total += loss.detach()
        if world > 1:
            dist.all_reduce(total)
            total /= world
        losses.append(total.item())
        opt.step()
        if step == 1:
            for h in hooks:
                h.remove()
        if step == args.checkpoint_at:
            path = args.out + ".ckpt"
            if rank == 0:
                torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, path)
            if world > 1:
                dist.barrier()
            del model, opt
            torch.manual_seed(99)  # a different init: only the checkpoint can make it match
            model, opt = fresh()
            state = torch.load(path, map_location="cpu")
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])

    inner = model.module if world > 1 else model
    result = {"losses": losses, "world": world, "grad_order": order,
              "params": {n: p.detach().tolist() for n, p in inner.named_parameters()},
              "buffers": {n: b.detach().tolist() for n, b in inner.named_buffers()}}
    status = getattr(inner, "fallback", None)
    if status is not None:  # partial acceleration: where each submodule ran
        result["submodules"] = [[s.name, s.runs] for s in status.submodules]
    if world > 1:
        for key, value in (("buffers_per_rank", result["buffers"]), ("forward_buffers_per_rank", seen_buffers)):
            gathered = [None] * world
            dist.all_gather_object(gathered, value)
            result[key] = gathered
        dist.barrier()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    if world > 1:
        # Free DDP (its reducer holds the process group) while Python is alive, so that the group
        # and its gloo threads go with destroy_process_group. Left to interpreter shutdown, a gloo
        # thread could free a tensor that holds a Python object after finalization began, and
        # abort the rank ("terminate called without an active exception", from
        # ProcessGroupGloo::runLoop; torch's, reproduced with --engine eager).
        del model, opt, inner
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
