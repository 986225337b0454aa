"""The ATen fallback: which ATen ops an ORTModule routes through com.torch_ort::ATenOp, and how
they are found. An op qualifies when the exporter cannot lower it, or when our engine cannot run
what it was lowered to (no kernel, no gradient rule).

Most are decided while the one export translates (translate_routing): the exporter picks each FX
node's translation through a hook that routes an aten op to ATenOp when the exporter's registry
has no translation for it, when its translation fails, or when the ONNX nodes its translation
recorded include an op our engine has no kernel for (_C.kernel_ops()); the recorded nodes are
then taken back out. Such ops cost no second export. The rest need one more export with the op
routed: an op the exporter decomposes before translating (digamma reaches translation as
prims.digamma), found from the failed export, and ops without a gradient rule, which only the
engine build knows are on a gradient path: it raises UnsupportedOpError / GradientError carrying
the nodes as data (`.unsupported`), whose exporter metadata names the ATen overload each node came
from. The set is remembered per ORTModule, so later exports start with it.
ORTMODULE_ATEN_FALLBACK=0 switches it off (such ops then fail, or fall back to eager PyTorch).
"""
from __future__ import annotations

import contextlib
import re

import torch

from torch_ort._compat import (
    MissingTorchFeature,
    OpOverload,
    is_op_overload,
    onnx_dispatch_wrapped,
    onnx_tracer,
)
from torch_ort.ortmodule.export.exporter import (
    EXPORT_LOCK,
    TRANSLATING,
    ExportResult,
    exception_chain,
    export_module,
)
from torch_ort.ortmodule.policy.fallback_policy import ORTModuleTorchModelException
from torch_ort.ortmodule.policy.debug_options import LOGGER
from torch_ort.ortmodule.export.translations.aten_op import (
    UnencodableArgumentError,
    aten_op_translation,
    qualified_name,
)

MAX_EXPORTS = 6  # one export per round of newly found ops; more means something keeps failing


# Namespaces whose operators never take the ATen fallback: collectives and other side effects,
# the exporter's own decompositions (prims) and higher-order operators.
NOT_ROUTED = frozenset({"prims", "prim", "higher_order", "c10d", "_c10d_functional", "c10d_functional",
                        "_c10d_functional_autograd", "_dtensor", "profiler", "onnx", "onnx_symbolic"})


def resolve_aten(target) -> OpOverload | None:
    """The OpOverload of an FX target or its printed form 'aten.cumsum.default', always the
    torch.ops object: copies (a node's meta after the exporter's passes) are different keys for
    the exporter's registry and decomposition tables. Besides aten, any library's operator
    registered with torch.library ('transformers.grouped_mm_fallback.default', the user's own),
    except the NOT_ROUTED namespaces."""
    parts = str(target).split(".")
    if len(parts) != 3 or parts[0] in NOT_ROUTED:
        return None
    try:
        namespace = getattr(torch.ops, parts[0])
    except (AttributeError, RuntimeError):
        return None
    packet = getattr(namespace, parts[1], None)
    overload = getattr(packet, parts[2], None) if packet is not None else None
    return overload if is_op_overload(overload) else None


def aten_op_of(node) -> OpOverload | None:
    """The ATen overload an exported ONNX node was lowered from: the exporter's 'namespace'
    metadata ends with '<fx node>: <target>'."""
    namespace = node.metadata_props.get("namespace", "")
    _, _, target = namespace.rpartition("/")[2].partition(": ")
    return resolve_aten(target)


class AtenFallback:
    """Per ORTModule: the overloads that run through ATenOp, each with why (logged once)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled  # ORTMODULE_ATEN_FALLBACK
        self.reasons: dict[OpOverload, str] = {}
        self.rejected: dict[OpOverload, str] = {}  # ops it cannot carry, and why
        self._translations: dict = {}

    def translations(self) -> dict:
        return dict(self._translations)

    def translation(self, op: OpOverload):
        """The ATenOp translation of a routed overload."""
        return self._translations[op]

    def add(self, found: dict) -> bool:
        """Adds overloads not seen before; False when there are none (nothing to re-export for)."""
        if not self.enabled:
            return False
        new = False
        for op, why in found.items():
            if op in self.reasons:
                continue
            try:
                translation = aten_op_translation(op)
            except (UnencodableArgumentError, MissingTorchFeature) as e:
                self.rejected[op] = str(e)
                continue
            self.reasons[op] = why
            self._translations[op] = translation
            if not qualified_name(op).startswith("aten::"):  # another library's: ATenOp may call it
                from torch_ort import _C
                _C.allow_library_op(qualified_name(op))
            LOGGER.info("ATen fallback: %s runs through the ATen dispatcher (%s)", qualified_name(op), why)
            new = True
        return new


NO_TRANSLATION = "the exporter has no ONNX translation for it"
TRANSLATION_FAILED = "its ONNX translation failed"


def kernel_key(node) -> str:
    """'domain::op_type' of an ONNX node as _C.kernel_ops() spells it ('' is the ONNX domain)."""
    return f"{'' if node.domain == 'ai.onnx' else node.domain}::{node.op_type}"


def _no_kernel(op_types) -> str:
    return f"our engine has no kernel for ONNX {', '.join(op_types)}"


def _take_back(tracer, start: int, functions: dict) -> None:
    """Removes what a translation recorded into the exporter's tracer after node `start`: its
    nodes (unhooked from the values they read), the constants it added to the tracer's shared
    constant table (a later node would reuse one whose Constant node is gone), the functions."""
    removed = tracer.nodes[start:]
    del tracer.nodes[start:]
    produced = {id(v) for node in removed for v in node.outputs}
    farm = getattr(tracer, "constant_farm", None) or {}
    for key in [k for k, v in farm.items() if id(v) in produced]:
        del farm[key]
    for node in removed:
        node.resize_inputs(0)
    if isinstance(getattr(tracer, "functions", None), dict):
        tracer.functions.clear()
        tracer.functions.update(functions)


def _checked_translation(op: OpOverload, translation, aten: AtenFallback, kernel_ops: set):
    """`translation` (the exporter's for `op`), run as recorded into the tracer; when it fails, or
    records a node our engine has no kernel for, that is taken back and `op` is translated to
    ATenOp instead (unless the ATen fallback cannot carry `op`: then the stock result stands, or
    its error propagates)."""
    def translate(*args, **kwargs):
        try:
            tracer = onnx_tracer()
        except MissingTorchFeature:
            tracer = None
        if not isinstance(getattr(tracer, "nodes", None), list):  # not the tracer we know: as is
            return translation(*args, **kwargs)  # (the post-export scan still routes it)
        start, functions = len(tracer.nodes), dict(getattr(tracer, "functions", None) or {})
        try:
            outputs = translation(*args, **kwargs)
        except Exception:
            if not aten.add({op: TRANSLATION_FAILED}):
                raise
        else:
            missing = sorted({n.op_type for n in tracer.nodes[start:] if kernel_key(n) not in kernel_ops})
            if not missing or not aten.add({op: _no_kernel(missing)}):
                return outputs
        _take_back(tracer, start, functions)
        return aten.translation(op)(*args, **kwargs)

    return translate


@contextlib.contextmanager
def translate_routing(aten: AtenFallback, kernel_ops: set):
    """Within the block (exports serialised by EXPORT_LOCK, held here) the exporter's choice of
    each aten node's translation goes through the ATen fallback first: an op with no translation
    in the exporter's registry (asked, not read from its error), or whose translation fails or
    emits an op without a kernel of ours, is routed to ATenOp in this same export."""
    if not aten.enabled:
        yield
        return

    def wrap(dispatch):
        def routed(node, registry):
            translation, message = dispatch(node, registry)
            op = resolve_aten(node.target) if is_op_overload(node.target) else None
            if op in aten.reasons:  # routed by an earlier node of this export (or in the table)
                return aten.translation(op), "ATen fallback"
            if op is None or op in aten.rejected:
                return translation, message
            if translation is None:  # the registry has none (for these input types)
                if aten.add({op: NO_TRANSLATION}):
                    return aten.translation(op), "ATen fallback: the registry has no translation"
                return translation, message
            return _checked_translation(op, translation, aten, kernel_ops), message
        return routed

    with EXPORT_LOCK, onnx_dispatch_wrapped(wrap):
        yield


# torch.onnx's DispatchError text: the only place the exporter names an op it has no translation
# for when its failing frame is not at hand. The registry check in translate_routing decides this
# up front; this parse is the fallback for errors raised outside it (an export failing where the
# hook is not installed, or a torch without the dispatch step to wrap).
_NO_FUNCTION = re.compile(r"No ONNX function found for <OpOverload\(op='([\w.]+)', overload='(\w+)'\)>")


def _failed_translation(error: BaseException, name: str):
    """(FX node, registry) of the exporter's frames that failed translating FX node `name`: the
    node's meta keeps the ATen op a decomposition started from (digamma -> prims.digamma), and
    its graph shows every other node the same export would fail on next."""
    node = registry = None
    for exc in exception_chain(error):
        tb = exc.__traceback__
        while tb is not None:
            local = tb.tb_frame.f_locals
            if isinstance(local.get("node"), torch.fx.Node) and local["node"].name == name:
                node = local["node"]
                registry = registry or local.get("registry")
            tb = tb.tb_next
    return node, registry


def _source_op(node) -> OpOverload | None:
    return resolve_aten(node.target) or resolve_aten(node.meta.get("original_aten"))


def ops_from_export_error(error: BaseException) -> dict:
    """{overload: why} for the ops a failed export could not translate: the failing node's, and
    (when the exporter's registry is at hand) every other untranslatable node of its graph, so
    one re-export covers them all. {} when the export failed for another reason."""
    messages = [str(e) for e in exception_chain(error)]
    translating = next((m for m in map(TRANSLATING.match, messages) if m), None)
    if translating is None:
        return {}  # failed before translation (tracing, data-dependent control flow): not ours to fix
    node, registry = _failed_translation(error, translating.group(1))
    if node is None or registry is None:  # the exporter's frames are gone: only its text is left
        untranslated = next((m for m in map(_NO_FUNCTION.search, messages) if m), None)
        op = resolve_aten(f"{untranslated.group(1)}.{untranslated.group(2)}") if untranslated else None
        if node is not None and _source_op(node) is not None:
            return {_source_op(node): NO_TRANSLATION if untranslated else TRANSLATION_FAILED}
        return {op: NO_TRANSLATION} if op is not None else {}
    found = {}
    op = _source_op(node)
    if op is not None:
        found[op] = TRANSLATION_FAILED if registry.is_registered(node.target) else NO_TRANSLATION
    for other in node.graph.nodes:
        if (other.op == "call_function" and is_op_overload(other.target)
                and not registry.is_registered(other.target)):
            op = _source_op(other)
            if op is not None:
                found.setdefault(op, NO_TRANSLATION)
    return found


def ops_without_kernels(result: ExportResult, kernel_ops: set) -> dict:
    """{overload: why} for exported nodes our engine has no kernel for."""
    found = {}
    for node in result.raw_model[0].graph:
        op = aten_op_of(node) if kernel_key(node) not in kernel_ops else None
        if op is not None:
            found.setdefault(op, _no_kernel([node.op_type]))
    return found


def ops_from_engine_error(result: ExportResult, error: BaseException) -> dict:
    """{overload: why} for the nodes an engine build error is about: _C.UnsupportedOpError and
    _C.GradientError carry them as data (`.unsupported`: (node, domain, op_type, missing) rows,
    missing 'kernel', 'gradient rule' or 'working gradient rule')."""
    missing = {}
    for node, _domain, _op_type, what in getattr(error, "unsupported", ()):
        missing.setdefault(node, what)
    found = {}
    for node in result.raw_model[0].graph:
        op = aten_op_of(node) if node.name in missing else None
        if op is not None:
            found.setdefault(op, f"our engine has no {missing[node.name]} for ONNX {node.op_type}")
    return found


def export_with_fallback(module, args, kwargs, opset, aten: AtenFallback, on_export,
                         functions=None, deepcopy: bool = False, shape_plan: str = "dynamic",
                         decisions_from_values: bool = True) -> ExportResult:
    """Exports with translate_routing, re-exporting while new ops are found for the ATen fallback
    that it could not route within the export (`functions`, `deepcopy` and `shape_plan`: see
    exporter.export_module). ops_without_kernels after the export is a safety net: the routing
    already took every aten node whose translation emits an op without a kernel."""
    from torch_ort import _C

    kernel_ops = set(_C.kernel_ops())
    for _ in range(MAX_EXPORTS):
        on_export()
        try:
            with translate_routing(aten, kernel_ops):
                result = export_module(module, args, kwargs, opset, aten.translations(), functions,
                                       deepcopy, shape_plan=shape_plan, decisions_from_values=decisions_from_values)
            shape_plan = result.shape_plan  # an ATen-fallback round starts where this one succeeded
        except ORTModuleTorchModelException as error:
            found = ops_from_export_error(error)
            if aten.add(found):
                continue
            # Say why the ATen fallback could not take over (the exporter's own text is long).
            why = [aten.rejected[op] for op in found if op in aten.rejected]
            why += [str(e) for e in exception_chain(error) if isinstance(e, UnencodableArgumentError)]
            if why:
                raise ORTModuleTorchModelException(f"torch.onnx.export failed: {why[0]}") from error
            raise
        if not aten.add(ops_without_kernels(result, kernel_ops)):
            return result
    raise ORTModuleTorchModelException(
        f"ATen fallback: still finding unsupported ops after {MAX_EXPORTS} exports; routed so far: "
        + ", ".join(qualified_name(op) for op in aten.reasons))
