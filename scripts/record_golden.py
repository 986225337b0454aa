"""Record the golden GPT-2 trajectory under eager PyTorch: per-step losses and final gradients of
a small GPT2LMHeadModel trained 50 AdamW steps; tests/python/test_golden.py replays it.

    PYTHONPATH=$PWD .venv/bin/python scripts/record_golden.py     # rewrites tests/python/golden/

The file holds everything the replay needs (config, initial weights, token batches, optimizer
settings), so it does not depend on transformers' weight init staying the same. Re-record only
when the trajectory's definition changes, never to make a failing replay pass.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "python", "golden", "gpt2_50steps.pt")

CONFIG = dict(vocab_size=64, n_embd=32, n_head=4, n_layer=2, n_positions=32, resid_pdrop=0.0,
              embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
STEPS, BATCH, SEQ, SEED = 50, 4, 24, 1234
OPTIM = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)


def build_model(config: dict, state: dict[str, torch.Tensor] | None = None):
    import transformers

    transformers.logging.set_verbosity_error()
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))
    if state is not None:
        params = dict(model.named_parameters())
        if params.keys() != state.keys():
            raise ValueError(f"golden weights do not match the model: {sorted(params.keys() ^ state.keys())}")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(state[name])
    return model


def make_inputs(seed: int, steps: int, batch: int, seq: int, vocab: int) -> torch.Tensor:
    """(steps, batch, seq) tokens: arithmetic progressions mod vocab with a random start and
    stride, so there is something to learn and the loss falls."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (steps, batch, 1), generator=g)
    stride = torch.randint(1, 5, (steps, batch, 1), generator=g)
    return ((start + stride * torch.arange(seq)) % vocab).to(torch.uint8)


def train(model, inputs: torch.Tensor, optim: dict, on_step=None):
    """Trains on `inputs` (labels = input_ids; the model shifts them). Returns the per-step losses
    and the gradients of the last step (before its update), keyed by parameter name. on_step(i)
    is called after each step (the replay test reads ORTModule's counters there)."""
    opt = torch.optim.AdamW(model.parameters(), **optim)
    losses = []
    for tokens in inputs:
        ids = tokens.long()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        if on_step is not None:
            on_step(len(losses) - 1)
    return losses, grads


def record(path: str = GOLDEN) -> dict:
    torch.manual_seed(SEED)
    model = build_model(CONFIG)
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    inputs = make_inputs(SEED, STEPS, BATCH, SEQ, CONFIG["vocab_size"])
    losses, grads = train(model, inputs, OPTIM)
    import transformers

    golden = {
        "format": 1, "config": CONFIG, "optim": OPTIM, "initial_state": initial, "inputs": inputs,
        "losses": torch.tensor(losses, dtype=torch.float64), "final_grads": grads,
        "recorded_with": {"torch": str(torch.__version__), "transformers": str(transformers.__version__)},
    }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(golden, path)
    return golden


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=GOLDEN)
    args = p.parse_args()
    golden = record(args.out)
    losses = golden["losses"]
    size = os.path.getsize(args.out)
    print(f"wrote {args.out} ({size / 1024:.0f} KiB): {len(losses)} steps, loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}, {len(golden['final_grads'])} gradients")
    return 0 if size < 1 << 20 else 1


if __name__ == "__main__":
    sys.exit(main())
