"""Hugging Face call conventions: use_cache off in grad mode unless asked for; caches as pytrees.

transformers' decoder models (GPT-2, Llama, ...) default to use_cache=True and return a
`DynamicCache` holding every layer's keys and values. In a training step nothing reads it: the
loop takes `.loss` (or `.logits`), and Hugging Face itself turns the cache off whenever it trains
with gradient checkpointing. Returning it from our graph would cost a graph output per key/value
tensor and a zero gradient for each in backward. So ORTModule decides, per call:

- grad mode is on (gradients may flow) and the caller did not pass `use_cache` or
  `past_key_values`: the model runs with `use_cache=False` (logged once at INFO). A wrapper that
  passes its keyword arguments on to a model that takes `use_cache` (peft's PeftModel around a
  causal LM) is called the same way. The loss, the
  logits and their gradients are exactly eager's; `past_key_values` is simply absent.
- anything else (`use_cache=True` passed explicitly, a cache passed in, or a forward-only call
  under `torch.no_grad()`): the model's own behaviour holds, and the DynamicCache leaves the graph
  as tensors (transformers' own pytree registration) and comes back rebuilt as a DynamicCache; an
  encoder-decoder's EncoderDecoderCache (T5, BART) as its two DynamicCaches (ours, below).

Saving and loading are not here: accelerate saves an ORTModule through state_dict/load_state_dict
(the wrapped model's keys) as it is, and the Trainer's pretrained checkpoints come from
torch_ort.utils.hf.Trainer. Nothing in torch_ort replaces a function of transformers or accelerate.
"""
from __future__ import annotations

import functools
import inspect
import sys
import weakref

import torch

from torch_ort.ortmodule.policy.debug_options import LOGGER

_logged: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
_cache_registered = False


def register_cache_pytree() -> bool:
    """Lets torch.export flatten a transformers DynamicCache and EncoderDecoderCache (idempotent).
    False if unavailable."""
    global _cache_registered
    if not _cache_registered:
        try:
            from transformers.integrations.executorch import register_dynamic_cache_export_support
        except ImportError:  # an older or newer transformers without the helper
            return False
        register_dynamic_cache_export_support()
        _register_encoder_decoder_cache()
        _cache_registered = True
    return True


def _register_encoder_decoder_cache() -> None:
    """EncoderDecoderCache as a pytree node: its self-attention and cross-attention DynamicCaches
    are the children; which cross-attention layers are filled (is_updated, read by the next
    decoding step) is the context, so the rebuilt cache is reused exactly as eager's."""
    from torch.utils import _pytree

    try:
        from transformers.cache_utils import EncoderDecoderCache
    except ImportError:
        return
    if EncoderDecoderCache in _pytree.SUPPORTED_NODES:
        return
    names = ("self_attention_cache", "cross_attention_cache")

    def flatten(cache):
        return [getattr(cache, n) for n in names], tuple(sorted(cache.is_updated.items()))

    def flatten_with_keys(cache):
        children, context = flatten(cache)
        return [(_pytree.GetAttrKey(n), c) for n, c in zip(names, children)], context

    def unflatten(children, context):
        cache = EncoderDecoderCache(*children)
        cache.is_updated = dict(context)
        return cache

    _pytree.register_pytree_node(
        EncoderDecoderCache, flatten, unflatten, flatten_with_keys_fn=flatten_with_keys,
        serialized_type_name=f"{EncoderDecoderCache.__module__}.{EncoderDecoderCache.__name__}")


@functools.lru_cache(maxsize=128)
def _unbound_signature(func) -> inspect.Signature | None:
    """A class's forward() signature without `self`, computed once per class."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def _forward_signature(module: torch.nn.Module) -> inspect.Signature | None:
    func = getattr(module.forward, "__func__", None)
    if func is not None:
        return _unbound_signature(func)
    try:  # forward replaced on the instance: no cache
        return inspect.signature(module.forward)
    except (TypeError, ValueError):
        return None


def _wrapped_model(module: torch.nn.Module) -> torch.nn.Module | None:
    """The model a wrapper hands its calls to (peft's PeftModel.get_base_model()), or None."""
    get_base_model = getattr(module, "get_base_model", None)
    inner = get_base_model() if callable(get_base_model) else None
    return inner if isinstance(inner, torch.nn.Module) and inner is not module else None


def _takes_use_cache(module: torch.nn.Module) -> bool:
    config = getattr(module, "config", None)
    if not getattr(config, "use_cache", False):
        return False  # the model does not build a cache by default
    sig = _forward_signature(module)
    if sig is None:
        return False
    if "use_cache" in sig.parameters:
        return True
    # A wrapper whose forward passes **kwargs on to the model it wraps (peft's PeftModel with a
    # LoRA adapter): the wrapped model's forward decides.
    passes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    inner = _wrapped_model(module) if passes_kwargs else None
    return inner is not None and _takes_use_cache(inner)


def adapt_call(module: torch.nn.Module, args: tuple, kwargs: dict, grad_enabled: bool) -> dict:
    """The keyword arguments ORTModule runs `module` with (a new dict when it changes any)."""
    if not _takes_use_cache(module):
        return kwargs
    if "transformers" in sys.modules:  # the model may build a DynamicCache; never import it ourselves
        register_cache_pytree()
    if not grad_enabled:
        return kwargs
    try:
        bound = _forward_signature(module).bind_partial(*args, **kwargs).arguments
    except TypeError:
        return kwargs  # a call eager would reject too; let the model say so
    if "use_cache" in bound or "use_cache" in kwargs or bound.get("past_key_values") is not None \
            or kwargs.get("past_key_values") is not None:
        return kwargs  # the caller asked for a cache: honour it
    if module not in _logged:
        _logged.add(module)
        LOGGER.info("%s: running with use_cache=False while gradients flow (its key/value cache "
                    "is not trained through); pass use_cache=True to get past_key_values",
                    type(module).__name__)
    return {**kwargs, "use_cache": False}
