"""lockstep.hf: a transformers Qwen3ForCausalLM patched onto lockstep's ops. Bitwise: its
log-probs == lockstep.Engine.score == the rollout's recorded log-probs; its autograd gradients ==
the C++ model backward (Engine.gradients, engine::Backprop); accumulate mode == the C++ backward
over the same micro-batches == one micro-batch holding them; run to run; a sequence alone ==
packed with others; torch.compile == eager. Plus opcheck of the new ops and clear errors."""

import numpy as np
import pytest
import torch
import transformers  # a test dependency: missing means failing, never skipping

import lockstep
import lockstep.hf as lh
from conftest import assert_bitwise

V = 300


def make_model(tied=False, dtype=torch.float32, seed=0, **cfg):
    torch.manual_seed(seed)
    args = dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=V,
        intermediate_size=96,
        tie_word_embeddings=tied,
        max_position_embeddings=512,
    )
    args.update(cfg)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**args))
    with torch.no_grad():  # weights large enough that every op matters (not HF's 0.02 init)
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
            else:
                p.uniform_(0.5, 1.5)
    return model.to(dtype)


def packed(seqs):
    """ids [T] i64, cu_seqlens [B+1] i32, next-token targets [T] (-100 at each last row)."""
    ids = torch.tensor([t for s in seqs for t in s])
    cu = torch.tensor(np.cumsum([0] + [len(s) for s in seqs]), dtype=torch.int32)
    targets = torch.tensor([t for s in seqs for t in list(s[1:]) + [-100]])
    return ids, cu, targets


def random_seqs(gen, lens):
    return [torch.randint(0, V, (n,), generator=gen).tolist() for n in lens]


def engine_of(model, contract=None, tp=1):
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    return lockstep.Engine(sd, config=lh.hf_config_dict(model), contract=contract, tp=tp)


def per_seq(x, seqs):
    out, r = [], 0
    for s in seqs:
        out.append(x[r : r + len(s)])
        r += len(s)
    return out


def as_bits(a):
    return torch.from_numpy(np.ascontiguousarray(a)).view(torch.int32)


def library_bf16(t):
    out = torch.empty(t.shape, dtype=torch.bfloat16)
    lockstep._C.round_bf16(t.detach().contiguous(), out)
    return out


CONFIGS = [
    pytest.param(False, torch.float32, id="untied-f32"),
    pytest.param(True, torch.float32, id="tied-f32"),
    pytest.param(False, torch.bfloat16, id="untied-bf16"),
    pytest.param(True, torch.bfloat16, id="tied-bf16"),
]


@pytest.mark.parametrize("tied,dtype", CONFIGS)
def test_logprobs_equal_engine_score(tied, dtype, gen):
    model = lh.patch(make_model(tied, dtype))
    seqs = random_seqs(gen, [5, 17, 2, 9])
    ids, cu, targets = packed(seqs)
    logp, ent = lh.logprobs(model, ids, targets, cu_seqlens=cu, temperature=0.8)
    scores = engine_of(model).score(seqs, temperature=0.8)
    for i, (s, lp, en) in enumerate(zip(scores, per_seq(logp, seqs), per_seq(ent, seqs))):
        assert_bitwise(lp[:-1].detach(), torch.from_numpy(s.logp), f"seq {i} logp")
        assert_bitwise(en[:-1].detach(), torch.from_numpy(s.entropy), f"seq {i} entropy")
        assert_bitwise(lp[-1].detach(), torch.tensor(0.0), "ignored row's logp (+0)")
    # HF's padding-free position_ids and [1, T] ids give the same bits.
    pos = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    logp2, ent2 = lh.logprobs(model, ids[None], targets[None], position_ids=pos, temperature=0.8)
    assert_bitwise(logp2, logp, "position_ids logp")
    assert_bitwise(ent2, ent, "position_ids entropy")


def test_logprobs_equal_rollout(gen):
    model = lh.patch(make_model(tied=True))
    eng = engine_of(model)
    prompts = random_seqs(gen, [4, 7, 4])
    sampling = lockstep.Sampling(temperature=0.7, max_new_tokens=6, seed=5, stop_on_eos=False)
    outs = eng.generate(prompts, sampling)
    seqs = [p + o.tokens.tolist() for p, o in zip(prompts, outs)]
    ids, cu, targets = packed(seqs)
    logp, ent = lh.logprobs(model, ids, targets, cu_seqlens=cu, temperature=0.7)
    for i, (p, o, lp, en) in enumerate(zip(prompts, outs, per_seq(logp, seqs), per_seq(ent, seqs))):
        n = len(o.tokens)
        assert_bitwise(lp[len(p) - 1 : len(p) - 1 + n].detach(), torch.from_numpy(o.logp), f"{i}")
        assert_bitwise(en[len(p) - 1 : len(p) - 1 + n].detach(), torch.from_numpy(o.entropy))


def test_f32_rounding_is_the_engines():
    model = make_model(dtype=torch.float32)
    with torch.no_grad():  # ties and values that are not bf16: every rounding case
        model.model.norm.weight[:4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 1e-40, -0.0])
    got = engine_of(model).state_dict()
    for name, p in model.state_dict().items():
        assert_bitwise(got[name], lh._bf16(p), name)
        assert_bitwise(got[name], library_bf16(p), name)


def backward_case(model, seqs, gen, temperature=1.0, step_indices=None, entropy=True):
    ids, cu, targets = packed(seqs)
    g_lp = torch.randn(ids.shape[0], generator=gen)
    g_ent = torch.randn(ids.shape[0], generator=gen)
    logp, ent = lh.logprobs(model, ids, targets, cu_seqlens=cu, temperature=temperature,
                            step_indices=step_indices)
    loss = (g_lp * logp).sum() + ((g_ent * ent).sum() if entropy else 0.0)
    loss.backward()
    return g_lp, g_ent


def cpp_gradients(model, seqs, g_lp, g_ent, temperature=1.0, micro_batches=None, contract=None,
                  tp=1):
    targets = [list(s[1:]) + [-1] for s in seqs]
    return engine_of(model, contract, tp).gradients(
        seqs,
        targets,
        per_seq(g_lp.numpy(), seqs),
        None if g_ent is None else per_seq(g_ent.numpy(), seqs),
        temperature=temperature,
        micro_batches=micro_batches,
    )


@pytest.mark.parametrize("tied,dtype", CONFIGS)
def test_gradients_equal_cpp_backward(tied, dtype, gen):
    model = lh.patch(make_model(tied, dtype))
    seqs = random_seqs(gen, [6, 13, 2])
    g_lp, g_ent = backward_case(model, seqs, gen, temperature=0.9)
    grads, _, _ = cpp_gradients(model, seqs, g_lp, g_ent, temperature=0.9)
    names = dict(model.named_parameters())
    assert sorted(grads) == sorted(names)
    for name, p in names.items():
        want = torch.from_numpy(grads[name])
        assert p.grad.dtype == dtype
        if dtype == torch.float32:
            assert_bitwise(p.grad, want, name)
        else:  # the fp32 gradient rounded once (a tied one after its parts are combined, B.7)
            assert_bitwise(p.grad, library_bf16(want), name)


@pytest.mark.parametrize("contract,tp", [
    (lockstep.Contract(gemm_segments=2, vocab_segments=2, kv_chunk=64, vocab_tile=64), 2),
    (lockstep.Contract(gemm_segments=2, vocab_segments=2), 1),
], ids=["S2-tp2", "S2-tp1"])
def test_gradients_equal_cpp_backward_segments(contract, tp, gen):
    model = lh.patch(make_model(tied=True), contract=contract, tp=tp)
    seqs = random_seqs(gen, [70, 3])  # > one KV chunk of 64
    g_lp, _ = backward_case(model, seqs, gen, entropy=False)
    grads, logp, _ = cpp_gradients(model, seqs, g_lp, None, contract=contract, tp=tp)
    for name, p in model.named_parameters():
        assert_bitwise(p.grad, torch.from_numpy(grads[name]), name)
    ids, cu, targets = packed(seqs)
    mine, _ = lh.logprobs(model, ids, targets, cu_seqlens=cu)
    scores = engine_of(model, contract, tp).score(seqs)
    for i, (s, lp) in enumerate(zip(scores, per_seq(mine, seqs))):
        assert_bitwise(lp[:-1].detach(), torch.from_numpy(s.logp), f"seq {i}")


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_from_pretrained_equals_engine_dir(tied, gen, tmp_path):
    # save_pretrained / from_pretrained (safetensors + config.json, bf16): Engine(dir) loads the
    # same files.
    make_model(tied, torch.bfloat16).save_pretrained(tmp_path)
    model = lh.patch(transformers.Qwen3ForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16))
    seqs = random_seqs(gen, [8, 3])
    ids, cu, targets = packed(seqs)
    logp, _ = lh.logprobs(model, ids, targets, cu_seqlens=cu)
    for i, (s, lp) in enumerate(zip(lockstep.Engine(tmp_path).score(seqs), per_seq(logp, seqs))):
        assert_bitwise(lp[:-1].detach(), torch.from_numpy(s.logp), f"seq {i}")


def test_run_to_run(gen):
    seqs = random_seqs(gen, [9, 4])
    results = []
    for _ in range(2):
        model = lh.patch(make_model(tied=True))
        ids, cu, targets = packed(seqs)
        logp, ent = lh.logprobs(model, ids, targets, cu_seqlens=cu)
        (logp.sum() - 0.1 * ent.sum()).backward()
        results.append((logp, ent, {n: p.grad for n, p in model.named_parameters()}))
    (a, b, ga), (c, d, gc) = results
    assert_bitwise(a, c, "logp")
    assert_bitwise(b, d, "entropy")
    for name in ga:
        assert_bitwise(ga[name], gc[name], name)


@pytest.mark.parametrize("tied,dtype", CONFIGS)
def test_accumulate_mode(tied, dtype, gen):
    model = lh.patch(make_model(tied, dtype))
    seqs = random_seqs(gen, [7, 11, 4])
    acc = lh.GradAccumulator(model)
    _, cu, _ = packed(seqs)
    g_lp = torch.randn(int(cu[-1]), generator=gen)
    g_ent = torch.randn(int(cu[-1]), generator=gen)
    parts = [([0], seqs[:1]), ([1, 2], seqs[1:])]
    r = 0
    for steps, mb in parts:
        ids, mcu, targets = packed(mb)
        n = ids.shape[0]
        logp, ent = lh.logprobs(model, ids, targets, cu_seqlens=mcu, step_indices=steps)
        ((g_lp[r : r + n] * logp).sum() + (g_ent[r : r + n] * ent).sum()).backward()
        r += n
    assert all(p.grad is None for p in model.parameters())
    mine = {k: v.clone() for k, v in acc.finish().items()}
    two, _, _ = cpp_gradients(model, seqs, g_lp, g_ent, micro_batches=[[0], [1, 2]])
    one, _, _ = cpp_gradients(model, seqs, g_lp, g_ent)
    for name in mine:
        assert mine[name].dtype == torch.float32
        assert_bitwise(mine[name], torch.from_numpy(two[name]), name)
        assert_bitwise(torch.from_numpy(two[name]), torch.from_numpy(one[name]), name)
    # The same step as one micro-batch in accumulate mode.
    acc.reset()
    ids, cu, targets = packed(seqs)
    logp, ent = lh.logprobs(model, ids, targets, cu_seqlens=cu)
    ((g_lp * logp).sum() + (g_ent * ent).sum()).backward()
    for name, g in acc.finish().items():
        assert_bitwise(g, mine[name], name)
    # Out of order: refused before any buffer changes.
    acc.reset()
    backward_case(model, seqs[1:], gen, step_indices=[3, 4])
    before = {n: p.main_grad.clone() for n, p in model.named_parameters()}
    with pytest.raises(lockstep.Error, match="canonical order"):
        backward_case(model, seqs[:1], gen, step_indices=[2])
    for n, p in model.named_parameters():
        assert_bitwise(p.main_grad, before[n], n)
    acc.remove()
    backward_case(model, seqs[:1], gen)
    assert all(p.grad is not None for p in model.parameters())


def test_alone_equals_packed(gen):
    model = lh.patch(make_model())
    seqs = random_seqs(gen, [33, 8, 1, 20])
    ids, cu, targets = packed(seqs)
    with torch.no_grad():
        logp, ent = lh.logprobs(model, ids, targets, cu_seqlens=cu)
        for i, s in enumerate(seqs):
            a_ids, a_cu, a_tg = packed([s])
            lp, en = lh.logprobs(model, a_ids, a_tg, cu_seqlens=a_cu)
            assert_bitwise(lp, per_seq(logp, seqs)[i], f"seq {i} logp")
            assert_bitwise(en, per_seq(ent, seqs)[i], f"seq {i} entropy")


def test_compile_same_bits(gen):
    torch._dynamo.reset()
    model = lh.patch(make_model(tied=True))
    seqs = random_seqs(gen, [5, 12])
    ids, cu, targets = packed(seqs)

    def f(ids, targets):
        return lh.logprobs(model, ids, targets, cu_seqlens=cu, temperature=0.9)

    results = []
    for fn in (f, torch.compile(f)):
        model.zero_grad()
        logp, ent = fn(ids, targets)
        (logp.sum() + 0.5 * ent.sum()).backward()
        results.append((logp, ent, {n: p.grad.clone() for n, p in model.named_parameters()}))
    torch._dynamo.reset()
    (a, b, ga), (c, d, gc) = results
    assert_bitwise(c, a, "logp")
    assert_bitwise(d, b, "entropy")
    for name in ga:
        assert_bitwise(gc[name], ga[name], name)


def test_accumulate_under_compile(gen):
    # Accumulate mode inside a compiled function runs its ops eagerly (same bits as eager); once
    # removed, the function is recompiled into plain mode.
    torch._dynamo.reset()
    model = lh.patch(make_model())
    seqs = random_seqs(gen, [6, 4])
    ids, cu, targets = packed(seqs)

    def f(ids, targets):
        logp, ent = lh.logprobs(model, ids, targets, cu_seqlens=cu)
        return logp.sum() - 0.3 * ent.sum()

    compiled = torch.compile(f)
    got = []
    for fn in (f, compiled):
        acc = lh.GradAccumulator(model)
        fn(ids, targets).backward()
        assert all(p.grad is None for p in model.parameters())
        got.append({k: v.clone() for k, v in acc.finish().items()})
        acc.remove()
    for name in got[0]:
        assert_bitwise(got[1][name], got[0][name], name)
    compiled(ids, targets).backward()
    torch._dynamo.reset()
    for name, p in model.named_parameters():
        assert_bitwise(p.grad, got[0][name], name)  # plain mode, one micro-batch: the same chain


def test_engine_gradients_errors(gen):
    model = make_model()
    eng = engine_of(model)
    seqs = random_seqs(gen, [3, 4])
    tg = [s[1:] + [-1] for s in seqs]
    g = [np.zeros(len(s), np.float32) for s in seqs]
    with pytest.raises(lockstep.Error, match="canonical order|step index"):
        eng.gradients(seqs, tg, g, micro_batches=[[1], [0]])
    with pytest.raises(lockstep.Error, match="targets, g_lp and g_ent"):
        eng.gradients(seqs, [tg[0], tg[1][:-1]], g)
    with pytest.raises(lockstep.Error, match="neither -1 nor in the vocab"):
        eng.gradients(seqs, [tg[0], [V] * 4], g)
    with pytest.raises(lockstep.Error, match="outside"):
        eng.gradients(seqs, tg, g, micro_batches=[[0, 2]])
    with pytest.raises(TypeError, match="float32"):
        eng.gradients(seqs, tg, [np.zeros(3), np.zeros(4)])


def test_forward_logits_and_hf_accuracy(gen):
    model = make_model()
    ref = make_model()
    lh.patch(model)
    seqs = random_seqs(gen, [6, 10])
    ids, cu, targets = packed(seqs)
    pos = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    out = model(input_ids=ids[None], position_ids=pos)
    assert isinstance(out, transformers.modeling_outputs.CausalLMOutputWithPast)
    assert out.logits.shape == (1, ids.shape[0], V) and out.logits.dtype == torch.float32
    logp, _ = lh.logprobs(model, ids, targets, cu_seqlens=cu)
    with torch.no_grad():  # accuracy (not bits): the same math as HF's fp32 model
        want = torch.cat([ref(input_ids=torch.tensor([s])).logits[0] for s in seqs])
        assert (out.logits[0] - want).abs().max() < 0.3  # bf16 ops vs fp32, logits up to ~10
        lsm = torch.log_softmax(want, -1)
        keep = targets != -100
        ref_lp = lsm[keep].gather(1, targets[keep][:, None])[:, 0]
        assert (ref_lp - logp[keep]).abs().max() < 0.3
    out.logits.sum().backward()  # gradients flow (torch's, not the contract's)
    assert model.lm_head.weight.grad is not None


def test_opcheck_new_ops(gen):
    model = lh.patch(make_model(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=1, intermediate_size=48))
    st = model._lockstep
    dims = list(st.dims)
    ids = torch.randint(0, V, (7,), generator=gen)
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    steps = torch.arange(3)
    pos = torch.tensor([0, 1, 2, 0, 1, 2, 3], dtype=torch.int32)

    def leaf(t):
        return t.detach().clone().requires_grad_()

    table = leaf(model.model.embed_tokens.weight)
    ws = [leaf(w) for w in lh._layer_weights(model.model.layers[0])]
    res = leaf(lh._embed(ids, table, cu, steps))
    out = leaf(torch.randn(7, 32, generator=gen).bfloat16().float())
    norm = leaf(model.model.norm.weight)
    lm = leaf(model.lm_head.weight)
    targets = torch.randint(0, V, (7,), generator=gen)
    targets[2] = -100
    ops = torch.ops.lockstep_hf
    layer_out = ops.layer(out, res, ws, pos, cu, steps, dims, st.eps, st.theta)
    head_out = ops.head(out, res, norm, lm, targets, 0.9, -100, cu, steps, dims, st.eps)
    saved = [t.detach() for t in layer_out[2:]]
    g = torch.randn(7, 32, generator=gen)
    g_t = torch.randn(7, generator=gen)

    def zeros(t):
        return torch.zeros(t.shape, dtype=torch.float32)

    # The backward ops have no gradient of their own: detached inputs.
    norm_d, lm_d = norm.detach(), lm.detach()
    ws_d = [w.detach() for w in ws]
    s_final, hidden = head_out[3].detach(), head_out[4].detach()

    for op, args in [
        (ops.embed, (ids, table, cu, steps)),
        (ops.layer, (None, res, ws, pos, cu, steps, dims, st.eps, st.theta)),
        (ops.layer, (out, res, ws, pos, cu, steps, dims, st.eps, st.theta)),
        (ops.head, (out, res, norm, lm, targets, 0.9, -100, cu, steps, dims, st.eps)),
        (ops.final_norm, (out, res, norm, st.eps)),
        (ops.tie, (leaf(model.model.embed_tokens.weight.bfloat16()),)),
        (ops.embed_backward, (g, ids, zeros(table), cu, steps, torch.bfloat16)),
        (ops.layer_backward, (g, g, saved, ws_d, [zeros(w) for w in ws], pos, cu, steps, dims,
                              st.eps, st.theta, False)),
        (ops.head_backward, (g_t, g_t, s_final, hidden, norm_d, lm_d, targets,
                             head_out[1].detach(), head_out[2].detach(), zeros(norm), zeros(lm),
                             cu, steps, 0.9, -100, dims, st.eps, True)),
        (ops.final_norm_backward, (g, s_final, norm_d, st.eps)),
        (ops.tie_backward, (g, g, out.detach().bfloat16())),
    ]:
        torch.library.opcheck(op, args)


# ---- errors -------------------------------------------------------------------------------------


def test_patch_errors():
    with pytest.raises(TypeError, match="Qwen3ForCausalLM"):
        lh.patch(torch.nn.Linear(2, 2))
    for cfg, match in [
        (dict(attention_bias=True), "attention_bias"),
        (dict(use_sliding_window=True, sliding_window=4, max_window_layers=0), "sliding"),
        (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
         "rope_type"),
        (dict(head_dim=8), "head_dim"),
    ]:
        with pytest.raises(lockstep.Error, match=match):
            lh.patch(make_model(**cfg))
    with pytest.raises(lockstep.Error, match="multiples of tp"):
        lh.patch(make_model(num_key_value_heads=1),
                 contract=lockstep.Contract(gemm_segments=2, vocab_segments=2), tp=2)
    with pytest.raises(lockstep.Error, match="gemm_segments"):
        lh.patch(make_model(), tp=2)
    with pytest.raises(lockstep.Error, match="CPU"):
        lh.patch(make_model().to("meta"))
    with pytest.raises(lockstep.Error, match="not patched"):
        lh.logprobs(make_model(), torch.tensor([1, 2]), torch.tensor([2, -100]),
                    cu_seqlens=torch.tensor([0, 2], dtype=torch.int32))


def test_input_errors():
    model = lh.patch(make_model())
    ids = torch.tensor([1, 2, 3, 4])
    tg = torch.tensor([2, 3, -100, -100])
    cu = torch.tensor([0, 3, 4], dtype=torch.int32)
    cases = [
        (dict(), "cu_seqlens .* or position_ids"),
        (dict(position_ids=torch.tensor([[0, 1, 3, 0]])), r"position_ids\[2\] = 3"),
        (dict(position_ids=torch.tensor([[1, 2, 3, 4]])), "must start at 0"),
        (dict(position_ids=torch.tensor([[0, 1, 2]])), "3 entries for T = 4"),
        (dict(cu_seqlens=torch.tensor([0, 3, 5], dtype=torch.int32)), "end at T = 4"),
        (dict(cu_seqlens=torch.tensor([0, 3, 4])), "int32"),
        (dict(cu_seqlens=cu, position_ids=torch.tensor([[0, 1, 2, 3]])), "different packings"),
        (dict(cu_seqlens=cu, step_indices=[0]), "1 entries for 2"),
        (dict(cu_seqlens=cu, step_indices=[1, 1]), "distinct"),
        (dict(cu_seqlens=cu, temperature=0.0), "temperature"),
    ]
    for kwargs, match in cases:
        with pytest.raises(lockstep.Error, match=match):
            lh.logprobs(model, ids, tg, **kwargs)
    with pytest.raises(lockstep.Error, match="targets has 3 entries"):
        lh.logprobs(model, ids, tg[:3], cu_seqlens=cu)
    with pytest.raises(lockstep.Error, match=r"targets\[1\] = 300"):
        lh.logprobs(model, ids, torch.tensor([2, V, -100, -100]), cu_seqlens=cu)
    with pytest.raises(lockstep.Error, match=r"input_ids\[3\] = -1"):
        lh.logprobs(model, torch.tensor([1, 2, 3, -1]), tg, cu_seqlens=cu)
    with pytest.raises(lockstep.Error, match=r"shape \[T\] or \[1, T\]"):
        lh.logprobs(model, ids.view(2, 2), tg, cu_seqlens=cu)
    with pytest.raises(TypeError, match="integer tensor"):
        lh.logprobs(model, ids.float(), tg, cu_seqlens=cu)
    with pytest.raises(lockstep.Error, match="CPU or CUDA tensors only"):
        lh.logprobs(model, ids.to("meta"), tg, cu_seqlens=cu)
    with pytest.raises(lockstep.Error, match="labels"):
        model(input_ids=ids[None], position_ids=torch.tensor([[0, 1, 2, 0]]), labels=ids[None])
    with pytest.raises(lockstep.Error, match="attention_mask"):
        model(input_ids=ids[None], attention_mask=torch.tensor([[1, 1, 1, 0]]),
              position_ids=torch.tensor([[0, 1, 2, 0]]))
