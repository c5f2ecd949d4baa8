"""softmax_ext inside many Hugging Face architectures: does a training step
run, and does it give torch's loss and gradients?

    python scripts/model_sweep.py [--models all|gpt2,bert,...] [--dtypes bfloat16,float32]
        [--modes eager,compiled] [--variants patch,integration] [--device cuda] [--jobs 8] [--csv PATH]

Each architecture is a tiny random-init config (eager attention) run in
eval mode (no dropout, so every variant computes the same function), one
forward and backward of a fixed batch. For each (dtype, mode) the reference
is plain torch, eager; every variant (`patch`: softmax_ext.patch();
`integration`: softmax_ext.integrations.transformers.apply(model) plus
patch(); `torch`: plain torch, a control for the compiled rows) reports the
loss's relative difference from the reference, the gradients' relative
difference (all parameters as one, and the worst parameter: _compare), and the
softmax_ext ops that ran (from a profile of the step). A compiled variant
that fails is retried as plain torch compiled, to tell softmax_ext's
failures from the model's own. Each (architecture, dtype) runs in a process
of its own, --jobs at a time (compiling is CPU-bound); each prints JSON
lines, the parent a table.
"""

import argparse
import concurrent.futures
import csv
import json
import os
import subprocess
import sys
import threading
import time
import traceback

ARCHS = ("gpt2", "bert", "llama", "vit", "t5", "bart", "qwen2", "clip", "swin", "deberta-v2", "xlnet",
         "groupvit", "perceiver", "wav2vec2", "mixtral", "funnel", "longformer")
SEQ, BATCH, VOCAB = 32, 2, 1000


def build(name):
    """(model, batch kwargs factory(generator, device)) for a tiny config."""
    import torch
    import transformers as tf

    eager = dict(attn_implementation="eager")
    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)

    def tokens(g, device, vocab=VOCAB, seq=SEQ):
        return torch.randint(0, vocab, (BATCH, seq), generator=g).to(device)

    def lm(g, device):
        # labels drawn apart from the inputs: a masked LM that sees its labels
        # copies them, and a loss near 0 is all rounding
        ids = tokens(g, device)
        labels = tokens(g, device)
        labels[:, :3] = -100
        return dict(input_ids=ids, labels=labels)

    def seq2seq(g, device):
        ids = tokens(g, device)
        labels = tokens(g, device, seq=SEQ // 2)
        labels[:, -2:] = -100
        return dict(input_ids=ids, labels=labels)

    def images(g, device, size=32, classes=10):
        return dict(pixel_values=torch.randn(BATCH, 3, size, size, generator=g).to(device),
                    labels=torch.randint(0, classes, (BATCH,), generator=g).to(device))

    def pairs(g, device, size=32):
        return dict(input_ids=tokens(g, device, seq=16), pixel_values=torch.randn(BATCH, 3, size, size, generator=g)
                    .to(device), return_loss=True)

    if name == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=SEQ,
                                                **eager)), lm
    if name == "bert":
        return tf.BertForMaskedLM(tf.BertConfig(vocab_size=VOCAB, max_position_embeddings=SEQ, **small, **eager)), lm
    if name == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=VOCAB, num_key_value_heads=2,
                                                  max_position_embeddings=SEQ, **small, **eager)), lm
    if name == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(vocab_size=VOCAB, num_key_value_heads=2,
                                                  max_position_embeddings=SEQ, **small, **eager)), lm
    if name == "mixtral":
        return tf.MixtralForCausalLM(tf.MixtralConfig(vocab_size=VOCAB, num_key_value_heads=2, num_local_experts=4,
                                                      num_experts_per_tok=2, max_position_embeddings=SEQ,
                                                      output_router_logits=True, **small, **eager)), lm
    if name == "t5":
        return tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                         num_heads=4, decoder_start_token_id=0, pad_token_id=0,
                                                         **eager)), seq2seq
    if name == "bart":
        return tf.BartForConditionalGeneration(tf.BartConfig(
            vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=SEQ,
            **eager)), seq2seq
    if name == "vit":
        return tf.ViTForImageClassification(tf.ViTConfig(image_size=32, patch_size=8, num_labels=10, **small,
                                                         **eager)), images
    if name == "swin":
        return tf.SwinForImageClassification(tf.SwinConfig(image_size=32, patch_size=4, embed_dim=32, depths=[2, 2],
                                                           num_heads=[2, 4], window_size=4, num_labels=10,
                                                           **eager)), images
    if name == "clip":
        return tf.CLIPModel(tf.CLIPConfig(text_config=dict(vocab_size=VOCAB, max_position_embeddings=16, **small),
                                          vision_config=dict(image_size=32, patch_size=8, **small), **eager)), pairs
    if name == "groupvit":
        return tf.GroupViTModel(tf.GroupViTConfig(
            text_config=dict(vocab_size=VOCAB, max_position_embeddings=16, **small),
            vision_config=dict(image_size=32, patch_size=8, hidden_size=64, depths=[2, 2], num_group_tokens=[8, 0],
                               num_output_groups=[4, 4], num_attention_heads=4, intermediate_size=128),
            projection_dim=32, projection_intermediate_dim=64, **eager)), pairs
    if name == "deberta-v2":
        return tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(vocab_size=VOCAB, max_position_embeddings=SEQ,
                                                          relative_attention=True, pos_att_type=["p2c", "c2p"],
                                                          **small, **eager)), lm
    if name == "xlnet":
        return tf.XLNetLMHeadModel(tf.XLNetConfig(vocab_size=VOCAB, d_model=64, n_layer=2, n_head=4, d_inner=128,
                                                  **eager)), lm
    if name == "perceiver":
        return tf.PerceiverForMaskedLM(tf.PerceiverConfig(
            vocab_size=VOCAB, max_position_embeddings=SEQ, num_latents=16, d_latents=64, d_model=64,
            num_blocks=1, num_self_attends_per_block=2, num_self_attention_heads=4, num_cross_attention_heads=4,
            qk_channels=64, v_channels=64, **eager)), lm
    if name == "funnel":
        return tf.FunnelForMaskedLM(tf.FunnelConfig(vocab_size=VOCAB, block_sizes=[1, 1], d_model=64, n_head=4,
                                                    d_head=16, d_inner=128, **eager)), lm
    if name == "longformer":
        return tf.LongformerForMaskedLM(tf.LongformerConfig(vocab_size=VOCAB, max_position_embeddings=SEQ + 2,
                                                            attention_window=8, **small, **eager)), lm
    if name == "wav2vec2":
        def audio(g, device):
            return dict(input_values=torch.randn(BATCH, 4000, generator=g).to(device),
                        labels=torch.randint(1, 30, (BATCH, 6), generator=g).to(device))

        return tf.Wav2Vec2ForCTC(tf.Wav2Vec2Config(vocab_size=32, conv_dim=(32, 32), conv_stride=(5, 2),
                                                   conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                                   num_conv_pos_embedding_groups=4, **small, **eager)), audio
    raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHS)}")


def _loss_of(out):
    return out.loss if hasattr(out, "loss") else out["loss"]


def _step(fn, batch, params):
    for p in params:
        p.grad = None
    loss = _loss_of(fn(**batch))
    loss.backward()
    grads = [p.grad.detach().float().clone() if p.grad is not None else None for p in params]
    return float(loss.detach().float()), grads


def _compare(loss, grads, ref_loss, ref_grads):
    """(the loss's relative difference, the gradients' relative difference
    as a whole: ‖g − g_ref‖ / ‖g_ref‖ over every parameter, the largest of a
    parameter's own: ‖g − g_ref‖ / max(‖g_ref‖, 1e-3 · ‖all of g_ref‖)). A
    gradient that is zero in exact arithmetic (a bias before a softmax) is
    rounding noise in both runs, so each parameter is also measured against
    the whole."""
    total = sum(float(r.norm()) ** 2 for r in ref_grads if r is not None) ** 0.5
    diff, worst = 0.0, 0.0
    for g, r in zip(grads, ref_grads):
        if (g is None) != (r is None):
            diff = worst = float("inf")
        elif g is not None:
            d = float((g - r).norm())
            diff += d * d
            worst = max(worst, d / max(float(r.norm()), 1e-3 * total, 1e-30))
    return abs(loss - ref_loss) / max(abs(ref_loss), 1e-30), diff ** 0.5 / max(total, 1e-30), worst


def _ops_of(fn):
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sorted({e.name.split("::")[1] for e in prof.events() if e.name.startswith("softmax_ext::")})


def worker(name, dtypes, modes, variants, device):
    """One architecture: a JSON line per (dtype, mode, variant), torch's
    defaults otherwise (no compiled autograd, static shapes first)."""
    import contextlib

    import torch

    import softmax_ext
    from softmax_ext.integrations import transformers as sx_transformers

    torch.set_num_threads(2)

    @contextlib.contextmanager
    def routing(variant, model):
        if variant in ("patch", "integration"):
            softmax_ext.patch()
        if variant == "integration":
            sx_transformers.apply(model)
        try:
            yield
        finally:
            softmax_ext.unpatch()
            if variant == "integration":
                sx_transformers.remove(model)

    def emit(**row):
        print(json.dumps(dict(model=name, device=device, **row)), flush=True)

    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(0)
        model, make = build(name)
        model = model.to(device=device, dtype=dtype).eval()
        if hasattr(model.config, "use_cache"):
            model.config.use_cache = False
        batch = make(torch.Generator().manual_seed(1), device)
        if dtype != torch.float32:
            batch = {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in batch.items()}
        params = list(model.parameters())
        ref_loss, ref_grads = _step(model, batch, params)
        for mode in modes:
            for variant in variants:
                if variant == "torch" and mode == "eager":
                    continue
                torch._dynamo.reset()
                fn = torch.compile(model) if mode == "compiled" else model
                t0 = time.perf_counter()
                try:
                    with routing(variant, model):
                        loss, grads = _step(fn, batch, params)
                        ops = _ops_of(lambda: _step(fn, batch, params))
                    dl, dg, dw = _compare(loss, grads, ref_loss, ref_grads)
                    emit(dtype=dtype_name, mode=mode, variant=variant, status="ok", loss=loss, ref_loss=ref_loss,
                         loss_rel=dl, grad_rel=dg, grad_worst=dw, ops=" ".join(ops),
                         seconds=round(time.perf_counter() - t0, 1))
                except Exception as e:  # noqa: BLE001  (a failure is the result)
                    msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
                    torch_too = None
                    if mode == "compiled" and variant != "torch":
                        torch._dynamo.reset()
                        try:
                            _step(torch.compile(model), batch, params)
                            torch_too = False
                        except Exception:  # noqa: BLE001
                            torch_too = True
                    emit(dtype=dtype_name, mode=mode, variant=variant, status="error", error=msg,
                         seconds=round(time.perf_counter() - t0, 1),
                         torch_compiled_fails_too=torch_too, trace=traceback.format_exc()[-1500:])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="all")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--variants", default="patch,integration")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--jobs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    parser.add_argument("--csv", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    dtypes, modes, variants = args.dtypes.split(","), args.modes.split(","), args.variants.split(",")
    if args.worker:
        worker(args.worker, dtypes, modes, variants, args.device)
        return 0

    models = ARCHS if args.models == "all" else tuple(args.models.split(","))
    base = [sys.executable, os.path.abspath(__file__), "--modes", args.modes, "--variants", args.variants,
            "--device", args.device]
    # compiling is what takes the time: each worker's inductor gets its share of the CPUs
    env = dict(os.environ)
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 2) // args.jobs)))
    rows, lock = [], threading.Lock()

    def run(unit):
        name, dtype = unit
        # lines are printed as they come: a worker still compiling at a
        # timeout leaves what it finished
        proc = subprocess.Popen(base + ["--worker", name, "--dtypes", dtype], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)
        got = 0
        for line in proc.stdout:
            if line.startswith("{"):
                row = json.loads(line)
                with lock:
                    rows.append(row)
                    _print_row(row)
                got += 1
        err = proc.stderr.read()
        if proc.wait() != 0 or not got:
            tail = err.strip().splitlines()[-1:] or [""]
            row = dict(model=name, dtype=dtype, status="error", error=f"worker exit {proc.returncode}: {tail[0][:300]}")
            with lock:
                rows.append(row)
                _print_row(row)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(run, [(name, dtype) for name in models for dtype in dtypes]))
    bad = [r for r in rows if r["status"] != "ok"]
    print(f"\n{len(rows)} runs, {len(rows) - len(bad)} ok, {len(bad)} failed"
          f" ({sum(1 for r in bad if r.get('torch_compiled_fails_too'))} of them fail in plain torch.compile too)")
    for r in bad:
        if r.get("trace"):
            print(f"\n--- {r['model']} {r.get('dtype')} {r.get('mode')} {r.get('variant')}\n{r['trace']}")
    if args.csv:
        keys = ["model", "dtype", "mode", "variant", "status", "loss", "ref_loss", "loss_rel", "grad_rel", "grad_worst",
                "ops",
                "error", "torch_compiled_fails_too", "seconds"]
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
    return 1 if bad else 0


def _print_row(r):
    head = f"{r['model']:<11} {r.get('dtype', ''):<9} {r.get('mode', ''):<9} {r.get('variant', ''):<12}"
    if r["status"] == "ok":
        print(f"{head} ok    loss {r['loss']:.5g} (rel {r['loss_rel']:.1e})  grads rel {r['grad_rel']:.1e}, "
              f"worst {r['grad_worst']:.1e}  [{r['ops']}]  {r['seconds']} s", flush=True)
    else:
        print(f"{head} ERROR {r['error']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
