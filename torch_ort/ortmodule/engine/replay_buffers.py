"""The replay buffers of ORTMODULE_USE_CUDA_GRAPH (cuda_graph.py), and when a replay may write them.

Replay buffers (torch.compile's cudagraph trees treat outputs so; here .grad too). A replay writes
the same addresses every time, so what one replay returns, the next one overwrites:
- Outputs are the forward graph's buffers, not copies. A call that is about to replay the same
  capture first invalidates the outputs the last replay returned: reading one afterwards raises
  "...overwritten by a later replay..." (a loss read with .item() before the next step is fine;
  clone() what is kept longer). A view or detach() of an output cannot be invalidated, so while
  one is alive calls of that shape run uncaptured and it keeps its values (one warning).
- A parameter's gradient is handed to autograd as a new tensor on the backward graph's buffer,
  which autograd adopts as .grad when .grad is None — no copy, as in eager. The backward graph
  has its own memory pool, so a forward replay never writes where a .grad lives. Before the next
  replay, a .grad still on a buffer (gradient accumulation, zero_grad(set_to_none=False)) moves to
  its own memory (one copy; the same tensor object), and autograd then adds the new gradient to
  it as in eager. Anything else still on a buffer (an earlier .grad kept after
  zero_grad(set_to_none=True), a view of one) keeps its values: calls of that shape run uncaptured
  while it is alive (one warning); only such an alias made between a forward and its backward
  makes that backward raise, rather than overwrite it.
- Gradients for the caller's own tensors are the buffers themselves (autograd copies them).
This needs torch._C._storage_Use_Count and torch._C._set_storage_access_error_msg (private,
feature-checked); without them outputs are cloned and gradients copied, as before.
"""
from __future__ import annotations

import torch

from torch_ort.ortmodule.policy.debug_options import LOGGER

STALE = ("torch_ort (ORTMODULE_USE_CUDA_GRAPH=1): this output of an earlier call was overwritten by a "
         "later replay of the same CUDA graph; clone() an output you keep past the module's next call")


def tracks_buffers() -> bool:
    """Whether this torch can count a storage's references and invalidate a tensor (private APIs
    that torch.compile's cudagraph trees use); without them replays copy out what they return."""
    return hasattr(torch._C, "_storage_Use_Count") and hasattr(torch._C, "_set_storage_access_error_msg")


def storage_refs(t: torch.Tensor) -> int:
    """References to t's storage (every tensor that shares its memory holds one)."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def invalidate(t: torch.Tensor) -> None:
    """t lets go of its memory; reading it raises STALE."""
    torch._C._set_storage_access_error_msg(t, STALE)


def outputs_free(captured, zero_copy: bool) -> bool:
    """Whether the next replay may overwrite the outputs the last one returned. Those outputs
    themselves may be alive: the replay invalidates them (reading one then raises STALE). A
    view or detach() of one also holds the memory, and then this call runs uncaptured (the
    alias keeps its values). Changes nothing."""
    if not zero_copy:
        return True
    handed = [t for t in (ref() for ref in captured.handed) if t is not None]
    held = {}  # storage -> references the handed outputs hold, which the replay drops
    for t in handed:
        key = t.untyped_storage().data_ptr()
        held[key] = held.get(key, 0) + 1
    if all(storage_refs(o) - held.get(o.untyped_storage().data_ptr(), 0) <= r
           for o, r in zip(captured.outputs, captured.output_refs)):
        return True
    if not captured.warned:
        captured.warned = True
        LOGGER.warning("ORTMODULE_USE_CUDA_GRAPH: a view or detach() of an output of an earlier "
                       "call is still alive; calls run uncaptured while it is, so it keeps its "
                       "values (clone() the outputs you keep)")
    return False

def grads_free(captured, params: list, at_forward: bool, num_user: int, zero_copy: bool) -> bool:
    """Whether the backward graph may overwrite its gradient buffers. A .grad still on one
    (gradient accumulation, zero_grad(set_to_none=False)) first moves to its own memory, the
    same tensor object. Anything else still on one (an earlier .grad kept after
    zero_grad(set_to_none=True), a view of one) keeps it: at the forward, this call then
    runs uncaptured; at the backward (an alias made after the forward), it raises."""
    if not zero_copy:
        return True
    n = num_user
    mine = [(g, base) for i, (g, base) in enumerate(zip(captured.grads_out, captured.grad_refs))
            if g is not None and i >= n]
    if all(storage_refs(g) <= base for g, base in mine):
        return True
    buffers = {g.untyped_storage().data_ptr() for g, _ in mine} - {0}
    with torch.no_grad():  # every .grad first: two gradients may share one buffer's storage
        for p in params:
            grad = p.grad
            if grad is not None and grad.untyped_storage().data_ptr() in buffers:
                grad.data = grad.clone()
    if all(storage_refs(g) <= base for g, base in mine):
        return True
    if not at_forward:
        raise RuntimeError(
            "torch_ort (ORTMODULE_USE_CUDA_GRAPH=1): a view or detach() of a parameter's .grad, "
            "made after an earlier backward, is still alive; this backward would overwrite it. "
            "clone() gradients you keep across a backward, or set ORTMODULE_USE_CUDA_GRAPH=0")
    if not captured.warned_grads:
        captured.warned_grads = True
        LOGGER.warning("ORTMODULE_USE_CUDA_GRAPH: a gradient of an earlier step (a .grad kept "
                       "after zero_grad, or a view of one) is still alive; calls run uncaptured "
                       "while it is, so it keeps its values (clone() the gradients you keep)")
    return False
