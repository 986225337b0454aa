"""ORTMODULE_FALLBACK_POLICY: every flag exercised by a model that triggers its failure kind —
covered: one warning naming the flag, then eager PyTorch; not covered (or FALLBACK_DISABLE): the
error itself. ORTMODULE_FALLBACK_RETRY, FORCE_TORCH_* and BAD_INITIALIZATION. After every kind,
ORTModule.fallback (and stats()["fallback"]) names the flag and the reason; the warning is an
ORTModuleFallbackWarning, which a filter can turn into an error."""
import warnings

import pytest
import torch

from test_bad_input import ComplexInput, DataDependentBranch, WithPixelShuffle
import torch_ort
from torch_ort import FallbackStatus, ORTModule, ORTModuleFallbackWarning
from torch_ort.ortmodule import (
    ORTModuleDeviceException,
    ORTModuleInitException,
    ORTModuleIOError,
    ORTModuleONNXModelException,
    ORTModuleTorchModelException,
)

pytestmark = pytest.mark.branches_unexportable  # its `if h.sum() > 0` models must not export


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x).pow(2).mean()


class Either(torch.nn.Module):
    """Complex input: eager only; real input: the engine."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, z):
        return self.fc(z.real if z.is_complex() else z).pow(2).mean()


class Lazy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.LazyLinear(3)

    def forward(self, x):
        return self.fc(x).pow(2).mean()


def _meta():
    return Small().to("meta"), torch.randn(2, 4, device="meta")


# flag, failure kind, (model, input) factory, extra environment
CASES = {
    "FALLBACK_UNSUPPORTED_DEVICE": (ORTModuleDeviceException, _meta, {}),
    "FALLBACK_UNSUPPORTED_DATA": (ORTModuleIOError,
                                  lambda: (ComplexInput(), torch.randn(3, 4, dtype=torch.cfloat)), {}),
    "FALLBACK_UNSUPPORTED_TORCH_MODEL": (ORTModuleTorchModelException,
                                         lambda: (DataDependentBranch(), torch.randn(3, 4)), {}),
    "FALLBACK_UNSUPPORTED_ONNX_MODEL": (ORTModuleONNXModelException,
                                        lambda: (WithPixelShuffle(), torch.randn(3, 4)),
                                        {"ORTMODULE_ATEN_FALLBACK": "0"}),
}



def armed(monkeypatch, flag, policy):
    """(failure kind, model, input) of CASES[flag], its environment set and the policy given."""
    kind, make, env = CASES[flag]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", policy)
    return (kind, *make())


@pytest.mark.parametrize("flag", sorted(CASES))
def test_flag_falls_back_with_one_warning_naming_it(monkeypatch, flag):
    kind, model, x = armed(monkeypatch, flag, flag)
    ours = ORTModule(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            out = ours(x)
            assert out.device == x.device
            torch.testing.assert_close(out, model(x)) if x.device.type != "meta" else None
    mine = [str(w.message) for w in caught if "torch_ort" in str(w.message)]
    assert len(mine) == 1 and flag in mine[0], mine
    assert [w.category for w in caught if "torch_ort" in str(w.message)] == [ORTModuleFallbackWarning]
    assert isinstance(ours._fallback.cause, kind)
    assert_status(ours, flag, kind)


def assert_status(ours, flag, kind=None):
    """ORTModule.fallback after a fallback: a frozen FallbackStatus naming the policy flag, the
    reason (the failure's message) and the failure's class; stats() shows the same."""
    status = ours.fallback
    assert isinstance(status, FallbackStatus), status
    assert status.flag == flag and status.reason, status
    assert status.error_type == (kind.__name__ if kind is not None else "")
    if kind is not None:
        assert status.reason == str(ours._fallback.cause)
    assert ours.stats()["fallback"] == status
    with pytest.raises(AttributeError):
        ours.fallback = None  # read-only
    with pytest.raises(Exception):
        status.flag = "x"  # frozen


@pytest.mark.parametrize("flag", sorted(CASES))
def test_flag_missing_from_policy_raises_that_kind(monkeypatch, flag):
    others = "|".join(f for f in CASES if f != flag)
    kind, model, x = armed(monkeypatch, flag, others)
    with pytest.raises(kind):
        ORTModule(model)(x)


@pytest.mark.parametrize("flag", sorted(CASES))
def test_fallback_disable_raises_with_the_cause(monkeypatch, flag):
    kind, model, x = armed(monkeypatch, flag, f"FALLBACK_DISABLE|{flag}")
    with pytest.raises(kind) as info:
        ORTModule(model)(x)
    assert str(info.value)


def test_bad_initialization(monkeypatch):
    with pytest.raises(ORTModuleInitException, match="lazy"):
        ORTModule(Lazy())  # the default policy does not cover it
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_BAD_INITIALIZATION")
    with pytest.warns(ORTModuleFallbackWarning, match="FALLBACK_BAD_INITIALIZATION"):
        ours = ORTModule(Lazy())
    assert_status(ours, "FALLBACK_BAD_INITIALIZATION", ORTModuleInitException)
    assert "lazy" in ours.fallback.reason
    ours(torch.randn(2, 5)).backward()  # eager materialises the lazy parameters and trains
    assert ours.module.fc.weight.grad.shape == (3, 5)
    assert ours.export_count == 0
    assert_status(ours, "FALLBACK_BAD_INITIALIZATION", ORTModuleInitException)


@pytest.mark.parametrize("flag", ["FALLBACK_FORCE_TORCH_FORWARD", "FALLBACK_FORCE_TORCH_BACKWARD"])
def test_forced_fallback_runs_eager_from_the_start(monkeypatch, flag):
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", flag)
    with pytest.warns(ORTModuleFallbackWarning, match=flag):
        ours = ORTModule(Small())
    assert_status(ours, flag)
    ours(torch.randn(2, 4)).backward()
    assert ours.export_count == 0 and ours.module.fc.weight.grad is not None
    assert_status(ours, flag)


@pytest.mark.fallback
def test_retry_uses_the_engine_again(monkeypatch):
    monkeypatch.setenv("ORTMODULE_FALLBACK_RETRY", "1")

    ours = ORTModule(Either())
    with pytest.warns(ORTModuleFallbackWarning, match="FALLBACK_UNSUPPORTED_DATA"):
        ours(torch.randn(3, 4, dtype=torch.cfloat))   # eager this once
    assert_status(ours, "FALLBACK_UNSUPPORTED_DATA", ORTModuleIOError)
    ours(torch.randn(3, 4)).backward()                 # the engine again
    assert ours.export_count == 1
    assert ours.fallback is None and ours.stats()["fallback"] is None


@pytest.mark.fallback
def test_without_retry_eager_stays(monkeypatch):
    ours = ORTModule(Either())
    with pytest.warns(UserWarning):
        ours(torch.randn(3, 4, dtype=torch.cfloat))
    ours(torch.randn(3, 4)).backward()
    assert ours.export_count == 0


def test_invalid_policy_lists_valid_flags(monkeypatch):
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_SOMETIMES")
    with pytest.raises(ValueError, match="FALLBACK_UNSUPPORTED_DEVICE"):
        ORTModule(Small())


def test_dataparallel_around_ortmodule_is_refused():
    with pytest.raises(TypeError, match="DataParallel"):
        ORTModule(Small())._replicate_for_data_parallel()


class Box:
    """A class torch_ort cannot flatten (not a tensor, scalar or registered container)."""

    def __init__(self, t):
        self.t = t


class BoxIn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, box):
        return self.fc(box.t).sum()


class BoxOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return Box(self.fc(x))


@pytest.mark.parametrize("model, arg", [(BoxIn, lambda: Box(torch.randn(2, 4))),
                                        (BoxOut, lambda: torch.randn(2, 4))], ids=["input", "output"])
def test_a_custom_class_in_or_out_is_unsupported_data(monkeypatch, model, arg):
    """An input or output of a custom class is data the engine cannot take: ORTModuleIOError,
    which FALLBACK_UNSUPPORTED_DATA covers (it was ORTModuleTorchModelException)."""
    with pytest.raises(ORTModuleIOError, match="Box"):
        ORTModule(model())(arg())
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_UNSUPPORTED_DATA")
    inner = model()
    ours = ORTModule(inner)
    with pytest.warns(UserWarning, match="FALLBACK_UNSUPPORTED_DATA"):
        out = ours(arg())
    assert isinstance(out, (torch.Tensor, Box)) and isinstance(ours._fallback.cause, ORTModuleIOError)


def test_dataparallel_inside_ortmodule_is_an_unsupported_torch_model(monkeypatch):
    """ORTModule(DataParallel(m)) raises ORTModuleTorchModelException under the policy (it raised a
    plain TypeError, outside it); FALLBACK_UNSUPPORTED_TORCH_MODEL runs it eager, as ORT does."""
    with pytest.raises(ORTModuleTorchModelException, match="DataParallel"):
        ORTModule(torch.nn.DataParallel(Small()))
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_UNSUPPORTED_TORCH_MODEL")
    inner = Small()
    with pytest.warns(ORTModuleFallbackWarning, match="FALLBACK_UNSUPPORTED_TORCH_MODEL"):
        ours = ORTModule(torch.nn.DataParallel(inner))
    x = torch.randn(3, 4)
    torch.testing.assert_close(ours(x), inner(x))
    assert ours.export_count == 0
    assert_status(ours, "FALLBACK_UNSUPPORTED_TORCH_MODEL", ORTModuleTorchModelException)


@pytest.mark.fallback
def test_dataparallel_with_retry_stays_eager(monkeypatch):
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_UNSUPPORTED_TORCH_MODEL")
    monkeypatch.setenv("ORTMODULE_FALLBACK_RETRY", "1")
    with pytest.warns(UserWarning):
        ours = ORTModule(torch.nn.DataParallel(Small()))
    for _ in range(2):
        ours(torch.randn(3, 4)).backward()
    assert ours.export_count == 0


def test_no_fallback_while_the_engine_runs():
    ours = ORTModule(Small())
    assert ours.fallback is None
    ours(torch.randn(2, 4)).backward()
    assert ours.export_count == 1 and ours.fallback is None and ours.stats()["fallback"] is None


def test_the_warning_class_is_exported_and_a_user_warning():
    assert torch_ort.ORTModuleFallbackWarning is torch_ort.ortmodule.ORTModuleFallbackWarning
    assert issubclass(ORTModuleFallbackWarning, UserWarning)
    assert torch_ort.FallbackStatus is torch_ort.ortmodule.FallbackStatus


@pytest.mark.parametrize("flag", sorted(CASES))
def test_fallback_warning_filtered_to_an_error_raises_and_nothing_runs_eager(monkeypatch, flag):
    """warnings.simplefilter("error", ORTModuleFallbackWarning): every call that would fall back
    raises the warning instead, and the module is not switched to eager behind the user's back."""
    kind, model, x = armed(monkeypatch, flag, flag)
    ours = ORTModule(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ORTModuleFallbackWarning)
        for _ in range(2):
            with pytest.raises(ORTModuleFallbackWarning, match=flag):
                ours(x)
            assert ours.fallback is None and not ours._fallback.active
    with pytest.warns(ORTModuleFallbackWarning):  # unfiltered, the same call falls back
        ours(x)
    assert_status(ours, flag, kind)


@pytest.mark.parametrize("flag, make", [
    ("FALLBACK_FORCE_TORCH_FORWARD", Small),
    ("FALLBACK_BAD_INITIALIZATION", Lazy),
    ("FALLBACK_UNSUPPORTED_TORCH_MODEL", lambda: torch.nn.DataParallel(Small())),
])
def test_fallback_warning_filtered_to_an_error_at_construction(monkeypatch, flag, make):
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", flag)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ORTModuleFallbackWarning)
        with pytest.raises(ORTModuleFallbackWarning, match=flag):
            ORTModule(make())


@pytest.mark.fallback
def test_other_warnings_are_not_fallback_warnings(monkeypatch):
    """The filter catches fallbacks only: a module that trains through the engine warns nothing
    of that class."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ORTModuleFallbackWarning)
        ours = ORTModule(Small())
        ours(torch.randn(2, 4)).backward()
    assert ours.fallback is None
