"""ORTMODULE_FALLBACK_POLICY: which engine failures run the original module in eager PyTorch."""
from __future__ import annotations

import dataclasses
import enum
import warnings

from torch_ort.ortmodule.policy.debug_options import LOGGER, TorchOrtWarning, parse_flags


class FallbackPolicy(enum.IntFlag):
    """ORTMODULE_FALLBACK_POLICY's flags: which failures run eager PyTorch instead of raising."""

    FALLBACK_DISABLE = 1
    FALLBACK_FORCE_TORCH_FORWARD = 2
    FALLBACK_FORCE_TORCH_BACKWARD = 4
    FALLBACK_UNSUPPORTED_DEVICE = 8
    FALLBACK_UNSUPPORTED_DATA = 16
    FALLBACK_UNSUPPORTED_TORCH_MODEL = 32
    FALLBACK_UNSUPPORTED_ONNX_MODEL = 64
    FALLBACK_BAD_INITIALIZATION = 128


DEFAULT_POLICY = (
    FallbackPolicy.FALLBACK_UNSUPPORTED_DEVICE
    | FallbackPolicy.FALLBACK_UNSUPPORTED_DATA
    | FallbackPolicy.FALLBACK_UNSUPPORTED_TORCH_MODEL
    | FallbackPolicy.FALLBACK_UNSUPPORTED_ONNX_MODEL
)


def parse_policy(text: str) -> FallbackPolicy:
    """'FALLBACK_DISABLE' or 'FALLBACK_UNSUPPORTED_DATA|FALLBACK_UNSUPPORTED_DEVICE' (prefix optional)."""
    return parse_flags(FallbackPolicy, "FALLBACK_", "ORTMODULE_FALLBACK_POLICY", text)


class ORTModuleFallbackWarning(TorchOrtWarning):
    """The one warning of a fallback to eager PyTorch. Filter it by class, or make every fallback
    an error: warnings.simplefilter("error", ORTModuleFallbackWarning)."""


@dataclasses.dataclass(frozen=True)
class SubmoduleStatus:
    """Where one submodule runs while its module falls back with partial acceleration."""

    name: str        # its qualified name in the module, e.g. "blocks.0"
    runs: str        # "engine"; "eager"; "split" (its own forward eager, its submodules listed after
                     # it); or "not called" (no call has reached it yet)
    reason: str      # why it does not run in the engine ("" when it does)
    error_type: str  # the failure's class ("" when it runs in the engine)


@dataclasses.dataclass(frozen=True)
class FallbackStatus:
    """Why an ORTModule runs its module in eager PyTorch (ORTModule.fallback, stats()["fallback"])."""

    flag: str        # the ORTMODULE_FALLBACK_POLICY flag that allowed it, e.g. "FALLBACK_UNSUPPORTED_DATA"
    reason: str      # the failure, as the warning states it
    error_type: str  # the failure's class, e.g. "ORTModuleIOError" ("" for a forced fallback)
    # With partial acceleration (ORTMODULE_PARTIAL_ACCELERATION): where each candidate submodule
    # runs, in module order; empty when the whole module runs eagerly.
    submodules: tuple[SubmoduleStatus, ...] = ()
    # With partial acceleration: the share of the module's parameters (elements) inside the
    # submodules that run in the engine; None when the whole module runs eagerly.
    engine_parameter_share: float | None = None
    # With partial acceleration: the share of the forward's FLOPs (matrix products, convolutions,
    # attention) those submodules spent, counted on the first call; None when not counted.
    engine_flop_share: float | None = None

    @property
    def engine_submodules(self) -> tuple[str, ...]:
        """The submodules that run in the engine (partial acceleration)."""
        return tuple(s.name for s in self.submodules if s.runs == "engine")


class ORTModuleError(RuntimeError):
    """Base of the failure kinds the fallback policy knows; `policy` is the flag that covers it."""

    policy = FallbackPolicy(0)


class ORTModuleDeviceException(ORTModuleError):
    """Inputs or parameters on a device the engine does not run on (FALLBACK_UNSUPPORTED_DEVICE)."""

    policy = FallbackPolicy.FALLBACK_UNSUPPORTED_DEVICE


class ORTModuleIOError(ORTModuleError):
    """An input or output the engine cannot take (FALLBACK_UNSUPPORTED_DATA)."""

    policy = FallbackPolicy.FALLBACK_UNSUPPORTED_DATA


class ORTModuleTorchModelException(ORTModuleError):
    """A module torch.export cannot capture or the engine does not take (FALLBACK_UNSUPPORTED_TORCH_MODEL)."""

    policy = FallbackPolicy.FALLBACK_UNSUPPORTED_TORCH_MODEL


class ORTModuleONNXModelException(ORTModuleError):
    """An exported graph the engine cannot build (FALLBACK_UNSUPPORTED_ONNX_MODEL)."""

    policy = FallbackPolicy.FALLBACK_UNSUPPORTED_ONNX_MODEL


class ORTModuleInitException(ORTModuleError):
    """The engine is unusable from construction on (FALLBACK_BAD_INITIALIZATION)."""

    policy = FallbackPolicy.FALLBACK_BAD_INITIALIZATION


class FallbackManager:
    """Decides, per failure, whether to raise or to run eager PyTorch from now on (warning once).
    FORCE_TORCH_FORWARD / FORCE_TORCH_BACKWARD run the whole module in eager PyTorch from the
    first call, as in ONNX Runtime (our backward is never split from our forward)."""

    def __init__(self, policy: FallbackPolicy = DEFAULT_POLICY, retry: bool = False):
        self.policy = policy
        self.retry = retry
        self.cause: BaseException | None = None
        self.quiet = False  # a submodule's manager under partial acceleration: its owner warns
        self.status: FallbackStatus | None = None  # set while the last call ran eager (ORTModule.fallback)
        forced = policy & (FallbackPolicy.FALLBACK_FORCE_TORCH_FORWARD | FallbackPolicy.FALLBACK_FORCE_TORCH_BACKWARD)
        self.active = bool(forced) and not policy & FallbackPolicy.FALLBACK_DISABLE
        self.forced = FallbackPolicy(forced) if self.active else FallbackPolicy(0)

    def covers(self, error: ORTModuleError) -> bool:
        return not self.policy & FallbackPolicy.FALLBACK_DISABLE and bool(self.policy & error.policy)

    def warn_forced(self) -> None:
        """The one warning of a user-forced fallback. When the warning is made an error
        (ORTModuleFallbackWarning filtered to "error"), it raises before anything is recorded."""
        if self.cause is None:
            cause = ORTModuleError(f"fallback forced by ORTMODULE_FALLBACK_POLICY ({self.forced.name})")
            warnings.warn(f"torch_ort: running the module in eager PyTorch: {cause}",
                          ORTModuleFallbackWarning, stacklevel=4)
            self.cause = cause
            self.status = FallbackStatus(self.forced.name, str(cause), "")

    def handle(self, error: ORTModuleError, eager=None, split=None):
        """Raises `error` unless the policy covers its kind; otherwise switches to eager and returns
        eager() (None without it). When eager() raises too, the failure is the call's own — the
        module fails in eager PyTorch as well (its forward raised on these inputs while being
        exported): nothing switches, nothing is warned, and eager's error propagates as it would
        without torch_ort; the next call tries the engine again. `split` (partial acceleration)
        says, once eager() ran, which submodules ran in the engine."""
        if not self.covers(error):
            raise error
        result = None if eager is None else eager()
        if self.cause is None and not self.quiet:
            # Warned before anything switches: a warning made an error leaves the module as it
            # was, so every call that would fall back raises it (none runs eager silently).
            if split is None:
                what, undo = "falling back to eager PyTorch", ""
            else:
                what = "running the module eagerly, its submodules in the engine where they can"
                undo = f" Where they run: {split()}. ORTMODULE_PARTIAL_ACCELERATION=0 runs the whole module eagerly."
            warnings.warn(
                f"torch_ort: {what} ({error.policy.name}): {error}.{undo} "
                "Set ORTMODULE_FALLBACK_POLICY=FALLBACK_DISABLE to raise instead.",
                ORTModuleFallbackWarning, stacklevel=4)
        LOGGER.info("fallback to PyTorch because of %s: %s", type(error).__name__, error)
        self.cause = error
        self.status = FallbackStatus(error.policy.name, str(error), type(error).__name__)
        self.active = not self.retry
        return result

    def engine_ran(self) -> None:
        """A call ran through the engine (after a retry): no fallback to report any more."""
        self.status = None
