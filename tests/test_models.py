"""softmax_ext inside models: a hand-written transformer block (always) and
tiny random-init Hugging Face models (when transformers is installed), with
softmax_ext.patch() and with softmax_ext.integrations.transformers, eager and
compiled: the same losses and gradients as plain torch, and the softmax_ext
ops really run."""

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICES


@pytest.fixture(autouse=True)
def _clean():
    import softmax_ext

    softmax_ext.unpatch()
    torch._dynamo.reset()
    yield
    softmax_ext.unpatch()
    torch._dynamo.reset()
    try:
        from softmax_ext.integrations import transformers as sx_transformers

        sx_transformers.remove()
    except ImportError:
        pass


def _ops_called(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


class TinyBlock(torch.nn.Module):
    """Pre-norm attention + MLP, causal mask, an LM head and its loss."""

    def __init__(self, vocab=97, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.emb = torch.nn.Embedding(vocab, d)
        self.norm1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.norm2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, tokens, labels):
        b, t = tokens.shape
        h = self.emb(tokens)
        q, k, v = self.qkv(self.norm1(h)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        mask = torch.full((t, t), float("-inf"), device=tokens.device).triu(1)
        attn = F.softmax(scores + mask, dim=-1)
        h = h + self.proj((attn @ v).transpose(1, 2).reshape(b, t, -1))
        h = h + self.mlp(self.norm2(h))
        logits = self.head(h)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def _loss_and_grads(model, *inputs):
    model.zero_grad(set_to_none=True)
    loss = model(*inputs)
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_tiny_block_patched_matches_torch(device, compiled):
    import softmax_ext

    torch.manual_seed(0)
    model = TinyBlock().to(device)
    tokens = torch.randint(0, 97, (2, 16), device=device)
    labels = torch.randint(0, 97, (2, 16), device=device)
    loss_ref, grads_ref = _loss_and_grads(model, tokens, labels)
    run = torch.compile(model, backend="aot_eager" if device == "cpu" else "inductor") if compiled else model
    with softmax_ext.patch():
        ops = _ops_called(lambda: run(tokens, labels))
        loss, grads = _loss_and_grads(run, tokens, labels)
    if compiled and device == "cuda":
        # Inductor fuses the attention's short rows itself (softmax_ext/_inductor.py);
        # the loss stays softmax_ext's
        assert "softmax_ext::_cross_entropy_forward" in ops, sorted(o for o in ops if "softmax_ext" in o)
    else:
        assert "softmax_ext::softmax" in ops, sorted(o for o in ops if "softmax" in o)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------
# Hugging Face transformers (tiny random-init configs)
# --------------------------------------------------------------------------


def _tiny_model(arch):
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, attn_implementation="eager")
    if arch == "llama":
        config = transformers.LlamaConfig(num_key_value_heads=2, max_position_embeddings=64, **common)
        return transformers.LlamaForCausalLM(config)
    if arch == "gpt2":
        config = transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                         attn_implementation="eager")
        return transformers.GPT2LMHeadModel(config)
    if arch == "bert":
        config = transformers.BertConfig(max_position_embeddings=64, **common)
        return transformers.BertForMaskedLM(config)
    raise ValueError(arch)


def _hf_loss_and_grads(model, ids, labels):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    return out.loss.detach().float(), grads


# Every architecture eager both ways; compiles (slow on a small CPU) for a few.
HF_CASES = [(arch, how, False) for arch in ("llama", "gpt2", "bert") for how in ("patch", "integration")]
HF_CASES += [("llama", "patch", True), ("llama", "integration", True), ("bert", "integration", True)]


@pytest.mark.parametrize("arch,how,compiled", HF_CASES,
                         ids=[f"{a}-{h}-{'compiled' if c else 'eager'}" for a, h, c in HF_CASES])
def test_transformers_models_match_torch(arch, how, compiled):
    import softmax_ext
    from softmax_ext.integrations import transformers as sx_transformers

    torch.manual_seed(0)
    model = _tiny_model(arch).float().eval()  # no dropout: the two runs must see the same function
    model.config.use_cache = False
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (2, 24))
    labels = ids.clone()
    labels[:, :3] = -100
    loss_ref, grads_ref = _hf_loss_and_grads(model, ids, labels)

    if how == "patch":
        softmax_ext.patch()
    else:
        sx_transformers.apply(model)
    run = torch.compile(model, backend="aot_eager") if compiled else model
    ops = _ops_called(lambda: run(input_ids=ids, labels=labels))
    loss, grads = _hf_loss_and_grads(run, ids, labels)
    assert "softmax_ext::softmax" in ops, sorted(o for o in ops if "softmax" in o)
    assert any(o.startswith("softmax_ext::") and "cross_entropy" in o for o in ops), sorted(ops)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-5)
    assert len(grads) == len(grads_ref)
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # (causal LMs: transformers' loss upcasts the logits)
def test_integration_loss_of_16bit_logits_is_transformers_float32_loss(arch):
    """bf16 logits: the integration reads them as they are, and its loss has
    the value transformers computes on logits.float() (not the bf16-rounded
    one), with the same gradients."""
    from softmax_ext.integrations import transformers as sx_transformers

    torch.manual_seed(0)
    model = _tiny_model(arch).to(torch.bfloat16).eval()
    model.config.use_cache = False
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[:, :3] = -100
    loss_ref, grads_ref = _hf_loss_and_grads(model, ids, labels)
    sx_transformers.apply(model)
    loss, grads = _hf_loss_and_grads(model, ids, labels)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, loss_ref, rtol=2e-6, atol=2e-6)
    for g, r in zip(grads, grads_ref):
        torch.testing.assert_close(g.float(), r.float(), rtol=2e-2, atol=2e-3)


def test_integration_reapplied_reuses_compiled_code():
    """apply() / remove() around every step (as a benchmark interleaving
    variants does) does not make torch.compile recompile: the modeling
    modules get the same namespace objects each time. A step compiled before
    the first apply() leaves torch.compile's aliases of torch.nn.functional
    in the modeling module's globals, which apply() must not change."""
    from torch._dynamo.testing import CompileCounter

    from softmax_ext.integrations import transformers as sx_transformers

    torch.manual_seed(0)
    model = _tiny_model("gpt2").float().eval()
    model.config.use_cache = False
    ids = torch.randint(0, 128, (2, 24))
    counter = CompileCounter()
    run = torch.compile(model, backend=counter)
    run(input_ids=ids, labels=ids)  # compiled without the integration first (its module aliases stay torch's)
    frames = []
    for _ in range(3):
        sx_transformers.apply(model)
        run(input_ids=ids, labels=ids)
        sx_transformers.remove(model)
        frames.append(counter.frame_count)
    assert frames[0] == frames[-1], frames


def test_example_train_gpt_runs(capsys):
    """examples/train_gpt.py (a few eager steps): both curves printed and equal."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "examples", "train_gpt.py")
    spec = importlib.util.spec_from_file_location("train_gpt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--device", "cpu", "--steps", "3", "--batch", "4", "--no-compile"])
    out = capsys.readouterr().out
    assert "plain torch | softmax_ext.patch()" in out
    diff = float(out.split("largest difference between the curves:")[1].split()[0])
    assert diff < 1e-4, out
