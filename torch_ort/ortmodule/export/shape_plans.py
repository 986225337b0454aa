"""How much of a call's input shapes an export keeps symbolic (SHAPE_PLANS), the dynamic_shapes
torch.export is given for a plan, and the sizes an exported graph fixed."""
from __future__ import annotations

import inspect

import torch

from torch_ort._compat import pytree


def dynamic_shapes(module, args, kwargs, static: dict):
    """Dim.AUTO for every dimension of every tensor input, keyed by forward()'s parameter names
    (torch.export keeps a dim static only when the model forces it), except the dims `static`
    fixes: {id(tensor): dims held at the call's sizes}."""
    def custom(x):  # a container a library registered (a DynamicCache), not a builtin one
        return type(x) in pytree.SUPPORTED_NODES and type(x).__module__ not in ("builtins", "collections")

    def spec(x):
        if isinstance(x, torch.Tensor):
            fixed = static.get(id(x), ())
            return {d: None if d in fixed else torch.export.Dim.AUTO for d in range(x.dim())} or None
        if custom(x):  # torch.export reads its dims as a list, one entry per child
            return [pytree.tree_map(spec, c, is_leaf=custom) for c in pytree.SUPPORTED_NODES[type(x)].flatten_fn(x)[0]]
        return None
    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    return {name: pytree.tree_map(spec, value, is_leaf=custom) for name, value in bound.arguments.items()}


# How much of the input shapes an export keeps symbolic, most first. A model whose code does not
# hold for every size (x.squeeze(1) of a size-1 dim, a view the exporter's decomposition cannot
# replay with symbolic strides, inconsistent solver constraints) exports with fewer dynamic dims;
# the graph then records the sizes it fixed (ExportResult.static_dims) and a call with other sizes
# exports again (GraphRunner.accepts), never running a graph specialised to other sizes.
SHAPE_PLANS = ("dynamic", "size-1 dims static", "static")


def plan_static_dims(plan: str, tensors: list) -> dict | None:
    """{id(tensor): dims fixed} under `plan`; None when the plan fixes nothing more than the
    previous one (no size-1 dims: that retry would export the same graph)."""
    if plan == "dynamic":
        return {}
    if plan == "static":
        return {id(t): set(range(t.dim())) for t in tensors} if any(t.dim() for t in tensors) else None
    ones = {id(t): {d for d, n in enumerate(t.shape) if n == 1} for t in tensors}
    return ones if any(ones.values()) else None


def pinned_symbols(ep) -> dict:
    """{symbol name: size} for the symbolic dims the trace pinned to one value: torch.export keeps
    such a dim symbolic in the graph's input shapes but records its range as a single size (e.g.
    `x.unbind(1)[-1]` resolves -1 for the traced size only)."""
    pinned = {}
    for symbol, bounds in ep.range_constraints.items():
        if bounds.lower == bounds.upper and getattr(bounds.lower, "is_Integer", False):
            pinned[str(symbol)] = int(bounds.lower)
    return pinned


def fixed_sizes(value, pinned: dict) -> list:
    """Per dim of a graph input: the size the export fixed (a number, or a symbol the trace pinned
    to one size), None where any size is accepted."""
    if not value.shape:
        return []
    return [d if isinstance(d, int) else pinned.get(str(getattr(d, "value", d))) for d in value.shape.dims]
