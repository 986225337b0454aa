"""torch_ort/_compat.py: a torch without one of the private symbols we use loses only that
feature, and says which feature and which torch version. The fallbacks a missing symbol selects
are simulated on this torch, so that they run in every environment, not only where it is missing."""
import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.utils.checkpoint as cp

from test_checkpoint import Checkpointed
from torch_ort import ORTModule, _compat
from torch_ort.ortmodule import CheckpointNotAllowedError


def test_missing_symbols_are_none_and_their_errors_name_feature_and_version():
    assert _compat._find("torch._no_such_module.anything") is None
    assert _compat._find("torch.utils._pytree.tree_map") is not None
    assert _compat.aten_op("_no_such_op.default") is None
    assert _compat.aten_op("_native_batch_norm_legit.no_stats") is torch.ops.aten._native_batch_norm_legit.no_stats
    module = _compat._Missing("flattening inputs", "torch.utils._no_pytree")
    with pytest.raises(_compat.MissingTorchFeature) as error:
        module.tree_leaves([])
    assert "flattening inputs" in str(error.value) and torch.__version__ in str(error.value)
    assert "torch.utils._no_pytree" in str(error.value)


def test_without_op_overload_the_aten_fallback_is_off_and_says_so_once(monkeypatch, torch_ort_log):
    monkeypatch.setattr(_compat, "OpOverload", ())
    monkeypatch.setattr(_compat, "_logged", set())
    assert not _compat.is_op_overload(torch.ops.aten.add.Tensor)
    assert not _compat.is_op_overload(torch.ops.aten.mul.Tensor)
    said = [r.getMessage() for r in torch_ort_log if "OpOverload" in r.getMessage()]
    assert len(said) == 1 and "ATen fallback" in said[0] and torch.__version__ in said[0]


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_routed_through_the_public_function_without_the_inner_entry(
        strict, monkeypatch, torch_ort_log, reentrant):
    """torch 2.11 has no torch.utils.checkpoint._checkpoint_impl: checkpoint() itself is swapped
    during the export, so calls through the module attribute are still refused or recomputed."""
    monkeypatch.setattr(_compat, "_CHECKPOINT_IMPL", None)
    monkeypatch.setattr(_compat, "_logged", set())
    with pytest.raises(CheckpointNotAllowedError):
        ORTModule(Checkpointed(reentrant))(torch.randn(3, 4))
    assert cp.checkpoint is _compat._CHECKPOINT  # put back after the failed export

    monkeypatch.setenv("ORTMODULE_ALLOW_AUTOGRAD_CHECKPOINT", "1")
    torch.manual_seed(0)
    eager = Checkpointed(reentrant)
    ours = copy.deepcopy(eager)
    model = ORTModule(ours)
    x = torch.randn(5, 4)
    loss_o, loss_e = model(x), eager(x)
    loss_o.backward()
    loss_e.backward()
    torch.testing.assert_close(loss_o, loss_e, rtol=1e-5, atol=1e-6)
    for (name, pe), po in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(po.grad, pe.grad, rtol=1e-5, atol=1e-6, msg=name)
    runner = next(iter(model._plan_cache.runners()))
    assert "torch.utils.checkpoint.CheckpointFunction" in runner.export.python_ops
    said = [r.getMessage() for r in torch_ort_log if "_checkpoint_impl" in r.getMessage()]
    assert len(said) == 1 and torch.__version__ in said[0]  # a user who allowed them is told


# Private torch names torch_ort reaches at import time or later, as (module, name).
HIDDEN = {
    "OpOverload": ("torch._ops", "OpOverload"),
    "_checkpoint_impl": ("torch.utils.checkpoint", "_checkpoint_impl"),
    "unset_fake_temporarily": ("torch._subclasses.fake_tensor", "unset_fake_temporarily"),
    "current_tracer": ("torch.onnx._internal.exporter._core", "current_tracer"),
}


@pytest.mark.parametrize("symbol", sorted(HIDDEN))
def test_import_never_fails_because_a_private_torch_symbol_is_missing(symbol):
    """A torch release without one of these loses that feature, not `import torch_ort`. In a fresh
    interpreter, `import torch_ort` sees the module through a copy without the name (torch's own
    code keeps its module, as a torch without the name would be consistent in itself); then a
    plain model trains through the engine."""
    module, name = HIDDEN[symbol]
    script = "\n".join([
        "import importlib, sys, types",
        "import torch",
        f"real = importlib.import_module({module!r})",
        f"copy = types.ModuleType({module!r})",
        f"copy.__dict__.update((k, v) for k, v in vars(real).items() if k != {name!r})",
        f"sys.modules[{module!r}] = copy",
        "import torch_ort",
        f"sys.modules[{module!r}] = real",
        "model = torch_ort.ORTModule(torch.nn.Linear(4, 2))",
        "loss = model(torch.randn(3, 4)).sum()",
        "loss.backward()",
        "assert model.fallback is None and model.stats()['engine_builds'] == 1, model.fallback",
        "print('trained')",
    ])
    env = dict(os.environ, ORTMODULE_FALLBACK_POLICY="FALLBACK_DISABLE")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-2000:]
