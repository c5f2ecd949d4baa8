"""Drop-in modules for torch.nn.Softmax and torch.nn.LogSoftmax, and
swap_softmax() to put them (and CrossEntropyLoss) into an existing model."""

import warnings
from typing import Optional

import torch

from ._ops import log_softmax, softmax


def _implicit_dim(name: str, ndim: int) -> int:
    # torch.nn.functional's rule for dim=None, with its deprecation warning.
    warnings.warn(
        f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X as an argument.",
        stacklevel=3,
    )
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(torch.nn.Module):
    """softmax along `dim`, like torch.nn.Softmax."""

    def __init__(self, dim: Optional[int] = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax(x, _implicit_dim("softmax", x.dim()) if self.dim is None else self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(torch.nn.Module):
    """log_softmax along `dim`, like torch.nn.LogSoftmax."""

    def __init__(self, dim: Optional[int] = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return log_softmax(x, _implicit_dim("log_softmax", x.dim()) if self.dim is None else self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class CrossEntropyLoss(torch.nn.Module):
    """softmax_ext.cross_entropy as a module, like torch.nn.CrossEntropyLoss
    (class-index targets; same constructor arguments, plus inplace_backward:
    write the gradient over the logits in the backward pass)."""

    def __init__(
        self,
        weight: Optional[torch.Tensor] = None,
        size_average=None,
        ignore_index: int = -100,
        reduce=None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        inplace_backward: bool = False,
    ) -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            from torch.nn import _reduction

            reduction = _reduction.legacy_get_string(size_average, reduce)
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.inplace_backward = inplace_backward

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from ._cross_entropy import cross_entropy

        if target.is_floating_point():
            # probability targets: torch's cross_entropy (softmax_ext takes class indices)
            return torch.nn.functional.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                                                     reduction=self.reduction, label_smoothing=self.label_smoothing)
        return cross_entropy(
            input,
            target,
            self.weight,
            self.ignore_index,
            self.reduction,
            self.label_smoothing,
            inplace_backward=self.inplace_backward,
        )

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
            f"label_smoothing={self.label_smoothing}, inplace_backward={self.inplace_backward}"
        )


def _replacement(child: torch.nn.Module) -> Optional[torch.nn.Module]:
    """The softmax_ext module standing in for `child` (exactly one of torch's
    classes, not a subclass with behaviour of its own), or None."""
    kind = type(child)
    if kind is torch.nn.Softmax:
        return Softmax(child.dim)
    if kind is torch.nn.LogSoftmax:
        return LogSoftmax(child.dim)
    if kind is torch.nn.CrossEntropyLoss:
        return CrossEntropyLoss(
            weight=child.weight,
            ignore_index=child.ignore_index,
            reduction=child.reduction,
            label_smoothing=child.label_smoothing,
        )
    return None


def swap_softmax(module: torch.nn.Module) -> int:
    """Replaces, in place, every torch.nn.Softmax, torch.nn.LogSoftmax and
    torch.nn.CrossEntropyLoss submodule of `module` with its softmax_ext
    counterpart (same arguments); returns how many were replaced. `module`
    itself is not replaced (swap its parent's attribute for that)."""
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            new = _replacement(child)
            if new is not None:
                new.train(child.training)
                setattr(parent, name, new)
                replaced += 1
    return replaced
