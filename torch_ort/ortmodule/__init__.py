"""ORTModule and its options (names follow ONNX Runtime Training)."""
from torch_ort.ortmodule.policy.fallback_policy import (
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
from torch_ort.ortmodule.policy.debug_options import ConfigurationWarning, DebugOptions, LogLevel, TorchOrtWarning
from torch_ort.ortmodule.export.python_op_export import CheckpointNotAllowedError
from torch_ort.ortmodule.ortmodule import ORTModule
from torch_ort.ortmodule.examine import Examination, examine
from torch_ort.ortmodule.engine.memory_budget import MemoryBudgetError

__all__ = [
    "ORTModule", "DebugOptions", "LogLevel", "FallbackPolicy", "FallbackStatus",
    "ORTModuleFallbackWarning", "SubmoduleStatus", "ORTModuleError",
    "ORTModuleDeviceException", "ORTModuleIOError", "ORTModuleTorchModelException",
    "ORTModuleONNXModelException", "ORTModuleInitException", "CheckpointNotAllowedError",
    "MemoryBudgetError", "TorchOrtWarning", "ConfigurationWarning", "examine", "Examination",
]
