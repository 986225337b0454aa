"""com.torch_ort::ATenOp: an ATen operator carried through our graph by name, for ops the
exporter cannot lower or our engine cannot run; the runtime calls it through the ATen dispatcher
(csrc/runtime/kernels/aten_fallback.cc) and PyTorch autograd provides its backward.

aten_op_translation(overload) builds the custom translation for one overload. Which overloads
take this path is decided per ORTModule while exporting (torch_ort/ortmodule/export/aten_routing.py),
so TRANSLATIONS, the table of ops that always take it, is empty.

The node: tensor arguments become node inputs; every other argument becomes attributes:
  aten_op              "aten::cumsum.default": the operator and its overload
  arg_kinds            one per schema argument, in schema order (kwarg-only ones included):
    default   not passed: the schema's default      none      None
    tensor    arg<i> = node input index              tensors   arg<i> = input indices (-1: None)
    int/bool  arg<i> = int                           ints/bools arg<i> = ints; for ints,
    item      arg<i> = input index of a 0-d tensor             arg<i>_inputs = per element an
              (a SymInt/SymFloat traced from shapes)           input index (-1: the constant)
    float     arg<i> = 0-d float64 tensor            floats    arg<i> = 1-d float64 tensor
              (int, float and bool also stand for a Python number where the schema wants a Tensor)
    str       arg<i> = string                        dtype     arg<i> = ONNX TensorProto type
    layout, memory_format, device    arg<i> = "strided", "contiguous_format", "cuda:0" ...
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from torch_ort._compat import OpOverload, onnx_tracer, op_schema

DOMAIN = "com.torch_ort"
TRANSLATIONS: dict = {}


class UnencodableArgumentError(TypeError):
    """An argument of an ATen op that the ATenOp node cannot carry (a Generator, a Python object)."""


def qualified_name(overload: OpOverload) -> str:
    """'aten::cumsum.default' — the name logs and error messages use."""
    schema = op_schema(overload)
    return f"{schema.name}.{schema.overload_name or 'default'}"


def _strip(text: str, prefix: str) -> str:
    return text[len(prefix):] if text.startswith(prefix) else text


def _unwrap_optional(type_name: str) -> str:
    return type_name[len("Optional["):-1] if type_name.startswith("Optional[") else type_name


class _Encoder:
    """Binds one call's (args, kwargs) to the schema and encodes them as inputs + attributes."""

    def __init__(self, overload: OpOverload):
        self.overload = overload
        self.schema = op_schema(overload)
        self.inputs: list = []
        self.attrs: list = [ir.AttrString("aten_op", qualified_name(overload))]
        self.kinds: list[str] = []

    def fail(self, arg, why: str):
        raise UnencodableArgumentError(
            f"ATen fallback for {qualified_name(self.overload)}: cannot encode argument "
            f"'{arg.name}' ({arg.real_type}): {why}")

    def input_index(self, value) -> int:
        self.inputs.append(value)
        return len(self.inputs) - 1

    def encode(self, args: tuple, kwargs: dict):
        for i, arg in enumerate(self.schema.arguments):
            if i < len(args) and not arg.kwarg_only:
                value = args[i]
            elif arg.name in kwargs:
                value = kwargs[arg.name]
            elif arg.has_default_value():
                self.kinds.append("default")
                continue
            else:
                self.fail(arg, "it was not passed and has no default")
            self.kinds.append(self.encode_arg(i, arg, value))
        self.attrs.append(ir.AttrStrings("arg_kinds", self.kinds))
        return self.inputs, self.attrs

    def encode_arg(self, i: int, arg, value) -> str:
        name = f"arg{i}"
        real = str(arg.real_type)
        base = _unwrap_optional(real)
        if value is None or (base == "ScalarType" and value == -1):  # the exporter's None dtype
            if base != real:
                return "none"
            self.fail(arg, "None for a non-optional argument")
        if isinstance(value, ir.Value):
            if base == "Tensor":
                self.attrs.append(ir.AttrInt64(name, self.input_index(value)))
                return "tensor"
            if base in ("int", "SymInt", "float", "number", "bool"):
                self.attrs.append(ir.AttrInt64(name, self.input_index(value)))
                return "item"
            self.fail(arg, "a traced tensor where a constant was expected")
        if base == "Tensor" and isinstance(value, (bool, int, float)):
            base = "number"  # a wrapped number (aten.mul.Tensor(x, 2)); the kernel makes the tensor
        if base.startswith("List[") and not isinstance(value, (list, tuple)):
            value = [value]  # int[1] dims=0: one value for a one-element list
        if base in ("List[Tensor]", "List[Optional[Tensor]]"):
            self.attrs.append(ir.AttrInt64s(name, [-1 if v is None else self.input_index(v) for v in value]))
            return "tensors"
        if base in ("int", "SymInt") or (base == "number" and isinstance(value, int)):
            if isinstance(value, bool) and base == "number":
                self.attrs.append(ir.AttrInt64(name, int(value)))
                return "bool"
            self.attrs.append(ir.AttrInt64(name, int(value)))
            return "int"
        if base in ("float", "number"):
            self.attrs.append(ir.AttrTensor(name, ir.tensor(np.array(float(value), dtype=np.float64))))
            return "float"
        if base == "bool":
            self.attrs.append(ir.AttrInt64(name, int(bool(value))))
            return "bool"
        if base in ("List[int]", "List[SymInt]"):
            consts = [v if isinstance(v, int) else 0 for v in value]
            self.attrs.append(ir.AttrInt64s(name, consts))
            if any(isinstance(v, ir.Value) for v in value):
                self.attrs.append(ir.AttrInt64s(f"{name}_inputs", [
                    self.input_index(v) if isinstance(v, ir.Value) else -1 for v in value]))
            return "ints"
        if base == "List[bool]":
            self.attrs.append(ir.AttrInt64s(name, [int(bool(v)) for v in value]))
            return "bools"
        if base == "List[float]":
            self.attrs.append(ir.AttrTensor(name, ir.tensor(np.array(value, dtype=np.float64))))
            return "floats"
        if base == "str":
            self.attrs.append(ir.AttrString(name, value))
            return "str"
        if base == "ScalarType" and isinstance(value, int):
            self.attrs.append(ir.AttrInt64(name, value))  # the exporter made it an ONNX type
            return "dtype"
        if base in ("Layout", "MemoryFormat", "Device"):
            text = _strip(str(value), "torch.")
            self.attrs.append(ir.AttrString(name, text))
            return {"Layout": "layout", "MemoryFormat": "memory_format", "Device": "device"}[base]
        self.fail(arg, f"{type(value).__name__} values are not supported")


def check_supported(overload: OpOverload) -> None:
    """Raises UnencodableArgumentError for overloads the ATenOp node cannot represent at all."""
    schema = op_schema(overload)
    if schema.is_mutable:
        raise UnencodableArgumentError(
            f"ATen fallback for {qualified_name(overload)}: the op mutates its inputs")
    for ret in schema.returns:
        if str(ret.type) != "Tensor":
            raise UnencodableArgumentError(
                f"ATen fallback for {qualified_name(overload)}: it returns {ret.type}; only "
                "tensors can be node outputs")


def _emit(inputs: list, attrs: list, num_outputs: int):
    # Custom-domain nodes have no ONNX schema for onnxscript to build them from, so the node is
    # recorded straight into the exporter's tracer, as torch's own onnx.ops.symbolic does.
    tracer = onnx_tracer()
    if tracer is None:
        raise RuntimeError("ATenOp translations run only inside torch.onnx.export")
    node = ir.Node(DOMAIN, "ATenOp", inputs, attributes=attrs, num_outputs=num_outputs, version=1)
    tracer.nodes.append(node)
    return node.outputs


def aten_op_translation(overload: OpOverload):
    """The custom translation that lowers every call of `overload` to one ATenOp node."""
    check_supported(overload)
    num_outputs = len(op_schema(overload).returns)

    def translate(*args, **kwargs):
        inputs, attrs = _Encoder(overload).encode(args, kwargs)
        outputs = _emit(inputs, attrs, num_outputs)
        return outputs[0] if num_outputs == 1 else list(outputs)

    translate.__name__ = f"aten_fallback_{op_schema(overload).name.split('::')[-1]}"
    return translate
