"""Translations of operators other libraries register with torch.library, where our engine has a
native op for what they compute. transformers' grouped_mm (the experts of its mixture-of-experts
models: rows sorted by expert, one product per expert) exports to our GroupedMatMul, whose
kernel and gradient run without calling back into Python (csrc/runtime/kernels/grouped_matmul.cc);
any other library's operator without an ONNX translation takes the ATen fallback (aten_routing.py).

Such operators exist only once their library is imported, so library_translations() is read at
each export, not collected into TABLE at import.
"""
from __future__ import annotations

import torch

from torch_ort.ortmodule.export.translations.nn import our_op

GROUPED_MATMUL = our_op("GroupedMatMul", [("input", "T", False), ("weight", "T", False), ("offs", "I", False)], {})


def grouped_matmul(input, weight, offs):
    """grouped_mm_fallback(Tensor input, Tensor weight, Tensor offs) -> Tensor"""
    return GROUPED_MATMUL(input, weight, offs)


# (namespace, operator, overload) -> translation
_LIBRARY_OPS = {("transformers", "grouped_mm_fallback", "default"): grouped_matmul}


def library_translations() -> dict:
    """{overload: translation} for the operators of _LIBRARY_OPS registered in this process."""
    table = {}
    for (namespace, name, overload), translation in _LIBRARY_OPS.items():
        packet = getattr(getattr(torch.ops, namespace), name, None)
        op = getattr(packet, overload, None) if packet is not None else None
        if op is not None:
            table[op] = translation
    return table
