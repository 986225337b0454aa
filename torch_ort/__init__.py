"""torch_ort: train PyTorch modules faster through a C++ graph engine.

    model = torch_ort.ORTModule(model)   # forward + backward run by our engine
    optimizer = torch_ort.optim.FusedAdam(model.parameters())
"""
from torch_ort import optim
from torch_ort.ortmodule import DebugOptions, LogLevel, ORTModule

__all__ = ["ORTModule", "DebugOptions", "LogLevel"]
__version__ = "0.1.0"
