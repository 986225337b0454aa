"""One rank of an FSDP2 (torch.distributed.fsdp.fully_shard) training run, launched by torchrun:
`python -m torch.distributed.run --standalone --nproc_per_node 2 fsdp_worker.py --engine ort ...`.

The model is a stack of blocks, each its own FSDP unit, under a root unit holding the head
(--model mlp: three Linear+tanh blocks; gpt: the tiny nanoGPT of model_zoo, its blocks the units). With
--engine ort every block is fully_shard(ORTModule(block)) (the supported composition); with eager,
fully_shard(block). Every step takes one global batch from a seeded generator; rank r trains on its
half. Rank 0 writes the per-step global losses and the final full parameters to --out (JSON).
--checkpoint-at N saves model and optimizer with torch.distributed.checkpoint after step N, rebuilds
both from another seed and loads them. --refusal records what ORTModule says about the composition
it does not support (ORTModule around modules already managed by FSDP2)."""
import argparse
import gc
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_zoo  # noqa: E402

D_IN, HIDDEN, CLASSES, BLOCKS = 12, 32, 5, 3


class Block(nn.Module):
    def __init__(self, d_in: int):
        super().__init__()
        self.fc = nn.Linear(d_in, HIDDEN)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(D_IN if i == 0 else HIDDEN) for i in range(BLOCKS)])
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x, labels):
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x), labels)


class GPTLoss(nn.Module):
    """nanoGPT: each transformer block (attention, LayerNorms, MLP) is a unit; the tied
    embedding/lm_head, position embedding and final LayerNorm are the root's."""

    def __init__(self):
        super().__init__()
        self.gpt = model_zoo.nanogpt()

    @property
    def blocks(self) -> nn.ModuleList:
        return self.gpt.h

    def forward(self, idx, targets):
        return self.gpt(idx, targets)[1]


def build(engine: str, seed: int, name: str = "mlp") -> nn.Module:
    torch.manual_seed(seed)
    model = Net() if name == "mlp" else GPTLoss()
    for i, block in enumerate(model.blocks):
        if engine == "ort":
            from torch_ort import ORTModule
            block = model.blocks[i] = ORTModule(block)
        fully_shard(block)
    fully_shard(model)
    return model


def global_batch(name: str, size: int, gen: torch.Generator):
    if name == "mlp":
        return torch.randn(size, D_IN, generator=gen), torch.randint(0, CLASSES, (size,), generator=gen)
    (idx, targets), _ = model_zoo.nanogpt_batch(size, 32, gen)
    return idx, targets


def make_optimizer(name: str, params):
    # SGD for nanoGPT: Adam would amplify rounding in its near-zero gradients.
    return torch.optim.AdamW(params, lr=1e-2) if name == "mlp" else torch.optim.SGD(params, lr=0.1)


def refusals() -> dict:
    """ORTModule around an FSDP-managed module: the error under FALLBACK_DISABLE (construction),
    the fallback under the default policy, and the error at the first call when fully_shard is
    applied inside an ORTModule after it was built."""
    from torch_ort import ORTModule
    from torch_ort.ortmodule.policy.fallback_policy import ORTModuleTorchModelException
    out = {}
    try:
        ORTModule(build("eager", 0))
    except ORTModuleTorchModelException as e:
        out["construction"] = str(e)
    policy = os.environ.pop("ORTMODULE_FALLBACK_POLICY")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wrapped = ORTModule(build("eager", 0))
        x, y = torch.randn(4, D_IN), torch.randint(0, CLASSES, (4,))
        wrapped(x, y).backward()  # eager FSDP, as without torch_ort
        out["default_policy"] = wrapped.fallback.flag
    finally:
        os.environ["ORTMODULE_FALLBACK_POLICY"] = policy
    torch.manual_seed(0)
    inner = Net()
    wrapped = ORTModule(inner)
    for block in inner.blocks:
        fully_shard(block)
    try:
        wrapped(torch.randn(4, D_IN), torch.randint(0, CLASSES, (4,)))
    except ORTModuleTorchModelException as e:
        out["first_call"] = str(e)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=("ort", "eager"), default="ort")
    ap.add_argument("--model", choices=("mlp", "gpt"), default="mlp")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8, help="global batch size")
    ap.add_argument("--checkpoint-at", type=int, default=0)
    ap.add_argument("--refusal", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict = {"world": world}
    if args.refusal:
        result["refusal"] = refusals()

    model = build(args.engine, 0, args.model)
    opt = make_optimizer(args.model, model.parameters())
    gen = torch.Generator().manual_seed(1234)
    share = args.batch // world
    losses = []
    for step in range(1, args.steps + 1):
        x, y = global_batch(args.model, args.batch, gen)
        loss = model(x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share])
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append((total / world).item())
        if step == args.checkpoint_at:
            path = args.out + ".dcp"
            dcp.save({"model": get_model_state_dict(model),
                      "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=path)
            del model, opt
            model = build(args.engine, 99, args.model)  # another init: only the checkpoint can make it match
            opt = make_optimizer(args.model, model.parameters())
            state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
            dcp.load(state, checkpoint_id=path)
            set_model_state_dict(model, state["model"])
            set_optimizer_state_dict(model, opt, state["optim"])
    result["losses"] = losses
    result["params"] = {n: p.full_tensor().tolist() for n, p in model.named_parameters()}
    if args.engine == "ort":
        result["fallback"] = [str(b.fallback) for b in model.blocks if b.fallback is not None]
        result["exports"] = [b.export_count for b in model.blocks]
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    del model, opt  # before the group: one left to interpreter shutdown can abort a gloo rank
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
