"""DeepSpeed's distributed start-up for the DeepSpeed run scripts, on gloo's collectives."""
import deepspeed


def init_distributed() -> None:
    # Without this, DeepSpeed's CPU accelerator compiles its shared-memory allreduce (a JIT C++
    # build of about a minute on 2 cores, in every new environment) before the first collective;
    # these runs use gloo's collectives.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
