"""Export of the wrapped module to ONNX: every dimension symbolic, parameters and buffers moved
from initializers to graph inputs (bound to the live tensors at run time, zero copy)."""
from __future__ import annotations

import contextlib
import functools
import re
import threading
import time
from dataclasses import dataclass, field

import torch

from torch_ort._compat import pytree
from torch_ort.ortmodule.export import buffers, decisions, python_op_export, translations
from torch_ort.ortmodule.export.autocast import autocast_inside, autocast_state
from torch_ort.ortmodule.export.ctc_loss import ctc_loss_as_library_op
from torch_ort.ortmodule.export.translations.library import library_translations
from torch_ort.ortmodule.export.export_quiet import quiet_exporter
from torch_ort.ortmodule.export.shape_plans import (SHAPE_PLANS, dynamic_shapes, fixed_sizes, pinned_symbols,
                                                    plan_static_dims)
from torch_ort.ortmodule.export.workarounds import (
    UNKNOWN_OUTPUT,
    as_keywords,
    attention_with_mask_grad_as_math,
    attribute_reads,
    decomposition_tables_kept,
    extra_keywords_named,
    fresh_leaves,
    register_dataclass,
    structural_copy,
    torchlib_registry_kept,
)
from torch_ort.ortmodule.policy.fallback_policy import ORTModuleIOError, ORTModuleTorchModelException
from torch_ort.ortmodule.policy.debug_options import LOGGER


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
    #   unknown, e.g. a cache entry that did not record them); setting any other one cannot change
    #   the graph
    shape_plan: str = "dynamic"       # SHAPE_PLANS entry the export succeeded with
    decisions: int = 0                # data-dependent decisions taken from the call's values (decisions.py)

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


TRANSLATING = re.compile(r"Error when translating node %(\w+) ")  # the exporter's per-node failure


def export_module(module: torch.nn.Module, args: tuple, kwargs: dict, opset: int | None,
                  extra_translations: dict | None = None,
                  functions: python_op_export.FunctionPolicy | None = None,
                  deepcopy: bool = False, own_translations: bool = True,
                  shape_plan: str = "dynamic", decisions_from_values: bool = True) -> ExportResult:
    """extra_translations (ATen fallback ops) take precedence over translations.TABLE (ours, for
    the engine; `own_translations=False` leaves the stock exporter's standard ops); `functions`
    says how torch.autograd.Functions export (python_op_export.py); `deepcopy` exports a
    structural copy so that the trace never changes the module's own Python state; `shape_plan`
    is the SHAPE_PLANS entry to start from (the one an earlier export of this call needed);
    `decisions_from_values`: a Python `if` on a tensor's value is taken from this call's values
    and checked on later calls (decisions.py), else such a module does not export."""
    with EXPORT_LOCK:
        return _export_module(module, args, kwargs, opset, extra_translations, functions, deepcopy,
                              own_translations, shape_plan, decisions_from_values)


def _export_module(module, args, kwargs, opset, extra_translations, functions, deepcopy,
                   own_translations, shape_plan, decisions_from_values=True) -> ExportResult:
    start, original = time.perf_counter(), module
    args, kwargs = fresh_leaves(as_keywords(module, args, kwargs))
    tensors = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    own = {**translations.TABLE, **library_translations()} if own_translations else {}
    table = {**own, **(extra_translations or {})}
    remap = {}
    if deepcopy:
        module, remap = structural_copy(module)
    plans = [p for p in SHAPE_PLANS[SHAPE_PLANS.index(shape_plan):] if plan_static_dims(p, tensors) is not None]
    from_values = False  # data-dependent decisions taken from this call's values (decisions.py)
    at = 0
    while True:
        plan = plans[at]
        capture = python_op_export.Capture(functions or python_op_export.FunctionPolicy(), remap)
        try:
            with decisions.taken_from_values() if from_values else contextlib.nullcontext():
                program, ep, mutations, reads = _export_once(module, args, kwargs, opset, table, capture,
                                                             plan_static_dims(plan, tensors))
            break
        except Exception as e:  # the exporter raises many kinds; all mean "cannot export this model"
            capture.discard()
            LOGGER.debug("torch.onnx.export (%s) failed: %s: %s", plan, type(e).__name__, e)
            if decisions_from_values and not from_values and _data_dependent(e):
                LOGGER.info("%s branches on a tensor's value (%s); exporting again with the decision "
                            "taken from this call's values, checked on every later call",
                            type(module).__name__, _explain_failure(module, e))
                from_values = True
                continue
            refused = next((x for x in exception_chain(e) if isinstance(x, python_op_export.CheckpointNotAllowedError)), None)
            if refused is not None:
                raise python_op_export.CheckpointNotAllowedError(str(refused)) from None
            output = next(filter(None, (UNKNOWN_OUTPUT.search(str(x)) for x in exception_chain(e))), None)
            if output is not None and register_dataclass(output.group(1)):  # known from now on: again
                return _export_module(original, args, kwargs, opset, extra_translations, functions, deepcopy,
                                      own_translations, plan, decisions_from_values)
            if output is not None:
                raise ORTModuleIOError(
                    f"{type(module).__name__} returns a {output.group(1)}, which is neither a tensor, a "
                    "Python scalar, nor a container torch_ort can flatten (tuple, list, dict, or a "
                    "class registered with torch.utils._pytree or torch.export.register_dataclass)") from e
            if plan != plans[-1] and _shape_retry_helps(e):
                following = plans[at + 1]
                LOGGER.info("%s does not export with input dims %s (%s); exporting again with %s",
                            type(module).__name__, plan, _explain_failure(module, e), following)
                at += 1
                continue
            tried = f" (also tried: input dims {', '.join(plans[:at])})" if at else ""
            raise ORTModuleTorchModelException(_explain_failure(module, e) + tried) from e
    if plan != "dynamic":
        LOGGER.info("%s exported with input dims %s: a call with other sizes exports again",
                    type(module).__name__, plan)

    buffers.check_kept(ep, mutations)
    pinned = pinned_symbols(ep)
    model = program.model
    graph = model.graph
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(dict(module.named_buffers(remove_duplicate=False)))
    n_user = len(graph.inputs)
    if n_user != len(tensors):
        raise ORTModuleTorchModelException(
            f"the exported graph has {n_user} inputs but the call passed {len(tensors)} tensors")
    static_dims = [fixed_sizes(value, pinned) for value in graph.inputs]

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
                          shape_plan=plan, decisions=decisions.count(model) if from_values else 0)
    capture.attach(result)  # the registry entries live as long as the graph that names them
    return result


def _export_once(module, args, kwargs, opset, table, capture, static: dict):
    """One torch.onnx.export of the call: (program, exported program, buffer mutations, reads)."""
    with quiet_exporter(), buffers.keep_buffer_mutations() as mutations, \
            python_op_export.opaque_functions(capture, type(module).__name__), \
            attribute_reads(module) as reads, attention_with_mask_grad_as_math(), ctc_loss_as_library_op(), \
            extra_keywords_named(module, args, kwargs), torchlib_registry_kept(), decomposition_tables_kept(), \
            autocast_inside(module, autocast_state(_DEVICE_TYPES)):  # last: wraps forward
        program = torch.onnx.export(module, args, kwargs=kwargs, dynamo=True, optimize=False,
                                    dynamic_shapes=dynamic_shapes(module, args, kwargs, static),
                                    custom_translation_table=table or None,
                                    verbose=False, opset_version=opset)
        return program, program.exported_program, mutations, reads


def _data_dependent(error: BaseException) -> bool:
    """torch.export could not guard on a tensor's value (a Python `if` on it)."""
    return any("DataDependent" in type(e).__name__ or "data-dependent" in str(e) for e in exception_chain(error))


def _shape_retry_helps(error: BaseException) -> bool:
    """False for failures fewer dynamic dims cannot fix: control flow on a tensor's value, an op
    without a translation (the ATen fallback's business), a refused checkpoint."""
    for e in exception_chain(error):
        text = str(e)
        if isinstance(e, python_op_export.CheckpointNotAllowedError) or TRANSLATING.match(text) or \
                "data-dependent" in text or "DataDependent" in type(e).__name__:
            return False
    return True


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
