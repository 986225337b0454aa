"""ORTModule.export_onnx / save_as_onnx: the trained model's inference graph runs in ONNX Runtime
(PyPI's inference package) at batch and sequence sizes other than the example's, within 1e-4 of
PyTorch in eval mode; the module's mode, weights and engines are untouched."""
import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import model_zoo
import torch_ort


def session(path):
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def train_a_little(model, make_batch, steps=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        args, kwargs = make_batch(gen)
        out = model(*args, **kwargs)
        loss = out.loss if hasattr(out, "loss") else out[1]
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("name", ["gpt2", "bert_cls"])
def test_hugging_face_model_runs_in_onnxruntime_at_new_sizes(strict, tmp_path, name):
    torch.manual_seed(0)
    ours = torch_ort.ORTModule(getattr(model_zoo, name)())
    batch_of = model_zoo.lm_batch if name == "gpt2" else model_zoo.cls_batch
    train_a_little(ours, lambda g: batch_of(4, 16, g))
    exports, weights = ours.export_count, [p.detach().clone() for p in ours.parameters()]
    _, example = batch_of(2, 8, torch.Generator().manual_seed(1))
    path = ours.export_onnx(tmp_path / f"{name}.onnx", input_ids=example["input_ids"],
                            attention_mask=example["attention_mask"])
    assert ours.training and ours.export_count == exports  # mode restored, engines untouched
    assert all(torch.equal(a, b) for a, b in zip(weights, ours.parameters()))
    onnx.checker.check_model(str(path))
    sess = session(path)
    assert [i.name for i in sess.get_inputs()] == ["input_ids", "attention_mask"]
    ours.eval()
    for batch, seq in ((3, 23), (1, 5)):  # neither is the example's size
        _, kw = batch_of(batch, seq, torch.Generator().manual_seed(batch))
        with torch.no_grad():
            ref = ours.module(input_ids=kw["input_ids"], attention_mask=kw["attention_mask"]).logits
        got = sess.run(None, {"input_ids": kw["input_ids"].numpy(),
                              "attention_mask": kw["attention_mask"].numpy()})[0]
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-4)


class Clamp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clamp(-1, 1)

    @staticmethod
    def backward(ctx, g):
        return g  # straight-through


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(Clamp.apply(self.bn(self.fc1(x))))


def test_batchnorm_and_a_custom_function_from_the_last_calls_shapes(strict, tmp_path):
    """No example inputs: the last call's shapes are used. BatchNorm exports with its running
    statistics (eval), the custom Function with its forward."""
    torch.manual_seed(0)
    ours = torch_ort.ORTModule(Net())
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    for _ in range(4):
        loss = ours(torch.randn(8, 6)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert ours.module.bn.num_batches_tracked.item() == 4
    path = ours.save_as_onnx(tmp_path / "net.onnx")  # the alias
    x = torch.randn(5, 6) * 3
    ours.eval()
    with torch.no_grad():
        ref = ours.module(x)
    got = session(path).run(None, {session(path).get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-5)


def test_export_before_any_call_needs_example_inputs(tmp_path):
    ours = torch_ort.ORTModule(Net())
    with pytest.raises(ValueError, match="pass example inputs"):
        ours.export_onnx(tmp_path / "x.onnx")
    path = ours.export_onnx(tmp_path / "x.onnx", torch.randn(2, 6))
    assert session(path).get_outputs()[0].shape[1] == 3
