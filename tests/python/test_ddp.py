"""DistributedDataParallel around ORTModule, 2 processes over gloo (torchrun --standalone), against
one process over the same global batches: per-step losses and final parameters within rtol 1e-5,
with ORTModule and with eager; no_sync accumulation; find_unused_parameters; BatchNorm buffers
broadcast from rank 0; a checkpoint saved on rank 0 and loaded on every rank."""
import functools
import os
import tempfile

import pytest
import torch
from conftest import assert_same_training, read_result, run_worker

pytestmark = pytest.mark.branches_unexportable  # its `if h.sum() > 0` models must not export

WORKER = os.path.join(os.path.dirname(__file__), "ddp_worker.py")
# The runs' results and the checkpoints beside them, removed when the tests end.
SCRATCH = tempfile.TemporaryDirectory(prefix="torch_ort_ddp_")
TINY_GROUPS = {"ORTMODULE_GRADIENT_RELEASE": "0.000001"}  # small models still release in groups


@functools.lru_cache(maxsize=None)
def run(world: int, engine: str, *flags: str, env: tuple = ()) -> dict:
    out = os.path.join(SCRATCH.name, f"{world}_{engine}_{'_'.join(flags)}_{len(env)}.json")
    run_worker(WORKER, "--engine", engine, *flags, world=world, env=dict(env), out=out)
    return read_result(out)


@pytest.mark.parametrize("engine", ["ort", "eager"])
def test_two_processes_train_as_one_on_the_global_batch(engine):
    """Rank 0 saves a checkpoint after step 3; every rank rebuilds a differently initialised
    model and optimizer and loads it: the trajectory must not notice."""
    two = run(2, engine, "--steps", "6", "--checkpoint-at", "3")
    one = run(1, engine, "--steps", "6")
    assert two["world"] == 2 and one["world"] == 1
    assert_same_training(two, one)
    assert one["losses"][-1] < one["losses"][0]


def test_ortmodule_and_eager_ddp_agree():
    assert_same_training(run(2, "ort", "--steps", "6", "--checkpoint-at", "3"),
                         run(2, "eager", "--steps", "6", "--checkpoint-at", "3"))


@pytest.mark.parametrize("engine", ["ort", "eager"])
def test_no_sync_gradient_accumulation(engine):
    """Two micro-batches per step, the first under no_sync: the same as one process
    accumulating both."""
    assert_same_training(run(2, engine, "--steps", "4", "--accum", "2"),
                         run(1, engine, "--steps", "4", "--accum", "2"))


def test_gpt_with_gradient_release_in_groups():
    """nanoGPT (tied embedding) with gradients released in many groups during backward, and
    find_unused_parameters' graph traversal through the release chain."""
    env = tuple(TINY_GROUPS.items())
    gpt = ("--model", "nanogpt", "--steps", "4", "--optim", "sgd")  # (Adam would amplify rounding
    two = run(2, "ort", *gpt, "--find-unused", env=env)         # in near-zero gradients)
    assert_same_training(two, run(1, "ort", *gpt, env=env))
    order = two["grad_order"]  # the first step's arrival order: last layer first, as eager
    assert order.index("module.gpt.h.1.mlp.2.weight") < order.index("module.gpt.h.0.mlp.2.weight")
    assert order[-1] == "module.gpt.wte.weight"  # tied: final only once the embedding is done


def test_find_unused_parameters():
    two = run(2, "ort", "--model", "unused", "--steps", "4", "--find-unused", "--optim", "sgd")
    assert_same_training(two, run(1, "ort", "--model", "unused", "--steps", "4", "--optim", "sgd"))
    eager = run(2, "eager", "--model", "unused", "--steps", "4", "--find-unused", "--optim", "sgd")
    assert_same_training(two, eager)
    assert "module.spare.weight" not in two["grad_order"]


def test_batchnorm_buffers_are_rank_0s_on_every_rank():
    two = run(2, "ort", "--model", "cnn", "--steps", "4", "--optim", "sgd")
    at_forward = two["forward_buffers_per_rank"]  # as the last forward began, after the broadcast
    assert at_forward[0] == at_forward[1]
    after = two["buffers_per_rank"]  # each rank then updated them from its own half of the batch
    assert after[0]["bn.running_mean"] != after[1]["bn.running_mean"]
    assert after[0]["bn.num_batches_tracked"] == 4
    eager = run(2, "eager", "--model", "cnn", "--steps", "4", "--optim", "sgd")
    assert_same_training(two, eager)
    for rank in range(2):
        for name, value in after[rank].items():
            torch.testing.assert_close(torch.tensor(value), torch.tensor(eager["buffers_per_rank"][rank][name]),
                                       rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {rank} {name}: {m}")


def test_partial_acceleration_under_ddp():
    """A model with a data-dependent branch inside its loop of blocks (the whole module falls back,
    its blocks run in the engine): DDP over 2 processes trains as eager DDP does."""
    env = (("ORTMODULE_FALLBACK_POLICY", "FALLBACK_UNSUPPORTED_TORCH_MODEL"),)
    branchy = ("--model", "branchy", "--steps", "4", "--checkpoint-at", "2", "--optim", "sgd")
    two = run(2, "ort", *branchy, env=env)
    assert [name for name, runs in two["submodules"] if runs == "engine"] == \
        ["h.0", "h.1.attn", "h.1.mlp", "h.2", "h.3"]
    assert_same_training(two, run(2, "eager", *branchy))
