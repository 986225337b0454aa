"""How an ORTModule stands in for the module it wraps (ModuleProxy, a base of ORTModule): its
attributes, methods, parameters, buffers and state_dict are the wrapped module's; its `forward`
shows the wrapped module's signature; its state_dict keys are the wrapped module's inside a parent;
an attribute set on it is set on the wrapped module and marks the model changed; and a method the
wrapped module's class defines, assigned on the wrapper, stays the wrapper's (as ONNX Runtime's
ORTModule kept them apart)."""
from __future__ import annotations

import inspect
import types
import weakref
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch

from torch_ort.ortmodule.policy.compositions import fsdp_managed
from torch_ort.ortmodule.policy.debug_options import LOGGER
from torch_ort.ortmodule.policy.variables import SkipCheck

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


class ModuleProxy(torch.nn.Module):
    """The wrapped module shows through the ORTModule (the base ORTModule builds on): attribute
    reads, methods, parameters, buffers, modules and state_dict are the wrapped module's; setting
    an attribute or registering a parameter, buffer or module sets it there and marks the model
    changed (`_changed`: the next call re-exports). Reads ORTModule's `_settings`, `_lock` and
    `_plan_cache`."""

    @property
    def module(self) -> torch.nn.Module:
        return self._modules[ORIGINAL]
    def __repr__(self) -> str:
        # The wrapped module as it prints, inside ORTModule(...): not as a child named
        # _original_module (an implementation detail; state_dict keys do not show it either).
        inner = repr(self.module).replace("\n", "\n  ")
        return f"{type(self).__name__}(\n  {inner}\n)"

    def __getattr__(self, name):
        if "_modules" not in self.__dict__:  # half-built (unpickling, copy): nothing to forward to
            raise AttributeError(f"'ORTModule' object has no attribute {name!r}")
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        module = self._modules[ORIGINAL]
        value = getattr(module, name)
        if isinstance(value, types.MethodType) and value.__self__ is module:
            return types.MethodType(value.__func__, self._method_self())
        return value

    def _method_self(self):
        """What `self` is in a method of the wrapped module reached through the ORTModule
        (`model.generate(...)`, Lightning's `training_step`): the wrapped module as it is — an
        instance of its class sharing its attributes (super(), isinstance and properties work)
        — except that calling it, or its forward, runs the engine, and an attribute set through
        it is noted as one set on the ORTModule (re-export when an export read it)."""
        proxy = self.__dict__.get("_method_proxy")
        if proxy is None:
            module = self._modules[ORIGINAL]
            owner = weakref.ref(self)

            def __call__(_, *args, **kwargs):
                return owner()(*args, **kwargs)

            def forward(_, *args, **kwargs):
                return owner()._forward_call(*args, **kwargs)

            def __setattr__(this, name, value):
                type(module).__setattr__(this, name, value)
                owner()._note_set(name, value)

            cls = type(module)
            try:
                proxy_cls = type(cls.__name__, (cls,), {
                    "__call__": __call__, "forward": forward, "__setattr__": __setattr__,
                    "__module__": cls.__module__, "__qualname__": cls.__qualname__})
                proxy = object.__new__(proxy_cls)
                object.__setattr__(proxy, "__dict__", module.__dict__)  # the same attributes
            except (TypeError, AttributeError) as e:  # a class that refuses subclasses or __dict__
                LOGGER.info("methods of %s reached through the ORTModule run bound to the ORTModule "
                            "(%s: %s)", cls.__name__, type(e).__name__, e)
                proxy = self
            self.__dict__["_method_proxy"] = proxy
        return proxy

    def _replicate_for_data_parallel(self):
        # torch.nn.DataParallel replicates modules per GPU; the engine's state is per module.
        raise TypeError("torch.nn.DataParallel around ORTModule is not supported; use "
                        "DistributedDataParallel(ORTModule(model)) instead")

    def __setattr__(self, name, value):
        """After construction, an attribute that is not ORTModule's own goes to the wrapped module
        and marks the model changed: the next call re-exports (and keeps the engines when the
        graph comes out the same). A value that is not a module or tensor, set on an attribute no
        export read, cannot change any graph: nothing happens. A name that is a method the wrapped
        module's class defines (not forward, not nn.Module's) is set on the ORTModule only, as
        ORTModule did: the wrapped module keeps its own method."""
        if "_initialized" not in self.__dict__ or name in self.__dict__ or name == "training" \
                or hasattr(type(self), name) or own_method(self.module, name):
            return super().__setattr__(name, value)
        setattr(self.module, name, value)
        self._note_set(name, value)

    def _note_set(self, name, value) -> None:
        """Attribute `name` of the wrapped module was set: the next call re-exports, unless the
        value cannot change any graph."""
        if not isinstance(value, (torch.nn.Module, torch.Tensor)) and self._unread(name):
            LOGGER.debug("attribute %r set: no exported graph read it, nothing to re-export", name)
            return
        self._changed.add(name)

    def _unread(self, name: str) -> bool:
        """True when no current export read attribute `name` of the module (so its value cannot
        change any graph). SKIP_CHECK_DISABLED re-exports on every assignment instead."""
        if self._settings.skipcheck & SkipCheck.SKIP_CHECK_DISABLED:
            return False
        with self._lock:
            reads = [r.export.attributes_read for r in self._plan_cache.runners()]
        # (A forward that reads self.__dict__[name] directly is not seen; nn.Module itself reads
        # __dict__ on every submodule access, so that read cannot count as reading everything.)
        return bool(reads) and all(r is not None and name not in r for r in reads)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        out = self.module.state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        meta = getattr(out, "_metadata", None)
        if prefix and meta is not None:
            # Inside a parent, whose load_state_dict walks _modules: its children look their
            # versions up under '<prefix>_original_module...' (see module_proxy.keys_without_wrapper).
            inner = prefix + ORIGINAL
            for key in [k for k in meta if (k == prefix[:-1] or k.startswith(prefix)) and not k.startswith(inner)]:
                meta[inner + key[len(prefix) - 1:]] = meta[key]
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> Any:  # torch's _IncompatibleKeys
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    # Registering on the ORTModule registers on the wrapped module (whose state_dict, buffers and
    # parameters the ORTModule shows), and the next call re-exports, as for an attribute set.
    def register_buffer(self, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        if "_initialized" not in self.__dict__:
            return super().register_buffer(name, tensor, persistent)
        self.module.register_buffer(name, tensor, persistent)
        self._changed.add(name)

    def register_parameter(self, name: str, param: torch.nn.Parameter | None) -> None:
        if "_initialized" not in self.__dict__:
            return super().register_parameter(name, param)
        self.module.register_parameter(name, param)
        self._changed.add(name)

    def add_module(self, name: str, module: torch.nn.Module | None) -> None:
        if "_initialized" not in self.__dict__:
            return super().add_module(name, module)
        self.module.add_module(name, module)
        self._changed.add(name)

    register_module = add_module

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return self.module.named_parameters(prefix, recurse, remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        return self.module.named_buffers(prefix, recurse, remove_duplicate)

    def named_modules(self, memo: set[torch.nn.Module] | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, torch.nn.Module]]:
        # children() is NOT delegated: train(), to() and apply() recurse through it and must
        # reach the wrapped module itself.
        if fsdp_managed(self):
            # fully_shard(ORTModule(block)): FSDP2 finds its states (the root's lazy init, which
            # sets up the shared communication context) by walking named_modules; this ORTModule
            # carries one, so it shows itself first.
            return self._with_self(memo, prefix, remove_duplicate)
        return self.module.named_modules(memo, prefix, remove_duplicate)

    def _with_self(self, memo, prefix, remove_duplicate):
        if memo is None:
            memo = set()
        if self not in memo or not remove_duplicate:
            if remove_duplicate:
                memo.add(self)
            yield prefix, self
        yield from self.module.named_modules(memo, prefix, remove_duplicate)

    def _fqn_modifiers(self) -> dict[str, str]:
        """torch.distributed.checkpoint's contract for a module whose state_dict keys skip a
        child: each key's first name here is reached through _original_module (so the names
        its get_/set_model_state_dict and optimizer state use are the original module's)."""
        module = self.module
        return dict.fromkeys([*module._parameters, *module._buffers, *module._modules], ORIGINAL)
