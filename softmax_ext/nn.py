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
