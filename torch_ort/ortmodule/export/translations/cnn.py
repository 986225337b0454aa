"""BatchNorm in training mode. The stock translation of aten._native_batch_norm_legit_functional
forces inference (it normalizes with the running statistics) and returns the running statistics
unchanged; ONNX BatchNormalization(training_mode=1) could not match PyTorch anyway (it updates the
running variance with the biased batch variance, PyTorch with the unbiased one). So a module in
train mode exports to our com.torch_ort::BatchNormTraining (kernel: csrc/runtime/kernels/
cnn_batchnorm.cc), whose outputs are, in ATen's order here, Y, the new running mean and variance
(buffer updates, see buffers.py) and the saved mean / inv-std its gradient reads.
"""
from __future__ import annotations

from onnx.defs import OpSchema
from onnxscript.function_libs.torch_lib.ops import core as torchlib_core
from onnxscript.values import Op, Opset

from torch_ort._compat import aten_op

_FLOATS = ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)"]


def _schema() -> OpSchema:
    p, optional = OpSchema.FormalParameter, OpSchema.FormalParameterOption.Optional
    return OpSchema(
        "BatchNormTraining", "com.torch_ort", 1,
        inputs=[p("X", "T"), p("scale", "U", param_option=optional), p("B", "U", param_option=optional),
                p("running_mean", "U", param_option=optional), p("running_var", "U", param_option=optional)],
        outputs=[p("Y", "T"), p("running_mean_out", "U", param_option=optional),
                 p("running_var_out", "U", param_option=optional), p("saved_mean", "U", param_option=optional),
                 p("saved_inv_std", "U", param_option=optional)],
        type_constraints=[("T", _FLOATS, "data"), ("U", _FLOATS, "parameters and statistics")],
        attributes=[OpSchema.Attribute("epsilon", OpSchema.AttrType.FLOAT, "added to the variance"),
                    OpSchema.Attribute("momentum", OpSchema.AttrType.FLOAT,
                                       "PyTorch's: new = (1 - momentum) * old + momentum * batch")])


_BatchNormTraining = Op(Opset("com.torch_ort", 1), "BatchNormTraining", _schema())


def batch_norm_functional(input, weight=None, bias=None, running_mean=None, running_var=None,
                          training=False, momentum=0.1, eps=1e-5):
    """(Y, saved_mean, saved_inv_std, new_running_mean, new_running_var), as ATen returns them."""
    if not training:  # inference needs nothing of ours
        return torchlib_core.aten__native_batch_norm_legit_functional(
            input, weight, bias, running_mean, running_var, training, momentum, eps)
    y, new_mean, new_var, saved_mean, saved_inv_std = _BatchNormTraining(
        input, weight, bias, running_mean, running_var, epsilon=eps, momentum=momentum)
    return y, saved_mean, saved_inv_std, new_mean, new_var


def batch_norm_no_stats(input, weight=None, bias=None, training=True, momentum=0.1, eps=1e-5):
    """track_running_stats=False: batch statistics in train and eval mode alike."""
    y, new_mean, new_var, saved_mean, saved_inv_std = _BatchNormTraining(
        input, weight, bias, None, None, epsilon=eps, momentum=momentum)
    for unused in (new_mean, new_var):  # no running statistics: never computed, typed for import
        unused.dtype = input.dtype
    return y, saved_mean, saved_inv_std


# What torch.export emits for BatchNorm; a torch without these ops never emits them.
_BY_NAME = {
    "_native_batch_norm_legit_functional.default": batch_norm_functional,
    "_native_batch_norm_legit.no_stats": batch_norm_no_stats,
}
TRANSLATIONS = {aten_op(name): fn for name, fn in _BY_NAME.items() if aten_op(name) is not None}
