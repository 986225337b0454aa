"""A call of an ORTModule as the engine sees it: the arguments flattened (keyword order ignored,
Hugging Face's defaults applied), the tensors among them, and the input schema that selects a
graph. Inputs the graph cannot take raise ORTModuleIOError here, before any export."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from torch_ort._compat import pytree
from torch_ort.ortmodule.integrations import hf
from torch_ort.ortmodule.policy.fallback_policy import ORTModuleDeviceException, ORTModuleIOError

_DEVICES = ("cpu", "cuda")
# Leaves an input may have besides tensors: values the export records as constants of the graph.
_INPUT_LEAVES = (torch.Tensor, int, float, bool, str, type(None), torch.dtype, torch.device,
                 torch.layout, torch.memory_format)


def input_schema(spec, flat) -> tuple:
    """What makes a call need a new export: the input structure, the non-tensor values, and each
    tensor's dtype, rank and device type. Sizes are not part of it (dims are symbolic)."""
    leaves = []
    for x in flat:
        if isinstance(x, torch.Tensor):
            leaves.append(("T", x.dtype, x.dim(), x.device.type))
        else:
            leaves.append((type(x).__name__, repr(x)))
    return (str(spec), tuple(leaves))


@dataclass
class Call:
    kwargs: dict           # the keywords the graph is exported with (sorted, adapted)
    flat: list             # pytree leaves of (args, kwargs)
    spec: pytree.TreeSpec
    tensors: list          # the tensors among `flat`, in order: the graph's user inputs
    schema: tuple          # input_schema(spec, flat)


def parse_call(module: torch.nn.Module, args: tuple, kwargs: dict) -> Call:
    kwargs = hf.adapt_call(module, args, kwargs, torch.is_grad_enabled())
    kwargs = dict(sorted(kwargs.items()))  # keyword order is not part of the schema
    flat, spec = pytree.tree_flatten((args, kwargs))
    tensors = [x for x in flat if isinstance(x, torch.Tensor)]
    for i, t in enumerate(tensors):
        if t.is_complex() or t.is_quantized or t.is_sparse:
            raise ORTModuleIOError(f"input tensor {i} has unsupported dtype/layout {t.dtype}/{t.layout}")
    odd = next((x for x in flat if not isinstance(x, _INPUT_LEAVES)), None)
    if odd is not None:
        raise ORTModuleIOError(
            f"an input of type {type(odd).__qualname__} is neither a tensor, a Python scalar or "
            "string, nor a container of them (tuple, list, dict, or a class registered with "
            "torch.utils._pytree or torch.export.register_dataclass); torch_ort cannot pass it "
            "to the graph")
    return Call(kwargs, flat, spec, tensors, input_schema(spec, flat))


def check_devices(tensors, params) -> None:
    """The engine runs a call whose inputs and parameters are all on one CPU or CUDA device."""
    devices = {t.device for t in (*tensors, *params)}
    bad = [d for d in devices if d.type not in _DEVICES]
    if bad or len(devices) > 1:
        raise ORTModuleDeviceException(
            f"inputs and parameters are on {sorted(map(str, devices))}; the engine runs when all "
            f"are on one device of type {' or '.join(_DEVICES)}")


def device_types(tensors, module: torch.nn.Module) -> set:
    """Where a call computes: its tensors' devices, else the module's parameters'."""
    return {t.device.type for t in tensors} or {p.device.type for p in module.parameters()} or {"cpu"}
