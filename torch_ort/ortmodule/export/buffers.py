"""Buffers a module updates in forward (BatchNorm's running_mean, running_var, num_batches_tracked):
kept as extra graph outputs at export, copied into the live buffers after every engine forward.

torch.export functionalizes the in-place updates: the exported program returns each buffer's new
value as an output of kind BUFFER_MUTATION (ep.graph_signature.buffers_to_mutate maps it to the
buffer's name). torch.onnx translates those values but lists only the user outputs as graph
outputs, and its final cleanup (RemoveUnusedNodes, run by the opset conversion) then deletes
them. We list them as graph outputs, after the user outputs, between translation and cleanup.
The only seam there is torch.onnx's private _exported_program_to_onnx_program (_compat.py), so
it is feature-checked: without it, exporting a module that updates buffers raises a clear error
(the fallback policy then runs it in eager) instead of silently freezing its statistics.

The graph stays functional (our kernels never write into their inputs); GraphRunner binds the
buffers as graph inputs and BufferUpdates writes the new values back in place, so the buffer
objects (state_dict, optimizers, DDP) are the same ones eager would have updated.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import torch

from torch_ort import _compat
from torch_ort.ortmodule.policy.fallback_policy import ORTModuleTorchModelException

_LOCK = threading.Lock()  # the seam is module state: one export at a time patches it


@dataclass
class Mutations:
    fqns: list[str] = field(default_factory=list)  # buffers whose new values follow the user outputs
    kept: bool = False                             # the seam ran: fqns is complete


def _append_mutation_outputs(graph, signature) -> list[str]:
    from torch.export.graph_signature import OutputKind

    values = {v.name: v for v in graph.inputs}
    values.update(graph.initializers)
    for node in graph:
        values.update((v.name, v) for v in node.outputs)
    fqns = []
    for spec in signature.output_specs:
        if spec.kind != OutputKind.BUFFER_MUTATION:
            continue
        value = values.get(spec.arg.name)
        if value is None:
            raise ORTModuleTorchModelException(
                f"the new value of buffer '{spec.target}' (exported as '{spec.arg.name}') is not in "
                "the translated ONNX graph; torch_ort cannot keep the module's buffer updates")
        graph.outputs.append(value)
        fqns.append(spec.target)
    return fqns


@contextlib.contextmanager
def keep_buffer_mutations():
    """Around torch.onnx.export: mutated buffers become graph outputs after the user outputs."""
    found = Mutations()

    def wrap(original):
        def translate(exported_program, *args, **kwargs):
            program = original(exported_program, *args, **kwargs)
            found.fqns = _append_mutation_outputs(program.model.graph, exported_program.graph_signature)
            found.kept = True
            return program
        return translate

    # Without the seam (another torch) nothing is wrapped: check_kept() raises if the model needed it.
    with _LOCK, _compat.onnx_translation_wrapped(wrap):
        yield found


def check_kept(exported_program, found: Mutations) -> None:
    """Raises when the model updates buffers but the export could not keep the updates."""
    mutated = dict(exported_program.graph_signature.buffers_to_mutate)
    if mutated and (not found.kept or sorted(found.fqns) != sorted(mutated.values())):
        raise ORTModuleTorchModelException(
            f"the module updates buffers {sorted(mutated.values())} in forward, but the ONNX "
            f"exporter of torch {torch.__version__} drops those updates (it has no "
            f"{_compat.ONNX_TRANSLATION} to hook); torch_ort would leave them frozen")


class BufferUpdates:
    """Writes an engine call's trailing outputs (new buffer values) into the live buffers."""

    def __init__(self, module: torch.nn.Module, fqns: list[str]):
        named = dict(module.named_buffers(remove_duplicate=False))
        self.fqns = list(fqns)
        self.buffers = [named[n] for n in self.fqns]  # the live tensors, updated in place

    def apply(self, outputs):
        """Copies the new values into the buffers; returns the user's outputs only."""
        if not self.buffers:
            return outputs
        n_user = len(outputs) - len(self.buffers)
        with torch.no_grad():
            for live, new in zip(self.buffers, outputs[n_user:]):
                if new.data_ptr() != live.data_ptr():  # an unchanged buffer comes back as itself
                    live.copy_(new)
        return outputs[:n_user]
