"""ORTModule.export_onnx: the trained model as an ONNX inference graph for ONNX Runtime (or any
ONNX runtime): eval mode, weights included, every input dimension dynamic, standard ONNX ops only
(no engine fusions, no ATen fallback or PythonOp nodes: those exist for our engine, not others)."""
from __future__ import annotations

import os

import torch

from torch_ort._compat import pytree
from torch_ort.ortmodule.export import exporter, python_op_export
from torch_ort.ortmodule.integrations import hf
from torch_ort.ortmodule.policy.fallback_policy import ORTModuleTorchModelException
from torch_ort.ortmodule.policy.debug_options import LOGGER

_STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")
_EXTERNAL_DATA_BYTES = 1 << 30  # above this, weights go to '<path>.data' (protobuf caps at 2 GiB)


class CallSchema:
    """Enough of a call to make another one like it: the argument structure, each tensor's shape,
    dtype and device, and the non-tensor values (no tensor data is kept)."""

    def __init__(self, spec: pytree.TreeSpec, flat: list):
        """`spec`, `flat`: pytree.tree_flatten((args, kwargs)) of the call."""
        self.spec = spec
        self.leaves = [("T", tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else ("V", x)
                       for x in flat]

    def example(self) -> tuple[tuple, dict]:
        """Zeros of the recorded shapes (valid ids and masks for language models)."""
        flat = [torch.zeros(leaf[1], dtype=leaf[2], device=leaf[3]) if leaf[0] == "T" else leaf[1]
                for leaf in self.leaves]
        return pytree.tree_unflatten(flat, self.spec)


def export_inference(module: torch.nn.Module, args: tuple, kwargs: dict, path: str,
                     opset: int | None = None) -> str:
    """Writes `module`'s eval-mode graph to `path`; returns the path. The module's mode is
    restored; its parameters are read, never changed."""
    was_training = module.training
    module.eval()
    try:
        # A Hugging Face decoder exports without building a key/value cache unless asked to
        # (adapt_call's rule for calls that may be differentiated).
        kwargs = hf.adapt_call(module, args, kwargs, grad_enabled=True)
        with torch.no_grad():
            # Functions are traced through (their forward is what inference runs); neither our
            # translations nor the ATen fallback's: the stock exporter's standard ops.
            result = exporter.export_module(module, args, kwargs, opset, extra_translations=None,
                                            functions=python_op_export.FunctionPolicy(custom_autograd=False,
                                                                                      allow_checkpoint=True),
                                            deepcopy=True, own_translations=False)
    finally:
        module.train(was_training)
    model, moved = result.raw_model
    graph = model.graph
    foreign = sorted({f"{n.domain}::{n.op_type}" for n in graph.all_nodes() if n.domain not in _STANDARD_DOMAINS})
    if foreign:
        raise ORTModuleTorchModelException(
            f"export_onnx: the inference graph of {type(module).__name__} holds ops outside the ONNX "
            f"standard ({', '.join(foreign)}), which other runtimes cannot run")
    values = graph.inputs[len(graph.inputs) - len(moved):]
    for value, (name, data) in zip(values, moved):  # weights back in as initializers
        graph.inputs.remove(value)
        value.const_value = data
        graph.initializers[name] = value
    size = sum(data.nbytes for _, data in moved)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    import onnx_ir
    external = os.path.basename(path) + ".data" if size > _EXTERNAL_DATA_BYTES else None
    onnx_ir.save(model, path, external_data=external)
    LOGGER.info("export_onnx: wrote %s (%d nodes, %.1f MiB of weights%s; inputs %s)", path, len(graph),
                size / 2 ** 20, f" in {external}" if external else "", [v.name for v in graph.inputs])
    return path
