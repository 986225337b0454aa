"""Swin (transformers, random init) trains in the engine with fallback disabled: its window
padding computes `Mod` on symbolic sizes, which runs on our kernel, and its window partition and
shifted-window masks export once for every image size of the schema."""
import copy

import torch
import transformers

from torch_ort import ORTModule


def _swin():
    cfg = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                  window_size=4, num_labels=3, drop_path_rate=0.0, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.SwinForImageClassification(cfg)


def test_swin_trains_at_parity(strict):
    torch.manual_seed(0)
    eager = _swin()
    ours = ORTModule(copy.deepcopy(eager))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, ours)]
    g = torch.Generator().manual_seed(0)
    for batch in (2, 3, 2):
        pixels = torch.randn(batch, 3, 32, 32, generator=g)
        labels = torch.randint(0, 3, (batch,), generator=g)
        losses = []
        for m, opt in zip((eager, ours), opts):
            opt.zero_grad()
            loss = m(pixel_values=pixels, labels=labels).loss
            loss.backward()
            losses.append(loss)
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-6)
        for (name, pe), po in zip(eager.named_parameters(), ours.parameters()):
            torch.testing.assert_close(po.grad, pe.grad, rtol=1e-3, atol=1e-5, msg=lambda m: f"{name}: {m}")
        for opt in opts:
            opt.step()
    assert ours.export_count == 1
    assert ours.stats()["op_counts"].get("Mod", 0) >= 1  # the window padding's arithmetic, on our kernel
