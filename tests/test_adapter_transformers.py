"""The transformers adapter on a tiny random model on CPU torch: tokens counted, facts read, cleanly removed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import decodemon.engine_adapter.auto  # noqa: E402,F401  (registers the adapter with the attach hooks)
from decodemon.engine_adapter import transformers_generate as tg  # noqa: E402
from decodemon.probes import hooks  # noqa: E402


@pytest.fixture(scope="module")
def model():
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture
def marks(agent_marks):
    yield agent_marks
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


def test_generate_under_decodemon_run_is_counted_with_no_line_of_decodemon(tmp_path):
    """transformers' own generate() (tiny random model, CPU), started with `decodemon run`: an attach counts its
    tokens through the adapter, gets the model's facts, and a second attach does the same."""
    import json
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.conftest import cli

    loop = Path(__file__).parents[1] / "benchmarks" / "loops" / "hf_generate.py"
    log = tmp_path / "tokens.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "decodemon.monitor.cli", "run", "--", sys.executable, str(loop),
                             "--shape", "tiny", "--device", "cpu", "--new-tokens", "64", "--log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        t0 = time.time()
        while not (log.exists() and log.stat().st_size) and time.time() - t0 < 60:
            time.sleep(0.2)
        pid = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        for _ in range(2):
            t_a = time.time()
            r = cli("attach", pid, "--json", "--seconds", 2)
            t_b = time.time()
            assert r.returncode == 0, r.stderr
            j = json.loads(r.stdout)
            assert j["token_clock"] == "mark_token" and j["tokens"] > 20
            own = sorted(t for line in log.read_text().splitlines() for t in json.loads(line)["t"] if t_a <= t <= t_b)
            print(j["tokens"], len(own), j["tokens_per_s"], (len(own) - 1) / (own[-1] - own[0]))
            assert j["tokens"] <= len(own)  # the attach is inside [t_a, t_b]
            assert j["tokens"] >= 0.5 * len(own)
            weights = sum(p.numel() * 4 for p in _tiny_model().parameters())
            assert j["bytes_per_token"] >= weights
    finally:
        import os

        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def _tiny_model():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks" / "loops"))
    from common import build

    return build("qwen3", "tiny", "cpu")
