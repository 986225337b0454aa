"""Export of the wrapped module to ONNX: every dimension symbolic, parameters and buffers moved
from initializers to graph inputs (bound to the live tensors at run time, zero copy)."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import inspect
import re
import threading
import time
from dataclasses import dataclass, field

import torch

from torch_ort._compat import pytree
from torch_ort.ortmodule import buffers, python_op_export, translations
from torch_ort.ortmodule.export_quiet import quiet_exporter
from torch_ort.ortmodule.fallback_policy import ORTModuleIOError, ORTModuleTorchModelException
from torch_ort.ortmodule.debug_options import LOGGER


@dataclass
class ExportResult:
    onnx_bytes: bytes                 # the graph our engine imports (parameters as inputs)
    raw_model: object                 # the exporter's onnx_ir model with weights (for save_onnx)
    param_names: list[str]            # graph inputs after the user inputs, in order (FQNs)
    out_spec: pytree.TreeSpec         # how flat outputs rebuild the module's return value
    static_dims: list[list[int | None]]  # per user input: the sizes the export fixed (None: dynamic)
    seconds: float = 0.0
    input_names: list[str] = field(default_factory=list)
    buffer_updates: list[str] = field(default_factory=list)  # buffers whose new values are the trailing outputs
    out_constants: dict[int, object] = field(default_factory=dict)  # out_spec leaf -> value the
    #   graph does not compute (None entries, Python numbers); every other leaf is a graph output
    python_ops: list[str] = field(default_factory=list)  # Functions run as PythonOp (by name)
    from_cache: bool = False          # loaded from ORTMODULE_CACHE_DIR instead of exported
    shared: bool = False              # an identical sibling submodule's export (partial.SharedExports)
    stored: bool = False              # written to ORTMODULE_CACHE_DIR
    attributes_read: frozenset | None = None  # the module's own attributes the trace read (None:
    #   unknown, e.g. loaded from the cache); setting any other one cannot change the graph
    shape_plan: str = "dynamic"       # SHAPE_PLANS entry the export succeeded with

    @functools.cached_property
    def logits_output(self) -> int | None:
        """The graph output holding the `logits` the module returns beside a computed `loss`
        (a ModelOutput or dict with both keys, Hugging Face's causal LMs), else None. Worked out
        once per export: every training call reads it (ORTMODULE_SKIP_LOGITS)."""
        spec = self.out_spec
        keys = spec.context if isinstance(spec.context, list) else None
        if not keys or "loss" not in keys or "logits" not in keys:
            return None
        first = 0  # leaf index of each child's first leaf
        where = {}
        children = spec.children() if hasattr(spec, "children") else spec.children_specs
        for key, child in zip(keys, children):
            where[key] = (first, child.num_leaves == 1 and child.is_leaf())
            first += child.num_leaves
        (loss, loss_leaf), (logits, logits_leaf) = where["loss"], where["logits"]
        if not (loss_leaf and logits_leaf) or loss in self.out_constants or logits in self.out_constants:
            return None
        return sum(1 for i in range(logits) if i not in self.out_constants)

    def rebuild_outputs(self, tensors) -> object:
        """The module's return value (ModelOutput, dict, tuple, ...) from the graph's outputs."""
        tensors = iter(tensors)
        leaves = [self.out_constants[i] if i in self.out_constants else next(tensors)
                  for i in range(self.out_spec.num_leaves)]
        return pytree.tree_unflatten(leaves, self.out_spec)


_DEVICE_TYPES = ("cpu", "cuda")  # whose autocast state the export carries

# One export at a time in the process: torch.onnx.export / torch.export are not thread-safe, and
# an export patches process-wide state (torch.autograd.Function.apply and torch.utils.checkpoint
# for PythonOp, the exporter's loggers). Re-entrant: an export may run inside another's trace.
# Engines are built and run outside it.
EXPORT_LOCK = threading.RLock()

_DATA_DEPENDENT_HINT = (
    "Python control flow on a tensor's value (`if tensor:`, `.item()`, `bool(tensor)`) cannot be "
    "captured in a graph; use torch.where or torch.cond, or keep the decision outside the module.")


def _explain_failure(module: torch.nn.Module, error: BaseException) -> str:
    """One readable paragraph: what torch.export rejected, where in the model, how to fix it."""
    chain = [error]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    root, text = chain[-1], str(chain[-1])
    # torch.onnx.export runs torch.export first (capture), then translates the captured graph.
    captured = not any(type(e).__name__ == "TorchExportError" for e in chain)
    stage = "torch.onnx.export could not translate" if captured else "torch.export could not capture"
    message = f"{stage} {type(module).__name__}: {type(root).__name__}: " \
              f"{text.strip().splitlines()[0] if text.strip() else ''}"
    # torch.export names the user's source line: 'File "x.py", line 9, in forward\n    if h.sum() > 0:'
    where = re.search(r'File "([^"]+)", line (\d+), in (\w+)\n\s*(.+)', text)
    # The partial graph's last node is the op that needed a value it could not know.
    nodes = re.findall(r'^\s*(\w+): "[^"]*" = torch\.ops\.([\w.]+)\(', getattr(root, "partial_fx_graph", "") or "",
                       re.MULTILINE)
    if nodes:
        message += f" — node '{nodes[-1][0]}' ({nodes[-1][1]})"
    if where:
        message += f" — at {where.group(1)}:{where.group(2)} in {where.group(3)}: `{where.group(4).strip()}`"
    if "data-dependent" in text or "DataDependent" in type(root).__name__:
        message += ". " + _DATA_DEPENDENT_HINT
    return message + " (ORTMODULE_LOG_LEVEL=VERBOSE logs the exporter's whole error and output)"


def _dynamic_shapes(module, args, kwargs, static: dict):
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

def _register_dataclass(qualified: str) -> bool:
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


_UNKNOWN_OUTPUT = re.compile(r"Found <class '([^']+)'> in output, which is not a known type")
TRANSLATING = re.compile(r"Error when translating node %(\w+) ")  # the exporter's per-node failure


def _static_dims(plan: str, tensors: list) -> dict | None:
    """{id(tensor): dims fixed} under `plan`; None when the plan fixes nothing more than the
    previous one (no size-1 dims: that retry would export the same graph)."""
    if plan == "dynamic":
        return {}
    if plan == "static":
        return {id(t): set(range(t.dim())) for t in tensors} if any(t.dim() for t in tensors) else None
    ones = {id(t): {d for d, n in enumerate(t.shape) if n == 1} for t in tensors}
    return ones if any(ones.values()) else None


def _shape_retry_helps(error: BaseException) -> bool:
    """False for failures fewer dynamic dims cannot fix: control flow on a tensor's value, an op
    without a translation (the ATen fallback's business), a refused checkpoint."""
    for e in exception_chain(error):
        text = str(e)
        if isinstance(e, python_op_export.CheckpointNotAllowedError) or TRANSLATING.match(text) or \
                "data-dependent" in text or "DataDependent" in type(e).__name__:
            return False
    return True


@contextlib.contextmanager
def _forward_replaced(module: torch.nn.Module, forward):
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
def _extra_keywords_named(module, args, kwargs):
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
    with _forward_replaced(module, named_forward):
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
def _attribute_reads(module: torch.nn.Module):
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


def autocast_state(device_types) -> tuple:
    """(device type, dtype) per device type with autocast on: the export records autocast's casts,
    so a graph holds only under the state it was exported in (the engine itself runs with autocast
    off, csrc/runtime/executor.h)."""
    return tuple((d, torch.get_autocast_dtype(d)) for d in sorted(device_types)
                 if torch.amp.is_autocast_available(d) and torch.is_autocast_enabled(d))


def float32_cross_entropy(self, target, weight=None, reduction: int = 1, ignore_index: int = -100,
                          label_smoothing: float = 0.0):
    """The rule CUDA autocast lacks for aten::cross_entropy_loss (CPU autocast has it): inputs to
    float32, then the op with autocast off. Eager under CUDA autocast runs the op's decomposition,
    whose log_softmax and nll_loss are float32 ops, so it computes exactly this; without the rule
    a traced cross_entropy_loss stays whole and computes the loss in bf16/fp16."""
    def up(t):
        return t.float() if t is not None and t.dtype in (torch.float16, torch.bfloat16) else t

    with torch.autocast("cuda", enabled=False):
        return torch.ops.aten.cross_entropy_loss(up(self), up(target), up(weight), reduction, ignore_index,
                                                 label_smoothing)


_float32_rules = [0, None]  # (nesting depth, the torch.library.Library holding the rule)


@contextlib.contextmanager
def _cuda_autocast_float32_losses(state: tuple):
    """While an export traces under CUDA autocast, cross_entropy_loss has float32_cross_entropy as
    its AutocastCUDA kernel (registered once however deep exports nest; removed after)."""
    if not any(device == "cuda" for device, _ in state):
        yield
        return
    if _float32_rules[0] == 0:
        _float32_rules[1] = torch.library.Library("aten", "IMPL")
        _float32_rules[1].impl("cross_entropy_loss", float32_cross_entropy, "AutocastCUDA")
    _float32_rules[0] += 1
    try:
        yield
    finally:
        _float32_rules[0] -= 1
        if _float32_rules[0] == 0:
            _float32_rules[1] = None  # the Library's registrations die with it


@contextlib.contextmanager
def _autocast_inside(module: torch.nn.Module, state: tuple):
    """The caller's autocast (`state`) entered inside the traced forward, and off around the
    exporter: its decompositions would otherwise re-apply autocast to a graph that already holds
    the casts (and break regions the model runs with autocast disabled)."""
    if not state:
        yield
        return
    forward = module.forward  # after _attribute_reads: its recording forward

    @functools.wraps(forward)
    def autocast_forward(*args, **kwargs):
        with contextlib.ExitStack() as regions:
            for device, dtype in state:
                regions.enter_context(torch.autocast(device, dtype=dtype))
            return forward(*args, **kwargs)

    with contextlib.ExitStack() as off:
        off.enter_context(_cuda_autocast_float32_losses(state))
        for device, _ in state:
            off.enter_context(torch.autocast(device, enabled=False))
        off.enter_context(_forward_replaced(module, autocast_forward))
        yield


@contextlib.contextmanager
def _attention_with_mask_grad_as_math():
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


def export_module(module: torch.nn.Module, args: tuple, kwargs: dict, opset: int | None,
                  extra_translations: dict | None = None,
                  functions: python_op_export.FunctionPolicy | None = None,
                  deepcopy: bool = False, own_translations: bool = True,
                  shape_plan: str = "dynamic") -> ExportResult:
    """extra_translations (ATen fallback ops) take precedence over translations.TABLE (ours, for
    the engine; `own_translations=False` leaves the stock exporter's standard ops); `functions`
    says how torch.autograd.Functions export (python_op_export.py); `deepcopy` exports a
    structural copy so that the trace never changes the module's own Python state; `shape_plan`
    is the SHAPE_PLANS entry to start from (the one an earlier export of this call needed)."""
    with EXPORT_LOCK:
        return _export_module(module, args, kwargs, opset, extra_translations, functions, deepcopy,
                              own_translations, shape_plan)


def _fresh_leaves(tree):
    """Each tensor as a detached view (no copy) with its requires_grad: the exporter fakes the
    tensors it is given, and one carrying a .grad (an input reused across steps, input-gradient
    or adversarial training) or a grad_fn is not what it expects."""
    def fresh(t):
        return t.detach().requires_grad_(t.requires_grad) if t.requires_grad else t.detach()
    return pytree.tree_map_only(torch.Tensor, fresh, tree)


def _as_keywords(module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
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


def _export_module(module, args, kwargs, opset, extra_translations, functions, deepcopy,
                   own_translations, shape_plan) -> ExportResult:
    start, original = time.perf_counter(), module
    args, kwargs = _fresh_leaves(_as_keywords(module, args, kwargs))
    tensors = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    table = {**(translations.TABLE if own_translations else {}), **(extra_translations or {})}
    remap = {}
    if deepcopy:
        module, remap = structural_copy(module)
    plans = [p for p in SHAPE_PLANS[SHAPE_PLANS.index(shape_plan):] if _static_dims(p, tensors) is not None]
    for plan in plans:
        capture = python_op_export.Capture(functions or python_op_export.FunctionPolicy(), remap)
        try:
            program, ep, mutations, reads = _export_once(module, args, kwargs, opset, table, capture,
                                                         _static_dims(plan, tensors))
            break
        except Exception as e:  # the exporter raises many kinds; all mean "cannot export this model"
            capture.discard()
            LOGGER.debug("torch.onnx.export (%s) failed: %s: %s", plan, type(e).__name__, e)
            refused = next((x for x in exception_chain(e) if isinstance(x, python_op_export.CheckpointNotAllowedError)), None)
            if refused is not None:
                raise python_op_export.CheckpointNotAllowedError(str(refused)) from None
            output = next(filter(None, (_UNKNOWN_OUTPUT.search(str(x)) for x in exception_chain(e))), None)
            if output is not None and _register_dataclass(output.group(1)):  # known from now on: again
                return _export_module(original, args, kwargs, opset, extra_translations, functions, deepcopy,
                                      own_translations, plan)
            if output is not None:
                raise ORTModuleIOError(
                    f"{type(module).__name__} returns a {output.group(1)}, which is neither a tensor, a "
                    "Python scalar, nor a container torch_ort can flatten (tuple, list, dict, or a "
                    "class registered with torch.utils._pytree or torch.export.register_dataclass)") from e
            if plan != plans[-1] and _shape_retry_helps(e):
                following = plans[plans.index(plan) + 1]
                LOGGER.info("%s does not export with input dims %s (%s); exporting again with %s",
                            type(module).__name__, plan, _explain_failure(module, e), following)
                continue
            tried = f" (also tried: input dims {', '.join(plans[:plans.index(plan)])})" if plan != plans[0] else ""
            raise ORTModuleTorchModelException(_explain_failure(module, e) + tried) from e
    if plan != "dynamic":
        LOGGER.info("%s exported with input dims %s: a call with other sizes exports again",
                    type(module).__name__, plan)

    buffers.check_kept(ep, mutations)
    pinned = _pinned_symbols(ep)
    model = program.model
    graph = model.graph
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(dict(module.named_buffers(remove_duplicate=False)))
    n_user = len(graph.inputs)
    if n_user != len(tensors):
        raise ORTModuleTorchModelException(
            f"the exported graph has {n_user} inputs but the call passed {len(tensors)} tensors")
    static_dims = [_fixed_sizes(value, pinned) for value in graph.inputs]

    # Parameters and buffers become graph inputs; other initializers (lifted constants) stay.
    param_names = [name for name in graph.initializers if name in named]
    moved = []
    for name in param_names:
        moved.append((name, graph.initializers[name].const_value))
        value = graph.initializers.pop(name)
        value.const_value = None
        graph.inputs.append(value)
    import onnx_ir  # imported late: only needed once a model is exported

    onnx_bytes = onnx_ir.serde.serialize_model(model).SerializeToString()
    raw = (model, moved)
    seconds = time.perf_counter() - start
    LOGGER.info("exported %s in %.2fs: %d user inputs, %d parameters/buffers as inputs, %d nodes",
                type(module).__name__, seconds, n_user, len(param_names), len(graph))
    user_outputs = [spec.arg for spec in ep.graph_signature.output_specs
                    if spec.kind == torch.export.graph_signature.OutputKind.USER_OUTPUT]
    out_constants = {i: arg.value for i, arg in enumerate(user_outputs)
                     if isinstance(arg, torch.export.graph_signature.ConstantArgument)}
    result = ExportResult(onnx_bytes=onnx_bytes, raw_model=raw, param_names=param_names,
                          out_spec=ep.call_spec.out_spec, out_constants=out_constants,
                          static_dims=static_dims, seconds=seconds,
                          input_names=[v.name for v in graph.inputs[:n_user]],
                          buffer_updates=mutations.fqns, python_ops=list(capture.names),
                          attributes_read=None if None in reads else frozenset(reads),
                          shape_plan=plan)
    capture.attach(result)  # the registry entries live as long as the graph that names them
    return result


def _pinned_symbols(ep) -> dict:
    """{symbol name: size} for the symbolic dims the trace pinned to one value: torch.export keeps
    such a dim symbolic in the graph's input shapes but records its range as a single size (e.g.
    `x.unbind(1)[-1]` resolves -1 for the traced size only)."""
    pinned = {}
    for symbol, bounds in ep.range_constraints.items():
        if bounds.lower == bounds.upper and getattr(bounds.lower, "is_Integer", False):
            pinned[str(symbol)] = int(bounds.lower)
    return pinned


def _fixed_sizes(value, pinned: dict) -> list:
    """Per dim of a graph input: the size the export fixed (a number, or a symbol the trace pinned
    to one size), None where any size is accepted."""
    if not value.shape:
        return []
    return [d if isinstance(d, int) else pinned.get(str(getattr(d, "value", d))) for d in value.shape.dims]


def _export_once(module, args, kwargs, opset, table, capture, static: dict):
    """One torch.onnx.export of the call: (program, exported program, buffer mutations, reads)."""
    with quiet_exporter(), buffers.keep_buffer_mutations() as mutations, \
            python_op_export.opaque_functions(capture, type(module).__name__), \
            _attribute_reads(module) as reads, _attention_with_mask_grad_as_math(), \
            _extra_keywords_named(module, args, kwargs), \
            _autocast_inside(module, autocast_state(_DEVICE_TYPES)):  # after: wraps its forward
        program = torch.onnx.export(module, args, kwargs=kwargs, dynamo=True, optimize=False,
                                    dynamic_shapes=_dynamic_shapes(module, args, kwargs, static),
                                    custom_translation_table=table or None,
                                    verbose=False, opset_version=opset)
        return program, program.exported_program, mutations, reads


def exception_chain(error: BaseException):
    """The error, then its causes and contexts, each once."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def exported_with_weights(result: ExportResult) -> bytes:
    """The exporter's graph as it came out (weights as initializers), for DebugOptions.save_onnx."""
    import onnx_ir

    model, moved = result.raw_model
    graph = model.graph
    values = graph.inputs[len(graph.inputs) - len(moved):]
    try:
        for value, (name, data) in zip(values, moved):
            graph.inputs.remove(value)
            value.const_value = data
            graph.initializers[name] = value
        return onnx_ir.serde.serialize_model(model).SerializeToString()
    finally:
        for value, (name, _) in zip(values, moved):
            graph.initializers.pop(name)
            value.const_value = None
            graph.inputs.append(value)
