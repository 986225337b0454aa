"""A steady-state training step through ORTModule never waits on the GPU: after the first step
(export, engine build, the optimizer's state), steps of nanoGPT, Hugging Face GPT-2 and BERT and a
CNN with BatchNorm run under torch.cuda.set_sync_debug_mode("error") — any device→host read, or
blocking host→device copy, raises where it happens — and model.stats() counts no host reads in
forward or backward. Shape arithmetic and control values live on the host (DESIGN.md: placement).
Skipped without a GPU.

The loop around the engine is sync-free too: batches are on the GPU before the checked steps, the
optimizer is torch's fused AdamW (its step counts stay on the device), and no loss is read."""
import pytest
import torch

from test_gpu_parity import MODELS, autocast, build, on_device
from torch_ort import ORTModule

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def step(model, opt, batch, loss_of, precision):
    opt.zero_grad(set_to_none=True)
    args, kwargs = batch
    with autocast(precision):
        loss = loss_of(model(*args, **kwargs))
    loss.backward()
    opt.step()
    return loss.detach()


def checked_steps(name: str, precision: str, warmup_seqs: list, checked_seqs: list) -> list:
    """Trains an ORTModule: the warm-up steps as usual, then the checked ones under the "error"
    sync-debug mode, each followed by a look at stats(); returns the checked steps' losses."""
    _, make_batch, loss_of = MODELS[name]
    model = ORTModule(build(name))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(1)
    warmup = [on_device(*make_batch(gen, seq)) for seq in warmup_seqs]
    checked = [on_device(*make_batch(gen, seq)) for seq in checked_seqs]
    for batch in warmup:
        step(model, opt, batch, loss_of, precision)
    torch.cuda.synchronize()
    losses, reads = [], []
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch in checked:
            losses.append(step(model, opt, batch, loss_of, precision))
            stats = model.stats()
            reads.append((stats["host_reads_forward"], stats["host_reads_backward"]))
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert reads == [(0, 0)] * len(checked), f"host reads (forward, backward) per checked step: {reads}"
    assert all(torch.isfinite(loss).item() for loss in losses)
    return losses


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["nanogpt", "gpt2", "bert_cls", "cnn"])
def test_steady_state_steps_never_synchronize(strict, name, precision):
    checked_steps(name, precision, warmup_seqs=[16], checked_seqs=[16, 16, 16])


def test_new_sequence_length_needs_no_device_read(strict):
    """Lengths the engine has not run yet: their shapes are worked out on the host, with no
    re-export and no read of a shape tensor."""
    checked_steps("nanogpt", "fp32", warmup_seqs=[16], checked_seqs=[24, 16, 31])
