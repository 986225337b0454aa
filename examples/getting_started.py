"""Getting started: the smallest complete loop — ORTModule + FusedAdam — against eager PyTorch.

Data: scikit-learn's handwritten digits (1,797 8x8 images, shipped inside the package).
The two runs start from the same weights, see the same batches and use the same optimizer
(torch_ort's FusedAdam); the example prints both loss curves and the median step time of each.
The two torch_ort lines are marked. (scripts/run_example.sh runs the main example,
examples/huggingface_gpt2.py, not this file.)

    scripts/bootstrap.sh                   # installs what it needs (.venv); then:
    .venv/bin/python examples/getting_started.py
    .venv/bin/python examples/getting_started.py --steps 300 --batch 64
    .venv/bin/python examples/getting_started.py --device cuda   # on a GPU (default: the CPU)
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

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


def batches(x, y, batch, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (batch,), generator=g).to(x.device)
        yield x[idx], y[idx]


def train(model, x, y, args):
    opt = FusedAdam(model.parameters(), lr=args.lr)  # torch_ort line 2: one multi-tensor kernel per step
    losses, times = [], []
    for step, (xb, yb) in enumerate(batches(x, y, args.batch, args.steps, args.seed)):
        t0 = time.perf_counter()
        loss, _ = model(xb, yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    with torch.no_grad():
        model.eval()
        _, logits = model(x, y)
        accuracy = (logits.argmax(-1) == y).float().mean().item()
    return losses, times, accuracy


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, or cuda to train both models on the GPU")
    args = p.parse_args()

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32, device=args.device) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64, device=args.device)

    torch.manual_seed(args.seed)
    eager = MLP().to(args.device)
    ours = torch_ort.ORTModule(copy.deepcopy(eager))  # torch_ort line 1: forward + backward in the engine

    results = {}
    for name, model in (("eager", eager), ("ORTModule", ours)):
        results[name] = train(model, x, y, args)

    print(f"{'step':>6} {'eager loss':>12} {'ORTModule loss':>15}")
    for s in list(range(0, args.steps, max(1, args.steps // 10))) + [args.steps - 1]:
        print(f"{s:>6} {results['eager'][0][s]:>12.5f} {results['ORTModule'][0][s]:>15.5f}")
    for name, (losses, times, acc) in results.items():
        first, rest = times[0], times[1:] or times
        print(f"{name:>10}: first step {first * 1e3:8.1f} ms, median step {statistics.median(rest) * 1e3:6.2f} ms, "
              f"final loss {losses[-1]:.4f}, train accuracy {acc:.3f}")
    print(f"ORTModule exports: {ours.export_count}; max |loss difference| over {args.steps} steps: "
          f"{max(abs(a - b) for a, b in zip(results['eager'][0], results['ORTModule'][0])):.2e}")


if __name__ == "__main__":
    main()
