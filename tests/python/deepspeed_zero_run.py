"""Run by test_fp16_optimizer.py in a subprocess (DeepSpeed sets up torch.distributed, which must
not leak into the test process): trains a small MLP with DeepSpeed ZeRO-1/2 on the CPU
accelerator in bf16, unpatched and patched by FP16_Optimizer, and prints the results as JSON."""
import gc
import json
import os
import sys

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29531"),
                  RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", DS_ACCELERATOR="cpu")

import deepspeed  # noqa: E402
import deepspeed_gloo  # noqa: E402
import torch  # noqa: E402

from torch_ort.optim import FP16_Optimizer  # noqa: E402
from torch_ort.optim.modifiers import PATCHED  # noqa: E402

PATCHED_METHODS = ("has_overflow_serial", "has_overflow_partitioned_grads_serial", "get_grad_norm_direct")


def run(stage, patch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    cfg = {"train_batch_size": 8, "bf16": {"enabled": True}, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
           "gradient_clipping": 0.5, "steps_per_print": 10 ** 9}
    engine, opt, _, _ = deepspeed.initialize(model=model, config=cfg)
    out = {"calls": {}}
    if patch:
        assert FP16_Optimizer(opt) is opt and getattr(opt, PATCHED) == "deepspeed_zero"
        for name in PATCHED_METHODS:  # count the calls DeepSpeed makes to the patched methods
            fn = getattr(opt, name)

            def counted(*a, _fn=fn, _name=name, **k):
                out["calls"][_name] = out["calls"].get(_name, 0) + 1
                return _fn(*a, **k)
            setattr(opt, name, counted)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for step in range(6):
        x = torch.randn(8, 16, generator=gen).bfloat16()
        if step == 3:
            x[0, 0] = float("inf")  # this step's gradients are nan: DeepSpeed must skip it
            before = [p.detach().clone() for p in engine.module.parameters()]
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        if step == 3:
            out["skipped_step_left_params"] = all(
                torch.equal(a, p.detach()) for a, p in zip(before, engine.module.parameters()))
        losses.append(loss.item())
    out["losses"] = losses
    out["params"] = [p.detach().float().flatten().tolist()[:8] for p in engine.module.parameters()]
    if patch:  # the patched checks on hand-made inputs, against DeepSpeed's own code
        params = list(engine.module.parameters())
        grads = [torch.randn(p.shape, generator=gen).to(p.dtype) for p in params]
        mine = opt.get_grad_norm_direct(grads, params).item()
        theirs = type(opt).get_grad_norm_direct(opt, grads, params).item()
        out["norm"] = [mine, theirs]
        for p, g in zip(params, grads):
            p.grad = g
        out["overflow_clean"] = bool(opt.has_overflow_serial(params).item())
        params[1].grad[2] = float("nan")
        out["overflow_nan"] = bool(opt.has_overflow_serial(params).item())
        saved = opt.averaged_gradients
        opt.averaged_gradients = {0: [torch.ones(4), torch.tensor([1.0, float("inf")])]}
        out["partitioned_overflow"] = bool(opt.has_overflow_partitioned_grads_serial().item())
        opt.averaged_gradients = saved
    return out


if __name__ == "__main__":
    deepspeed_gloo.init_distributed()
    results = {f"stage{s}_{'patched' if p else 'plain'}": run(s, p) for s in (1, 2) for p in (False, True)}
    print("RESULTS " + json.dumps(results))
    sys.stdout.flush()
    # The engines and their gloo work go before the group, and the group before the interpreter
    # exits: a group left to shutdown can abort a rank ("terminate called without an active
    # exception") after the results are out.
    gc.collect()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
