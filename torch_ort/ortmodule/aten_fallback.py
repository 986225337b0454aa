"""The ATen fallback: which ATen ops an ORTModule routes through com.torch_ort::ATenOp, and how
they are found. An op qualifies when the exporter cannot lower it (a failed export names the FX
node), or when our engine cannot run what it was lowered to (an exported node with no kernel, or
an engine build naming nodes with no kernel or gradient rule: the exporter's node metadata names
the ATen overload each node came from). The module is then exported again with those overloads
translated to ATenOp; the set is remembered per ORTModule, so later exports start with it.
ORTMODULE_ATEN_FALLBACK=0 switches it off (such ops then fail, or fall back to eager PyTorch).
"""
from __future__ import annotations

import re

import torch

from torch_ort._compat import MissingTorchFeature, OpOverload, is_op_overload
from torch_ort.ortmodule.exporter import TRANSLATING, ExportResult, exception_chain, export_module
from torch_ort.ortmodule.fallback import ORTModuleTorchModelException
from torch_ort.ortmodule.options import LOGGER
from torch_ort.ortmodule.translations.aten_fallback import (
    UnencodableArgumentError,
    aten_op_translation,
    qualified_name,
)

MAX_EXPORTS = 6  # one export per round of newly found ops; more means something keeps failing


def resolve_aten(target) -> OpOverload | None:
    """The aten OpOverload of an FX target or its printed form 'aten.cumsum.default', always the
    torch.ops object: copies (a node's meta after the exporter's passes) are different keys for
    the exporter's registry and decomposition tables."""
    parts = str(target).split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return None
    packet = getattr(torch.ops.aten, parts[1], None)
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
            LOGGER.info("ATen fallback: %s runs through the ATen dispatcher (%s)", qualified_name(op), why)
            new = True
        return new


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
    untranslated = next((m for m in map(_NO_FUNCTION.search, messages) if m), None)
    no_translation = "the exporter has no ONNX translation for it"
    node, registry = _failed_translation(error, translating.group(1))
    if node is None:
        op = resolve_aten(f"{untranslated.group(1)}.{untranslated.group(2)}") if untranslated else None
        return {op: no_translation} if op is not None else {}
    found = {}
    op = _source_op(node)
    if op is not None:
        found[op] = no_translation if untranslated else "its ONNX translation failed"
    if registry is not None:
        for other in node.graph.nodes:
            if (other.op == "call_function" and is_op_overload(other.target)
                    and not registry.is_registered(other.target)):
                op = _source_op(other)
                if op is not None:
                    found.setdefault(op, no_translation)
    return found


def ops_without_kernels(result: ExportResult, kernel_ops: set) -> dict:
    """{overload: why} for exported nodes our engine has no kernel for."""
    found = {}
    for node in result.raw_model[0].graph:
        key = f"{'' if node.domain == 'ai.onnx' else node.domain}::{node.op_type}"
        op = aten_op_of(node) if key not in kernel_ops else None
        if op is not None:
            found.setdefault(op, f"our engine has no kernel for ONNX {node.op_type}")
    return found


def ops_from_engine_error(result: ExportResult, error: BaseException, what: str) -> dict:
    """{overload: why} for the nodes an engine build error names ('... (node NAME) ...')."""
    names = set(re.findall(r"\(node ([^)\s]+)\)", str(error)))
    found = {}
    for node in result.raw_model[0].graph:
        op = aten_op_of(node) if node.name in names else None
        if op is not None:
            found.setdefault(op, f"our engine has no {what} for ONNX {node.op_type}")
    return found


def export_with_fallback(module, args, kwargs, opset, aten: AtenFallback, on_export,
                         functions=None, deepcopy: bool = False, shape_plan: str = "dynamic") -> ExportResult:
    """Exports, re-exporting while new ops are found for the ATen fallback (`functions`,
    `deepcopy` and `shape_plan`: see exporter.export_module)."""
    from torch_ort import _C

    kernel_ops = set(_C.kernel_ops())
    for _ in range(MAX_EXPORTS):
        on_export()
        try:
            result = export_module(module, args, kwargs, opset, aten.translations(), functions, deepcopy,
                                   shape_plan=shape_plan)
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
