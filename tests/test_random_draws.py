"""Seeded draws over the softmax family's whole argument space at once:
rank 0-4, sizes from 1 to vocabulary-sized rows (CUDA), any axis, views
(transposed, step-sliced, narrowed with an offset, expanded), every dtype,
the forward's dtype= argument; forward values and output strides, and the
backward ops on views, against float64. The structured tests cover each
case apart; these cover their combinations, shapes no list names."""

import random

import pytest
import torch

from conftest import (
    BACKWARD_OPS,
    DEVICES,
    DTYPES,
    FORWARD_OPS,
    check_backward,
    check_forward,
    make_backward_inputs,
    make_input,
)


def _shape(rng, device):
    rank = rng.choice([0, 1, 2, 2, 3, 3, 4])
    small = [1, 2, 3, 5, 17, 33, 100]
    long = [257, 1000, 4097] + ([33000, 70000] if device == "cuda" else [])
    shape = [rng.choice(small) for _ in range(rank)]
    if rank and rng.random() < 0.5:  # one long dim, kept to a few rows
        shape[rng.randrange(rank)] = rng.choice(long)
        while rank > 1 and torch.Size(shape).numel() > 400_000:
            i = max(range(rank), key=lambda d: shape[d] if shape[d] < 257 else 0)
            if shape[i] == 1:
                break
            shape[i] = max(1, shape[i] // 3)
    return tuple(shape)


def _view(rng, x):
    """A random view of x (no copy) and how its dims map to x's: (view, perm)."""
    perm = list(range(x.dim()))
    kind = rng.choice(["none", "transpose", "step", "narrow", "expand"])
    if x.dim() >= 2 and kind == "transpose":
        a, b = rng.sample(range(x.dim()), 2)
        perm[a], perm[b] = perm[b], perm[a]
        return x.transpose(a, b), perm
    if x.dim() >= 1 and kind == "step":
        d = rng.randrange(x.dim())
        index = [slice(None)] * x.dim()
        index[d] = slice(rng.choice([0, 1]) if x.shape[d] > 1 else 0, None, rng.choice([2, 3]))
        return x[tuple(index)], perm
    if x.dim() >= 1 and kind == "narrow":
        d = rng.randrange(x.dim())
        if x.shape[d] > 2:
            return x.narrow(d, 1, x.shape[d] - 2), perm
    if kind == "expand":
        ones = [d for d in range(x.dim()) if x.shape[d] == 1]
        if ones:
            sizes = list(x.shape)
            sizes[rng.choice(ones)] = rng.choice([2, 5])
            return x.expand(sizes), perm
    return x, perm


@pytest.mark.parametrize("device", DEVICES)
def test_random_forward_draws(device):
    rng = random.Random(11)
    for i in range(150):
        dtype = rng.choice(DTYPES)
        base = make_input(_shape(rng, device), dtype, device, seed=300 + i)
        x, _ = _view(rng, base)
        dim = rng.randrange(-max(x.dim(), 1), max(x.dim(), 1))
        out_dtype = None
        if dtype in (torch.float16, torch.bfloat16) and rng.random() < 0.3:
            out_dtype = torch.float32
        name = rng.choice(FORWARD_OPS)
        check_forward(name, x, dim, out_dtype, via_op=rng.random() < 0.3, msg=f"draw {i}")


@pytest.mark.parametrize("device", DEVICES)
def test_random_backward_draws(device):
    rng = random.Random(12)
    for i in range(120):
        dtype = rng.choice(DTYPES)
        shape = _shape(rng, device)
        dim = rng.randrange(-max(len(shape), 1), max(len(shape), 1))
        name = rng.choice(BACKWARD_OPS)
        dy, y = make_backward_inputs(name, shape, dim, dtype, device, seed=500 + i)
        if len(shape) >= 2 and rng.random() < 0.5:  # both as transposed views; the axis moves with them
            a, b = rng.sample(range(len(shape)), 2)
            dy, y = dy.transpose(a, b), y.transpose(a, b)
            d = dim % len(shape)
            dim = b if d == a else a if d == b else d
        elif rng.random() < 0.3:  # dy read through another layout than y
            dy = dy.t().contiguous().t() if dy.dim() == 2 else dy
        check_backward(name, dy, y, dim, via_op=rng.random() < 0.3, msg=f"draw {i}")
