"""ORTMODULE_CACHE_DIR: exported graphs kept on disk, so a later process with the same model and
input schema skips torch.onnx.export (the slowest part of the first step).

An entry is two files named by a SHA-256 key: `<key>.onnx` (the graph our engine imports) and
`<key>.json` (how its inputs and outputs map to the module's: parameter names, output tree, ...).
Nothing in an entry is code: the JSON is data and the output tree is pytree's JSON form. The key
covers the versions of torch and torch_ort, the module's structure (repr, the source files of its
classes, every parameter's and buffer's name, shape and dtype), each submodule's plain attributes
and the fields of the objects it holds (a Hugging Face `config`), the training flag, the input
schema, the autocast state, the opset, the ATen fallback set and the settings that change what an
export produces (export_options).

Nothing read from the directory is trusted: an entry is ignored and rewritten when it does not
parse, was written by another format or another torch_ort/torch version, its graph does not match
its recorded digest (truncated or edited), its graph's inputs are not the recorded ones, it names
parameters the module lacks, or its graph holds a PythonOp node. The last rule is the one that
keeps a file from running Python: graphs with PythonOp nodes are never stored (their Functions live
only in the exporting process's registry), so a cached graph that has one was not written by us.
A graph that passes these checks still goes through the engine's importer, verifier and input
limits; if the engine cannot be built from it, the runner drops the entry and exports again
(runner.GraphRunner.engine_for).
"""
from __future__ import annotations

import enum
import hashlib
import inspect
import json
import os
import tempfile

import torch

from torch_ort._compat import pytree
from torch_ort._version import __version__
from torch_ort.ortmodule.export.exporter import ExportResult
from torch_ort.ortmodule.policy.debug_options import LOGGER

FORMAT = 1


def _class_sources(module: torch.nn.Module) -> list[str]:
    """'file:mtime:size' of the file defining each submodule class (an edit changes the key)."""
    out = set()
    for m in module.modules():
        try:
            path = inspect.getsourcefile(type(m)) or ""
            st = os.stat(path)
            out.add(f"{path}:{st.st_mtime_ns}:{st.st_size}")
        except (TypeError, OSError):
            out.add(type(m).__qualname__)
    return sorted(out)


_PLAIN = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, enum.Enum)


def _plain(value, depth: int, nesting: int = 0) -> str | None:
    """Deterministic text for a value a forward may read to decide what it computes: plain data
    (numbers, strings, dtypes, containers of them), a function (by its qualified name) and, `depth`
    objects down, an object's own fields (a Hugging Face model's `config`). None for anything
    else (tensors and modules are covered by the key's other parts), and for containers nested
    deeper than 8 (a list that holds itself)."""
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, (list, tuple)):
        parts = [_plain(v, depth, nesting + 1) for v in value] if nesting < 8 else [None]
        return None if None in parts else f"{type(value).__name__}({','.join(parts)})"
    if isinstance(value, dict):
        items = [(_plain(k, 0), _plain(v, depth, nesting + 1)) for k, v in value.items()] if nesting < 8 else [(None,)]
        return None if any(None in kv for kv in items) else "{" + ",".join(sorted(f"{k}:{v}" for k, v in items)) + "}"
    if isinstance(value, (torch.nn.Module, torch.Tensor, type)):
        return None
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    if depth > 0 and hasattr(value, "__dict__") and not callable(value):
        return type(value).__qualname__ + _fields(vars(value), depth - 1)
    return None


def _fields(state: dict, depth: int) -> str:
    texts = ((name, _plain(value, depth)) for name, value in sorted(state.items(), key=lambda kv: str(kv[0])))
    return "{" + ",".join(f"{name}={text}" for name, text in texts if text is not None) + "}"


def _module_state(module: torch.nn.Module) -> list[str]:
    """Each submodule's plain attributes and the fields of the objects it holds, which its repr
    need not show (`self.scale = 2.0`, `config._attn_implementation`): two modules that differ
    only there trace different graphs."""
    return [f"{name}:{_fields(vars(m), 2)}" for name, m in module.named_modules(remove_duplicate=False)]


def export_options(settings) -> tuple:
    """The settings that change what an export of the same module produces."""
    return (settings.decisions_from_values, settings.custom_autograd, settings.allow_checkpoint,
            sorted(settings.skipped_functions), settings.memory_opt_level >= 1)


def cache_key(module: torch.nn.Module, schema, opset, aten_ops, options=()) -> str:
    tensors = [(n, tuple(t.shape), str(t.dtype), t.device.type)
               for n, t in (*module.named_parameters(remove_duplicate=False),
                            *module.named_buffers(remove_duplicate=False))]
    text = repr((FORMAT, __version__, torch.__version__, repr(module), _class_sources(module),
                 _module_state(module), tensors, module.training, schema, opset, sorted(aten_ops),
                 tuple(options)))
    return hashlib.sha256(text.encode()).hexdigest()


def _jsonable(value) -> bool:
    try:
        return json.loads(json.dumps(value)) == value
    except (TypeError, ValueError):
        return False


def store(directory: str, key: str, result: ExportResult, aten_ops: list[str]) -> bool:
    if result.python_ops:
        LOGGER.info("ORTMODULE_CACHE_DIR: not caching the graph: it runs Python Functions (%s)",
                    ", ".join(sorted(set(result.python_ops))))
        return False
    constants = [[i, v] for i, v in result.out_constants.items()]
    try:
        spec = pytree.treespec_dumps(result.out_spec)
    except Exception as e:  # an output type pytree cannot serialise
        LOGGER.info("ORTMODULE_CACHE_DIR: not caching the graph: its output structure cannot be "
                    "written (%s)", e)
        return False
    if not _jsonable(constants):
        LOGGER.info("ORTMODULE_CACHE_DIR: not caching the graph: it returns non-JSON constants")
        return False
    meta = {"format": FORMAT, "torch_ort": __version__, "torch": torch.__version__,
            "onnx_sha256": hashlib.sha256(result.onnx_bytes).hexdigest(),
            "param_names": result.param_names, "out_spec": spec, "out_constants": constants,
            "static_dims": result.static_dims, "shape_plan": result.shape_plan,
            "input_names": result.input_names,
            "buffer_updates": result.buffer_updates, "aten_ops": aten_ops,
            "attributes_read": None if result.attributes_read is None else sorted(result.attributes_read),
            "export_seconds": result.seconds}
    os.makedirs(directory, exist_ok=True)
    for suffix, data in ((".onnx", result.onnx_bytes), (".json", json.dumps(meta).encode())):
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")  # atomic: rename when complete
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(directory, key + suffix))
    LOGGER.info("ORTMODULE_CACHE_DIR: stored the exported graph as %s", os.path.join(directory, key))
    return True


def load(directory: str, key: str, module: torch.nn.Module) -> tuple[ExportResult, list[str]] | None:
    """(the export, its ATen fallback op names), or None when there is no usable entry."""
    base = os.path.join(directory, key)
    if not os.path.exists(base + ".json"):
        return None
    try:
        with open(base + ".json", "rb") as f:
            meta = json.loads(f.read())
        with open(base + ".onnx", "rb") as f:
            onnx_bytes = f.read()
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT}")
        _check_versions(meta)
        if hashlib.sha256(onnx_bytes).hexdigest() != meta["onnx_sha256"]:
            raise ValueError("the graph file does not match its recorded digest (truncated or edited)")
        aten_ops = [str(op) for op in meta["aten_ops"]]
        _check_graph(onnx_bytes, list(meta["input_names"]) + list(meta["param_names"]), aten_ops)
        named = {n for n, _ in (*module.named_parameters(remove_duplicate=False),
                                *module.named_buffers(remove_duplicate=False))}
        missing = [n for n in meta["param_names"] if n not in named]
        if missing:
            raise ValueError(f"it names parameters the module lacks: {missing[:3]}")
        result = ExportResult(
            onnx_bytes=onnx_bytes, raw_model=None, param_names=list(meta["param_names"]),
            out_spec=pytree.treespec_loads(meta["out_spec"]),
            static_dims=[list(d) for d in meta["static_dims"]], seconds=0.0,
            shape_plan=str(meta.get("shape_plan", "dynamic")),
            input_names=list(meta["input_names"]), buffer_updates=list(meta["buffer_updates"]),
            out_constants={int(i): v for i, v in meta["out_constants"]}, from_cache=True,
            attributes_read=_names(meta.get("attributes_read")))
    except Exception as e:  # anything wrong with an entry: say so, export again, overwrite it
        LOGGER.warning("ORTMODULE_CACHE_DIR: ignoring cache entry %s (%s: %s); exporting again",
                       base, type(e).__name__, e)
        return None
    LOGGER.info("ORTMODULE_CACHE_DIR: loaded the exported graph from %s (export skipped; it took "
                "%.2fs when it was made)", base, meta.get("export_seconds", 0.0))
    return result, aten_ops


def _names(value) -> frozenset | None:
    """The module attributes the export read, as recorded (None: not recorded, so unknown)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("attributes_read is not a list of names")
    return frozenset(value)


def _check_versions(meta: dict) -> None:
    ours = {"torch_ort": __version__, "torch": torch.__version__}
    for name, version in ours.items():
        if meta.get(name) != version:
            raise ValueError(f"written by {name} {meta.get(name)!r}; this process runs {version}")


def _check_graph(onnx_bytes: bytes, expected_inputs: list[str], aten_ops: list[str]) -> None:
    """The graph's inputs are the recorded ones, it runs no Python (see the module docstring), and
    its ATen fallback nodes call only the recorded aten:: operators, each one this torch has.
    Everything else about the graph is the engine's to check when it imports it."""
    import onnx

    from torch_ort.ortmodule.export.aten_routing import resolve_aten
    from torch_ort.ortmodule.export.python_op import DOMAIN_OP

    unknown = [n for n in aten_ops if resolve_aten(n.replace("::", ".")) is None]
    if unknown:
        raise ValueError(f"it records ATen fallback ops that are not aten operators: {unknown[:3]}")

    model = onnx.ModelProto()
    model.ParseFromString(onnx_bytes)  # DecodeError on bytes that are not a ModelProto
    inputs = [i.name for i in model.graph.input]
    if inputs != expected_inputs:
        raise ValueError(f"its graph has inputs {inputs[:4]}..., the entry records "
                         f"{expected_inputs[:4]}...")
    domain, op = DOMAIN_OP.split("::")
    pending = [model.graph, *model.functions]  # and every subgraph held by an attribute
    while pending:
        for node in pending.pop().node:
            if node.op_type == op and node.domain == domain:
                raise ValueError(f"its graph has a PythonOp node ({node.name or 'unnamed'}); cached "
                                 "graphs never run Python")
            if node.op_type == "ATenOp" and node.domain == domain:
                called = [a.s.decode(errors="replace") for a in node.attribute if a.name == "aten_op"]
                if not called or called[0] not in aten_ops:
                    raise ValueError(f"its ATenOp node {node.name or 'unnamed'} calls {called[:1]}, "
                                     "not one of the recorded ATen fallback ops")
            for attr in node.attribute:
                pending.extend([attr.g] if attr.HasField("g") else [])
                pending.extend(attr.graphs)


def drop(directory: str, key: str, reason: str) -> None:
    """Removes an entry the engine could not be built from (it is written again after export)."""
    base = os.path.join(directory, key)
    LOGGER.warning("ORTMODULE_CACHE_DIR: the engine cannot be built from cache entry %s (%s); "
                   "exporting again", base, reason)
    for suffix in (".json", ".onnx"):
        try:
            os.remove(base + suffix)
        except OSError:
            pass
