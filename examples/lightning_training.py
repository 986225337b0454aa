"""PyTorch Lightning: a LightningModule whose network is an ORTModule, trained by lightning.Trainer.

Data: scikit-learn's handwritten digits (1,797 8x8 images, shipped inside the package).
The network is wrapped inside the LightningModule (`self.net = ORTModule(MLP())`), not the
LightningModule itself: Lightning keeps calling its hooks (training_step, configure_optimizers)
on the plain class, and forward + backward of `self.net` run in the engine. The same module is
trained once without ORTModule from the same seed on the same shuffled batches; the example prints
both loss curves. The two torch_ort lines are marked. With --devices 2 Lightning's "ddp" strategy
re-runs this script for the second process (gloo on the CPU); rank 0 prints.

    scripts/bootstrap.sh                   # installs what it needs (.venv); then:
    .venv/bin/python examples/lightning_training.py
    .venv/bin/python examples/lightning_training.py --steps 300 --batch 32
    .venv/bin/python examples/lightning_training.py --devices 2   # two processes, DDP over gloo
"""
from __future__ import annotations

import argparse
import logging

import lightning as L
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import torch_ort
from torch_ort.optim import FusedAdam


class MLP(torch.nn.Module):
    def __init__(self, d_in=64, hidden=256, classes=10):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.fc3 = torch.nn.Linear(hidden, classes)

    def forward(self, x, labels):
        h = torch.relu(self.fc1(x))
        h = torch.tanh(self.fc2(h))
        logits = self.fc3(h)
        return F.cross_entropy(logits, labels), logits


class DigitsClassifier(L.LightningModule):
    def __init__(self, ortmodule: bool, lr: float):
        super().__init__()
        self.lr = lr
        net = MLP()
        self.net = torch_ort.ORTModule(net) if ortmodule else net  # torch_ort line 1: the network, inside
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        loss, _ = self.net(*batch)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return FusedAdam(self.parameters(), lr=self.lr)  # torch_ort line 2: one multi-tensor kernel per step


def train(ortmodule: bool, data: TensorDataset, args) -> tuple[DigitsClassifier, L.Trainer]:
    L.seed_everything(args.seed, verbose=False)  # the same initial weights and shuffled batches for both
    model = DigitsClassifier(ortmodule, args.lr)
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
                        max_steps=args.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=args.batch, shuffle=True))
    return model, trainer


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64, help="per process")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--devices", type=int, default=1, help="CPU processes (2: Lightning's DDP over gloo)")
    args = p.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # Lightning's banner lines

    digits = load_digits()
    data = TensorDataset(torch.tensor(digits.data, dtype=torch.float32) / 16.0,
                         torch.tensor(digits.target, dtype=torch.int64))
    eager, _ = train(False, data, args)
    ours, trainer = train(True, data, args)
    if trainer.global_rank != 0:
        return

    with torch.no_grad():
        ours.eval()
        _, logits = ours.net(*data.tensors)
        accuracy = (logits.argmax(-1) == data.tensors[1]).float().mean().item()
    steps = len(ours.losses)
    print(f"{trainer.world_size} process(es), {steps} steps; ORTModule + FusedAdam in a LightningModule")
    print(f"{'step':>6} {'eager loss':>12} {'ORTModule loss':>15}")
    for s in sorted({*range(0, steps, max(1, steps // 10)), steps - 1}):
        print(f"{s:>6} {eager.losses[s]:>12.5f} {ours.losses[s]:>15.5f}")
    print(f"ORTModule: final loss {ours.losses[-1]:.4f}, train accuracy {accuracy:.3f} (rank 0's model)")
    print(f"ORTModule exports: {ours.net.export_count}; fell back: {ours.net.fallback is not None}; "
          f"max |loss difference| over {steps} steps: "
          f"{max(abs(a - b) for a, b in zip(eager.losses, ours.losses)):.2e}")


if __name__ == "__main__":
    main()
