"""The distribution torch_ort is installed as, and the one it must not be installed beside.

The import package is `torch_ort`, the name ONNX Runtime Training's own package (`torch-ort` on
PyPI) installs too, so the distribution has a name of its own: torch-ort-engine. Two
distributions that install the same import package overwrite each other's files, and uninstalling
either removes files the other needs; `import torch_ort` says so when it finds `torch-ort`
installed as well (ONNX Runtime's, or an older build of this project under that name).
"""
from __future__ import annotations

import warnings

NAME = "torch-ort-engine"
CONFLICTING = "torch-ort"
FIX = (f"pip uninstall -y {CONFLICTING} onnxruntime-training, then install {NAME} again (pip install "
       "--force-reinstall --no-deps . in its checkout, or its wheel)")


def conflicting_version() -> str | None:
    """The version of an installed `torch-ort` distribution, None when there is none."""
    from importlib import metadata
    try:
        return metadata.version(CONFLICTING)
    except metadata.PackageNotFoundError:
        return None


def warn_if_conflicting(category: type[Warning]) -> None:
    version = conflicting_version()
    if version is not None:
        warnings.warn(
            f"the distribution {CONFLICTING} {version} is installed beside {NAME}: it is ONNX Runtime's "
            f"package (or an older build of this one under that name) and installs the same import "
            f"package, torch_ort, so the files of the two may be mixed. Remove it and reinstall this "
            f"one: {FIX}", category, stacklevel=3)
