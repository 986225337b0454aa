"""What an export changes around the module for the duration of a trace, and why: each a
workaround for a torch.export / torch.onnx behaviour (keywords read as args, outputs of unknown
dataclasses, a forward's **kwargs counted twice, SDPA with a mask that requires grad), or a record
the engine needs (the attributes forward reads, a structural copy to trace)."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import re
import threading

import torch

from torch_ort._compat import pytree
from torch_ort.ortmodule.policy.debug_options import LOGGER


def register_dataclass(qualified: str) -> bool:
    """Registers the dataclass named `qualified` ('package.module.Class') as a pytree node, so that
    an output of that type leaves the graph as its fields and comes back rebuilt; False when the
    name is no dataclass (or cannot be imported, or is registered already)."""
    module_name, _, name = qualified.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return False
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)) or cls in pytree.SUPPORTED_NODES:
        return False
    torch.export.register_dataclass(cls, serialized_type_name=qualified)
    LOGGER.info("%s is returned by the model: registered with torch.utils._pytree as a dataclass", qualified)
    return True


UNKNOWN_OUTPUT = re.compile(r"Found <class '([^']+)'> in output, which is not a known type")


@contextlib.contextmanager
def forward_replaced(module: torch.nn.Module, forward):
    """module.forward is `forward` (an instance attribute) within the block, then what it was."""
    outer = module.__dict__.get("forward")
    module.__dict__["forward"] = forward
    try:
        yield
    finally:
        if outer is None:
            del module.__dict__["forward"]
        else:
            module.__dict__["forward"] = outer


@contextlib.contextmanager
def extra_keywords_named(module, args, kwargs):
    """While exporting, forward's signature names the call's extra keywords (those its **kwargs
    collects: Trainer's num_items_in_batch) as keyword-only parameters. torch.export 2.11 counts
    them twice, once inside **kwargs and once on their own, when dynamic_shapes is a dict: "Must
    provide a tree_name when there might be a mismatch"."""
    try:
        signature = inspect.signature(module.forward)
        bound = signature.bind(*args, **kwargs).arguments
    except (TypeError, ValueError):  # no signature, or a call eager rejects too: let export say so
        yield
        return
    params = list(signature.parameters.values())
    var = next((p for p in params if p.kind is p.VAR_KEYWORD), None)
    if var is None or not bound.get(var.name):
        yield
        return
    forward = module.forward

    def named_forward(*a, **kw):
        return forward(*a, **kw)

    named_forward.__signature__ = signature.replace(parameters=[p for p in params if p is not var] + [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in bound[var.name]])
    with forward_replaced(module, named_forward):
        yield


def structural_copy(module: torch.nn.Module):
    """(copy, {id(copied submodule): original}) — the Python objects copied, every parameter and
    buffer shared — or (module, {}) when the module cannot be deep-copied."""
    memo = {id(t): t for t in (*module.parameters(), *module.buffers())}
    try:
        clone = copy.deepcopy(module, memo)
    except Exception as e:  # locks, generators, C handles: export the module itself
        LOGGER.info("ORTMODULE_DEEPCOPY_BEFORE_MODEL_EXPORT: %s cannot be deep-copied (%s: %s); "
                    "exporting it in place", type(module).__name__, type(e).__name__, e)
        return module, {}
    return clone, {id(c): o for o, c in zip(module.modules(), clone.modules())}


@contextlib.contextmanager
def attribute_reads(module: torch.nn.Module):
    """Records which attributes of `module` itself its forward reads while traced, by giving the
    object a subclass (restored after) whose __getattribute__ records, while forward runs: the
    exporter's own bookkeeping (it snapshots __dict__) is not the model reading its state."""
    reads: set = set()
    inside = [0]
    cls = type(module)

    def __getattribute__(self, name, _get=cls.__getattribute__):
        if inside[0] and self is module:
            reads.add(name)
        return _get(self, name)

    @functools.wraps(cls.forward)
    def forward(self, *args, **kwargs):
        inside[0] += 1
        try:
            return cls.forward(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    try:
        module.__class__ = type(cls.__name__, (cls,), {
            "__getattribute__": __getattribute__, "forward": forward,
            "__module__": cls.__module__, "__qualname__": cls.__qualname__})
    except TypeError:  # a class whose instances cannot change class: reads stay unknown
        yield reads
        reads.add(None)
        return
    try:
        yield reads
    finally:
        module.__class__ = cls


@contextlib.contextmanager
def attention_with_mask_grad_as_math():
    """While the exporting thread traces, scaled_dot_product_attention whose attn_mask requires
    grad (T5's learned position bias) is traced as its math form, the kernel eager picks for it on
    the CPU. Traced as the fused op, the exporter's decomposition retrace computes the op's output
    layout without grad (a fused kernel's layout, which makes a later .contiguous() a no-op and
    drops it) and its type-promotion pass with grad (the math kernel's): the recorded view then
    cannot be replayed ("Cannot view a tensor with shape ... and strides ..."). The graph computes
    the same either way: the stock translation of the fused op is this math."""
    functional = torch.nn.functional
    fused = functional.scaled_dot_product_attention
    exporting = threading.get_ident()

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None and attn_mask.requires_grad and threading.get_ident() == exporting:
            return torch.ops.aten._scaled_dot_product_attention_math(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
        return fused(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                     scale=scale, enable_gqa=enable_gqa)

    functional.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = fused


class _KeptRegistry:
    """The exporter's registry of torchlib translations, built once per opset, and the torchlib
    names that resolved to no operator when it was built (a library loaded later may define one)."""
    def __init__(self, registry, unresolved: list[str]):
        self.registry, self.unresolved = registry, unresolved

    def still_valid(self) -> bool:
        return not any(_resolves(name) for name in self.unresolved)


def _resolves(qualified: str) -> bool:
    """Whether torchlib's 'namespace::op[.overload]' names an operator now (quietly: the exporter's
    own lookup warns about every torchvision name when torchvision is absent)."""
    namespace, _, rest = qualified.partition("::")
    op, _, overload = rest.partition(".")
    if namespace == "torchvision" and importlib.util.find_spec("torchvision") is None:
        return False
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        return overload in packet.overloads() if overload else \
            bool({"default", ""} & set(packet._overload_names))
    except (AttributeError, RuntimeError):
        return False


_KEPT_REGISTRIES: dict[int, _KeptRegistry] = {}


class _Domain:
    def __init__(self, domain: str):
        self.domain = domain


@contextlib.contextmanager
def _traced_domains_only():
    """While the registry is built, a traced torchlib function's `function_ir` is its domain only.
    Building the registry reads nothing else of it (onnxscript's get_torchlib_ops takes
    `function_ir.domain`), and onnxscript derives that IR anew on every read by parsing the
    function's source: 497 functions, about 0.7 s of every process's first export. The domain
    is the function's opset's (tests/python/test_torchlib_registry.py checks each). An onnxscript
    without the class builds the registry as it always did."""
    try:
        from onnxscript._internal.values import TracedOnnxFunction
    except ImportError:
        yield
        return
    full = TracedOnnxFunction.__dict__.get("function_ir")
    if not isinstance(full, property):
        yield
        return
    TracedOnnxFunction.function_ir = property(lambda self: _Domain(self.opset.domain))
    try:
        yield
    finally:
        TracedOnnxFunction.function_ir = full


@contextlib.contextmanager
def torchlib_registry_kept():
    """While exporting, torch.onnx's registry of ATen translations is a copy of one built before.
    The exporter builds it from torchlib on every call (0.6-1.4 s, most of it inferring each
    function's signature) and the result only changes when an operator torchlib names appears,
    e.g. torchvision's after an import. Each export gets its own dict of lists, so the custom
    translations it registers in front stay its own; the translations themselves are shared (the
    exporter never changes one once built)."""
    from torch.onnx._internal.exporter import _registration

    cls = _registration.ONNXRegistry
    built = cls.__dict__["from_torchlib"]

    def from_torchlib(klass, opset_version=_registration._constants.TORCHLIB_OPSET):
        kept = _KEPT_REGISTRIES.get(opset_version)
        if klass is not cls or kept is None or not kept.still_valid():
            unresolved, resolve = [], _registration._get_overload

            def recording(name):
                target = resolve(name)
                if target is None:
                    unresolved.append(name)
                return target

            _registration._get_overload = recording
            try:
                with _traced_domains_only():
                    registry = built.__func__(klass, opset_version=opset_version)
            finally:
                _registration._get_overload = resolve
            if klass is not cls:
                return registry
            kept = _KEPT_REGISTRIES[opset_version] = _KeptRegistry(registry, unresolved)
        registry = copy.copy(kept.registry)
        registry.functions = {target: list(decomps) for target, decomps in kept.registry.functions.items()}
        return registry

    cls.from_torchlib = classmethod(from_torchlib)
    try:
        yield
    finally:
        cls.from_torchlib = built


_KEPT_DECOMPOSITIONS: dict[tuple, dict] = {}  # one entry, the last key's: models alternating
#   between two ATen-fallback sets rebuild, and a long process keeps one table, not one per set


@contextlib.contextmanager
def decomposition_tables_kept():
    """While exporting, the exporter's decomposition table for a set of translated operators is
    built once (0.1-0.3 s a call: it walks all of torch's decompositions), and again when a
    decomposition appears: a Python one in torch._decomp's table or a CompositeImplicitAutograd
    kernel (a library's op). Each export gets its own dict of the shared decompositions."""
    import torch._decomp
    from torch.onnx._internal.exporter import _decomp

    build = _decomp.create_onnx_friendly_decomposition_table

    def create_onnx_friendly_decomposition_table(onnx_registered_ops):
        key = (frozenset(onnx_registered_ops), len(torch._decomp.decomposition_table),
               len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")))
        if key not in _KEPT_DECOMPOSITIONS:
            _KEPT_DECOMPOSITIONS.clear()
            _KEPT_DECOMPOSITIONS[key] = build(onnx_registered_ops)
        return dict(_KEPT_DECOMPOSITIONS[key])

    _decomp.create_onnx_friendly_decomposition_table = create_onnx_friendly_decomposition_table
    try:
        yield
    finally:
        _decomp.create_onnx_friendly_decomposition_table = build


def fresh_leaves(tree):
    """Each tensor as a detached view (no copy) with its requires_grad: the exporter fakes the
    tensors it is given, and one carrying a .grad (an input reused across steps, input-gradient
    or adversarial training) or a grad_fn is not what it expects."""
    def fresh(t):
        return t.detach().requires_grad_(t.requires_grad) if t.requires_grad else t.detach()
    return pytree.tree_map_only(torch.Tensor, fresh, tree)


def as_keywords(module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with every argument forward can take by name passed by name, in parameter order
    before the call's own keywords (the flattened order stays the call's). torch.onnx.export reads
    a dict at the end of `args` as keyword arguments (its older API's convention), so
    model(batch) with forward(self, batch) lost its only argument."""
    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
    except (TypeError, ValueError):  # no signature, or a call eager rejects too: let export say so
        return args, kwargs
    kinds = {name: bound.signature.parameters[name].kind for name in bound.arguments}
    if inspect.Parameter.VAR_POSITIONAL in kinds.values():
        return args, kwargs  # *args after named parameters: everything stays as called
    positional, named = [], {}
    for name, value in bound.arguments.items():
        if kinds[name] is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(value)
        elif kinds[name] is not inspect.Parameter.VAR_KEYWORD and name not in kwargs:
            named[name] = value  # (the call's own keywords, **kwargs' included, follow as given)
    return tuple(positional), {**named, **kwargs}
