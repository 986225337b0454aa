"""The value types of the ORTMODULE_* variables (variables.py): each parser takes (variable name,
text) and returns the value, or raises a ValueError naming the variable and the valid values."""
from __future__ import annotations

import enum
import json
import os
import re
from dataclasses import dataclass

from torch_ort.ortmodule.policy.debug_options import LogLevel, parse_flags, parse_log_level
from torch_ort.ortmodule.policy.fallback_policy import DEFAULT_POLICY, FallbackPolicy, parse_policy

TRUE = ("1", "true", "on", "yes")
FALSE = ("0", "false", "off", "no")


class SkipCheck(enum.IntFlag):
    """ORTMODULE_SKIPCHECK_POLICY: which per-call checks are skipped once the engine is built."""

    SKIP_CHECK_DISABLED = 1        # re-check everything on every call
    SKIP_CHECK_DEVICE = 2          # do not re-check that parameters stayed on their device
    SKIP_CHECK_BUILD_GRADIENT = 4  # trust an attribute proven not to change the graph
    SKIP_CHECK_EXECUTION_AGENT = 8  # (ORT name kept) reuse engines without re-validating them


DEFAULT_SKIPCHECK = (SkipCheck.SKIP_CHECK_DEVICE | SkipCheck.SKIP_CHECK_BUILD_GRADIENT
                     | SkipCheck.SKIP_CHECK_EXECUTION_AGENT)


@dataclass(frozen=True)
class RecomputePlan:
    """One ORTMODULE_MEMORY_OPT_CONFIG entry: recompute `count` occurrences (-1: all) of a cluster."""

    cluster: str
    strategy: int  # 0 none, 1 recompute, 2 recompute with compromise
    count: int


def invalid(name: str, text: str, valid: str) -> ValueError:
    return ValueError(f"{name}={text!r} is not valid; {valid}")


def boolean(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise invalid(name, text, f"use one of {', '.join(TRUE + FALSE)}")


def auto_bool(name: str, text: str) -> bool | str:
    """"auto" (the code decides), else a bool."""
    return "auto" if text.strip().lower() == "auto" else boolean(name, text)


def opset(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 7 <= value <= 30:
        raise invalid(name, text, "use an ONNX opset number such as 18, 20 or 23")
    return value


def path(name: str, text: str) -> str:
    if not text.strip():
        raise invalid(name, text, "use a directory path")
    return os.path.abspath(os.path.expanduser(text))


def names(name: str, text: str) -> frozenset[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if not all(part.isidentifier() for part in n.split(".")):
            raise invalid(name, text, f"{n!r} is not a fully qualified class name "
                           "(module.path.ClassName), comma-separated")
    return frozenset(names)


def pass_names(name: str, text: str) -> frozenset[str]:
    from torch_ort import _C  # the pipelines live in the engine
    known = _C.pass_names()
    names = [n.strip() for n in text.split(",") if n.strip()]
    required = _C.required_pass_names()
    optional = [n for n in known if n not in required]
    for n in names:
        if n in required:
            raise invalid(name, text, f"{n!r} is a lowering the engine needs and cannot be disabled; "
                           f"passes that can: {', '.join(optional)}")
        if n not in known:
            raise invalid(name, text, f"{n!r} is not a graph pass; passes: {', '.join(optional)}")
    return frozenset(names)


def memory_level(name: str, text: str) -> int:
    if text.strip() not in ("0", "1", "2"):
        raise invalid(name, text, "use 0 (user config only), 1 (recompute per transformer layer) or "
                       "2 (also the compromise plans)")
    return int(text)


def plans(name: str, text: str) -> tuple[RecomputePlan, ...]:
    """'<cluster>:<strategy 0/1/2>:<count, -1 = all>' comma-separated, or a JSON file holding a
    list of such strings (ORT's "enable_memory_optimizer_config" list)."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if len(entries) == 1 and entries[0].endswith(".json"):
        try:
            with open(entries[0]) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise invalid(name, text, f"the JSON file could not be read ({e})") from None
        data = data.get("Recompute", data) if isinstance(data, dict) else data
        if not isinstance(data, list) or not all(isinstance(e, str) for e in data):
            raise invalid(name, text, "the JSON file must hold a list of '<cluster>:<strategy>:<count>'")
        entries = data
    plans = []
    for entry in entries:
        parts = entry.split(":")
        ok = len(parts) == 3 and parts[0] and parts[1] in ("0", "1", "2")
        try:
            count = int(parts[2]) if ok else 0
        except ValueError:
            ok = False
        if not ok or count < -1:
            raise invalid(name, text, f"entry {entry!r} must read '<cluster id>:<strategy 0/1/2>:"
                           "<count, -1 for all>', e.g. 'Gelu+:1:-1'")
        plans.append(RecomputePlan(parts[0], int(parts[1]), count))
    return tuple(plans)


def mebibytes(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise invalid(name, text, "use a size in MiB, e.g. 1 or 0.25 (0 turns it off)")
    return value


BYTE_UNITS = {"": 1, "b": 1, "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40,
               "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12}


def byte_size(name: str, text: str) -> int:
    """A size: bytes, or a number with a unit (KiB, MiB, GiB, TiB; KB, MB, GB, TB), e.g. 6GiB."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = BYTE_UNITS.get(m.group(2).lower()) if m else None
    if unit is None or float(m.group(1)) * unit < 1:
        raise invalid(name, text, "use a size such as 6GiB, 512MiB or 1073741824 (bytes)")
    return int(float(m.group(1)) * unit)


def count(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise invalid(name, text, "use a whole number such as 16 (0: no bound)")
    return value


def skipcheck(name: str, text: str) -> SkipCheck:
    return parse_flags(SkipCheck, "SKIP_CHECK_", name, text) or DEFAULT_SKIPCHECK


def policy(name: str, text: str) -> FallbackPolicy:
    return parse_policy(text) or DEFAULT_POLICY


def log_level(name: str, text: str) -> LogLevel:
    return parse_log_level(text)
