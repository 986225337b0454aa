"""The op-case table: one row per supported op case (shapes, dtypes, attributes, broadcasting),
each run as a single-node ONNX model through torch_ort._C.Engine and compared with eager PyTorch —
forward for every row, backward for every row whose op has a gradient rule.

Rows live in one module per op family, named as the family file that defines the op
(csrc/core/ops/<family>.cc: elementwise.py, shape.py, ...); ALL_CASES collects every module here.
Each module draws its random inputs from the generator reseeded for it (by its name), so a row
added to one family leaves every other family's inputs as they were.
"""
import dataclasses
import importlib
import pkgutil
import zlib
from typing import Callable

import torch
import torch.nn.functional as F  # noqa: F401  (re-exported for the family modules)
from onnx import TensorProto, helper, numpy_helper

OURS = "com.torch_ort"
ONNX_TYPE = {torch.float32: TensorProto.FLOAT, torch.float64: TensorProto.DOUBLE,
             torch.float16: TensorProto.FLOAT16, torch.int64: TensorProto.INT64,
             torch.int32: TensorProto.INT32, torch.bool: TensorProto.BOOL, torch.uint8: TensorProto.UINT8}
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-7, atol=1e-9),
       torch.float16: dict(rtol=1e-3, atol=1e-3)}

_gen = torch.Generator().manual_seed(0)


def f(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen, dtype=dtype)


def pos(*shape):  # strictly positive (Sqrt, Log, Pow bases)
    return torch.rand(*shape, generator=_gen) + 0.5


def i64(*v):
    return torch.tensor(v, dtype=torch.int64)


def labels(*shape, classes):
    return torch.randint(0, classes, shape, generator=_gen)


@dataclasses.dataclass
class Case:
    op: str
    inputs: list                        # tensors; None = omitted optional input
    ref: Callable                       # eager reference: (*inputs) -> tensor or tuple
    attrs: dict = dataclasses.field(default_factory=dict)
    domain: str = ""
    opset: int = 20
    n_out: int = 1
    consts: tuple = ()                  # input indices baked in as initializers
    seed: int | None = None             # re-seed torch before ref and engine (random ops)
    check_grad: bool = True             # backward parity when the op has a gradient rule
    id: str = ""

    def __post_init__(self):
        self.id = self.id or self.op


def sce_grad(reduction, ignore_index=None):
    def ref(dloss, log_prob, lab, w=None):
        x = log_prob.clone().requires_grad_()  # log_softmax(log_prob) == log_prob
        kw = {} if ignore_index is None else dict(ignore_index=ignore_index)
        loss = F.cross_entropy(x, lab, weight=w, reduction=reduction, **kw)
        return torch.autograd.grad(loss, x, dloss)[0]
    return ref


def nll_grad(reduction):
    def ref(dloss, inp, lab, w=None):
        x = inp.clone().requires_grad_()
        return torch.autograd.grad(F.nll_loss(x, lab, weight=w, reduction=reduction), x, dloss)[0]
    return ref


def lp(*shape):
    return torch.log_softmax(f(*shape), 1)


def as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def single_node_model(case, expected):
    names, graph_inputs, inits, feeds = [], [], [], []
    for i, t in enumerate(case.inputs):
        if t is None:
            names.append("")
            continue
        names.append(f"in{i}")
        if i in case.consts:
            inits.append(numpy_helper.from_array(t.numpy(), f"in{i}"))
        else:
            graph_inputs.append(helper.make_tensor_value_info(f"in{i}", ONNX_TYPE[t.dtype], list(t.shape)))
            feeds.append(t)
    outs = [f"out{i}" for i in range(case.n_out)]
    node = helper.make_node(case.op, names, outs, name=f"/test/{case.id}", domain=case.domain, **case.attrs)
    graph = helper.make_graph([node], case.id, graph_inputs,
                              [helper.make_tensor_value_info(n, ONNX_TYPE[e.dtype], list(e.shape))
                               for n, e in zip(outs, expected)], initializer=inits)
    opsets = [helper.make_opsetid("", case.opset), helper.make_opsetid(OURS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString(), feeds




def _collect():
    cases = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        _gen.manual_seed(zlib.crc32(info.name.encode()))
        module = importlib.import_module(f"{__name__}.{info.name}")
        for case in module.CASES:
            case.family = info.name  # the module it is written in (test_ops_doc.py checks it)
        cases.extend(module.CASES)
    return cases


ALL_CASES = _collect()


def expect_named_error(model: bytes, feeds, match: str):
    """Bad-input tests: the model's outputs are declared without shapes (what is under test is the
    bad input, not a wrong declaration); the error may come from shape inference at build time
    (VerifyError) or from the kernel at run time (KernelError) — either way it must match."""
    import onnx
    import pytest

    from torch_ort import _C

    proto = onnx.load_from_string(model)
    for out in proto.graph.output:
        out.type.tensor_type.ClearField("shape")
    with pytest.raises((_C.VerifyError, _C.KernelError), match=match):
        engine = _C.Engine(proto.SerializeToString(), False, [False] * len(feeds))
        engine.forward(feeds)
