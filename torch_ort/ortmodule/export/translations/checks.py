"""Run-time checks the export adds: DecisionCheck(X, cond) for a decision taken from the values
a call had (torch_ort/ortmodule/export/decisions.py)."""
from __future__ import annotations

import torch
from onnx.defs import OpSchema
from onnxscript.values import Op, Opset

from torch_ort.ortmodule.export import decisions  # noqa: F401  (registers torch_ort::decision_check)

_TYPES = [f"tensor({t})" for t in ("float", "double", "float16", "bfloat16", "int64", "int32", "int16",
                                   "int8", "uint8", "bool")]
_SCHEMA = OpSchema(
    "DecisionCheck", "com.torch_ort", 1,
    inputs=[OpSchema.FormalParameter("x", "T"), OpSchema.FormalParameter("cond", "tensor(bool)")],
    outputs=[OpSchema.FormalParameter("y", "T")],
    type_constraints=[("T", _TYPES, "")],
    attributes=[OpSchema.Attribute("message", OpSchema.AttrType.STRING, required=False)])
DECISION_CHECK = Op(Opset("com.torch_ort", 1), "DecisionCheck", _SCHEMA)


def decision_check(x, cond, message: str = ""):
    """decision_check(Tensor x, Tensor cond, str message) -> x, checked"""
    return DECISION_CHECK(x, cond, message=message)


TRANSLATIONS = {torch.ops.torch_ort.decision_check.default: decision_check}
