"""The transformers adapter on a tiny random model on CPU torch: tokens counted, facts read, cleanly removed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import decodemon.engine_adapter.auto  # noqa: E402,F401  (registers the adapter with the attach hooks)
from decodemon.engine_adapter import transformers_generate as tg  # noqa: E402
from decodemon.probes import agent, hooks  # noqa: E402


@pytest.fixture(scope="module")
def model():
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture
def marks(monkeypatch):
    seen, facts = [], []
    monkeypatch.setattr(agent, "mark_token", lambda depth=0: seen.append(depth))
    monkeypatch.setattr(agent, "set_model_facts", facts.append)
    yield seen, facts
    tg.uninstall()


def generate(model, n, **kw):
    ids = torch.randint(0, 256, (1, 7))
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0, **kw)


def test_every_generated_token_is_marked_with_its_depth(model, marks):
    seen, facts = marks
    assert "transformers generate()" in hooks.attach()
    out = generate(model, 12)
    assert out.shape[1] - 7 == 12
    assert len(seen) == 12  # one mark per generated token, the prefill's included
    assert seen == list(range(8, 20))  # the depth after each step: prompt 7 + tokens so far
    f = facts[0]
    assert f.weight_bytes == sum(p.numel() * 4 for p in model.parameters())
    assert f.layers == 2 and f.dtype == "float32"
    assert f.kv_bytes_per_position == 2 * 2 * 2 * 16 * 4  # K and V x layers x kv heads x head_dim x fp32


def test_static_cache_generate_is_counted_too(model, marks):
    seen, facts = marks
    tg.install()
    generate(model, 6, cache_implementation="static")
    assert len(seen) == 6
    assert facts[0].kv_bytes_per_position == 2 * 2 * 2 * 16 * 4


def test_detach_puts_generate_back_as_it_was(model, marks):
    seen, _ = marks
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.__dict__[tg._NAME]
    assert tg.install() == "transformers generate()"
    assert tg.install() is None  # once
    hooks.detach()
    assert GenerationMixin.__dict__[tg._NAME] is original and not tg.installed()
    generate(model, 4)
    assert seen == []
