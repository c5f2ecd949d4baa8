"""Drop-in modules for torch.nn.Softmax and torch.nn.LogSoftmax."""

from typing import Optional

import torch

from ._ops import log_softmax, softmax


def _legacy_dim(ndim: int) -> int:
    # torch.nn.functional's rule for dim=None (deprecated there too).
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(torch.nn.Module):
    """softmax along `dim`, like torch.nn.Softmax."""

    def __init__(self, dim: Optional[int] = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax(x, _legacy_dim(x.dim()) if self.dim is None else self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(torch.nn.Module):
    """log_softmax along `dim`, like torch.nn.LogSoftmax."""

    def __init__(self, dim: Optional[int] = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return log_softmax(x, _legacy_dim(x.dim()) if self.dim is None else self.dim)

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
