"""ORTModule and its options (names follow ONNX Runtime Training)."""
from torch_ort.ortmodule.fallback_policy import (
    FallbackPolicy,
    FallbackStatus,
    ORTModuleFallbackWarning,
    SubmoduleStatus,
    ORTModuleDeviceException,
    ORTModuleError,
    ORTModuleInitException,
    ORTModuleIOError,
    ORTModuleONNXModelException,
    ORTModuleTorchModelException,
)
from torch_ort.ortmodule.debug_options import ConfigurationWarning, DebugOptions, LogLevel, TorchOrtWarning
from torch_ort.ortmodule.python_op_export import CheckpointNotAllowedError
from torch_ort.ortmodule.ortmodule import ORTModule
from torch_ort.ortmodule.examine import Examination, examine
from torch_ort.ortmodule.runner import MemoryBudgetError

__all__ = [
    "ORTModule", "DebugOptions", "LogLevel", "FallbackPolicy", "FallbackStatus",
    "ORTModuleFallbackWarning", "SubmoduleStatus", "ORTModuleError",
    "ORTModuleDeviceException", "ORTModuleIOError", "ORTModuleTorchModelException",
    "ORTModuleONNXModelException", "ORTModuleInitException", "CheckpointNotAllowedError",
    "MemoryBudgetError", "TorchOrtWarning", "ConfigurationWarning", "examine", "Examination",
]
