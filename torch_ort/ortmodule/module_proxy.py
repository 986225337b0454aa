"""How an ORTModule stands in for the module it wraps: its `forward` shows the wrapped module's
signature, its state_dict keys are the wrapped module's inside a parent, and a method the wrapped
module's class defines, assigned on the wrapper, stays the wrapper's (as ONNX Runtime's ORTModule
kept them apart)."""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch_ort.ortmodule.ortmodule import ORTModule

ORIGINAL = "_original_module"  # the wrapped module's name in ORTModule._modules


class ForwardAttribute:
    """ORTModule.forward: on an instance, the call carrying the wrapped module's signature
    (inspect.signature(model.forward)) — Hugging Face's Trainer keeps only the dataset columns
    that forward's signature names; on the class, the plain function."""

    def __get__(self, instance, owner):
        if instance is None:
            return owner._forward_call
        bound = Forward(instance)
        instance.__dict__["forward"] = bound  # one per instance (the instance dict wins from now on)
        return bound


class Forward:
    """ORTModule.forward of one instance: calls the engine path, shows the wrapped module's
    signature (and, as __wrapped__, its forward)."""

    __name__ = __qualname__ = "forward"

    def __init__(self, owner: "ORTModule"):
        self.__self__ = owner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__self__._forward_call(*args, **kwargs)

    @property
    def __wrapped__(self):
        return self.__self__.module.forward

    @property
    def __signature__(self):
        return inspect.signature(self.__self__.module.forward)


def keys_without_wrapper(_module, state_dict, prefix, *_):
    """ORTModule inside another module (DDP's .module, a parent model): its state_dict() entries
    carry the original's keys, but the parent's load_state_dict walks _modules and expects
    '<prefix>_original_module.<key>'; rename them in place before the walk reaches the child."""
    inner = prefix + ORIGINAL + "."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)


def own_method(module: torch.nn.Module, name: str) -> bool:
    """True when `name` is a method that the module's class (or a base other than nn.Module)
    defines, other than forward."""
    if name == "forward" or name.startswith("__"):
        return False
    defined = inspect.getattr_static(type(module), name, None)
    return inspect.isfunction(defined) and getattr(torch.nn.Module, name, None) is not defined
