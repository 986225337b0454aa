"""The cnn family (csrc/core/ops/cnn.cc): convolutions, pooling, batch normalization and their gradients."""
import torch
import torch.nn.functional as F

from op_table import Case, OURS, f, i64, pos  # noqa: F401


NEG_INF = float("-inf")


def flat_indices(y_idx, x):
    """ATen's per-plane argmax -> ONNX's index into the whole flattened input."""
    n, c = x.shape[:2]
    plane = x[0, 0].numel()
    offsets = (torch.arange(n * c) * plane).reshape(n, c, *([1] * (x.dim() - 2)))
    return y_idx + offsets


def max_pool_with_flat_indices(fn, **kw):
    def ref(x):
        y, idx = fn(x, return_indices=True, **kw)
        return y, flat_indices(idx, x)
    return ref


def windows_2d(x, k, s, pads, fill):
    """(N, C, OH, OW, kh*kw) windows of x padded by pads = (top, left, bottom, right) with `fill`."""
    t, l, b, r = pads
    xp = F.pad(x, (l, r, t, b), value=fill)
    n, c = x.shape[:2]
    oh, ow = (xp.shape[2] - k[0]) // s[0] + 1, (xp.shape[3] - k[1]) // s[1] + 1
    cols = F.unfold(xp.reshape(n * c, 1, *xp.shape[2:]), k, stride=s)  # (N*C, kh*kw, OH*OW)
    return cols.transpose(1, 2).reshape(n, c, oh, ow, -1)


def avg_pool_unfold(k, s, pads, count_include_pad):
    def ref(x):
        w = windows_2d(x, k, s, pads, 0.0 if count_include_pad else float("nan"))
        return w.mean(-1) if count_include_pad else w.nanmean(-1)
    return ref


def bn_eval(x, w, b, m, v):
    return F.batch_norm(x, m, v, w, b, training=False, eps=1e-3)


def bn_onnx_training(x, w, b, m, v):  # ONNX: running = input·momentum + batch·(1 − momentum), biased var
    dims = [0, *range(2, x.dim())]
    y = F.batch_norm(x, None, None, w, b, training=True, eps=1e-5)
    var, mean = torch.var_mean(x.detach(), dims, correction=0)
    return y, m * 0.8 + mean * 0.2, v * 0.8 + var * 0.2


def bn_torch_training(x, w=None, b=None, m=None, v=None, momentum=0.1, eps=1e-5):
    """PyTorch's own training step: (Y, new running mean, new running var, saved mean, inv-std)."""
    rm, rv = (m.clone(), v.clone()) if m is not None else (None, None)
    y, save_mean, save_invstd = torch.native_batch_norm(x, w, b, rm, rv, True, momentum, eps)
    if m is None:
        return y
    return y, rm, rv, save_mean.detach(), save_invstd.detach()


def bn_grad(training, with_saved):
    def ref(dy, x, w, s3=None, s4=None):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        bs = torch.zeros_like(w, requires_grad=True)
        if training:
            y = F.batch_norm(xs, None, None, ws, bs, training=True, eps=1e-5)
        else:
            y = F.batch_norm(xs, s3, s4, ws, bs, training=False, eps=1e-5)
        return torch.autograd.grad(y, [xs, ws, bs], dy)
    return ref


def conv_grad(transposed, **kw):
    def ref(dy, x, w):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        cout = w.shape[1] * kw.get("groups", 1) if transposed else w.shape[0]
        bs = torch.zeros(cout, requires_grad=True)
        fn = F.conv_transpose2d if transposed else F.conv2d
        return torch.autograd.grad(fn(xs, ws, bs, **kw), [xs, ws, bs], dy)
    return ref


def pool_grad(fn, x_shape, **kw):
    def ref(dy, *rest):
        x = torch.zeros(x_shape, requires_grad=True)  # avg-pool gradients do not depend on X
        return torch.autograd.grad(fn(x, **kw), x, dy)[0]
    return ref


def max_pool_grad_ref(dy, idx, shape):
    dx = torch.zeros(int(torch.prod(shape)))
    return dx.index_add(0, idx.reshape(-1), dy.reshape(-1)).reshape(*shape.tolist())


_x4, _x3, _x5 = f(2, 4, 7, 6), f(2, 4, 9), f(1, 2, 5, 4, 6)


_pool_x = f(2, 3, 8, 7)
_gmp_x = f(2, 3, 4, 5)
_mp = F.max_pool2d(_pool_x, 2, 2, return_indices=True)


CASES = [
    # --- Conv: X (N, C, D...), W (M, C/group, k...), [B]
    Case("Conv", [_x4, f(6, 4, 3, 3), f(6)], F.conv2d),
    Case("Conv", [_x4, f(6, 2, 3, 2), None], lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 0),
                                                                      dilation=(1, 2), groups=2),
         attrs=dict(strides=[2, 1], pads=[1, 0, 1, 0], dilations=[1, 2], group=2), id="Conv-group-stride-dilation-nobias"),
    Case("Conv", [_x3, f(5, 4, 4), f(5)], lambda x, w, b: F.conv1d(F.pad(x, (3, 3)), w, b, dilation=2),
         attrs=dict(auto_pad="SAME_UPPER", dilations=[2]), id="Conv-1d-same-upper"),
    Case("Conv", [_x3, f(5, 4, 4), f(5)], lambda x, w, b: F.conv1d(F.pad(x, (2, 1)), w, b),
         attrs=dict(auto_pad="SAME_LOWER"), id="Conv-1d-same-lower-asymmetric"),
    Case("Conv", [_x4, f(3, 4, 2, 3), f(3)], lambda x, w, b: F.conv2d(F.pad(x, (2, 0, 0, 1)), w, b, stride=2),
         attrs=dict(pads=[0, 2, 1, 0], strides=[2, 2]), id="Conv-asymmetric-pads"),
    Case("Conv", [_x5, f(4, 2, 3, 2, 3), f(4)], lambda x, w, b: F.conv3d(x, w, b, padding=1),
         attrs=dict(pads=[1] * 6, kernel_shape=[3, 2, 3]), id="Conv-3d"),
    Case("Conv", [_x4, f(6, 4, 3, 3), f(6)], F.conv2d, attrs=dict(auto_pad="VALID"), id="Conv-valid"),
    Case("Conv", [_x4.double(), f(6, 4, 3, 3, dtype=torch.float64), None], F.conv2d, id="Conv-f64"),
    # --- ConvTranspose: W (C, M/group, k...)
    Case("ConvTranspose", [f(2, 4, 5, 5), f(4, 3, 3, 3), f(6)],
         lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2),
         attrs=dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1], group=2), id="ConvTranspose-group-output-padding"),
    Case("ConvTranspose", [f(2, 4, 5, 5), f(4, 2, 3, 2), None],
         lambda x, w: F.conv_transpose2d(x, w, stride=2)[:, :, 1:-1, 0:],
         attrs=dict(strides=[2, 2], pads=[1, 0, 1, 0]), id="ConvTranspose-nobias"),
    Case("ConvTranspose", [f(2, 4, 5, 5), f(4, 2, 3, 3), f(2)],
         lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2)[:, :, 2:, 1:-1],
         attrs=dict(strides=[2, 2], pads=[2, 1, 0, 1]), id="ConvTranspose-asymmetric-pads"),
    Case("ConvTranspose", [f(2, 4, 5, 5), f(4, 2, 3, 3), f(2)],
         lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, dilation=2)[:, :, 2:-1, 2:-1],
         attrs=dict(strides=[2, 2], dilations=[2, 2], output_shape=[10, 10]), id="ConvTranspose-output-shape"),
    Case("ConvTranspose", [_x3, f(4, 3, 4), f(3)], lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3)[:, :, 0:-1],
         attrs=dict(strides=[3], auto_pad="SAME_UPPER"), id="ConvTranspose-1d-same-upper"),
    Case("ConvTranspose", [f(1, 2, 3, 3, 2), f(2, 2, 2, 2, 2), None],
         lambda x, w: F.conv_transpose3d(x, w, stride=2, output_padding=1),
         attrs=dict(strides=[2, 2, 2], output_padding=[1, 1, 1]), id="ConvTranspose-3d"),
    # --- MaxPool (output 1, when asked for: indices into the flattened input)
    Case("MaxPool", [_pool_x], lambda x: F.max_pool2d(x, 2, 2), attrs=dict(kernel_shape=[2, 2], strides=[2, 2])),
    Case("MaxPool", [_pool_x], max_pool_with_flat_indices(F.max_pool2d, kernel_size=3, stride=2, padding=1,
                                                          dilation=2, ceil_mode=True), n_out=2,
         attrs=dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], dilations=[2, 2], ceil_mode=1),
         id="MaxPool-indices-pads-dilation-ceil"),
    Case("MaxPool", [_x3], max_pool_with_flat_indices(F.max_pool1d, kernel_size=3, stride=2), n_out=2,
         attrs=dict(kernel_shape=[3], strides=[2]), id="MaxPool-1d-indices"),
    Case("MaxPool", [_x5], max_pool_with_flat_indices(F.max_pool3d, kernel_size=2, stride=(1, 2, 2), padding=1), n_out=2,
         attrs=dict(kernel_shape=[2, 2, 2], strides=[1, 2, 2], pads=[1] * 6), id="MaxPool-3d-indices"),
    Case("MaxPool", [_pool_x], lambda x: (lambda y, i: (y, flat_indices(
        ((i // 8) - 1) * 7 + (i % 8), x)))(*F.max_pool2d(F.pad(x, (0, 1, 1, 0), value=NEG_INF), 2, 2, return_indices=True)),
         attrs=dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 0, 0, 1]), n_out=2, id="MaxPool-asymmetric-indices"),
    Case("MaxPool", [_pool_x], lambda x: F.max_pool2d(F.pad(x, (1, 1, 0, 1), value=NEG_INF), 3, 3),
         attrs=dict(kernel_shape=[3, 3], strides=[3, 3], auto_pad="SAME_UPPER"), id="MaxPool-same-upper"),
    # --- AveragePool
    Case("AveragePool", [_pool_x], lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
         attrs=dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    Case("AveragePool", [_pool_x], lambda x: F.avg_pool2d(x, (2, 3), 1, (1, 1), count_include_pad=True),
         attrs=dict(kernel_shape=[2, 3], pads=[1, 1, 1, 1], count_include_pad=1), id="AveragePool-count-pads"),
    Case("AveragePool", [_x3], lambda x: F.avg_pool1d(x, 2), attrs=dict(kernel_shape=[2], strides=[2]), id="AveragePool-1d"),
    Case("AveragePool", [_x5], lambda x: F.avg_pool3d(x, 2, 1, 1, count_include_pad=False), attrs=dict(kernel_shape=[2, 2, 2], pads=[1] * 6),
         id="AveragePool-3d"),
    Case("AveragePool", [_pool_x], avg_pool_unfold((2, 2), (2, 2), (1, 0, 1, 1), count_include_pad=False),
         attrs=dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 0, 1, 1]), id="AveragePool-asymmetric-exclude-pad"),
    Case("AveragePool", [_pool_x], avg_pool_unfold((3, 3), (2, 2), (0, 2, 2, 1), count_include_pad=True),
         attrs=dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 2, 2, 1], count_include_pad=1),
         id="AveragePool-asymmetric-count-pads"),
    # --- global pools
    Case("GlobalAveragePool", [_pool_x], lambda x: x.mean((2, 3), keepdim=True)),
    Case("GlobalAveragePool", [_x5], lambda x: x.mean((2, 3, 4), keepdim=True), id="GlobalAveragePool-3d"),
    Case("GlobalMaxPool", [_gmp_x], lambda x: x.amax((2, 3), keepdim=True)),
    Case("GlobalMaxPool", [_x3], lambda x: x.amax(2, keepdim=True), id="GlobalMaxPool-1d"),
    # --- BatchNormalization (ONNX): inference, and training_mode=1 with ONNX's running statistics
    Case("BatchNormalization", [_x4, pos(4), f(4), f(4), pos(4)], bn_eval, attrs=dict(epsilon=1e-3)),
    Case("BatchNormalization", [f(5, 3), pos(3), f(3), f(3), pos(3)], bn_eval, attrs=dict(epsilon=1e-3), opset=9,
         id="BatchNormalization-2d-opset9"),
    Case("BatchNormalization", [_x3, pos(4), f(4), f(4), pos(4)], bn_onnx_training, n_out=3,
         attrs=dict(training_mode=1, momentum=0.8), id="BatchNormalization-training-mode"),
    # --- our BatchNormTraining: PyTorch's training step, running statistics updated functionally
    Case("BatchNormTraining", [_x4, pos(4), f(4), f(4), pos(4)], bn_torch_training, n_out=5, domain=OURS,
         attrs=dict(momentum=0.1, epsilon=1e-5)),
    Case("BatchNormTraining", [_x3, pos(4), f(4), f(4), pos(4)],
         lambda *a: bn_torch_training(*a, momentum=0.3, eps=1e-3), n_out=5, domain=OURS,
         attrs=dict(momentum=0.3, epsilon=1e-3), id="BatchNormTraining-3d"),
    Case("BatchNormTraining", [_x5, None, None, None, None], lambda x: bn_torch_training(x), domain=OURS,
         attrs=dict(momentum=0.1, epsilon=1e-5), id="BatchNormTraining-no-affine-no-stats"),
    # --- gradient ops of ours
    Case("ConvGrad", [f(2, 6, 5, 4), _x4, f(6, 4, 3, 3)], conv_grad(False), n_out=3, domain=OURS),
    Case("ConvGrad", [f(2, 6, 4, 4), _x4, f(6, 2, 3, 2)], conv_grad(False, stride=(2, 1), padding=(1, 0),
                                                                    dilation=(1, 2), groups=2),
         attrs=dict(strides=[2, 1], pads=[1, 0, 1, 0], dilations=[1, 2], group=2), n_out=3, domain=OURS,
         id="ConvGrad-group-stride-dilation"),
    Case("ConvTransposeGrad", [f(2, 6, 10, 10), f(2, 4, 5, 5), f(4, 3, 3, 3)],
         conv_grad(True, stride=2, padding=1, output_padding=1, groups=2),
         attrs=dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1], group=2), n_out=3, domain=OURS),
    Case("MaxPoolGrad", [f(2, 3, 4, 3), flat_indices(_mp[1], _pool_x), i64(2, 3, 8, 7)], max_pool_grad_ref,
         domain=OURS),
    Case("AveragePoolGrad", [f(2, 3, 5, 4), i64(2, 3, 8, 7)],
         pool_grad(F.avg_pool2d, (2, 3, 8, 7), kernel_size=3, stride=2, padding=1, ceil_mode=True,
                   count_include_pad=False),
         attrs=dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1), domain=OURS),
    Case("GlobalMaxPoolGrad", [f(2, 3, 1, 1), _gmp_x, _gmp_x.amax((2, 3), keepdim=True)],
         lambda dy, x, y: dy * (x == y), domain=OURS),
    Case("BatchNormalizationGrad", [f(2, 4, 7, 6), _x4, pos(4)], bn_grad(True, False), n_out=3, domain=OURS,
         id="BatchNormalizationGrad-recompute-stats"),
    Case("BatchNormalizationGrad", [f(2, 4, 7, 6), _x4, pos(4),
                                    _x4.mean((0, 2, 3)), _x4.var((0, 2, 3), unbiased=False).add(1e-5).rsqrt()],
         bn_grad(True, True), n_out=3, domain=OURS, id="BatchNormalizationGrad-saved-stats"),
    Case("BatchNormalizationGrad", [f(2, 4, 7, 6), _x4, pos(4), f(4), pos(4)], bn_grad(False, False), n_out=3,
         attrs=dict(training=0), domain=OURS, id="BatchNormalizationGrad-inference"),
]
