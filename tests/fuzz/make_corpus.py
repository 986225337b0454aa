"""Writes the fuzzer's seed corpus (tests/fuzz/corpus) from graphs ORTModule itself saves.

Each tiny training model takes one step through ORTModule with
  * ORTMODULE_CACHE_DIR set: `<key>.onnx` is the graph the engine imports (parameters as graph
    inputs, no weights) -> `<name>.cache.pb`;
  * DebugOptions(save_onnx=True): the engine's optimized forward graph (our fused ops,
    `<name>_optimized_pre_grad_training.onnx`) and its forward+backward graph (gradient ops,
    `<name>_execution_model_training.onnx`) -> `<name>.optimized.pb`, `<name>.training.pb`.
The extension is .pb, not .onnx, because the repository ignores *.onnx files.

    .venv/bin/python tests/fuzz/make_corpus.py        # rewrites tests/fuzz/corpus/*.pb
"""
from __future__ import annotations

import glob
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")
MAX_BYTES = 200 * 1024  # per file; the whole corpus stays under 2 MB


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, stride=2)
        self.fc = nn.Linear(4, 5)

    def forward(self, x, y):
        h = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)
        h = F.adaptive_avg_pool2d(F.relu(self.conv2(h)), 1).flatten(1)  # (B, 4)
        return F.cross_entropy(self.fc(h), y)


class Indexing(nn.Module):
    """Embedding, gather, index_select, advanced indexing, where and a masked mean."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.proj = nn.Linear(6, 4)

    def forward(self, ids, pick):
        e = self.emb(ids)                                    # (B, T, 6)
        g = torch.gather(e, 1, pick[:, :, None].expand(-1, -1, 6))
        s = torch.index_select(self.proj(g), 2, torch.tensor([0, 2]))
        m = (ids > 3)[:, : s.shape[1], None]
        return torch.where(m, s, s * 0.5).mean() + e[:, 0].sum()


class ShapeOps(nn.Module):
    """Reshape, transpose, concat, slice, squeeze/unsqueeze, expand."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6) * 0.1)

    def forward(self, x):                                     # (B, 4, 6)
        b = x.shape[0]
        h = torch.cat([x, x.transpose(1, 2).reshape(b, 4, 6)], dim=2)  # (B, 4, 12)
        s = h[:, 1:3, ::2]                                    # (B, 2, 6)
        a, c = s[:, :, :3], s[:, :, 3:]                       # (B, 2, 3) each
        h = (a * c).unsqueeze(1).expand(b, 2, 2, 3).reshape(b, -1)
        return (h.sum() + (x * self.w).flatten(1)[:, 2:10].squeeze().pow(2).sum())


def cases():
    from model_zoo import NanoGPT

    gen = torch.Generator().manual_seed(0)
    gpt = NanoGPT(vocab=16, width=8, heads=2, layers=1, positions=8)
    ids = torch.randint(0, 16, (2, 6), generator=gen)
    yield "mlp", MLP(), (torch.randn(4, 6, generator=gen), torch.randint(0, 3, (4,), generator=gen))
    yield "gpt", gpt, (ids, torch.randint(0, 16, (2, 6), generator=gen))
    yield "cnn", CNN(), (torch.randn(2, 3, 8, 8, generator=gen), torch.randint(0, 5, (2,), generator=gen))
    yield "index", Indexing(), (torch.randint(0, 11, (2, 5), generator=gen),
                                torch.randint(0, 5, (2, 3), generator=gen))
    yield "shapes", ShapeOps(), (torch.randn(3, 4, 6, generator=gen),)


def _strip(path: str) -> bytes:
    """The graph without the exporter's per-node metadata (stack traces, FX node text: 90% of the
    bytes), which the importer never reads; smaller inputs make faster fuzzing."""
    import onnx

    model = onnx.load(path)
    model.ClearField("metadata_props")
    for graph in (model.graph,):
        graph.doc_string = ""
        for node in graph.node:
            node.ClearField("metadata_props")
            node.doc_string = ""
        for vi in (*graph.input, *graph.output, *graph.value_info):
            vi.ClearField("metadata_props")
    return model.SerializeToString()


def main() -> None:
    from torch_ort import DebugOptions, ORTModule

    os.makedirs(OUT, exist_ok=True)
    for old in glob.glob(os.path.join(OUT, "*.pb")):
        os.remove(old)
    with tempfile.TemporaryDirectory() as tmp:
        cache, saved = os.path.join(tmp, "cache"), os.path.join(tmp, "saved")
        os.makedirs(cache), os.makedirs(saved)
        os.environ["ORTMODULE_CACHE_DIR"] = cache
        os.environ["ORTMODULE_SAVE_ONNX_PATH"] = saved
        os.environ["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"
        for name, model, args in cases():
            before = set(os.listdir(cache))
            m = ORTModule(model, debug_options=DebugOptions(save_onnx=True, onnx_prefix=name))
            out = m(*args)
            loss = out if isinstance(out, torch.Tensor) else out[1]
            loss.backward()
            graphs = {"cache": [os.path.join(cache, f) for f in set(os.listdir(cache)) - before
                                if f.endswith(".onnx")]}
            for kind, stage in (("optimized", "optimized_pre_grad"), ("training", "execution_model")):
                graphs[kind] = glob.glob(os.path.join(saved, f"{name}_{stage}_training.onnx"))
            for kind, paths in graphs.items():
                if len(paths) != 1:
                    raise SystemExit(f"{name}: expected one {kind} graph, found {paths}")
                size = os.path.getsize(paths[0])
                if size > MAX_BYTES:
                    print(f"skip {name}.{kind}: {size} bytes")
                    continue
                data = _strip(paths[0])
                with open(os.path.join(OUT, f"{name}.{kind}.pb"), "wb") as f:
                    f.write(data)
                print(f"{name}.{kind}.pb: {len(data)} bytes")
    total = sum(os.path.getsize(p) for p in glob.glob(os.path.join(OUT, "*.pb")))
    print(f"corpus: {total} bytes in {OUT}")
    assert total < 2 * 1024 * 1024, "corpus over 2 MB"


if __name__ == "__main__":
    main()
