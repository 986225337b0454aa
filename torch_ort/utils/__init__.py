"""torch_ort.utils: helpers around training loops (data: load-balancing distributed samplers)."""
from torch_ort.utils import data

__all__ = ["data"]
