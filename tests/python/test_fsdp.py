"""FSDP2 (torch.distributed.fsdp.fully_shard) with ORTModule inside each unit,
fully_shard(ORTModule(block)), 2 processes over gloo (torchrun --standalone), against the same
model sharded without ORTModule: per-step losses and final full parameters within rtol 1e-5; a
torch.distributed.checkpoint save/load mid-run does not change the trajectory. ORTModule around
modules FSDP2 already manages is refused with the supported composition named. Models: three
Linear blocks under a head (AdamW), and the tiny nanoGPT of model_zoo (SGD)."""
import functools
import os
import tempfile

from conftest import assert_same_training, read_result, run_worker

WORKER = os.path.join(os.path.dirname(__file__), "fsdp_worker.py")
# The runs' results and the checkpoints beside them, removed when the tests end.
SCRATCH = tempfile.TemporaryDirectory(prefix="torch_ort_fsdp_")


@functools.lru_cache(maxsize=None)
def run(engine: str, *flags: str) -> dict:
    out = os.path.join(SCRATCH.name, f"{engine}_{'_'.join(flags)}.json")
    run_worker(WORKER, "--engine", engine, *flags, world=2, out=out)
    return read_result(out)


CHECKPOINTED = ("--steps", "5", "--checkpoint-at", "3")


def ours() -> dict:
    """The ORTModule run; it first records the refusals (which build their own models, then
    reseed: the training that follows is unaffected)."""
    return run("ort", *CHECKPOINTED, "--refusal")


def test_ortmodule_in_each_unit_trains_as_eager_fsdp():
    result = ours()
    assert result["world"] == 2
    assert result["fallback"] == [], "a block ran eager"
    assert result["exports"] == [1, 1, 1]  # the rebuilt model after the checkpoint: once per block
    assert_same_training(result, run("eager", *CHECKPOINTED))
    assert result["params"].keys() >= {"blocks.0.fc.weight", "head.bias"}  # the original names


def test_nanogpt_blocks_as_units_across_a_checkpoint():
    """Transformer blocks (attention, LayerNorm, MLP) as the ORTModule units; the tied
    embedding/lm_head in the root unit, eager."""
    gpt = ("--model", "gpt", "--steps", "4", "--checkpoint-at", "2")
    result = run("ort", *gpt)
    assert result["fallback"] == [] and result["exports"] == [1, 1]
    assert_same_training(result, run("eager", *gpt))


def test_checkpoint_round_trip_continues_identically():
    """After step 3 the model and optimizer are rebuilt from another seed and loaded from the
    dcp checkpoint (get_/set_model_state_dict, get_/set_optimizer_state_dict): the run matches
    one that never stopped."""
    assert_same_training(ours(), run("ort", "--steps", "5"))


def test_ortmodule_around_fsdp_units_is_refused():
    refusal = ours()["refusal"]
    for where in ("construction", "first_call"):
        assert "fully_shard(ORTModule(block))" in refusal[where], refusal
        assert "FSDP2" in refusal[where]
    assert "fully_shard was applied to the module" in refusal["construction"]
    assert "submodule 'blocks.0'" in refusal["first_call"]  # fully_shard after wrapping
    assert refusal["default_policy"] == "FALLBACK_UNSUPPORTED_TORCH_MODEL"  # runs eager FSDP
