"""CNNs through ORTModule against eager PyTorch: losses, gradients, BatchNorm's running statistics
(updated in the live buffers after every training forward) and eval-mode outputs, with nothing
allowed to fall back to eager (FALLBACK_DISABLE)."""
import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import twin
from torch_ort import ORTModule, _compat
from torch_ort.ortmodule import ORTModuleTorchModelException


class SmallCNN(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(16, classes)

    def forward(self, x, labels):
        logits = self.head(self.features(x))
        return F.cross_entropy(logits, labels), logits


class Conv1dNet(nn.Module):
    """The 1-D kernels and their attribute corners: groups, dilation, ceil_mode, output_padding,
    padded average pooling that excludes pads, and a BatchNorm without affine parameters nor running
    statistics (batch statistics in eval mode too)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3, padding=2, dilation=2, groups=2)
        self.bn = nn.BatchNorm1d(6, momentum=0.3)
        self.pool = nn.MaxPool1d(3, 2, padding=1, ceil_mode=True)
        self.up = nn.ConvTranspose1d(6, 4, 3, stride=2, padding=1, output_padding=1)
        self.bn2 = nn.BatchNorm1d(4, affine=False, track_running_stats=False)
        self.avg = nn.AvgPool1d(3, 2, padding=1, ceil_mode=True, count_include_pad=False)

    def forward(self, x):
        h = self.pool(torch.relu(self.bn(self.conv(x))))
        h = self.avg(torch.tanh(self.bn2(self.up(h))))
        return h.pow(2).mean()


def batch(gen, n, size=12):
    return torch.randn(n, 3, size, size, generator=gen), torch.randint(0, 5, (n,), generator=gen)


def assert_state_equal(eager, ours):
    """Running statistics and step counters must equal eager's exactly (same ATen kernels)."""
    theirs = ours.module.state_dict()
    for name, want in eager.state_dict().items():
        assert torch.equal(theirs[name], want), f"{name}: max diff {(theirs[name] - want).abs().max()}"


def test_cnn_trains_like_eager(strict):
    eager, wrapped = twin(SmallCNN)
    ours = ORTModule(wrapped)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    for step in range(20):
        x, y = batch(gen, n=[8, 5, 11, 3][step % 4], size=[12, 14][step % 2])  # no re-export for either
        losses = []
        for model, opt in ((eager, opt_e), (ours, opt_o)):
            opt.zero_grad()
            loss, logits = model(x, y)
            assert logits.shape == (x.shape[0], 5)  # the buffer updates never reach the user
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=0, msg=f"step {step} loss")
        for (name, p_e), p_o in zip(eager.named_parameters(), ours.parameters()):
            torch.testing.assert_close(p_o.grad, p_e.grad, rtol=1e-3, atol=1e-5, msg=f"step {step} {name}.grad")
        opt_e.step()
        opt_o.step()
    assert ours.export_count == 1, "a new batch or image size must not re-export"
    assert int(wrapped.features[1].num_batches_tracked) == 20
    assert_state_equal(eager, ours)

    eager.eval(), ours.eval()
    x, y = batch(gen, n=6)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, y), eager(x, y), rtol=0, atol=0)
    loss_e, logits_e = eager(x, y)  # eval with autograd on: the eval graph's training engine
    loss_o, logits_o = ours(x, y)
    torch.testing.assert_close(logits_o, logits_e, rtol=0, atol=0)
    loss_e.backward(), loss_o.backward()
    torch.testing.assert_close(wrapped.features[0].weight.grad, eager.features[0].weight.grad, rtol=1e-3, atol=1e-5)
    assert ours.export_count == 2
    assert_state_equal(eager, ours)  # eval mode leaves the statistics alone


def test_no_grad_forward_in_train_mode_updates_running_stats(strict):
    """Eager BatchNorm in train mode updates its statistics under no_grad too (inference engine)."""
    eager, wrapped = twin(SmallCNN)
    ours = ORTModule(wrapped)
    gen = torch.Generator().manual_seed(1)
    for n in (4, 7):
        x, y = batch(gen, n)
        with torch.no_grad():
            torch.testing.assert_close(ours(x, y), eager(x, y), rtol=1e-5, atol=1e-6)
    assert_state_equal(eager, ours)
    assert wrapped.features[1].running_mean.abs().sum() > 0  # it did move


def test_conv1d_batchnorm_variants_train_like_eager(strict):
    eager, wrapped = twin(Conv1dNet)
    ours = ORTModule(wrapped)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(2)
    for step in range(6):
        x = torch.randn(step % 3 + 2, 4, 17 + step, generator=gen)
        for model, opt in ((eager, opt_e), (ours, opt_o)):
            opt.zero_grad()
            model(x).backward()
        for (name, p_e), p_o in zip(eager.named_parameters(), ours.parameters()):
            torch.testing.assert_close(p_o.grad, p_e.grad, rtol=1e-3, atol=1e-5, msg=f"step {step} {name}.grad")
        opt_e.step()
        opt_o.step()
    # ceil_mode pooling makes the trace fix the length (torch.export specialises it): each new
    # length exports again rather than running a graph traced for another; batch sizes do not.
    assert ours.export_count == 6
    assert next(iter(ours._plan_cache.runners())).export.static_dims == [[None, 4, 22]]
    assert_state_equal(eager, ours)
    eager.eval(), ours.eval()
    x = torch.randn(3, 4, 20, generator=gen)
    with torch.no_grad():  # bn2 has no running statistics: batch statistics in eval mode too
        torch.testing.assert_close(ours(x), eager(x), rtol=1e-5, atol=1e-6)


def test_buffer_updates_are_trailing_graph_outputs():
    """What the exporter hands the engine: user outputs first, then one output per mutated buffer."""
    from torch_ort.ortmodule.export.exporter import export_module

    model = SmallCNN().train()
    x, y = batch(torch.Generator().manual_seed(3), 4)
    result = export_module(model, (x, y), {}, None)
    assert result.buffer_updates == [f"features.{i}.{b}" for i in (1, 5)
                                     for b in ("running_mean", "running_var", "num_batches_tracked")]
    assert "features.1.num_batches_tracked" in result.param_names  # bound as an input, zero copy
    assert export_module(model.eval(), (x, y), {}, None).buffer_updates == []


def test_exporter_without_the_seam_raises_instead_of_freezing_stats(strict, monkeypatch):
    """If torch.onnx lacks the seam we hook, a module that updates buffers must not silently train
    with frozen statistics: the export fails, naming the buffers (the fallback policy decides)."""
    monkeypatch.setattr(_compat, "onnx_translation_wrapped", lambda wrap: contextlib.nullcontext(False))
    ours = ORTModule(SmallCNN())
    with pytest.raises(ORTModuleTorchModelException, match="running_mean"):
        ours(*batch(torch.Generator().manual_seed(4), 4))
    ours.eval()  # nothing to keep in eval mode: the same torch exports it fine
    ours(*batch(torch.Generator().manual_seed(4), 4))
