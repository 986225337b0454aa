"""torch_ort.utils.data: samplers that give every rank equally heavy work."""
from torch_ort.utils.data.sampler import (
    LoadBalancingDistributedBatchSampler,
    LoadBalancingDistributedSampler,
)

__all__ = ["LoadBalancingDistributedSampler", "LoadBalancingDistributedBatchSampler"]
