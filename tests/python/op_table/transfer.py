"""The transfer family (csrc/core/ops/transfer.cc): ToHost and ToDevice, and DecisionCheck."""
import torch
import torch.nn.functional as F
from onnx import TensorProto, numpy_helper

from op_table import Case, OURS, f, i64, labels, lp, nll_grad, pos, sce_grad  # noqa: F401


CASES = [
    # Placement's crossings: the same values, on the host / on the run's device (both the CPU here).
    Case("ToHost", [i64(2, 3, 4)], lambda s: s, domain=OURS),
    Case("ToDevice", [f(3, 4)], lambda x: x, domain=OURS),
    # A decision the export took from values (export/decisions.py), checked: the input, when it holds.
    Case("DecisionCheck", [f(3, 4), torch.tensor(True)], lambda x, c: x, domain=OURS),
]
