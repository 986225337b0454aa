"""Hugging Face transformers.Trainer for an ORTModule-wrapped model: its checkpoints are the wrapped
model's own `save_pretrained` (config.json, tied weights kept tied), which `from_pretrained` loads.

    from torch_ort.utils.hf import Trainer          # instead of transformers.Trainer
    trainer = Trainer(model=ORTModule(model), args=args, train_dataset=data)

Why a Trainer subclass: transformers.Trainer chooses how to save by type alone. It calls
`save_pretrained` when `trainer.model` is a PreTrainedModel (or PeftModel), or when
`accelerator.unwrap_model(trainer.model)` is one; that unwrapping recognises only the classes
accelerate lists (DistributedDataParallel, DataParallel, DeepSpeedEngine, FSDP, torch.compile's
module), by isinstance. For any other module it writes `model.state_dict()` with safetensors'
`save_file`: no config.json, and with tied weights (GPT-2's lm_head and wte) it raises, as
safetensors refuses tensors that share memory. Neither check reads an attribute a wrapper could
provide, so ORTModule cannot change the outcome from its side without patching accelerate.

`Trainer` here changes one public method, `save_model` (which checkpoints, a final
`trainer.save_model()` and push_to_hub go through): while it runs, `trainer.model` is the
wrapped module, so transformers' own saving code picks `save_pretrained`; then it is the
ORTModule again. Training, DDP preparation (DDP(ORTModule(model)), the supported order) and
loading a checkpoint (`load_state_dict`, which ORTModule passes on with the same keys) stay
transformers' and accelerate's, on the ORTModule. `SavePretrainedMixin` does the same for another
Trainer subclass: list it first among the bases.

accelerate alone needs nothing: `Accelerator.prepare(ORTModule(model), optimizer)` returns the
ORTModule (or DDP around it); `save_model`, `save_state`/`load_state` and `get_state_dict` go
through `state_dict`/`load_state_dict`, whose keys are the wrapped model's; `unwrap_model` returns
the ORTModule, whose `save_pretrained` is the wrapped model's.
"""
from __future__ import annotations

import transformers

from torch_ort.ortmodule import ORTModule


class SavePretrainedMixin:
    """For a transformers.Trainer subclass (first among the bases): when `trainer.model` is an
    ORTModule, saving goes through the module it wraps (`save_pretrained` for a PreTrainedModel)."""

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        wrapper = self.model
        if not isinstance(wrapper, ORTModule):
            return super().save_model(output_dir, _internal_call)
        # Trainer._save decides by isinstance(self.model, PreTrainedModel): show it the wrapped
        # module for the duration of the save only (training and loading keep the ORTModule).
        self.model = wrapper.module
        try:
            return super().save_model(output_dir, _internal_call)
        finally:
            self.model = wrapper


class Trainer(SavePretrainedMixin, transformers.Trainer):
    """transformers.Trainer whose checkpoints of an ORTModule are the wrapped model's own
    (`save_pretrained`); the same arguments, otherwise the same behaviour."""


__all__ = ["SavePretrainedMixin", "Trainer"]
