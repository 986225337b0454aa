"""A PyTorch Lightning run whose LightningModule holds an ORTModule (or the same network eager):
`python lightning_worker.py --engine ort --devices 2 --out result.json`. With --devices 2 Lightning's
default "ddp" strategy re-runs this script for rank 1 (gloo on the CPU). With --resume-after E the
run stops after E epochs, saves a checkpoint (trainer.save_checkpoint), and a fresh module built
from another seed continues from it (Trainer.fit(ckpt_path=...)) to --epochs.

Each rank writes its per-step losses to --out with `.rank<r>` appended; rank 0 also writes the final
parameters (state_dict keys) and, for ORTModule, its fallback and export count."""
from __future__ import annotations

import argparse
import json
import os

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import torch_ort
from torch_ort.optim import FusedAdam


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(12, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 5)

    def forward(self, x, labels):
        h = torch.tanh(self.fc2(torch.relu(self.fc1(x))))
        return F.cross_entropy(self.fc3(h), labels)


class Classifier(L.LightningModule):
    """The network is wrapped inside the LightningModule: Lightning's hooks stay on this class,
    forward and backward of `self.net` run in the engine."""

    def __init__(self, engine: str = "ort", optim: str = "fused_adam", seed: int = 0):
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(seed)
        net = MLP()
        self.net = torch_ort.ORTModule(net) if engine == "ort" else net
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = self.net(*batch)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        if self.hparams.optim == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return FusedAdam(self.parameters(), lr=1e-2)


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    return TensorDataset(torch.randn(64, 12, generator=g), torch.randint(0, 5, (64,), generator=g))


def trainer(devices: int, epochs: int, ckpt_dir: str) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                     max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=ckpt_dir)


def run(engine: str, devices: int, epochs: int, resume_after: int, optim: str, out: str) -> dict:
    loader = DataLoader(dataset(), batch_size=16)  # 4 steps an epoch on one process, 2 on each of two
    model = Classifier(engine, optim)
    losses: list[float] = []
    ckpt_dir = os.path.dirname(os.path.abspath(out))
    if resume_after:
        t = trainer(devices, resume_after, ckpt_dir)
        t.fit(model, loader)
        path = os.path.join(ckpt_dir, os.path.basename(out) + ".ckpt")
        t.save_checkpoint(path)  # every rank calls it; rank 0 writes
        losses += model.losses
        model = Classifier(engine, optim, seed=1)  # other weights: the checkpoint must replace them
        t = trainer(devices, epochs, ckpt_dir)
        t.fit(model, loader, ckpt_path=path)
    else:
        t = trainer(devices, epochs, ckpt_dir)
        t.fit(model, loader)
    losses += model.losses
    result = {"world": t.world_size, "rank": t.global_rank, "losses": losses}
    if t.global_rank == 0:
        result["params"] = {k: v.tolist() for k, v in model.state_dict().items()}
        if engine == "ort":
            result["fallback"] = None if model.net.fallback is None else str(model.net.fallback)
            result["export_count"] = model.net.export_count
    with open(f"{out}.rank{t.global_rank}", "w") as f:
        json.dump(result, f)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=("ort", "eager"), default="ort")
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--resume-after", type=int, default=0, help="epochs before the checkpoint (0: none)")
    ap.add_argument("--optim", choices=("fused_adam", "sgd"), default="fused_adam")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    run(args.engine, args.devices, args.epochs, args.resume_after, args.optim, args.out)


if __name__ == "__main__":
    main()
