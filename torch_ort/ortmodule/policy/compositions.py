"""The compositions with other module wrappers that ORTModule does not take as a whole:
DataParallel (replicates the module per GPU), and a module FSDP2 already manages (ORTModule goes
inside each FSDP unit instead). Refused at construction and before every export."""
from __future__ import annotations

import torch

from torch_ort.ortmodule.policy.fallback_policy import ORTModuleTorchModelException


def fsdp_managed(module: torch.nn.Module) -> bool:
    """True when FSDP2's fully_shard was applied to `module` (its class became an FSDPModule)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(module, FSDPModule)


def refusal(module: torch.nn.Module) -> ORTModuleTorchModelException | None:
    """Why the engine does not take `module` as a whole (None when it does)."""
    if isinstance(module, torch.nn.DataParallel):
        return ORTModuleTorchModelException(
            "ORTModule does not support torch.nn.DataParallel; wrap the module with ORTModule "
            "first, then use DistributedDataParallel")
    sharded = next((name for name, m in module.named_modules() if fsdp_managed(m)), None)
    if sharded is not None:
        # FSDP2 all-gathers parameters in hooks around each unit's forward: an export would trace
        # through them, and the engine would bind sharded DTensors.
        where = f"submodule {sharded!r}" if sharded else "the module"
        return ORTModuleTorchModelException(
            f"ORTModule does not support a module managed by FSDP2 (fully_shard was applied to "
            f"{where}); wrap each unit with ORTModule first, then shard it: "
            "fully_shard(ORTModule(block)) for each block, then fully_shard(model)")
    return None
