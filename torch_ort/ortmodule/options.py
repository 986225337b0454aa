"""DebugOptions and LogLevel (every ORTMODULE_* variable is in config.py)."""
from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass

LOGGER = logging.getLogger("torch_ort")


class LogLevel(enum.IntEnum):
    VERBOSE = 0
    INFO = 1
    WARNING = 2
    ERROR = 3
    FATAL = 4


_TO_LOGGING = {
    LogLevel.VERBOSE: logging.DEBUG,
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


@dataclass
class DebugOptions:
    """What ORTModule logs and saves. ORTMODULE_LOG_LEVEL, when set, overrides log_level."""

    log_level: LogLevel = LogLevel.WARNING
    save_onnx: bool = False
    onnx_prefix: str = ""

    def __post_init__(self):
        if not isinstance(self.log_level, LogLevel):
            raise TypeError(f"log_level must be a LogLevel, got {self.log_level!r}")
        if self.save_onnx and not self.onnx_prefix:
            raise ValueError("DebugOptions(save_onnx=True) needs an onnx_prefix for the file names")
        env = os.environ.get("ORTMODULE_LOG_LEVEL", "").strip()
        if env:
            self.log_level = parse_log_level(env)

    @property
    def save_path(self) -> str:
        """Directory save_onnx writes to: ORTMODULE_SAVE_ONNX_PATH, else the current directory."""
        return os.path.abspath(os.environ.get("ORTMODULE_SAVE_ONNX_PATH") or os.getcwd())

    def apply_log_level(self) -> None:
        """Sets the torch_ort logger's level; ranks other than 0 stay quiet at INFO and above
        (only errors), so a multi-process job logs once."""
        level = _TO_LOGGING[self.log_level]
        if self.log_level >= LogLevel.INFO and _rank() > 0:
            level = logging.ERROR
        LOGGER.setLevel(level)
        if not LOGGER.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("[torch_ort %(levelname)s] %(message)s"))
            LOGGER.addHandler(handler)
            LOGGER.propagate = False
