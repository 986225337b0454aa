"""Translations of NN ops whose stock ONNX export loses training meaning.

- cross_entropy: the stock SoftmaxCrossEntropyLoss drops label_smoothing (and would read
  class-probability targets as indices); smoothing goes to our CrossEntropyLoss, probability
  targets to plain ONNX math.
- embedding: the stock export is a Gather, which loses padding_idx (its row must get no gradient)
  and scale_grad_by_freq; ours Embedding keeps both.
- dropout: the stock Dropout carries p as a float32 constant; a float64 one keeps the exact p, so
  the kernel scales exactly as eager does.
- scaled_dot_product_attention: the stock export emits its dropout without training_mode, i.e. as
  an identity; with dropout_p > 0 ours applies it (eager applies it whenever dropout_p > 0).

Ops of our domain are described by an OpSchema built here (the exporter's tracer needs one), and
each is the last op of its translation so that the exporter types its output.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from onnx.defs import OpSchema
from onnxscript import ir
from onnxscript.function_libs.torch_lib.ops import nn as _torchlib_nn
from onnxscript.onnx_opset import opset18 as op
from onnxscript.values import Op, Opset


class UntranslatableCall(ValueError):
    """A call our translation cannot express faithfully; the export fails naming why (and the ATen
    fallback may then carry the op instead)."""

OURS = Opset("com.torch_ort", 1)
_FLOATS = ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"]
_INDICES = ["tensor(int64)", "tensor(int32)"]
_FLOAT_DTYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def our_op(name: str, inputs: list[tuple[str, str, bool]], attrs: dict[str, OpSchema.AttrType]) -> Op:
    """An op of com.torch_ort with one output of type T; inputs are (name, type var, optional)."""
    param = OpSchema.FormalParameter
    option = OpSchema.FormalParameterOption
    schema = OpSchema(
        name, OURS.domain, OURS.version,
        inputs=[param(n, t, param_option=option.Optional if opt else option.Single) for n, t, opt in inputs],
        outputs=[param("output", "T")],
        type_constraints=[("T", _FLOATS, ""), ("I", _INDICES, "")],
        attributes=[OpSchema.Attribute(a, kind, required=False) for a, kind in attrs.items()])
    return Op(OURS, name, schema)


_INT, _FLOAT, _STRING = OpSchema.AttrType.INT, OpSchema.AttrType.FLOAT, OpSchema.AttrType.STRING
EMBEDDING = our_op("Embedding", [("weight", "T", False), ("indices", "I", False)],
                    {"padding_idx": _INT, "scale_grad_by_freq": _INT})
CROSS_ENTROPY = our_op("CrossEntropyLoss", [("scores", "T", False), ("labels", "I", False), ("weights", "T", True)],
                        {"reduction": _STRING, "ignore_index": _INT, "label_smoothing": _FLOAT})
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _scalar(value: float, dtype: ir.DataType):
    return op.Constant(value=ir.tensor(value, dtype=dtype))


def cross_entropy_loss(self, target, weight=None, reduction: int = 1, ignore_index: int = -100,
                       label_smoothing: float = 0.0):
    """cross_entropy_loss(Tensor self, Tensor target, Tensor? weight, int reduction, SymInt ignore_index,
    float label_smoothing)"""
    red = _REDUCTIONS[reduction]
    if target.dtype in _FLOAT_DTYPES:
        return _cross_entropy_probabilities(self, target, weight, red, label_smoothing)
    if label_smoothing == 0.0:
        loss, _ = op.SoftmaxCrossEntropyLoss(self, target, weight, reduction=red, ignore_index=ignore_index)
        return loss
    return CROSS_ENTROPY(self, target, weight, reduction=red, ignore_index=ignore_index,
                         label_smoothing=label_smoothing)


def _cross_entropy_probabilities(self, target, weight, red: str, label_smoothing: float):
    """Class-probability targets: loss_i = −Σ_c w_c·t_ic·log_softmax(x)_ic, t smoothed as
    t·(1 − ε) + ε/C; "mean" averages over the N·d1·… samples (as eager does)."""
    rank = len(self.shape)
    lp = op.LogSoftmax(self, axis=1)
    if label_smoothing > 0.0:
        classes = op.Cast(op.Shape(self, start=1, end=2), to=self.dtype)  # (1,): C, maybe dynamic
        target = op.Add(op.Mul(target, _scalar(1.0 - label_smoothing, self.dtype)),
                        op.Div(_scalar(label_smoothing, self.dtype), classes))
    prod = op.Mul(lp, target)
    if weight is not None:
        prod = op.Mul(prod, op.Reshape(weight, op.Constant(value_ints=[1, -1] + [1] * (rank - 2))))
    per_sample = op.Neg(op.ReduceSum(prod, op.Constant(value_ints=[1]), keepdims=0))
    if red == "none":
        return per_sample
    if red == "sum":
        return op.ReduceSum(per_sample, keepdims=0)
    return op.ReduceMean(per_sample, keepdims=0)


def embedding(weight, indices, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False):
    """embedding(Tensor weight, Tensor indices, SymInt padding_idx, bool scale_grad_by_freq, bool sparse)"""
    if sparse:
        raise UntranslatableCall("nn.Embedding(sparse=True) produces sparse gradients, which our Embedding op does not "
                                 "(the ATen fallback carries it instead)")
    return EMBEDDING(weight, indices, padding_idx=padding_idx, scale_grad_by_freq=int(scale_grad_by_freq))


def _dropout(x, p: float, train: bool):
    return op.Dropout(x, _scalar(p, ir.DataType.DOUBLE), op.Constant(value=ir.tensor(bool(train))))


def native_dropout(input, p: float, train: Optional[bool] = None):
    """native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor mask); train None = True."""
    out, mask = _dropout(input, p, train is None or train)
    return out, mask


def dropout(input, p: float, train: bool):
    """dropout(Tensor input, float p, bool train)"""
    out, _ = _dropout(input, p, train)
    return out


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False):
    """softmax(Q·Kᵀ·scale + mask)·V with dropout on the attention weights, as eager's math path:
    Q and K each scaled by √scale, a bool mask as 0 / lowest value, causal = lower triangle."""
    if dropout_p == 0.0:  # nothing lost in the stock translation
        return _torchlib_nn.aten_scaled_dot_product_attention.func(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if len(query.shape) != 4 or len(key.shape) != 4 or len(value.shape) != 4:
        raise UntranslatableCall("scaled_dot_product_attention with dropout: only 4-D query, key and value")
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: is_causal and attn_mask cannot both be set")
    if enable_gqa and query.shape[1] != key.shape[1]:
        key, value = _torchlib_nn._attention_repeat_kv_for_group_query(query, key, value)
    head = query.shape[-1]
    if scale is None and not isinstance(head, int):
        root = op.Sqrt(_torchlib_nn._attention_scale(query))
    else:
        factor = 1.0 / math.sqrt(head) if scale is None else scale
        if factor < 0:
            raise UntranslatableCall("scaled_dot_product_attention with dropout: negative scale")
        root = _scalar(math.sqrt(factor), query.dtype)  # eager: sqrt in double, then the tensor dtype
    b, h, length, _ = query.shape
    source = key.shape[2]
    key_t = _shaped(op.Transpose(key, perm=[0, 1, 3, 2]), [b, h, key.shape[3], source])
    scores = _shaped(op.MatMul(_shaped(op.Mul(query, root), query.shape), _shaped(op.Mul(key_t, root), key_t.shape)),
                     [b, h, length, source])
    if is_causal:
        scores = op.Add(scores, _torchlib_nn._causal_attention_mask(query, key))
    elif attn_mask is not None and attn_mask.dtype == ir.DataType.BOOL:
        lowest = _scalar(query.dtype.min, query.dtype)
        scores = op.Add(scores, op.Where(attn_mask, _scalar(0.0, query.dtype), lowest))
    elif attn_mask is not None:
        scores = op.Add(scores, attn_mask)
    probs = _shaped(op.Softmax(_shaped(scores, [b, h, length, source]), axis=-1), [b, h, length, source])
    weights, _ = _dropout(probs, dropout_p, True)
    return op.MatMul(_shaped(weights, probs.shape), value)


def _shaped(value, dims):
    """Types an intermediate value of a translation: the exporter types only the output (from the
    FX node's meta); our autodiff needs the ranks (MatMul, Transpose). Inputs share one dtype."""
    value.shape = ir.Shape(list(dims))
    value.dtype = value.producer().inputs[0].dtype
    return value


aten = torch.ops.aten
TRANSLATIONS = {
    aten.cross_entropy_loss.default: cross_entropy_loss,
    aten.embedding.default: embedding,
    aten.native_dropout.default: native_dropout,
    aten.dropout.default: dropout,
    aten.scaled_dot_product_attention.default: scaled_dot_product_attention,
}
