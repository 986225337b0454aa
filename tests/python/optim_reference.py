"""Plain PyTorch references of torch_ort.optim's update rules, one parameter at a time, in fp32
math (a low-precision parameter is read as fp32 and rounded back once per step). The fused
kernels are compared with these step by step."""
import math


def adam_step(p, g, m, v, *, lr, beta1, beta2, eps, weight_decay, step, bias_correction, mode):
    """One step of AdamWMode `mode` on p (any float dtype); m and v are fp32, updated in place."""
    bc1 = 1 - beta1 ** step if bias_correction else 1.0
    bc2 = 1 - beta2 ** step if bias_correction else 1.0
    w = p.float()
    g = g.float()
    if mode == 2:
        w = w * (1 - lr * weight_decay)
    if mode == 0:
        g = g + weight_decay * w
    m.copy_(beta1 * m + (1 - beta1) * g)
    v.copy_(beta2 * v + (1 - beta2) * (g * g))
    if mode == 2:
        w = w - (lr / bc1) * m / (v.sqrt() * (1 / math.sqrt(bc2)) + eps)
    else:
        w = w - (lr * math.sqrt(bc2) / bc1) * m / (v.sqrt() + eps)
    if mode == 1:
        w = w * (1 - lr * weight_decay)
    p.copy_(w)


def lamb_step(params, grads, ms, vs, *, lr, beta1, beta2, eps, weight_decay, step, bias_correction,
              adam_w_mode, grad_averaging, use_nvlamb, ratio_min, ratio_max, max_weight_norm,
              grad_scale):
    """One LAMB step of a group (fused_lamb.py's formulas); grad_scale includes the clipping."""
    bc1 = 1 - beta1 ** step if bias_correction else 1.0
    bc2 = 1 - beta2 ** step if bias_correction else 1.0
    for p, g, m, v in zip(params, grads, ms, vs):
        w = p.float()
        g = g.float() * grad_scale
        if not adam_w_mode:
            g = g + weight_decay * w
        m.copy_(beta1 * m + ((1 - beta1) if grad_averaging else 1.0) * g)
        v.copy_(beta2 * v + (1 - beta2) * (g * g))
        u = (m * (1 / bc1)) / ((v * (1 / bc2)).sqrt() + eps)
        if adam_w_mode:
            u = u + weight_decay * w
        wn = w.double().norm().item()
        if max_weight_norm is not None:
            wn = min(wn, max_weight_norm)
        un = u.double().norm().item()
        ratio = 1.0
        if use_nvlamb or weight_decay != 0:
            ratio = wn / un if wn > 0 and un > 0 else 1.0
        ratio = min(max(ratio, ratio_min), ratio_max)
        p.copy_(w - (lr * ratio) * u)


def global_norm(grads):
    return math.sqrt(sum(g.double().pow(2).sum().item() for g in grads))
