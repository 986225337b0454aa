"""A model no graph can capture (Python control flow on a tensor's value): with FALLBACK_DISABLE
a clear error naming the op, the node and the source line; by default one warning, then eager
training identical to plain PyTorch."""
import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F

from conftest import twin
from torch_ort import ORTModule
from torch_ort.ortmodule import ORTModuleTorchModelException

pytestmark = pytest.mark.branches_unexportable  # its `if h.sum() > 0` models must not export


class SkipsMaskWhenUnpadded(torch.nn.Module):
    """A pattern from real model code: look at the mask's values to skip work when nothing is
    padded. Eager runs it; torch.export cannot, because the branch depends on data."""

    def __init__(self, width=8, classes=3):
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x, attention_mask, labels):
        m = attention_mask.to(x.dtype).unsqueeze(-1)                      # (B, T, 1)
        if (attention_mask == 0).any():                                   # data-dependent branch
            pooled = (x * m).sum(dim=1) / m.sum(dim=1)
        else:
            pooled = x.mean(dim=1)
        logits = self.head(torch.tanh(self.fc(pooled)))
        return F.cross_entropy(logits, labels)


BRANCH_LINE = next(i for i, line in enumerate(inspect.getsource(SkipsMaskWhenUnpadded).splitlines())
                   if "data-dependent branch" in line) + inspect.getsourcelines(SkipsMaskWhenUnpadded)[1]


def batch(gen, padded=True):
    x = torch.randn(4, 6, 8, generator=gen)
    mask = torch.ones(4, 6, dtype=torch.long)
    if padded:
        mask[1, 3:] = 0
    return x, mask, torch.randint(0, 3, (4,), generator=gen)


def test_uncapturable_model_raises_naming_op_node_and_line(strict):
    ours = ORTModule(SkipsMaskWhenUnpadded())
    with pytest.raises(ORTModuleTorchModelException) as info:
        ours(*batch(torch.Generator().manual_seed(0)))
    message = str(info.value)
    assert message.startswith("torch.export could not capture SkipsMaskWhenUnpadded")
    assert "node 'item' (aten.item" in message, message                # the op and its node
    assert f"test_bad_models.py:{BRANCH_LINE} in forward" in message, message  # the source line
    assert "(attention_mask == 0).any()" in message
    assert "torch.where" in message                                    # how to fix it
    assert len(message) < 1200 and "\x1b[" not in message              # one readable paragraph
    assert ours.export_count == 1  # one attempt: no ATen-fallback retry can help here


@pytest.mark.fallback
def test_default_policy_warns_once_and_trains_like_eager(capfd):
    eager, wrapped = twin(SkipsMaskWhenUnpadded)
    ours = ORTModule(wrapped)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_o = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(5):
            data = batch(gen, padded=step % 2 == 0)  # both branches, as eager would take them
            losses = []
            for model, opt in ((eager, opt_e), (ours, opt_o)):
                opt.zero_grad()
                loss = model(*data)
                loss.backward()
                opt.step()
                losses.append(loss.item())
            assert losses[1] == losses[0]
    ours_warnings = [str(w.message) for w in caught if "torch_ort" in str(w.message)]
    assert len(ours_warnings) == 1, ours_warnings
    assert "falling back" in ours_warnings[0] and "UNSUPPORTED_TORCH_MODEL" in ours_warnings[0]
    assert "(attention_mask == 0).any()" in ours_warnings[0]
    for p, q in zip(eager.parameters(), ours.parameters()):
        torch.testing.assert_close(q, p)
    assert "def forward" not in capfd.readouterr().err  # the exporter's partial graphs stay quiet
