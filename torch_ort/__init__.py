"""torch_ort: train PyTorch modules faster through a C++ graph engine.

    model = torch_ort.ORTModule(model)   # forward + backward run by our engine
    print(torch_ort.examine(model, *example_inputs))  # what runs where, before training
    optimizer = torch_ort.optim.FusedAdam(model.parameters(), lr=1e-4)  # torch.optim.AdamW's update
"""
from torch_ort import optim, utils
from torch_ort.ortmodule import (ConfigurationWarning, DebugOptions, Examination, FallbackStatus, LogLevel,
                                 ORTModule, ORTModuleFallbackWarning, SubmoduleStatus, TorchOrtWarning, examine)
from torch_ort import _distribution
from torch_ort._version import __version__

_distribution.warn_if_conflicting(TorchOrtWarning)


def __getattr__(name: str):
    """torch_ort._C and torch_ort._C_cuda load on first use, checked against the running torch
    (torch_ort/_extension.py)."""
    if name in ("_C", "_C_cuda"):
        from torch_ort import _extension
        return _extension.load(name)
    raise AttributeError(f"module 'torch_ort' has no attribute {name!r}")


def pass_names() -> list[str]:
    """The engine's graph passes that can be disabled (ORTMODULE_DISABLED_PASSES), in pipeline
    order; the lowerings it cannot run without are left out."""
    from torch_ort import _C
    required = set(_C.required_pass_names())
    return [n for n in _C.pass_names() if n not in required]


__all__ = ["ORTModule", "DebugOptions", "LogLevel", "FallbackStatus", "SubmoduleStatus",
           "ORTModuleFallbackWarning", "TorchOrtWarning", "ConfigurationWarning", "optim", "pass_names",
           "utils", "examine", "Examination"]
