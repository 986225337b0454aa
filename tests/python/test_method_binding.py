"""Methods of the wrapped module reached through the ORTModule (`model.generate`, a Lightning
`training_step`, a user's `run_forward`) run with `self` standing for the ORTModule where it
matters: calling `self(...)` or `self.forward(...)` runs the engine, while super(), isinstance,
properties and attributes behave as on the wrapped module."""
import copy
import sys

import pytest
import torch

import model_zoo
from conftest import twin
from torch_ort import ORTModule


def ran_engine(output: torch.Tensor) -> bool:
    return type(output.grad_fn).__name__ == "EngineFunctionBackward"


class Base(torch.nn.Module):
    def describe(self, x):
        return x * 2


class Net(Base):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.scale = 1.0

    def forward(self, x):
        return self.fc(x) * self.scale

    def run_forward(self, x):  # the engine must run: self is reached through the ORTModule
        return self(x)

    def run_forward_method(self, x):
        return self.forward(x)

    def training_step(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def describe(self, x):  # super() needs self to be an instance of this class
        return super().describe(x) + 1

    def set_scale(self, value):
        self.scale = value

    @property
    def width(self):
        return self.fc.out_features


def test_a_method_calling_self_runs_the_engine(strict):
    eager, copied = twin(Net)
    ours = ORTModule(copied)
    x = torch.randn(4, 3)
    for call in ("run_forward", "run_forward_method"):
        out = getattr(ours, call)(x)
        assert ran_engine(out), f"{call}: {out.grad_fn}"  # (was AddmmBackward0: eager)
        torch.testing.assert_close(out, getattr(eager, call)(x))
    assert ours.export_count == 1


def test_training_step_through_the_wrapper_trains_like_eager(strict):
    eager, copied = twin(Net)
    ours = ORTModule(copied)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_o = torch.optim.SGD(ours.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        batch = (torch.randn(8, 3, generator=gen), torch.randn(8, 2, generator=gen))
        losses = []
        for model, opt in ((eager, opt_e), (ours, opt_o)):
            opt.zero_grad()
            loss = model.training_step(batch)
            loss.backward()
            opt.step()
            losses.append(loss)
        torch.testing.assert_close(losses[1], losses[0])
    assert ours.export_count == 1 and ours.engine_build_count == 1  # (0 and 0: it ran eager)
    for p_o, p_e in zip(ours.parameters(), eager.parameters()):
        torch.testing.assert_close(p_o, p_e)


def test_super_isinstance_and_properties_see_the_wrapped_class(strict):
    ours = ORTModule(Net())
    x = torch.ones(2, 3)
    torch.testing.assert_close(ours.describe(x), x * 2 + 1)
    assert ours.width == 2
    assert isinstance(ours.run_forward.__self__, Net)
    assert ours.run_forward.__self__.fc is ours.module.fc  # the same attributes, not a copy


def test_an_attribute_set_in_a_method_reaches_the_module_and_re_exports(strict):
    ours = ORTModule(Net())
    x = torch.randn(4, 3)
    before = ours(x)
    ours.set_scale(3.0)
    assert ours.module.scale == 3.0
    after = ours(x)
    torch.testing.assert_close(after, before * 3.0)  # forward read scale: the graph changed
    assert ours.export_count == 2


def test_copies_after_a_method_call_are_independent(strict):
    ours = ORTModule(Net())
    ours.run_forward(torch.randn(2, 3))
    clone = copy.deepcopy(ours)
    clone.set_scale(5.0)
    assert ours.module.scale == 1.0 and clone.module.scale == 5.0
    assert ran_engine(clone.run_forward(torch.randn(2, 3)))


def test_generate_runs_through_the_engine_like_eager(strict):
    torch.manual_seed(0)
    eager = model_zoo.gpt2().eval()
    ours = ORTModule(copy.deepcopy(eager)).eval()
    ids = torch.randint(1, model_zoo.VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    options = dict(max_new_tokens=4, do_sample=False, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        expected = eager.generate(ids, **options)
        got = ours.generate(ids, **options)
    assert torch.equal(got, expected)
    assert ours.export_count >= 1  # the prefill and the cached decoding steps ran in the engine


@pytest.mark.parametrize("reach", ["stored bound method", "getattr"])
def test_methods_of_the_module_class_only(strict, reach):
    """nn.Module's own methods (parameters, to, train, ...) stay the ORTModule's."""
    ours = ORTModule(Net())
    method = ours.parameters if reach == "getattr" else getattr(ours, "parameters")
    assert method.__self__ is ours
