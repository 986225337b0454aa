"""Run by test_deepspeed.py under torchrun (2 gloo processes, DeepSpeed's CPU accelerator):
ORTModule inside a DeepSpeed ZeRO stage 1 and 2 engine with torch_ort's FusedAdam as the client
optimizer — fp32, and bf16 with FP16_Optimizer patching DeepSpeed's optimizer — against the
same model in eager PyTorch under the same engine. Rank 0 prints the results as JSON."""
import gc
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import deepspeed_gloo  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from torch_ort import ORTModule  # noqa: E402
from torch_ort.optim import FP16_Optimizer, FusedAdam  # noqa: E402
from torch_ort.optim.modifiers import PATCHED  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (torch.nn.Linear(16, 64), torch.nn.Linear(64, 64),
                                        torch.nn.Linear(64, 4))

    def forward(self, x, y):
        h = F.gelu(self.fc2(F.gelu(self.fc1(x))))
        return F.cross_entropy(self.fc3(h).float(), y)


def train(stage: int, bf16: bool, ort: bool, steps: int = 6) -> dict:
    torch.manual_seed(0)
    model = Net()
    if ort:
        model = ORTModule(model)
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
           "gradient_clipping": 1.0, "steps_per_print": 10 ** 9, "bf16": {"enabled": bf16}}
    opt = FusedAdam(model.parameters(), lr=1e-2)
    engine, ds_opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    patched = None
    if bf16:
        assert FP16_Optimizer(ds_opt) is ds_opt
        patched = getattr(ds_opt, PATCHED, None)
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 16, generator=gen)[rank * 4:(rank + 1) * 4]  # one batch, learnt step by step
    y = torch.randint(0, 4, (8,), generator=gen)[rank * 4:(rank + 1) * 4]
    losses = []
    for _ in range(steps):
        loss = engine(x.bfloat16() if bf16 else x, y)
        engine.backward(loss)
        engine.step()
        total = loss.detach().float().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    inner = engine.module.module if ort else engine.module
    return {"losses": losses, "patched": patched, "wrapped": type(engine.module).__name__,
            "optimizer": type(ds_opt).__name__,
            "params": [p.detach().float().flatten()[:6].tolist() for p in inner.parameters()]}


if __name__ == "__main__":
    deepspeed_gloo.init_distributed()
    results = {f"stage{s}_{'bf16' if b else 'fp32'}_{'ort' if o else 'eager'}": train(s, b, o)
               for s in (1, 2) for b in (False, True) for o in (False, True)}
    if dist.get_rank() == 0:
        print("RESULTS " + json.dumps(results))
    sys.stdout.flush()
    # The engines and their gloo work go before the group, and the group before the interpreter
    # exits: a group left to shutdown can abort a rank ("terminate called without an active
    # exception") after the results are out.
    gc.collect()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
