"""lockstep.Engine: the rollout engine and the training forward from Python, on the built-in model.

Bitwise claims compare bit patterns (uint32 views of the fp32 values), never allclose.
"""

import json
import struct

import numpy as np
import pytest
import torch

import lockstep
from lockstep import Contract, Engine, Sampling

V = 2048  # the built-in model's vocab


def rng_prompt(seed, n):
    return np.random.default_rng(seed).integers(3, V, size=n).tolist()


# Five requests of different lengths and settings; requests 1 and 3 share a prompt (prefix sharing).
PROMPTS = [
    rng_prompt(1, 5),
    rng_prompt(2, 19),
    rng_prompt(3, 2),
    rng_prompt(2, 19),
    rng_prompt(5, 33),
]
SAMPLING = [
    Sampling(temperature=0.8, max_new_tokens=6, seed=7),
    Sampling(temperature=1.0, top_p=0.9, max_new_tokens=9, seed=7),
    Sampling(temperature=0.0, max_new_tokens=4),  # greedy: log-probs at temperature 1
    Sampling(temperature=1.0, top_p=0.9, max_new_tokens=9, seed=7),
    Sampling(temperature=0.6, top_k=40, min_p=0.05, max_new_tokens=7, seed=11),
]


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def assert_same(a, b, what=""):
    """Two Completions (or Scores) hold the same tokens and the same bits."""
    for field in ("tokens", "logp", "lse", "entropy"):
        if not hasattr(a, field):
            continue
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and x.shape == y.shape, f"{what} {field}: {x!r} vs {y!r}"
        xb = x if field == "tokens" else bits(x)
        yb = y if field == "tokens" else bits(y)
        assert np.array_equal(xb, yb), f"{what} {field}: {x!r} vs {y!r}"


def logprob_temperature(s):
    return 1.0 if s.temperature == 0 else s.temperature


@pytest.fixture(scope="module")
def engine():
    return Engine()


@pytest.fixture(scope="module")
def batch(engine):
    return engine.generate(PROMPTS, SAMPLING)


def test_generate_outputs(engine, batch):
    assert engine.weight_version == 0
    assert engine.config["vocab_size"] == V and engine.config["model_type"] == "qwen3"
    assert len(batch) == len(PROMPTS)
    for c, s in zip(batch, SAMPLING):
        n = len(c.tokens)
        assert c.tokens.dtype == np.int32 and c.logp.dtype == np.float32
        assert 1 <= n <= s.max_new_tokens
        assert c.logp.shape == c.lse.shape == c.entropy.shape == (n,)
        assert c.finish in ("stop", "length") and (c.finish == "stop") == (n < s.max_new_tokens)
        assert ((c.tokens >= 0) & (c.tokens < V)).all()
        assert (c.logp <= 0).all() and (c.entropy >= 0).all()
    # Same prompt, seed and settings but another request id: other noise, other tokens.
    assert not np.array_equal(batch[1].tokens, batch[3].tokens)


def test_generate_is_deterministic(engine, batch):
    again = engine.generate(PROMPTS, SAMPLING)
    for i, (a, b) in enumerate(zip(batch, again)):
        assert_same(a, b, f"request {i}")
    # Another engine, and other engine choices (pages, batch limit, token budget, no sharing).
    other = Engine(page_size=4, max_running=2, max_batched_tokens=7, prefix_sharing=False)
    for i, (a, b) in enumerate(zip(batch, other.generate(PROMPTS, SAMPLING))):
        assert_same(a, b, f"request {i} (other engine choices)")
    split = Engine(page_size=8, max_batched_tokens=16, kv_splits=3, cascade=True)
    for i, (a, b) in enumerate(zip(batch, split.generate(PROMPTS, SAMPLING))):
        assert_same(a, b, f"request {i} (split-KV, cascade)")


def test_alone_equals_in_batch(engine, batch):
    for i in (0, 3, 4):
        alone = engine.generate([PROMPTS[i]], SAMPLING[i], request_ids=[i])
        assert_same(alone[0], batch[i], f"request {i} alone vs in the batch")


def test_score_equals_generate(engine, batch):
    seqs = [p + c.tokens.tolist() for p, c in zip(PROMPTS, batch)]
    scores = engine.score(
        seqs,
        prompt_lens=[len(p) for p in PROMPTS],
        temperature=[logprob_temperature(s) for s in SAMPLING],
    )
    for i, (s, c) in enumerate(zip(scores, batch)):
        assert_same(s, c, f"request {i}: score vs generate")
    # Default prompt_lens: every token after the first; the completion's rows are the tail.
    full = engine.score([seqs[2]])[0]
    assert full.logp.shape == (len(seqs[2]) - 1,)
    assert np.array_equal(bits(full.logp[len(PROMPTS[2]) - 1 :]), bits(batch[2].logp))


def test_tp2_rollout_equals_tp1_score():
    contract = Contract(gemm_segments=2, vocab_segments=2)
    tp2 = Engine(contract=contract, tp=2)
    tp1 = Engine(contract=contract, tp=1)
    assert tp2.tp == 2
    prompts, sampling = PROMPTS[:3], SAMPLING[:3]
    rollout = tp2.generate(prompts, sampling)
    for i, (a, b) in enumerate(zip(rollout, tp1.generate(prompts, sampling))):
        assert_same(a, b, f"request {i}: tp 2 vs tp 1 rollout")
    scores = tp1.score(
        [p + c.tokens.tolist() for p, c in zip(prompts, rollout)],
        prompt_lens=[len(p) for p in prompts],
        temperature=[logprob_temperature(s) for s in sampling],
    )
    for i, (s, c) in enumerate(zip(scores, rollout)):
        assert_same(s, c, f"request {i}: tp 2 rollout vs tp 1 score")


def test_update_weights_changes_outputs_and_version():
    e = Engine()
    prompts, sampling = PROMPTS[:2], SAMPLING[:2]
    before = e.generate(prompts, sampling)
    sd = e.state_dict()
    assert sd["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert "lm_head.weight" not in sd  # tied
    changed = dict(sd)
    changed["model.norm.weight"] = sd["model.norm.weight"] * 1.5
    assert e.update_weights(changed) == 1 and e.weight_version == 1
    after = e.generate(prompts, sampling)
    assert not all(np.array_equal(bits(a.logp), bits(b.logp)) for a, b in zip(before, after))
    # The old weights back, as f32 numpy arrays (exact in bf16), with an explicit version.
    f32 = {k: v.float().numpy() for k, v in sd.items()}
    assert e.update_weights(f32, version=10) == 10
    for i, (a, b) in enumerate(zip(before, e.generate(prompts, sampling))):
        assert_same(a, b, f"request {i} after restoring the weights")
    # A partial update, and an HF-style tied state dict naming lm_head.weight too.
    assert e.update_weights({"model.norm.weight": changed["model.norm.weight"]}, partial=True) == 11
    for i, (a, b) in enumerate(zip(after, e.generate(prompts, sampling))):
        assert_same(a, b, f"request {i} after the partial update")
    hf = dict(sd, **{"lm_head.weight": sd["model.embed_tokens.weight"]})
    assert e.update_weights(hf) == 12
    # An engine built from the state dict (and the config) is the built-in model.
    from_sd = Engine(sd, config=e.config)
    assert from_sd.weight_version == 0
    for i, (a, b) in enumerate(zip(before, from_sd.generate(prompts, sampling))):
        assert_same(a, b, f"request {i}: Engine(state_dict)")


def write_model_dir(path, config, state_dict):
    """config.json + model.safetensors (bf16), as a Hugging Face checkpoint holds them."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in sorted(state_dict.items()):
        data = t.contiguous().view(torch.int16).numpy().tobytes()
        end = offset + len(data)
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, end]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    (path / "config.json").write_text(json.dumps(config))


def test_engine_from_model_dir(tmp_path, engine, batch):
    write_model_dir(tmp_path, engine.config, engine.state_dict())
    e = Engine(str(tmp_path))
    assert e.config == engine.config
    for i, (a, b) in enumerate(zip(batch[:2], e.generate(PROMPTS[:2], SAMPLING[:2]))):
        assert_same(a, b, f"request {i}: Engine(model_dir)")
    with pytest.raises(lockstep.Error, match="does not exist"):
        Engine(str(tmp_path / "missing"))


def test_bad_weights_raise_and_keep_the_old_ones():
    e = Engine()
    prompts, sampling = PROMPTS[:1], SAMPLING[:1]
    before = e.generate(prompts, sampling)
    sd = e.state_dict()
    norm = sd["model.norm.weight"]
    bad = [
        ({"model.norm.weights": norm}, "model.norm.weights is not part of this Qwen3 model"),
        ({"model.norm.weight": norm[:-1]}, r"shape \[127\], the model's config expects \[128\]"),
        ({"model.norm.weight": norm.to(torch.float16)}, "dtype"),
        ({"model.norm.weight": norm.double().numpy()}, "dtype"),
        ({"model.norm.weight": np.full(128, np.nan, np.float32)}, "must be finite"),
        ({"model.norm.weight": np.full(128, 3.4e38, np.float32)}, "must be finite"),
        ({"model.norm.weight": [1.0] * 128}, "not an array"),
        ({"model.norm.weight": norm}, "missing weight model.embed_tokens.weight"),  # not partial
        (dict(sd, **{"lm_head.weight": 2 * sd["model.embed_tokens.weight"]}), "ties the"),
    ]
    for state, message in bad:
        with pytest.raises(lockstep.Error, match=message):
            e.update_weights(state, partial="missing" not in message and "ties" not in message)
        assert e.weight_version == 0
    with pytest.raises(lockstep.Error, match="not above the current weight version"):
        e.update_weights(sd, version=0)
    with pytest.raises(lockstep.Error, match="missing weight"):
        Engine({"model.norm.weight": norm})
    assert_same(before[0], e.generate(prompts, sampling)[0], "after the failed updates")


def test_bad_inputs_raise(engine):
    gen = engine.generate
    cases = [
        (lambda: gen([[1, V]]), f"token 1 is {V}, outside the vocab"),
        (lambda: gen([[-1]]), "token 0 is -1, outside the vocab"),
        (lambda: gen([[]]), "request 0: the prompt is empty"),
        (lambda: gen([]), "no prompts"),
        (lambda: gen([[1], [2]], [Sampling()]), "1 sampling settings for 2 prompts"),
        (lambda: gen([[1], [2]], request_ids=[4, 4]), "request id 4 appears twice"),
        (lambda: gen([[1]], Sampling(temperature=-1.0)), "temperature"),
        (lambda: gen([[1]], Sampling(top_p=0.0)), "top_p"),
        (lambda: gen([[1]], Sampling(top_p=1.5)), "top_p"),
        (lambda: gen([[1]], Sampling(top_k=-1)), "top_k"),
        (lambda: gen([[1]], Sampling(min_p=2.0)), "min_p"),
        (lambda: gen([[1]], {"max_new_tokens": 0}), "max_new_tokens is 0"),
        (lambda: gen([[1]], {"seed": -1}), "seed -1"),
        (lambda: gen([[1]], {"max_new_tokens": 5000}), "context"),
        (lambda: engine.score([[1]]), "prompt length 1 with 1 tokens"),
        (lambda: engine.score([[1, 2, 3]], prompt_lens=3), "prompt length 3 with 3 tokens"),
        (lambda: engine.score([[1, V + 5]]), "outside the vocab"),
        (lambda: engine.score([[1, 2]], temperature=0.0), "temperature"),
        (lambda: Engine(device="tpu"), "expected 'cpu' or 'cuda'"),
        (lambda: Engine(tp=2), "gemm_segments"),
        (lambda: Engine(tp=3), "tp is 3"),
        (lambda: Engine(num_pages=0), "num_pages"),
        (lambda: Engine(cascade=True, prefix_sharing=False), "cascade attention needs prefix"),
    ]
    for fn, message in cases:
        with pytest.raises(lockstep.Error, match=message):
            fn()
    with pytest.raises(TypeError):
        gen([[1.5]])
    with pytest.raises(TypeError):
        Sampling(top_k=1.0)
    with pytest.raises(TypeError):
        Sampling(temperature=True)
    # numpy scalars are numbers: the same request as with Python floats and ints.
    np_sampling = Sampling(temperature=np.float32(0.75), top_k=np.int64(9), max_new_tokens=3)
    py_sampling = Sampling(temperature=0.75, top_k=9, max_new_tokens=3)
    assert_same(gen([np.array([5, 6])], np_sampling)[0], gen([[5, 6]], py_sampling)[0], "numpy")


@pytest.mark.skipif(lockstep.cuda_build, reason="a CUDA build takes device='cuda'")
def test_cuda_needs_a_cuda_build():
    with pytest.raises(lockstep.Error, match="needs a CUDA build"):
        Engine(device="cuda")


@pytest.mark.skipif(
    not (lockstep.cuda_build and torch.cuda.is_available()), reason="needs a CUDA build and a GPU"
)
def test_cuda_engine_equals_cpu(engine, batch):
    gpu = Engine(device="cuda")
    for i, (a, b) in enumerate(zip(batch, gpu.generate(PROMPTS, SAMPLING))):
        assert_same(a, b, f"request {i}: cuda vs cpu rollout")
    scores = gpu.score(
        [p + c.tokens.tolist() for p, c in zip(PROMPTS, batch)],
        prompt_lens=[len(p) for p in PROMPTS],
        temperature=[logprob_temperature(s) for s in SAMPLING],
    )
    for i, (s, c) in enumerate(zip(scores, batch)):
        assert_same(s, c, f"request {i}: cuda score vs cpu generate")
    sd = engine.state_dict()
    changed = dict(sd, **{"model.norm.weight": sd["model.norm.weight"] * 1.5})
    cpu = Engine()
    assert gpu.update_weights(changed) == cpu.update_weights(changed) == 1
    on_cpu, on_gpu = cpu.generate(PROMPTS, SAMPLING), gpu.generate(PROMPTS, SAMPLING)
    for i, (a, b) in enumerate(zip(on_cpu, on_gpu)):
        assert_same(a, b, f"request {i}: cuda vs cpu after update_weights")
