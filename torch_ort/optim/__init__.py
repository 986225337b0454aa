"""torch_ort.optim: fused multi-tensor optimizers and mixed-precision training.

FusedAdam (three AdamWMode rules), FusedLamb, and FP16_Optimizer (fp32 masters, dynamic loss
scaling, fused unscale/overflow check/clipping; patches DeepSpeed, Megatron-LM, Apex AMP)."""
from .fp16_optimizer import FP16_Optimizer
from .fused_adam import AdamWMode, FusedAdam
from .fused_lamb import FusedLamb
from .loss_scaler import LossScaler

__all__ = ["AdamWMode", "FusedAdam", "FusedLamb", "FP16_Optimizer", "LossScaler"]
