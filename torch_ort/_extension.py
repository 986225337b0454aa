"""Loads torch_ort's compiled extensions (torch_ort._C, torch_ort._C_cuda) on first use, and says
clearly when the running torch is not the one they were compiled against.

The extensions link against libtorch's C++ symbols, which change between torch's minor releases:
an extension built for torch 2.15 does not load under 2.16 ("undefined symbol: ..."). setup.py
records the torch it compiled against in torch_ort/_build_info.py; before loading, the running
torch's major.minor is compared with it, and a mismatch, or a load failure of that kind, raises
TorchVersionError naming both versions and the command that rebuilds. `import torch_ort` itself
loads nothing compiled; the first use of the engine or the optimizers does.
"""
from __future__ import annotations

import importlib

# The torch releases torch_ort supports; scripts/build_backend.py tells pip the same range (a test
# keeps the two equal).
SUPPORTED = ((2, 11), (2, 15))  # inclusive
REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps ."


class TorchVersionError(ImportError):
    """torch_ort's compiled extension does not match the running torch."""


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def build_info(name: str) -> str | None:
    """A value setup.py recorded when it compiled the extensions (TORCH_VERSION, CUDA_ARCHS), None
    where no build recorded one."""
    try:
        from torch_ort import _build_info
    except ImportError:
        return None
    return getattr(_build_info, name, None)


def built_against() -> str | None:
    """The torch version torch_ort._C was compiled against, None where no build recorded one."""
    return build_info("TORCH_VERSION")


def supported(version: str) -> bool:
    return SUPPORTED[0] <= _minor(version) <= SUPPORTED[1]


def check(running: str | None = None, built: str | None = None) -> None:
    """Raises TorchVersionError when the running torch is outside the supported range or is not
    the minor release the extension was compiled against."""
    import torch  # here, not at the top: setup.py reads SUPPORTED and supported() without torch

    running = running or torch.__version__
    built = built if built is not None else built_against()
    lo, hi = (".".join(map(str, v)) for v in SUPPORTED)
    if not supported(running):
        raise TorchVersionError(
            f"torch_ort supports torch {lo} to {hi}; this is torch {running}"
            + (f" (torch_ort was compiled against torch {built})" if built else "")
            + f". Install a supported torch, then rebuild torch_ort: {REBUILD}")
    if built and _minor(built) != _minor(running):
        raise TorchVersionError(
            f"torch_ort was compiled against torch {built}, but torch {running} is running: its compiled "
            f"extension only loads under the torch it was built with. Rebuild torch_ort for this torch "
            f"({REBUILD}), or install torch {'.'.join(built.split('.')[:2])}.")


def load(name: str):
    """torch_ort.<name> (_C or _C_cuda), after check(); a load failure that means another torch is
    reported as TorchVersionError."""
    import torch

    check()
    try:
        return importlib.import_module(f"torch_ort.{name}")
    except ImportError as e:
        if "undefined symbol" in str(e) or "version `" in str(e):
            built = built_against() or "an unrecorded version"
            raise TorchVersionError(
                f"torch_ort.{name} does not load under torch {torch.__version__} (it was compiled "
                f"against torch {built}): {e}. Rebuild torch_ort for this torch: {REBUILD}") from e
        raise
