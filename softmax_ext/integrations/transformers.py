"""softmax_ext in Hugging Face transformers models.

    from softmax_ext.integrations import transformers as sx_transformers
    model = sx_transformers.apply(model)

apply(model) routes
- the loss: a causal-LM or masked-LM head's loss goes to
  softmax_ext.cross_entropy on the logits as they come out of the head (no
  float32 copy of the (tokens, vocab) logits; the maths is float32 inside and
  the loss is returned in float32 with transformers' own float32 value);
- the softmax, log_softmax and cross_entropy calls that the model's modeling
  code makes through ``nn.functional`` / ``nn.CrossEntropyLoss`` (the eager
  attention softmax among them), by giving those modeling modules an ``nn``
  namespace whose entry points are softmax_ext's (torch keeps every call
  softmax_ext does not serve, see softmax_ext.patching);
- nn.Softmax / nn.LogSoftmax / nn.CrossEntropyLoss submodules
  (softmax_ext.nn.swap_softmax).
It changes the modeling modules of the model's architecture for the whole
process (every model of that architecture) until remove(model). Calls made
through ``torch.softmax`` or ``Tensor.softmax`` need softmax_ext.patch().
Works under torch.compile: the routed calls trace to torch.ops.softmax_ext.*.
"""

import functools
import sys
import types
from typing import Dict, Optional

import torch

from .. import nn as sx_nn
from .._cross_entropy import rows_loss
from ..patching import routed

# Modeling modules given the softmax_ext namespace: module -> its own names.
_swapped: Dict[types.ModuleType, Dict[str, object]] = {}


@functools.lru_cache(maxsize=None)
def _functional_namespace() -> types.ModuleType:
    functional = types.ModuleType("softmax_ext.integrations.transformers.functional")
    functional.__dict__.update(vars(torch.nn.functional))
    for name in ("softmax", "log_softmax", "cross_entropy"):
        setattr(functional, name, routed(f"F.{name}"))
    return functional


@functools.lru_cache(maxsize=None)
def _nn_namespace(functional: types.ModuleType) -> types.ModuleType:
    nn = types.ModuleType("softmax_ext.integrations.transformers.nn")
    nn.__dict__.update(vars(torch.nn))
    nn.functional = functional
    nn.CrossEntropyLoss = sx_nn.CrossEntropyLoss
    return nn


def _swap_module_names(module: types.ModuleType, functional, nn) -> None:
    """Points `module`'s names for torch.nn, torch.nn.functional and
    torch.nn.CrossEntropyLoss at softmax_ext's namespaces."""
    replacements = {}
    for name, value in vars(module).items():
        if name.startswith("__"):
            # (torch.compile keeps its own aliases of imported modules in the
            # globals, e.g. __import_torch_dot_nn_dot_functional, and asserts
            # they still hold the module)
            continue
        if value is torch.nn:
            replacements[name] = nn
        elif value is torch.nn.functional:
            replacements[name] = functional
        elif value is torch.nn.CrossEntropyLoss:
            replacements[name] = sx_nn.CrossEntropyLoss
    if replacements:
        _swapped[module] = {name: getattr(module, name) for name in replacements}
        for name, value in replacements.items():
            setattr(module, name, value)


def _modeling_modules(model: torch.nn.Module):
    names = {type(m).__module__ for m in model.modules()}
    return [sys.modules[n] for n in sorted(names) if n.startswith("transformers.") and n in sys.modules]


def _fixed_cross_entropy(source, target, num_items_in_batch=None, ignore_index: int = -100, **kwargs):
    """transformers' fixed_cross_entropy on softmax_ext: "sum" divided by
    num_items_in_batch when given, "mean" otherwise; a float32 loss whose
    value is the float32 one transformers computes on `logits.float()`."""
    reduction = "sum" if num_items_in_batch is not None else "mean"
    # acc_loss: the loss in float32 for 16-bit logits (not rounded to 16 bits)
    loss = rows_loss(source, target, None, ignore_index, reduction, 0.0, acc_loss=True)
    if reduction == "sum":
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def causal_lm_loss(logits, labels, vocab_size: int, num_items_in_batch=None, ignore_index: int = -100,
                   shift_labels: Optional[torch.Tensor] = None, **kwargs):
    """transformers' ForCausalLMLoss without the float32 copy of the logits."""
    if shift_labels is None:
        labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    logits = logits.reshape(-1, vocab_size)
    shift_labels = shift_labels.reshape(-1).to(logits.device)
    return _fixed_cross_entropy(logits, shift_labels, num_items_in_batch, ignore_index)


def masked_lm_loss(logits, labels, vocab_size: int, num_items_in_batch=None, ignore_index: int = -100, **kwargs):
    """transformers' ForMaskedLMLoss without the float32 copy of the logits."""
    logits = logits.reshape(-1, vocab_size)
    labels = labels.reshape(-1).to(logits.device)
    return _fixed_cross_entropy(logits, labels, num_items_in_batch, ignore_index)


_LOSSES = {"ForCausalLMLoss": causal_lm_loss, "ForMaskedLMLoss": masked_lm_loss}


def apply(model: torch.nn.Module) -> torch.nn.Module:
    """Routes `model`'s loss, softmax and log_softmax to softmax_ext (see the
    module's docstring); returns the model."""
    # the same namespace objects on every call: torch.compile guards on the
    # modules' globals, so re-applying reuses the compiled code
    functional = _functional_namespace()
    nn = _nn_namespace(functional)
    for module in _modeling_modules(model):
        if module not in _swapped:
            _swap_module_names(module, functional, nn)
    try:
        loss = model.loss_function
    except (AttributeError, KeyError):
        loss = None
    ours = _LOSSES.get(getattr(loss, "__name__", ""))
    if ours is not None:
        model.loss_function = ours
    sx_nn.swap_softmax(model)
    return model


def remove(model: Optional[torch.nn.Module] = None) -> None:
    """Gives every modeling module changed by apply() its own names back, and
    `model` (if given) transformers' own loss function. Swapped submodules
    stay softmax_ext modules."""
    while _swapped:
        module, names = _swapped.popitem()
        for name, value in names.items():
            setattr(module, name, value)
    if model is not None and getattr(model, "_loss_function", None) in _LOSSES.values():
        del model._loss_function
