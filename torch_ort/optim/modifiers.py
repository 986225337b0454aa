"""In-place patches of third-party mixed-precision optimizers (what ONNX Runtime called
optimizer modifiers): their per-tensor inf/nan checks, fp16→fp32 unscale and gradient-norm loops
are replaced by torch_ort's fused multi-tensor kernels. Each modifier names the class it knows
(by module path, so nothing is imported here) and the methods it replaces; when one of those
methods is missing — another version of the library — the optimizer is left alone, with a warning.

    DeepSpeed ZeRO-1/2   has_overflow_serial, has_overflow_partitioned_grads_serial,
                         get_grad_norm_direct (L2; other norms keep DeepSpeed's code)
    Megatron-LM (legacy megatron.fp16.fp16.FP16_Optimizer)   _check_overflow, clip_master_grads
    Apex AMP (an optimizer amp.initialize processed)         _post_amp_backward (master weights)
    accelerate's DeepSpeedOptimizerWrapper                    the DeepSpeed optimizer inside it

Tested: DeepSpeed ZeRO-1 and ZeRO-2 for real (CPU accelerator, gloo, bf16) in
tests/python/test_fp16_optimizer.py. Megatron-LM and Apex need CUDA to install and are tested
against stand-ins with the attributes these patches read, not against the libraries.
"""
from __future__ import annotations

import abc
import types
import warnings
from typing import Callable, List, Optional

import torch

from . import _kernels

PATCHED = "_torch_ort_fused"  # attribute set on a patched optimizer: the modifier's name


def _qualnames(obj) -> List[str]:
    return [f"{c.__module__}.{c.__qualname__}" for c in type(obj).__mro__]


def _grads(params) -> List[torch.Tensor]:
    return [p.grad for p in params if p is not None and p.grad is not None]


class Modifier(abc.ABC):
    name = ""
    classes: tuple = ()    # fully qualified class names this modifier knows
    methods: tuple = ()    # methods it replaces; all must exist

    def matches(self, opt) -> bool:
        return any(q in self.classes for q in _qualnames(opt))

    @abc.abstractmethod
    def apply(self, opt, **kwargs) -> None:
        """Replaces the methods in place (each modifier its own)."""

    @staticmethod
    def bind(opt, name: str, fn: Callable) -> None:
        setattr(opt, name, types.MethodType(fn, opt))


class DeepSpeedZeRO(Modifier):
    name = "deepspeed_zero"
    classes = ("deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer",
               "deepspeed.runtime.zero.stage2.FP16_DeepSpeedZeroOptimizer")
    methods = ("has_overflow_serial", "has_overflow_partitioned_grads_serial", "get_grad_norm_direct",
               "_model_parallel_all_reduce")

    def apply(self, opt, **kwargs) -> None:
        from deepspeed import comm as dist
        from deepspeed.accelerator import get_accelerator
        from deepspeed.runtime.utils import is_model_parallel_parameter, mask_nan_or_inf_with_val_inplace

        def flag(found: bool) -> torch.Tensor:  # DeepSpeed's own return: a bool tensor of shape [1]
            return torch.tensor([found], dtype=torch.bool, device=get_accelerator().current_device_name())

        def has_overflow_serial(self, params):
            return flag(_kernels.has_nonfinite([g.contiguous() for g in _grads(params)]))

        def has_overflow_partitioned_grads_serial(self):
            groups = self.averaged_gradients  # {group index: [grad]} (a list in older DeepSpeed)
            groups = groups.values() if isinstance(groups, dict) else groups
            grads = [g.contiguous() for group in groups if group is not None for g in group if g is not None]
            return flag(_kernels.has_nonfinite(grads))

        original_norm = opt.get_grad_norm_direct

        def get_grad_norm_direct(self, gradients, params, norm_type=2):
            if float(norm_type) != 2.0:
                return original_norm(gradients, params, norm_type)
            kept = []
            unpadded = (g for g in gradients if not getattr(g, "_zero_padding", False))
            for g, p in zip(unpadded, params):
                if getattr(p, "ds_pipe_replicated", False):
                    continue  # a pipeline-replicated parameter counts once
                if is_model_parallel_parameter(p) or self.model_parallel_rank == 0:
                    kept.append(g.detach().contiguous())
            total = torch.tensor(_kernels.l2norm(kept) ** 2, dtype=torch.float32, device=self.device)
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.dp_process_group)
            self._model_parallel_all_reduce(tensor=total, op=dist.ReduceOp.SUM)
            total = total.sqrt()
            mask_nan_or_inf_with_val_inplace(total, device=self.device)
            return total

        self.bind(opt, "has_overflow_serial", has_overflow_serial)
        self.bind(opt, "has_overflow_partitioned_grads_serial", has_overflow_partitioned_grads_serial)
        self.bind(opt, "get_grad_norm_direct", get_grad_norm_direct)


class LegacyMegatron(Modifier):
    name = "megatron_fp16"
    classes = ("megatron.fp16.fp16.FP16_Optimizer",)
    methods = ("_check_overflow", "clip_master_grads")

    def apply(self, opt, get_horizontal_model_parallel_rank: Optional[Callable] = None,
              get_horizontal_model_parallel_group: Optional[Callable] = None, **kwargs) -> None:
        def _check_overflow(self):
            params = [p for group in self.fp16_groups for p in group] + \
                     [p for group in self.fp32_from_fp32_groups for p in group]
            self.overflow = _kernels.has_nonfinite([g.contiguous() for g in _grads(params)])
            return self.overflow

        def clip_master_grads(self, max_norm, norm_type=2):
            if self.overflow:
                return -1
            if float(norm_type) != 2.0:
                raise ValueError("torch_ort's patched clip_master_grads computes L2 norms only")
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            if get_horizontal_model_parallel_rank is not None:
                # Model-parallel copies are counted once: rank 0 counts the shared parameters.
                rank = get_horizontal_model_parallel_rank()
                counted = [p for p in params if getattr(p, "model_parallel", False) or rank == 0]
            else:
                counted = params
            if not params:
                return 0.0
            sq = _kernels.l2norm([g.contiguous() for g in _grads(counted)]) ** 2
            if get_horizontal_model_parallel_group is not None:
                t = torch.tensor([sq], dtype=torch.float32, device=params[0].device)
                torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM,
                                             group=get_horizontal_model_parallel_group())
                sq = float(t.item())
            norm = sq ** 0.5
            coef = max_norm / (norm + 1e-6)
            if coef < 1.0:
                grads = _kernels.Contiguous(_grads(params))
                _kernels.scale(grads.tensors, grads.tensors, coef)
                grads.write_back()
            return norm

        self.bind(opt, "_check_overflow", _check_overflow)
        self.bind(opt, "clip_master_grads", clip_master_grads)


class ApexAMP(Modifier):
    name = "apex_amp"
    methods = ("_post_amp_backward", "_amp_lazy_init")

    # Apex's own fused optimizers bind their own _post_amp_backward (ORT left FusedSGD alone too).
    OWN_PATH = ("apex.optimizers.fused_sgd.FusedSGD", "apex.optimizers.fused_adam.FusedAdam")

    def matches(self, opt) -> bool:
        return hasattr(opt, "_amp_stash")

    def apply(self, opt, **kwargs) -> None:
        if any(q in self.OWN_PATH for q in _qualnames(opt)):
            warnings.warn(f"FP16_Optimizer: {type(opt).__qualname__} keeps Apex's own fused "
                          "unscale; nothing patched", UserWarning, stacklevel=4)
            return
        original = opt._post_amp_backward

        def post_backward_with_master_weights(self, scaler):
            stash = self._amp_stash
            self._amp_lazy_init()
            fp16 = getattr(stash, "all_fp16_params", None)
            fp32 = getattr(stash, "all_fp32_from_fp16_params", None)
            # Accumulating into existing fp32 master gradients keeps Apex's own path.
            if fp16 is None or fp32 is None or any(p.grad is not None for p in fp32):
                return original(scaler)
            src, dst = [], []
            for p16, p32 in zip(fp16, fp32):
                if p16.grad is not None:
                    p32.grad = torch.empty_like(p32, memory_format=torch.contiguous_format)
                    src.append(p16.grad.contiguous())
                    dst.append(p32.grad)
            if _kernels.scale(src, dst, 1.0 / scaler.loss_scale()):
                scaler._has_overflow = True
                if getattr(scaler, "_overflow_buf", None) is not None:
                    scaler._overflow_buf.fill_(1)
            from apex.amp import _process_optimizer
            _process_optimizer.post_backward_models_are_masters(
                scaler, stash.all_fp32_from_fp32_params, stash.all_fp32_from_fp32_grad_stash)

        self.bind(opt, "_post_amp_backward", post_backward_with_master_weights)


MODIFIERS = (DeepSpeedZeRO(), LegacyMegatron(), ApexAMP())
KWARGS = ("get_horizontal_model_parallel_rank", "get_horizontal_model_parallel_group")  # Megatron's
ACCELERATE_WRAPPER = "accelerate.utils.deepspeed.DeepSpeedOptimizerWrapper"


def patch(optimizer, **kwargs):
    """Patches `optimizer` in place when a modifier knows it and returns it; None otherwise."""
    target = optimizer.optimizer if ACCELERATE_WRAPPER in _qualnames(optimizer) else optimizer
    for m in MODIFIERS:
        if not m.matches(target):
            continue
        if getattr(target, PATCHED, None) == m.name:
            return optimizer
        missing = [name for name in m.methods if not callable(getattr(target, name, None))]
        if missing:
            warnings.warn(f"FP16_Optimizer: {type(target).__qualname__} looks like {m.name} but has no "
                          f"{', '.join(missing)} (another version?); left unpatched", UserWarning,
                          stacklevel=3)
            return optimizer
        m.apply(target, **kwargs)
        setattr(target, PATCHED, m.name)
        return optimizer
    return None
