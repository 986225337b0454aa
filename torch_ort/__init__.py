"""torch_ort: train PyTorch modules faster through a C++ graph engine.

    model = torch_ort.ORTModule(model)   # forward + backward run by our engine
"""
from torch_ort.ortmodule import DebugOptions, LogLevel, ORTModule

__all__ = ["ORTModule", "DebugOptions", "LogLevel"]
__version__ = "0.1.0"
