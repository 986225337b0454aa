"""DebugOptions, LogLevel, the `torch_ort` logger and torch_ort's warning classes (every
ORTMODULE_* variable is in variables.py).

What the user must act on (a misspelled or ONNX-Runtime-only variable, an option with no effect,
a fallback to eager PyTorch) is a `warnings.warn` of a TorchOrtWarning class, shown with Python's
default settings. Events (exports, builds, the plans chosen) are log records: every record goes
to the `torch_ort` logger, which has only a NullHandler and propagates, so the application's
logging configuration (`logging.basicConfig`, its own handlers) decides where records go. Its
level is set only when the user asks for one (DebugOptions(log_level=...) or
ORTMODULE_LOG_LEVEL); the root logger is never touched."""
from __future__ import annotations

import enum
import logging
import os
import warnings
from dataclasses import dataclass

LOGGER = logging.getLogger("torch_ort")
LOGGER.addHandler(logging.NullHandler())  # handlers are the application's choice, not ours


class TorchOrtWarning(UserWarning):
    """Base of torch_ort's warnings: filter them all with
    warnings.filterwarnings("ignore", category=torch_ort.TorchOrtWarning)."""


class ConfigurationWarning(TorchOrtWarning):
    """A setting that has no effect: an ORTMODULE_* variable that is misspelled or only ONNX
    Runtime's, an argument ONNX Runtime accepted and torch_ort reads nowhere."""


class LogLevel(enum.IntEnum):
    """ONNX Runtime 1.19's levels, in its order (DEVINFO sits between VERBOSE and INFO)."""

    VERBOSE = 0
    DEVINFO = 1  # INFO on every rank: what ONNX Runtime offers its developers for debugging
    INFO = 2
    WARNING = 3
    ERROR = 4
    FATAL = 5


_TO_LOGGING = {
    LogLevel.VERBOSE: logging.DEBUG,
    LogLevel.DEVINFO: logging.INFO,
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.FATAL: logging.CRITICAL,
}


def parse_flags(flags: type[enum.IntFlag], prefix: str, variable: str, text: str) -> enum.IntFlag:
    """'A|B' (names with or without `prefix`) as a flag set; an unknown name raises, listing the
    valid ones."""
    value = flags(0)
    for part in text.split("|"):
        key = part.strip().upper()
        if not key:
            continue
        if not key.startswith(prefix):
            key = prefix + key
        if key not in flags.__members__:
            raise ValueError(f"{variable}={text!r}: unknown flag {part.strip()!r}; valid flags, joined "
                             f"by '|': {', '.join(flags.__members__)}")
        value |= flags[key]
    return value


def parse_log_level(text: str) -> LogLevel:
    try:
        return LogLevel[text.strip().upper()]
    except KeyError:
        valid = ", ".join(level.name for level in LogLevel)
        raise ValueError(f"ORTMODULE_LOG_LEVEL={text!r} is not valid; use one of {valid}") from None


def _rank() -> int:
    """This process's distributed rank: torch.distributed when initialised, else $RANK."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:  # pragma: no cover
        pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


class _RankFilter(logging.Filter):
    """On ranks other than 0, only errors pass, unless the level asked for is below INFO
    (VERBOSE, DEVINFO): a multi-process job logs once. The rank is read per record, since
    torch.distributed may be initialised after the ORTModule is made."""

    every_rank = False  # set by DebugOptions.apply_log_level

    def filter(self, record: logging.LogRecord) -> bool:
        return self.every_rank or record.levelno >= logging.ERROR or _rank() == 0


RANK_FILTER = _RankFilter()
LOGGER.addFilter(RANK_FILTER)

_config_told = False  # DebugOptions(config=...) said once that it has no effect


# DebugOptions' arguments and the type each must have: checked whatever save_onnx is (ORT checks
# onnx_prefix only when save_onnx is set, and save_onnx not at all; docs/migration.md says why).
_ARGUMENT_TYPES = {
    "log_level": ((LogLevel, type(None)), "a LogLevel such as LogLevel.INFO"),
    "save_onnx": (bool, "True or False"),
    "onnx_prefix": (str, "a str: the saved files' name prefix"),
    "save_path": (str, "a str: the directory for the saved files (ORTMODULE_SAVE_ONNX_PATH wins)"),
}


def _check_writable(directory: str) -> None:
    """OSError unless `directory` is a writable directory or can be created as one (its nearest
    existing ancestor is a writable directory): save_onnx fails here, not after the first export."""
    existing = directory
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        why = f"{existing} is not a directory"
    elif not os.access(existing, os.W_OK | os.X_OK):
        why = f"{existing} is not writable"
    else:
        return
    raise OSError(f"DebugOptions(save_onnx=True) cannot write to {directory} ({why}); set "
                  "ORTMODULE_SAVE_ONNX_PATH, or DebugOptions(save_path=...), to a writable directory")


@dataclass
class DebugOptions:
    """What ORTModule logs and saves, checked as ONNX Runtime's DebugOptions checks it (TypeError
    for a wrong type, ValueError for save_onnx without onnx_prefix, OSError for a directory that
    cannot be written). ORTMODULE_LOG_LEVEL, when set, overrides log_level;
    ORTMODULE_SAVE_ONNX_PATH, when set, overrides save_path. Both are read here, at construction.
    `config` is accepted as in ONNX Runtime 1.19, which takes it and reads it nowhere: it has no
    effect (a value other than None says so once, at WARNING)."""

    log_level: LogLevel | None = None  # None: WARNING, and the torch_ort logger's level is left alone
    save_onnx: bool = False
    onnx_prefix: str = ""
    save_path: str = ""  # save_onnx's directory when ORTMODULE_SAVE_ONNX_PATH is unset (default: cwd)
    config: object = None  # ONNX Runtime 1.19's unused argument, accepted for its signature

    def __post_init__(self):
        for name, (kind, expected) in _ARGUMENT_TYPES.items():
            value = getattr(self, name)
            if not isinstance(value, kind):
                named = value.strip().upper() if isinstance(value, str) else None
                hint = f"; use LogLevel.{named}" if name == "log_level" and named in LogLevel.__members__ else ""
                raise TypeError(f"DebugOptions({name}={value!r}): {name} must be {expected}, got "
                                f"{type(value).__name__}{hint}")
        if self.save_onnx and not self.onnx_prefix:
            raise ValueError("DebugOptions(save_onnx=True) needs an onnx_prefix for the file names")
        env = os.environ.get("ORTMODULE_LOG_LEVEL", "").strip()
        if env:
            self.log_level = parse_log_level(env)
        self._level_asked = self.log_level is not None  # by the argument or the variable
        if self.log_level is None:
            self.log_level = LogLevel.WARNING
        if self.config is not None:
            _tell_config_unused(self.config)
        self._save_dir = None
        if self.save_onnx:
            self._save_dir = self._resolve_save_dir()
            _check_writable(self._save_dir)

    def _resolve_save_dir(self) -> str:
        chosen = os.environ.get("ORTMODULE_SAVE_ONNX_PATH") or self.save_path or os.getcwd()
        return os.path.abspath(os.path.expanduser(chosen))

    @property
    def save_dir(self) -> str:
        """Directory save_onnx writes to: ORTMODULE_SAVE_ONNX_PATH, else save_path, else the
        current directory, as they were when these options were made."""
        return self._save_dir or self._resolve_save_dir()

    def apply_log_level(self) -> None:
        """Sets the torch_ort logger's level, only if the user asked for one (log_level or
        ORTMODULE_LOG_LEVEL); below INFO every rank speaks, else ranks other than 0 pass only
        errors (RANK_FILTER). No handler is added and no other logger is touched."""
        if not self._level_asked:
            return
        LOGGER.setLevel(_TO_LOGGING[self.log_level])
        RANK_FILTER.every_rank = self.log_level < LogLevel.INFO


def _tell_config_unused(config) -> None:
    global _config_told
    if not _config_told:
        _config_told = True
        warnings.warn(f"DebugOptions(config={type(config).__name__}) has no effect: ONNX Runtime 1.19 "
                      "accepts the argument and reads it nowhere, and so does torch_ort (docs/migration.md)",
                      ConfigurationWarning, stacklevel=4)
