"""ORTModule: a drop-in nn.Module whose forward and backward run through the torch_ort engine."""
from __future__ import annotations

import torch
from torch.utils import _pytree as pytree

from torch_ort.ortmodule import hf
from torch_ort.ortmodule.aten_fallback import AtenFallback
from torch_ort.ortmodule.bridge import EngineFunction
from torch_ort.ortmodule.fallback import (
    FallbackManager,
    ORTModuleError,
    ORTModuleIOError,
)
from torch_ort.ortmodule.options import DebugOptions
from torch_ort.ortmodule.runner import GraphRunner, input_schema

_ORIGINAL = "_original_module"


class ORTModule(torch.nn.Module):
    """Wraps `module`; its parameters, buffers and state_dict keys stay the original's."""

    def __init__(self, module: torch.nn.Module, debug_options: DebugOptions | None = None):
        if isinstance(module, ORTModule):
            raise TypeError("the module is already an ORTModule")
        if isinstance(module, torch.nn.DataParallel):
            raise TypeError("ORTModule does not support torch.nn.DataParallel; wrap the module with "
                            "ORTModule first, then use DistributedDataParallel")
        super().__init__()
        self._modules[_ORIGINAL] = module
        self._debug = debug_options or DebugOptions()
        self._debug.apply_log_level()
        self._fallback = FallbackManager()
        self._runners: dict = {}  # (training path, input schema) -> GraphRunner
        self._aten_fallback = AtenFallback()  # ops routed through ATenOp, found while exporting
        self.export_count = 0      # how many times the module was exported (tests assert it)
        self.engine_build_count = 0  # engines compiled: exports x (inference, each requires-grad set)

    # --- the original module shows through -------------------------------------------------
    @property
    def module(self) -> torch.nn.Module:
        return self._modules[_ORIGINAL]

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules[_ORIGINAL], name)

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self.module.named_parameters(prefix, recurse, remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self.module.named_buffers(prefix, recurse, remove_duplicate)

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        # children() is NOT delegated: train(), to() and apply() recurse through it and must
        # reach the wrapped module itself.
        return self.module.named_modules(memo, prefix, remove_duplicate)

    # --- forward ------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self._fallback.active:
            return self.module(*args, **kwargs)
        try:
            return self._forward_engine(args, kwargs)
        except ORTModuleError as error:
            self._fallback.handle(error)
            return self.module(*args, **kwargs)

    def _count_export(self):
        self.export_count += 1

    def _forward_engine(self, args, kwargs):
        kwargs = hf.adapt_call(self.module, args, kwargs, torch.is_grad_enabled())
        kwargs = dict(sorted(kwargs.items()))  # keyword order is not part of the schema
        flat, spec = pytree.tree_flatten((args, kwargs))
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        for i, t in enumerate(tensors):
            if t.is_complex() or t.is_quantized or t.is_sparse:
                raise ORTModuleIOError(f"input tensor {i} has unsupported dtype/layout {t.dtype}/{t.layout}")
        key = (self.module.training, input_schema(spec, flat))
        runner = self._runners.get(key)
        if runner is None or not runner.accepts(tensors):
            runner = GraphRunner(self.module, args, kwargs, self._debug, self._aten_fallback,
                                 on_export=self._count_export)
            self._runners[key] = runner
        # Gradients are built whenever autograd would record the call (also in eval mode, where
        # ORT silently ran inference); otherwise the forward-only inference engine runs.
        training = torch.is_grad_enabled() and any(t.requires_grad for t in (*tensors, *runner.params))
        built = runner.engines_built
        engine = runner.engine_for(training, tensors, args, kwargs)
        self.engine_build_count += runner.engines_built - built
        params = runner.params
        if training:
            outputs = EngineFunction.apply(engine, *tensors, *params)
        else:
            with torch.no_grad():
                outputs, _ = engine.forward([*tensors, *params])
        outputs = runner.buffer_updates.apply(list(outputs))  # running stats -> the module's buffers
        return runner.export.rebuild_outputs(outputs)
