"""Our own ONNX translations of ATen ops, handed to torch.onnx.export as custom_translation_table.

The exporter's stock translations lose meaning we need for training (label smoothing dropped from
cross-entropy, padding_idx dropped from embedding, BatchNorm training semantics) or have none at
all. Each module here defines TRANSLATIONS: {aten overload: onnxscript function}; TABLE merges
them (a later module may not silently override an earlier one).
"""
from __future__ import annotations

import importlib
import pkgutil


def _collect() -> dict:
    table: dict = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for op, fn in getattr(module, "TRANSLATIONS", {}).items():
            if op in table:
                raise RuntimeError(f"two custom ONNX translations for {op}: {info.name} and an earlier module")
            table[op] = fn
    return table


TABLE = _collect()
