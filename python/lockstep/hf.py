"""``lockstep.hf``: a Hugging Face ``Qwen3ForCausalLM`` running on lockstep's ops (issue 14).

API (stable; examples/grpo_hf.py is written against it)::

    import lockstep, lockstep.hf
    model = transformers.Qwen3ForCausalLM(cfg)            # or .from_pretrained(...)
    lockstep.hf.patch(model, contract=lockstep.Contract(), tp=1)   # in place; returns model

    # Packed varlen sequences: ids [T] (or [1, T]) with cu_seqlens [B+1] int32 on the host, or
    # HF's padding-free position_ids [1, T] (a sequence starts where position_ids == 0).
    logp, ent = lockstep.hf.logprobs(model, ids, targets, cu_seqlens=cu, temperature=1.0,
                                     ignore_index=-100, entropy=True, step_indices=None)
    loss = -(adv * logp).sum()        # logp, ent: [T] f32 with autograd; never a [T, V] buffer
    loss.backward()                   # param.grad: the contract backward's fp32 gradient

    out = model(input_ids=ids, position_ids=pos)   # CausalLMOutputWithPast, logits [1, T, V] f32

    # Accumulate mode (Megatron's main_grad): micro-batches continue ONE fp32 chain per weight.
    acc = lockstep.hf.GradAccumulator(model)   # p.main_grad = +0 (f32); p.grad stays None
    for mb in micro_batches:                   # in step order: step_indices ascending across
        logp, ent = lockstep.hf.logprobs(model, ..., step_indices=mb.step_indices)
        loss(logp, ent).backward()             # adds into p.main_grad (B.1); out of order: raises
    grads = acc.finish()                       # tied embeddings combined once (B.7); {name: f32}
    acc.reset()                                # +0 and a fresh order for the next step
    acc.remove()                               # back to plain autograd gradients

targets[t] is the token whose log-prob row t gives (usually ids[t + 1] inside a sequence and
``ignore_index`` at each sequence's last row); ignored rows give logp = entropy = +0 and no
gradient. step_indices [B] (default 0 .. B-1): each packed sequence's place in the training
step's canonical order (B.1); weight gradients reduce over tokens in that order.

What is bitwise (tested in tests/python/test_hf.py):
  * ``logprobs`` == ``lockstep.Engine(state_dict, config=<the HF config>).score(...)`` ==
    the rollout's recorded log-probs (``Engine.generate``), for fp32 (master) or bf16 weights:
    an fp32 weight is rounded to bf16 once (RNE, Engine.update_weights' rounding) with a
    straight-through gradient. A token's bits do not depend on what else is packed with it.
  * the gradients of ``Σ g_lp·logp + g_ent·entropy`` == the C++ model backward
    (engine::Backprop, §B.10) bit for bit: fp32 parameters get its fp32 gradients exactly;
    bf16 parameters get them rounded once (RNE) — except a tied bf16 embedding, whose two parts
    (lm_head, embedding) autograd adds in bf16 (use fp32 masters or the accumulate mode there).
  * accumulate mode == the C++ backward over the same micro-batches in the same order ==
    one micro-batch holding them all.
What is not: the ``logits`` of ``model(...)`` are lockstep's GEMM of the final hidden states
(fp32), but log-softmax of them in torch is not the contract's log-prob (use ``logprobs``);
gradients through ``logits`` are torch's, not the contract's. Per backward call (plain mode)
dW starts from +0 and autograd adds calls' results with torch's fp32 add: not B.1's chain.

CPU tensors only for now: CUDA tensors are refused (this module's ops are not yet run on CUDA).
"""
