"""The PEP 517 build backend: setuptools', building against the torch of the environment being
installed into.

The extension follows torch's C++ ABI, which changes between torch releases, so it must compile
against the torch it will run with. pip builds in an isolated environment by default; with torch
in the static build requirements, pip would install the newest torch there and build against that,
whatever the user has. So torch is a build requirement only when the target environment has none
(as under ``python -m build``, which builds in a fresh environment): pip runs this backend with
the target environment's interpreter, whose site-packages hold the user's torch, and that
directory is appended to the path (after the isolated environment's own, which keep precedence).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (the hooks not redefined here)

# The torch versions checked (scripts/check_torch.sh); setup.py reads it from here for the sdist.
TORCH = "torch>=2.11,<2.16"


def _target_site_packages() -> list[str]:
    """The target environment's site-packages that hold torch."""
    paths = sysconfig.get_paths()
    found = []
    for key in ("purelib", "platlib"):
        folder = paths.get(key)
        if folder and folder not in found and os.path.exists(os.path.join(folder, "torch", "__init__.py")):
            found.append(folder)
    return found


def _use_target_torch() -> bool:
    """True when torch can be imported, appending the target environment's site-packages if
    that is where it is."""
    if importlib.util.find_spec("torch") is not None:
        return True
    folders = _target_site_packages()
    for folder in folders:
        if folder not in sys.path:
            sys.path.append(folder)
    if folders:
        # Also for the compiler subprocesses that cpp_extension starts (ninja, nvcc) and the ones
        # setuptools starts in turn.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + folders)
    return bool(folders)


def get_requires_for_build_wheel(config_settings=None):
    extra = [] if _use_target_torch() else [TORCH]
    return _setuptools.get_requires_for_build_wheel(config_settings) + extra


def get_requires_for_build_editable(config_settings=None):
    extra = [] if _use_target_torch() else [TORCH]
    return _setuptools.get_requires_for_build_editable(config_settings) + extra


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _use_target_torch()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    _use_target_torch()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _use_target_torch()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _use_target_torch()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_sdist(config_settings=None):
    # Sources only: setup.py then needs no torch and gives the version without a torch tag.
    os.environ["TORCH_ORT_SDIST"] = "1"
    return _setuptools.get_requires_for_build_sdist(config_settings)


def build_sdist(sdist_directory, config_settings=None):
    os.environ["TORCH_ORT_SDIST"] = "1"
    return _setuptools.build_sdist(sdist_directory, config_settings)
