"""ATenOp rows: ATen operators carried through our graph by name (csrc/core/ops/aten.cc)."""
import numpy as np
import torch
from onnx import TensorProto, numpy_helper

from op_table import Case, OURS, f, pos  # noqa: F401


def aten(name, overload="", kinds=(), **args):
    """ATenOp attributes: aten_op, arg_kinds, and arg<i> values (floats as float64)."""
    attrs = dict(aten_op=f"aten::{name}.{overload or 'default'}", arg_kinds=list(kinds))
    for key, value in args.items():
        if isinstance(value, float):
            value = numpy_helper.from_array(np.array(value, dtype=np.float64))
        attrs[key] = value
    return attrs


def row(case_id, inputs, ref, attrs, **kw):
    return Case("ATenOp", inputs, ref, attrs=attrs, domain=OURS, id=f"ATenOp-{case_id}", **kw)


CASES = [
    row("cumsum", [f(3, 4)], lambda x: torch.cumsum(x, 1),
        aten("cumsum", kinds=["tensor", "int", "default"], arg0=0, arg1=1)),
    row("cumsum-dtype", [f(3, 4)], lambda x: torch.cumsum(x, 0, dtype=torch.float64),
        aten("cumsum", kinds=["tensor", "int", "dtype"], arg0=0, arg1=0, arg2=TensorProto.DOUBLE)),
    row("cumsum-none-dtype", [f(2, 5)], lambda x: torch.cumsum(x, -1),
        aten("cumsum", kinds=["tensor", "int", "none"], arg0=0, arg1=-1)),
    row("cummax-2-outputs", [f(3, 4)], lambda x: tuple(torch.cummax(x, 1)),
        aten("cummax", kinds=["tensor", "int"], arg0=0, arg1=1), n_out=2),
    row("polygamma-int-first", [pos(3, 4)], lambda x: torch.special.polygamma(1, x),
        aten("polygamma", kinds=["int", "tensor"], arg0=1, arg1=0)),
    row("renorm-float-scalars", [f(4, 3)], lambda x: torch.renorm(x, 2.0, 0, 1.5),
        aten("renorm", kinds=["tensor", "float", "int", "float"], arg0=0, arg1=2.0, arg2=0, arg3=1.5)),
    row("roll-int-lists", [f(3, 4)], lambda x: torch.roll(x, [1, -2], [0, 1]),
        aten("roll", kinds=["tensor", "ints", "ints"], arg0=0, arg1=[1, -2], arg2=[0, 1])),
    row("cat-tensor-list", [f(2, 3), f(4, 3)], lambda a, b: torch.cat([a, b], 0),
        aten("cat", kinds=["tensors", "int"], arg0=[0, 1], arg1=0)),
    row("kthvalue-item-bool", [f(3, 5), torch.tensor(2)],
        lambda x, k: tuple(torch.kthvalue(x, int(k), 1, True)),
        aten("kthvalue", kinds=["tensor", "item", "int", "bool"], arg0=0, arg1=1, arg2=1, arg3=1), n_out=2),
    row("linalg_qr-str", [f(5, 3, dtype=torch.float64)], lambda a: tuple(torch.linalg.qr(a, "reduced")),
        aten("linalg_qr", kinds=["tensor", "str"], arg0=0, arg1="reduced"), n_out=2),
    row("mul-wrapped-number", [f(3, 4)], lambda x: torch.ops.aten.mul.Tensor(x, 3),
        aten("mul", "Tensor", kinds=["tensor", "int"], arg0=0, arg1=3)),
    row("add-wrapped-float-alpha", [f(3, 4)], lambda x: torch.ops.aten.add.Tensor(x, 0.5, alpha=2),
        aten("add", "Tensor", kinds=["tensor", "float", "int"], arg0=0, arg1=0.5, arg2=2)),
    row("special_zeta-scalar-overload", [pos(3) + 1.0], lambda x: torch.special.zeta(x, 2.5),
        aten("special_zeta", "other_scalar", kinds=["tensor", "float"], arg0=0, arg1=2.5),
        check_grad=False),  # PyTorch has no derivative for zeta's first argument either,
]
