"""What FusedAdam and FusedLamb share: hyper-parameter checks, the gradients a step reads, fp32
moments, set_grad_none, closures, and a load_state_dict that keeps the moments fp32."""
from __future__ import annotations

import abc
from typing import Callable, Optional

import torch

from . import _kernels


def check_hyper(lr: float, betas, eps: float, weight_decay: float) -> None:
    if not 0.0 <= lr:
        raise ValueError(f"invalid learning rate {lr}: must be >= 0")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"invalid betas {betas}: two values in [0, 1)")
    if not 0.0 <= eps:
        raise ValueError(f"invalid eps {eps}: must be >= 0")
    if not 0.0 <= weight_decay:
        raise ValueError(f"invalid weight_decay {weight_decay}: must be >= 0")


_PARAM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_grad(opt_name: str, p: torch.Tensor, g: torch.Tensor) -> None:
    """What every optimizer step here reads in a gradient, checked before anything is written:
    dense, the parameter's dtype or fp32, the parameter's shape and device."""
    where = f"{opt_name}: parameter of shape {tuple(p.shape)}"
    if g.layout != torch.strided:
        raise RuntimeError(f"{where} has a {g.layout} gradient; {opt_name} does not support sparse "
                           "gradients (use torch.optim.SparseAdam for sparse embeddings)")
    if g.dtype != p.dtype and g.dtype != torch.float32:
        raise TypeError(f"{opt_name}: a {g.dtype} gradient for a {p.dtype} parameter of shape "
                        f"{tuple(p.shape)}; expected the parameter's dtype or float32")
    if g.shape != p.shape:
        raise ValueError(f"{where} has a gradient of shape {tuple(g.shape)}")
    if g.device != p.device:
        raise TypeError(f"{where} is on {p.device} but its gradient is on {g.device}")


def params_with_grads(opt_name: str, group: dict):
    """The group's parameters that have a gradient, and those gradients (contiguous). Everything
    the kernels would refuse is refused here, before any parameter of any group moves: parameter
    dtypes, and each gradient (check_grad)."""
    params, grads = [], []
    for p in group["params"]:
        g = p.grad
        if g is None:
            continue
        if p.dtype not in _PARAM_DTYPES:
            raise TypeError(f"{opt_name}: parameter of shape {tuple(p.shape)} is {p.dtype}; "
                            "expected float32, float16 or bfloat16")
        check_grad(opt_name, p, g)
        params.append(p)
        grads.append(g if g.is_contiguous() else g.contiguous())
    return params, grads


def moments(state: dict, p: torch.Tensor):
    """The fp32 (exp_avg, exp_avg_sq) of p, created as zeros on first use."""
    if "exp_avg" not in state:
        state["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        state["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
    return state["exp_avg"], state["exp_avg_sq"]


def load_fp32_state(opt: torch.optim.Optimizer, state_dict: dict, load) -> None:
    """torch.optim.Optimizer.load_state_dict casts floating state to the parameter's dtype; for a
    bf16/fp16 parameter that would round the fp32 moments. Load, then put the saved fp32 values
    back (state_dict's params are indices in param_groups order)."""
    load(state_dict)
    saved = state_dict["state"]
    for group, saved_group in zip(opt.param_groups, state_dict["param_groups"]):
        for p, key in zip(group["params"], saved_group["params"]):
            for name, value in saved.get(key, {}).items():
                if torch.is_tensor(value) and value.is_floating_point() and name != "step":
                    opt.state[p][name] = value.to(device=p.device, dtype=torch.float32, copy=True)


class FusedOptimizer(torch.optim.Optimizer, metaclass=abc.ABCMeta):
    """A torch.optim.Optimizer whose zero_grad sets gradients to None when `set_grad_none`, and
    whose load_state_dict keeps fp32 moments fp32 for low-precision parameters."""

    EXTRA = ("set_grad_none",)  # attributes beyond torch's own that pickling must keep

    def __init__(self, params, defaults: dict, set_grad_none: bool):
        self.set_grad_none = set_grad_none
        super().__init__(params, defaults)

    def __getstate__(self):  # torch keeps only defaults, state and param_groups
        state = super().__getstate__()
        state["_torch_ort_extra"] = {k: self.__dict__[k] for k in self.EXTRA if k in self.__dict__}
        return state

    def __setstate__(self, state):
        extra = state.pop("_torch_ort_extra", {})
        super().__setstate__(state)
        self.__dict__.update(extra)

    def checked_groups(self, name: str):
        """(group, params with grads, their grads) of every group, each group's hyper-parameters
        checked first: a bad value in a later group raises before any parameter moves."""
        work = [(group, *params_with_grads(name, group)) for group in self.param_groups]
        for group, _, _ in work:
            check_hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"])
        return work

    @abc.abstractmethod
    def hyper(self, group: dict, step: int, grad_scale: float) -> dict:
        """The kernel's hyper-parameters for `group` at `step`, resolved and checked (raises on
        a bad value); each optimizer (FusedAdam, FusedLamb) defines its own."""

    def check_step(self) -> None:
        """Raises what step() would raise for a bad hyper-parameter, reading nothing else and
        changing nothing: FP16_Optimizer calls it before it unscales the gradients, so that the
        inner step can then fail only on resources (out of memory, a kernel's device fault)."""
        for group in self.param_groups:
            check_hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"])
            self.hyper(group, group.get("step", 0) + 1, 1.0)

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    def load_state_dict(self, state_dict: dict) -> None:
        load_fp32_state(self, state_dict, super().load_state_dict)

    # FP16_Optimizer hands its overflow flag to step(found_inf=) and lets the kernels skip.
    accepts_found_inf = True

    @property
    def last_step_skipped(self) -> bool:
        """Whether the last step() changed nothing: its found_inf was set (or, for FusedLamb on a
        sync-free device, the gradient norm was not finite). On such a device this reads the
        flag back (a wait, on demand only); `skip_flag` is the device tensor itself."""
        flag = self.__dict__.get("skip_flag")
        return bool(flag.item() != 0) if torch.is_tensor(flag) else bool(self.__dict__.get("_skipped_host"))

    def sync_free_device(self, work) -> Optional[torch.device]:
        """The device of this step's gradients when it keeps its scalars there (_kernels.sync_free)."""
        device = next((grads[0].device for _, _, grads in work if grads), None)
        return device if device is not None and _kernels.sync_free(device) else None

    def host_skip(self, found_inf) -> bool:
        """The host path's reading of found_inf (a CPU flag: nothing to wait for); records it."""
        skipped = found_inf is not None and bool(found_inf.item() != 0)
        self.__dict__.update(skip_flag=None, _skipped_host=skipped)
        return skipped

    @staticmethod
    def flag_on(found_inf, device: torch.device) -> Optional[torch.Tensor]:
        """found_inf as the kernels read it: a 0-dim float32 tensor on `device` (no host read)."""
        if found_inf is None:
            return None
        return found_inf.reshape(()).to(device=device, dtype=torch.float32)

    def run_groups(self, work, prepare: Callable, skip: Optional[torch.Tensor] = None,
                   device_steps: bool = False) -> None:
        """One step over `work` ((group, params with grads, their grads) per group), in two phases.

        Prepare, for every group: its hyper-parameters, resolved and checked by
        prepare(group, step) -> launch(backend, params, grads, exp_avgs, exp_avg_sqs); its fp32
        moments (created as zeros on first use); contiguous stand-ins for the parameters; the
        kernel module of each device. Anything that can fail (a bad value, no kernels for a device,
        out of memory) fails here, and the moments this step created are removed again: the
        parameters, the state and every group's `step` are as they were.
        Commit: the kernels, group by group, whose inputs were all checked above; a group's
        `step` counts once its kernels ran. (An error from a kernel itself — a device fault — is
        not undone: that would need a copy of every parameter and moment.)

        device_steps (sync-free steps): each group's `step` is a 0-dim float64 tensor on its
        device, as torch's capturable optimizers keep it; prepare gets this update's step as that
        tensor, and a step the kernels skipped (`skip` nonzero) does not count."""
        plans, created = [], []
        try:
            for group, params, grads in work:
                if not params:
                    continue
                prev = group.get("step", 0)
                if device_steps and not torch.is_tensor(prev):
                    prev = torch.full((), float(prev), dtype=torch.float64, device=params[0].device)
                elif device_steps:  # a checkpoint loaded with map_location may have moved it
                    prev = prev.to(params[0].device, torch.float64)
                elif not device_steps and torch.is_tensor(prev):  # back from a sync-free device
                    prev = int(prev.item())
                step = prev + 1
                launch = prepare(group, step)
                for p in params:
                    if p not in self.state:
                        created.append((p, None))
                    elif "exp_avg" not in self.state[p]:
                        created.append((p, ("exp_avg", "exp_avg_sq")))
                ms, vs = zip(*(moments(self.state[p], p) for p in params))
                contiguous = _kernels.Contiguous(params)
                calls = [(_kernels.backend(device), lists) for device, lists in
                         _kernels.by_device(contiguous.tensors, grads, ms, vs).items()]
                plans.append((group, step, launch, contiguous, calls))
        except BaseException:
            for p, keys in created:
                if keys is None:
                    self.state.pop(p, None)
                else:
                    for key in keys:
                        self.state[p].pop(key, None)
            raise
        for group, step, launch, contiguous, calls in plans:
            for backend, lists in calls:
                launch(backend, *lists)
            contiguous.write_back()
            group["step"] = step if skip is None else step - skip

    @staticmethod
    def run_closure(closure: Optional[Callable[[], torch.Tensor]]):
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()
