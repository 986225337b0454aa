"""Hugging Face Trainer with an ORTModule-wrapped model (torch_ort.utils.hf.Trainer): trains as
transformers.Trainer trains the eager model, saves checkpoints through .module (save_pretrained:
config.json, tied weights) that from_pretrained loads, and resumes from one onto the same loss
trajectory. transformers.Trainer itself cannot save such a model as a pretrained one (below)."""
import pytest
import torch
import transformers

import model_zoo
import torch_ort
from torch_ort.utils import hf


class LMData(torch.utils.data.Dataset):
    def __init__(self, n=24, seq=16):
        gen = torch.Generator().manual_seed(0)
        self.rows = []
        for _ in range(n):
            _, kw = model_zoo.lm_batch(1, seq, gen)
            self.rows.append({k: v[0] for k, v in kw.items()})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class Exports(transformers.TrainerCallback):
    """ORTModule.export_count after every step."""

    def __init__(self, model):
        self.model, self.counts = model, []

    def on_step_end(self, args, state, control, **kwargs):
        self.counts.append(getattr(self.model, "export_count", 0))


def trainer(model, out_dir, steps=6, cls=hf.Trainer):
    args = transformers.TrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=4, max_steps=steps, logging_steps=1,
        save_steps=3, learning_rate=1e-3, report_to=[], use_cpu=True, seed=0, data_seed=0,
        disable_tqdm=True)
    return cls(model=model, args=args, train_dataset=LMData(), callbacks=[Exports(model)])


def losses(tr):
    return [h["loss"] for h in tr.state.log_history if "loss" in h]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, cls in (("eager", transformers.Trainer), ("ort", hf.Trainer)):  # the oracle: HF's own
        torch.manual_seed(0)
        model = model_zoo.gpt2()
        if name == "ort":
            model = torch_ort.ORTModule(model)
        tr = trainer(model, tmp_path_factory.mktemp(name), cls=cls)
        tr.train()
        out[name] = tr
    return out


def test_trainer_trains_an_ortmodule_as_eager(runs):
    ours, eager = losses(runs["ort"]), losses(runs["eager"])
    assert len(ours) == 6 and ours[-1] < ours[0]
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(eager), rtol=1e-4, atol=0)
    assert isinstance(runs["ort"].model, torch_ort.ORTModule)
    counts = next(c for c in runs["ort"].callback_handler.callbacks if isinstance(c, Exports)).counts
    assert len(counts) == 6 and len(set(counts)) == 1  # exported in step 1 only


@pytest.mark.parametrize("where", ["checkpoint-6", "save_model"])
def test_checkpoints_are_the_pretrained_model_and_load(runs, where, tmp_path):
    tr = runs["ort"]
    ckpt = f"{tr.args.output_dir}/checkpoint-6"
    if where == "save_model":  # the user's own final save, outside the training loop
        tr.save_model(str(tmp_path))
        ckpt = str(tmp_path)
    assert isinstance(tr.model, torch_ort.ORTModule)  # the wrapped module was shown only while saving
    loaded = type(tr.model.module).from_pretrained(ckpt)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # the tie survives
    state = tr.model.module.state_dict()
    assert list(state) == list(loaded.state_dict())
    for (name, a), b in zip(state.items(), loaded.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_transformers_trainer_itself_cannot_save_it_as_pretrained(tmp_path):
    """Why torch_ort.utils.hf.Trainer exists: transformers.Trainer saves a model that is not a
    PreTrainedModel (nor unwraps to one by accelerate's class list) as model.state_dict() through
    safetensors' save_file, which refuses GPT-2's tied lm_head/wte."""
    tr = trainer(torch_ort.ORTModule(model_zoo.gpt2()), tmp_path, cls=transformers.Trainer)
    with pytest.raises(RuntimeError, match="share memory"):
        tr.save_model(str(tmp_path / "out"))


def test_resume_from_a_checkpoint_continues_the_trajectory(runs, tmp_path):
    first = runs["ort"]
    torch.manual_seed(123)  # a different initialisation: only the checkpoint can make it match
    tr = trainer(torch_ort.ORTModule(model_zoo.gpt2()), tmp_path)
    tr.train(resume_from_checkpoint=f"{first.args.output_dir}/checkpoint-3")
    history = losses(tr)  # the checkpoint's three logged steps, then the three trained here
    assert len(history) == 6 and history[:3] == losses(first)[:3]
    torch.testing.assert_close(torch.tensor(history[3:]), torch.tensor(losses(first)[3:]), rtol=1e-5, atol=0)
