"""Training steps of real transformer models: plain torch beside softmax_ext,
eager and torch.compile, in one process.

    python -m benchmarks.bench_models [--models gpt2,bert,llama,vit,t5,clip]
        [--dtypes bfloat16,float32] [--modes eager,compiled] [--batch 4]
        [--variants torch,patch,integration,control] [--rounds 8] [--steps 3] [--paired] [--csv PATH]

Each model is a small random-init Hugging Face config (eager attention, no
dropout) trained with AdamW on fixed random data: --batch (4) sequences of 512 tokens
(ViT: 4 x batch images of 224x224; CLIP: 4 x batch image-text pairs). Variants:
- torch: the model as it is;
- patch: softmax_ext.patch() (torch.softmax, F.softmax, F.cross_entropy, ...
  routed to softmax_ext);
- integration: softmax_ext.integrations.transformers.apply(model) plus
  patch() (the loss on the head's logits without the float32 copy);
- control: plain torch again, a second copy timed like the others (an A/A
  run: its ratio to the torch variant is the noise of the measurement).
Every variant has its own copy of the same initial weights and data, so the
loss curves must agree. The variants of a (model, dtype, mode) are warmed up,
then timed in interleaved rounds (--steps steps of each variant per round, in
a rotating order), each step synchronised: what a training loop feels, host
time included. Reported: the median step time, the first and last loss, the
largest loss difference from the torch variant, and the memory a step
allocates beyond the resident weights and optimiser state (median). For the
Llama model (vocabulary 128256), --loss-profile adds the GPU time of the
loss's own kernels (cross-entropy / log_softmax / nll forward and backward).
Every row also gives the GPU time of all of a step's kernels (from a profile
of a few steps): a step whose wall time is well above it is host-bound.

--paired times every variant on one copy of the model (one set of weights,
optimiser state, compiled function and data), switching the routing between
steps: what differs between two copies (where their tensors and Python
objects sit) then falls on no variant, and the comparison is of the
routing alone. The loss columns mean nothing there (the variants train one
model in turns); the unpaired run compares the loss curves.
"""

import argparse
import contextlib
import copy
import csv
import gc
import statistics
import sys
import time

import torch

import softmax_ext

MODELS = ("gpt2", "bert", "llama", "vit", "t5", "clip")
VARIANTS = ("torch", "patch", "integration", "control")


def build(name: str, batch: int = 4):
    """(model, make_batch(generator) -> kwargs) for a small random-init config,
    `batch` sequences of 512 tokens a step (ViT and CLIP: 4 * batch images)."""
    import transformers as tf

    seq = 512
    common = dict(attn_implementation="eager")
    if name == "gpt2":
        cfg = tf.GPT2Config(vocab_size=50257, n_embd=512, n_layer=4, n_head=8, n_positions=seq,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
        model, vocab = tf.GPT2LMHeadModel(cfg), 50257
    elif name == "bert":
        cfg = tf.BertConfig(vocab_size=30522, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                            intermediate_size=2048, max_position_embeddings=seq, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, **common)
        model, vocab = tf.BertForMaskedLM(cfg), 30522
    elif name == "llama":
        cfg = tf.LlamaConfig(vocab_size=128256, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                             num_key_value_heads=4, intermediate_size=1408, max_position_embeddings=seq, **common)
        model, vocab = tf.LlamaForCausalLM(cfg), 128256
    elif name == "t5":
        cfg = tf.T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=4, num_heads=8,
                          dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, **common)
        model, vocab = tf.T5ForConditionalGeneration(cfg), 32128
    elif name == "vit":
        cfg = tf.ViTConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048,
                           num_labels=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common)
        model = tf.ViTForImageClassification(cfg)

        def make_vit(g, device):
            return dict(pixel_values=torch.randn(4 * batch, 3, 224, 224, generator=g).to(device),
                        labels=torch.randint(0, 1000, (4 * batch,), generator=g).to(device))

        return model, make_vit
    elif name == "clip":
        cfg = tf.CLIPConfig(
            text_config=dict(vocab_size=49408, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                             intermediate_size=2048, max_position_embeddings=77),
            vision_config=dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                               intermediate_size=2048, image_size=224, patch_size=16),
            **common)
        model = tf.CLIPModel(cfg)

        def make_clip(g, device):
            return dict(input_ids=torch.randint(0, 49408, (4 * batch, 77), generator=g).to(device),
                        pixel_values=torch.randn(4 * batch, 3, 224, 224, generator=g).to(device), return_loss=True)

        return model, make_clip
    else:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")

    def make_text(g, device):
        ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
        labels = ids.clone()
        if name == "t5":
            return dict(input_ids=ids, labels=labels[:, : seq // 4].contiguous())  # (some transformers view() them)
        return dict(input_ids=ids, labels=labels)

    return model, make_text


@contextlib.contextmanager
def variant_context(variant: str, model):
    """The variant's routing on for the block: none (torch, control), patch(),
    or patch() plus the transformers integration of `model`."""
    from softmax_ext.integrations import transformers as sx_transformers

    if variant not in ("torch", "control"):
        softmax_ext.patch()
    if variant == "integration":
        sx_transformers.apply(model)
    try:
        yield model
    finally:
        softmax_ext.unpatch()
        if variant == "integration":
            sx_transformers.remove(model)


def _loss_of(out):
    return out.loss if hasattr(out, "loss") else out["loss"]


class Case:
    """One variant of one model: its own weights (the same initial values for
    every variant), optimiser, compiled function and data."""

    def __init__(self, name, dtype, mode, variant, device, batch=4):
        torch.manual_seed(0)
        model, make_batch = build(name, batch)
        self.model = model.to(device=device, dtype=dtype).train()
        if hasattr(self.model.config, "use_cache"):
            self.model.config.use_cache = False
        g = torch.Generator().manual_seed(1)
        self.batches = [make_batch(g, device) for _ in range(4)]
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.variant = variant
        self.fwd = torch.compile(self.model) if mode == "compiled" else self.model
        self.i = 0
        self.losses, self.times, self.peaks = [], [], []
        self.error = None  # what a timed step raised

    def view(self, variant):
        """Another variant on this case's model, optimiser, compiled function
        and data (--paired), with its own times."""
        other = copy.copy(self)
        other.variant = variant
        other.losses, other.times, other.peaks = [], [], []
        other.error = None
        return other

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        loss = _loss_of(self.fwd(**self.batches[self.i % len(self.batches)]))
        loss.backward()
        self.opt.step()
        self.i += 1
        return loss.detach()

    def run(self, steps: int, timed: bool) -> None:
        """`steps` steps in this variant's state, each synchronised. Python's
        garbage collector runs before the steps and not during them (as
        timeit does): these small models' steps are host-bound, and a
        collection's pause would land on whichever variant happens to run."""
        gc.collect()
        gc.disable()
        try:
            self._run(steps, timed)
        finally:
            gc.enable()

    def _run(self, steps: int, timed: bool) -> None:
        with variant_context(self.variant, self.model):
            for _ in range(steps):
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                loss = self.step()
                torch.cuda.synchronize()
                if timed:
                    self.times.append((time.perf_counter() - t0) * 1e3)
                    self.peaks.append((torch.cuda.max_memory_allocated() - base) / 2**20)
                self.losses.append(float(loss))


def run_model(name, dtype, mode, variants, steps, warmup, rounds, device, loss_profile, batch=4, paired=False):
    """The variants of one (model, dtype, mode), timed in interleaved rounds
    (each round runs every variant for `steps` steps, in a rotating order), so
    that drifts of the machine fall on every variant alike. paired: every
    variant on the first one's model (Case.view)."""
    cases = []
    first = None
    for variant in variants:
        try:
            if paired and first is not None:
                case = first.view(variant)
            else:
                case = Case(name, dtype, mode, variant, device, batch)
                first = first or case
            case.run(warmup, timed=False)
            cases.append(case)
        except Exception as e:  # noqa: BLE001  (a crash is a result to record)
            cases.append(f"{type(e).__name__}: {str(e)[:200]}")
            print(f"  {name} {dtype} {mode} {variant}: {cases[-1]}", flush=True)
    live = [c for c in cases if isinstance(c, Case)]
    for r in range(rounds):
        for k in range(len(live)):
            case = live[(r + k) % len(live)]
            if case.error is None:
                try:
                    case.run(steps, timed=True)
                except Exception as e:  # noqa: BLE001  (recorded; the other variants go on)
                    case.error = f"{type(e).__name__}: {str(e)[:200]}"
                    print(f"  {name} {dtype} {mode} {case.variant}: {case.error}", flush=True)
    cases = [c.error if isinstance(c, Case) and c.error is not None else c for c in cases]
    rows = []
    for variant, case in zip(variants, cases):
        row = dict(model=name, dtype=str(dtype).replace("torch.", ""), mode=mode, variant=variant)
        if isinstance(case, str):
            row["error"] = case
        else:
            row.update(step_ms=statistics.median(case.times), step_ms_min=min(case.times),
                       loss_first=case.losses[0], loss_last=case.losses[-1],
                       peak_mib=statistics.median(case.peaks), losses=case.losses)
            with variant_context(variant, case.model):
                profile = _profile_step(case.step)
            row["gpu_ms"] = profile.step_ms
            if loss_profile:
                row["loss_gpu_ms"], row["loss_kernels"] = profile.loss_ms, profile.loss_kernels
        rows.append(row)
    return rows


# Kernel names of the loss, forward and backward: softmax_ext's ce_forward /
# ce_reduce / ce_backward kernels, torch's log_softmax (cunn_SoftMax... with a
# LogSoftMax epilogue) and nll_loss kernels, inductor's fused
# triton_*_log_softmax*_nll_loss* kernels. (Attention softmax kernels are
# not matched: no "log" and no "nll" in their names.)
_LOSS_KERNEL_MARKS = ("cross_entropy", "nll", "log_softmax", "logsoftmax", "logsumexp", "ce_forward", "ce_reduce",
                      "ce_backward")


class _StepProfile:
    """GPU time per step (ms) of every kernel, and of the loss's kernels."""

    def __init__(self, step_ms, loss_ms, loss_kernels):
        self.step_ms, self.loss_ms, self.loss_kernels = step_ms, loss_ms, loss_kernels


def _profile_step(step, reps=3):
    """The GPU time of a step's kernels, all of them and those that compute
    the loss (forward and backward), from a profile of `reps` steps. Beside
    the step's wall time it tells host-bound steps from GPU-bound ones."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    every, loss, names = 0.0, 0.0, set()
    for e in prof.key_averages():
        if e.device_type.name != "CUDA":
            continue
        every += e.device_time_total
        if any(m in e.key.lower() for m in _LOSS_KERNEL_MARKS):
            loss += e.device_time_total
            names.add(e.key[:60])
    return _StepProfile(every / reps / 1e3, loss / reps / 1e3, ";".join(sorted(names)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--variants", default="torch,patch,integration")
    parser.add_argument("--steps", type=int, default=3, help="timed steps of a variant in each round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--loss-profile", action="store_true", help="profile the loss kernels of the llama model")
    parser.add_argument("--batch", type=int, default=4,
                        help="sequences of 512 tokens a step (ViT, CLIP: 4x this many images); "
                             "larger batches make the steps GPU-bound")
    parser.add_argument("--paired", action="store_true",
                        help="every variant on one copy of the model, the routing switched between steps")
    parser.add_argument("--csv", default=None)
    args = parser.parse_args(argv)
    if min(args.steps, args.warmup, args.rounds) < 1:
        parser.error("--steps, --rounds and --warmup must be at least 1")
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"--variants: unknown {sorted(unknown)}; accepted: {', '.join(VARIANTS)}")
    if not torch.cuda.is_available():
        print("bench_models needs a CUDA device", file=sys.stderr)
        return 1
    device = "cuda"
    rows = []
    fields = ["model", "dtype", "mode", "variant", "step_ms", "step_ms_min", "ratio_vs_torch", "loss_first",
              "loss_last", "max_loss_diff", "peak_mib", "gpu_ms", "loss_gpu_ms", "loss_kernels", "error"]
    writer = None
    if args.csv:
        f = open(args.csv, "w", newline="")
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
    print(f"training steps on {torch.cuda.get_device_name()}, torch {torch.__version__}, batch {args.batch}")
    for name in args.models.split(","):
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            for mode in args.modes.split(","):
                torch._dynamo.reset()
                found = run_model(name, dtype, mode, args.variants.split(","), args.steps, args.warmup,
                                  args.rounds, device, args.loss_profile and name == "llama", args.batch,
                                  args.paired)
                base = next((r for r in found if r["variant"] == "torch" and "step_ms" in r), None)
                for row in found:
                    if base is not None and "step_ms" in row:
                        row["ratio_vs_torch"] = row["step_ms"] / base["step_ms"]
                        if not args.paired:
                            row["max_loss_diff"] = max(abs(a - b) for a, b in zip(row["losses"], base["losses"]))
                    rows.append(row)
                    if writer:
                        writer.writerow(row)
                        f.flush()
                    if "step_ms" in row:
                        print(f"  {name:6s} {dtype_name:8s} {mode:8s} {row['variant']:11s} {row['step_ms']:8.2f} ms "
                              f"x{row.get('ratio_vs_torch', float('nan')):.3f} "
                              f"loss {row['loss_first']:.4f}->{row['loss_last']:.4f} "
                              f"step peak {row['peak_mib']:.0f} MiB", flush=True)
    print()
    print(f"{'model':6s} {'dtype':8s} {'mode':8s} {'variant':11s} {'step ms':>8s} {'x torch':>7s} "
          f"{'max dloss':>9s} {'peak MiB':>8s} {'GPU ms':>7s} {'loss GPU ms':>11s}")
    for r in rows:
        if "step_ms" not in r:
            print(f"{r['model']:6s} {r['dtype']:8s} {r['mode']:8s} {r['variant']:11s} ERROR {r['error'][:60]}")
            continue
        print(f"{r['model']:6s} {r['dtype']:8s} {r['mode']:8s} {r['variant']:11s} {r['step_ms']:8.2f} "
              f"{r.get('ratio_vs_torch', float('nan')):7.3f} {r.get('max_loss_diff', float('nan')):9.2e} "
              f"{r['peak_mib']:8.0f} {r['gpu_ms']:7.2f} {r.get('loss_gpu_ms', float('nan')):11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
