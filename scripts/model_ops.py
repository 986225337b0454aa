"""Which ONNX ops each model-zoo model exports to, and which of them lack a kernel or a gradient
decision in the engine: the to-do list behind a failing tests/python/test_models.py.

    PYTHONPATH=$PWD .venv/bin/python scripts/model_ops.py [gpt2 bert_mlm ...] [--all]

It reads the exporter's graph as it comes out, before the engine's passes: an op a pass rewrites
away (e.g. SplitToSequence/SequenceAt once sequence_to_split exists) still shows here.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import model_zoo  # noqa: E402  (lives next to the tests that use it)

from torch_ort import _C  # noqa: E402
from torch_ort.ortmodule.integrations import hf  # noqa: E402
from torch_ort.ortmodule.export.exporter import export_module  # noqa: E402


def exported_ops(name: str) -> collections.Counter:
    import onnx

    factory, make_batch = model_zoo.ZOO[name]
    torch.manual_seed(0)
    model = factory(dropout=0.1)  # training mode with dropout: the op set training really needs
    args, kwargs = make_batch(2, 8, torch.Generator().manual_seed(0))
    kwargs = hf.adapt_call(model, args, kwargs, grad_enabled=True)
    proto = onnx.load_from_string(export_module(model, args, kwargs, None).onnx_bytes)
    return collections.Counter(f"{n.domain}::{n.op_type}" for n in proto.graph.node)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=list(model_zoo.ZOO))
    p.add_argument("--all", action="store_true", help="list every op, not only the missing ones")
    args = p.parse_args()
    kernels, rules, decided = set(_C.kernel_ops()), set(_C.differentiable_ops()), set(_C.gradient_ops())
    missing_anywhere = set()
    for name in args.models:
        ops = exported_ops(name)
        print(f"{name}: {sum(ops.values())} nodes, {len(ops)} op types")
        for op, count in sorted(ops.items()):
            gaps = [what for what, ok in (("kernel", op in kernels), ("gradient decision", op in decided))
                    if not ok]
            if gaps or args.all:
                grad = "rule" if op in rules else ("NO_GRADIENT" if op in decided else "-")
                print(f"  {op:32s} x{count:<4d} kernel={'yes' if op in kernels else 'NO':3s} gradient={grad}"
                      + (f"   missing: {', '.join(gaps)}" if gaps else ""))
            if gaps:
                missing_anywhere.add(op)
    print(f"ops missing a kernel or gradient decision: {', '.join(sorted(missing_anywhere)) or 'none'}")
    return 1 if missing_anywhere else 0


if __name__ == "__main__":
    sys.exit(main())
