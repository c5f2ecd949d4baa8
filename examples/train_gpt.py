"""Train a small GPT twice, with plain torch and with softmax_ext.patch(),
under torch.compile, and print both loss curves side by side.

    python examples/train_gpt.py [--device cuda] [--steps 60] [--no-compile]

The model is a few pre-norm transformer blocks written with F.softmax (the
attention) and F.cross_entropy (the loss), as most models are: patch() routes
both to softmax_ext without touching the model's code. Both runs start from
the same weights and see the same batches of a synthetic next-token task
(each sequence counts up from a random start, modulo the vocabulary), so the
two curves agree to rounding and both fall towards zero.
"""

import argparse
import contextlib
import math
import time

import torch
import torch.nn.functional as F

import softmax_ext


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.norm2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + mask
        attn = F.softmax(scores, dim=-1)
        h = h + self.proj((attn @ v).transpose(1, 2).reshape(b, t, d))
        return h + self.mlp(self.norm2(h))


class GPT(torch.nn.Module):
    def __init__(self, vocab: int = 512, d: int = 128, layers: int = 4, heads: int = 4, context: int = 64):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(context, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        h = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        mask = torch.full((t, t), float("-inf"), device=tokens.device).triu(1)
        for block in self.blocks:
            h = block(h, mask)
        logits = self.head(self.norm(h))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def batches(steps: int, batch: int, context: int, vocab: int, device: str):
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        seq = (start + torch.arange(context + 1)) % vocab
        yield seq[:, :-1].to(device), seq[:, 1:].to(device)


def train(patched: bool, args) -> list:
    torch.manual_seed(0)
    model = GPT().to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = torch.compile(model) if args.compile else model
    losses = []
    with softmax_ext.patch() if patched else contextlib.nullcontext():
        for tokens, targets in batches(args.steps, args.batch, 64, 512, args.device):
            opt.zero_grad(set_to_none=True)
            loss = step(tokens, targets)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")

    t0 = time.perf_counter()
    plain = train(False, args)
    t1 = time.perf_counter()
    ours = train(True, args)
    t2 = time.perf_counter()
    how = "torch.compile" if args.compile else "eager"
    print(f"small GPT, {args.device}, {how}: loss per step (plain torch | softmax_ext.patch())")
    for i in range(0, args.steps, max(1, args.steps // 12)):
        print(f"  step {i:4d}   {plain[i]:8.4f} | {ours[i]:8.4f}")
    print(f"  last       {plain[-1]:8.4f} | {ours[-1]:8.4f}")
    print(f"largest difference between the curves: {max(abs(a - b) for a, b in zip(plain, ours)):.2e}")
    print(f"wall time (compilation included): plain {t1 - t0:.1f} s, patched {t2 - t1:.1f} s")


if __name__ == "__main__":
    main()
