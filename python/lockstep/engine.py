"""``lockstep.Engine``: the rollout engine and the training forward of one Qwen3 model, from Python.

``generate`` runs the C++ rollout engine (paged KV cache, continuous batching, chunked prefill,
prefix sharing of equal prompts) and records, per generated token, its id and the sampling op's
fp32 log-prob, logsumexp and entropy; ``score`` runs the packed training forward (what
``lockstep score`` and the trainer compute). With the invariant ops both give the same bits for a
token, whatever the batch, the packing, the page size or the tensor-parallel degree.
``update_weights`` swaps in new weights (Hugging Face names, numpy arrays or CPU torch tensors,
bf16 or f32), bumping ``weight_version``; a bad state dict raises :class:`lockstep.Error` and leaves
the old weights. CPU (and CUDA in a CUDA build of the module).

    engine = lockstep.Engine()  # the built-in default model
    out = engine.generate([[1, 2, 3]], lockstep.Sampling(temperature=0.7, max_new_tokens=8))
    scores = engine.score([[1, 2, 3, *out[0].tokens]], prompt_lens=[3], temperature=0.7)
    assert (scores[0].logp.view("u4") == out[0].logp.view("u4")).all()
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import operator
import os
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

from lockstep import _C
from lockstep._C import Error
from lockstep.contract import Contract

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is a test dependency
    np = None


def _is_int(x: Any) -> bool:
    try:
        operator.index(x)
    except TypeError:
        return False
    return not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """One request's sampling settings (``lockstep::SamplingParams`` + the rollout's limits).

    temperature 0 is greedy (its log-probs are recorded at temperature 1); top_k 0, top_p 1 and
    min_p 0 are off. The noise is Philox keyed by ``seed`` and counted by (request id, position):
    the same request id and seed give the same tokens in any batch. Values are checked by the
    library (lockstep.Error naming the request).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_new_tokens: int = 16
    seed: int = 0
    stop_on_eos: bool = True  # stop after one of the config's eos_token_ids

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p"):
            if not _is_real(getattr(self, name)):
                raise TypeError(f"Sampling.{name} must be a number, got {getattr(self, name)!r}")
        for name in ("top_k", "max_new_tokens", "seed"):
            if not _is_int(getattr(self, name)):
                raise TypeError(f"Sampling.{name} must be an int, got {getattr(self, name)!r}")
        if not isinstance(self.stop_on_eos, bool):
            raise TypeError(f"Sampling.stop_on_eos must be a bool, got {self.stop_on_eos!r}")
        if not 0 <= operator.index(self.seed) < 2**64:
            raise Error(f"Sampling: seed {self.seed} is outside [0, 2**64)")
        if operator.index(self.max_new_tokens) < 1:
            raise Error(f"Sampling: max_new_tokens is {self.max_new_tokens}, must be >= 1")


@dataclasses.dataclass
class Completion:
    """One request's output: generated token ids (int32) and, per token, fp32 values at the
    request's log-prob temperature."""

    tokens: Any  # numpy int32 [n]
    logp: Any  # numpy float32 [n]: log p(token)
    lse: Any  # numpy float32 [n]: logsumexp of the tempered logits
    entropy: Any  # numpy float32 [n]: entropy of the tempered distribution (nats)
    finish: str  # "stop" (an eos token) or "length" (max_new_tokens or the context)


@dataclasses.dataclass
class Scores:
    """One sequence's scored tokens (those after the prompt), fp32."""

    logp: Any  # numpy float32 [len - prompt_len]
    lse: Any
    entropy: Any


def _token_list(what: str, i: int, seq: Any) -> list:
    if hasattr(seq, "tolist"):  # numpy arrays, torch tensors
        seq = seq.tolist()
    try:
        items = list(seq)
    except TypeError:
        raise TypeError(f"{what} {i} must be a sequence of token ids, got {seq!r}") from None
    out = []
    for j, t in enumerate(items):
        if not _is_int(t):
            raise TypeError(f"{what} {i}: token {j} is {t!r}, not an int token id")
        out.append(operator.index(t))
    return out


def _host_arrays(state_dict: Mapping[str, Any]) -> dict:
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"a state dict must be a mapping of names to arrays, got {state_dict!r}")
    out = {}
    for name, value in state_dict.items():
        if hasattr(value, "detach"):  # torch: DLPack refuses tensors that require grad
            value = value.detach()
        out[name] = value
    return out


class Engine:
    """The rollout engine and the training forward over one Qwen3 model.

    model: None (the built-in default model), a checkpoint directory (config.json +
    *.safetensors), or a state dict (HF names -> arrays; ``config`` gives its Qwen3 config as a
    config.json dict, default: the built-in model's config). contract: every bit-changing
    setting (:class:`lockstep.Contract`); tp (1, 2, 4, 8) needs gemm_segments >= tp and
    vocab_segments >= tp. device: "cpu", or "cuda" in a CUDA build of the module (the invariant
    CUDA kernels; weights are given and returned on the host). The remaining arguments are engine
    choices, which never change a bit: KV page size and pool, the running-set limit, the per-step
    token budget, prefix sharing (equal prompts fork one prefill), split-KV decode attention and
    cascade attention over shared prefixes (needs prefix sharing).
    """

    def __init__(
        self,
        model: Union[None, str, "os.PathLike[str]", Mapping[str, Any]] = None,
        *,
        config: Optional[Mapping[str, Any]] = None,
        contract: Optional[Contract] = None,
        device: str = "cpu",
        tp: int = 1,
        page_size: int = 16,
        num_pages: int = 1024,
        max_running: int = 32,
        max_batched_tokens: int = 256,
        prefix_sharing: bool = True,
        kv_splits: int = 1,
        cascade: bool = False,
    ) -> None:
        if np is None:
            raise ImportError("lockstep.Engine returns numpy arrays: pip install numpy")
        if contract is None:
            contract = Contract()
        if not isinstance(contract, Contract):
            raise TypeError(f"contract must be a lockstep.Contract, got {contract!r}")
        if not isinstance(device, str):
            raise TypeError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if not _is_int(tp):
            raise TypeError(f"tp must be an int, got {tp!r}")
        c = contract.to_c()
        if model is None:
            if config is not None:
                raise TypeError("config is only for a state dict (the built-in model has its own)")
            self._c = _C.Engine.default_model(c, tp, device)
        elif isinstance(model, (str, os.PathLike)):
            if config is not None:
                raise TypeError("config is only for a state dict (a directory has config.json)")
            self._c = _C.Engine.from_dir(os.fspath(model), c, tp, device)
        else:
            config_json = "" if config is None else json.dumps(dict(config))
            self._c = _C.Engine.from_weights(_host_arrays(model), config_json, c, tp, device)
        self._c.set_rollout(
            page_size,
            num_pages,
            max_running,
            max_batched_tokens,
            bool(prefix_sharing),
            kv_splits,
            bool(cascade),
        )
        self.contract = contract
        self.device = device

    @property
    def config(self) -> dict:
        """The model's Qwen3 config (config.json keys)."""
        return json.loads(self._c.config_json())

    @property
    def weight_version(self) -> int:
        """0 at construction; + 1 (or the given version) on every successful update_weights."""
        return self._c.weight_version

    @property
    def tp(self) -> int:
        return self._c.tp

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: Union[None, Sampling, Mapping[str, Any], Sequence[Sampling]] = None,
        *,
        request_ids: Optional[Sequence[int]] = None,
    ) -> list:
        """Completes every prompt; returns one :class:`Completion` per prompt, in order.

        sampling: one setting for all (a Sampling or its fields as a dict; None: the defaults) or
        one per prompt. request_ids (default 0, 1, ...): unique ints >= 0 that key each request's
        sampling noise, so a request alone and inside any batch gives the same tokens. Equal
        prompts share their prefix in the KV cache.
        """
        prompts = list(prompts)
        toks = [_token_list("prompt", i, p) for i, p in enumerate(prompts)]
        n = len(toks)
        if sampling is None or isinstance(sampling, (Sampling, Mapping)):
            one = sampling if isinstance(sampling, Sampling) else Sampling(**(sampling or {}))
            per = [one] * n
        else:
            per = [s if isinstance(s, Sampling) else Sampling(**s) for s in sampling]
            if len(per) != n:
                raise Error(f"Engine.generate: {len(per)} sampling settings for {n} prompts")
        if request_ids is None:
            ids = list(range(n))
        else:
            ids = [operator.index(r) for r in request_ids]
            if len(ids) != n:
                raise Error(f"Engine.generate: {len(ids)} request ids for {n} prompts")
        out = self._c.generate(
            toks,
            ids,
            [operator.index(s.seed) for s in per],
            [float(s.temperature) for s in per],
            [operator.index(s.top_k) for s in per],
            [float(s.top_p) for s in per],
            [float(s.min_p) for s in per],
            [operator.index(s.max_new_tokens) for s in per],
            [int(s.stop_on_eos) for s in per],
        )
        return [Completion(*c) for c in out]

    def score(
        self,
        sequences: Sequence[Sequence[int]],
        prompt_lens: Union[None, int, Sequence[int]] = None,
        *,
        temperature: Union[float, Sequence[float]] = 1.0,
    ) -> list:
        """Per sequence the fp32 log-prob, logsumexp and entropy of every token after the prompt
        (default: after the first token), by the packed training forward at `temperature` (one
        for all or one per sequence; a rollout's values are at its Sampling's temperature, 1 for
        greedy). Returns one :class:`Scores` per sequence."""
        toks = [_token_list("sequence", i, s) for i, s in enumerate(list(sequences))]
        n = len(toks)
        if prompt_lens is None:
            lens = [1] * n
        elif _is_int(prompt_lens):
            lens = [operator.index(prompt_lens)] * n
        else:
            lens = [operator.index(p) for p in prompt_lens]
        if _is_real(temperature):
            temps = [float(temperature)] * n
        else:
            temps = [float(t) for t in temperature]
        return [Scores(*s) for s in self._c.score(toks, lens, temps)]

    def gradients(
        self,
        sequences: Sequence[Sequence[int]],
        targets: Sequence[Sequence[int]],
        g_lp: Sequence[Any],
        g_ent: Optional[Sequence[Any]] = None,
        *,
        temperature: float = 1.0,
        micro_batches: Optional[Sequence[Sequence[int]]] = None,
    ) -> Tuple[dict, list, list]:
        """The C++ model backward (engine::Backprop, docs/contract.md §B.10) of the packed
        training forward: the fp32 gradient of every weight (HF names) for the loss whose
        gradient w.r.t. each token's log-prob is g_lp and w.r.t. its entropy g_ent.

        Per sequence i: ``targets[i][t]`` is the token row t's log-prob is taken of (in [0, V),
        or -1: none, logp +0, no gradient), ``g_lp[i]`` / ``g_ent[i]`` one f32 value per token
        (``g_ent`` None: no entropy gradient), all at one ``temperature``. The step index (B.1) of
        sequence i is i; ``micro_batches`` (default: one holding all, in order) lists the
        sequences each micro-batch packs; they add to one fp32 chain per weight in the given
        order, which must be the step order (else lockstep.Error). A tied embedding's lm_head and
        embedding parts are combined once at the end (B.7). CPU engines only.

        Returns (grads {name: numpy f32}, logp per sequence, entropy per sequence).
        """
        toks = [_token_list("sequence", i, s) for i, s in enumerate(list(sequences))]
        n = len(toks)
        tgts = [_token_list("targets", i, t) for i, t in enumerate(list(targets))]

        def f32_lists(name: str, values: Any) -> list:
            out = []
            for i, v in enumerate(list(values)):
                a = np.asarray(v.detach() if hasattr(v, "detach") else v)
                if a.dtype != np.float32 or a.ndim != 1:
                    raise TypeError(f"Engine.gradients: {name}[{i}] must be a 1-D float32 array")
                out.append(a.tolist())
            return out

        glp = f32_lists("g_lp", g_lp)
        gent = [] if g_ent is None else f32_lists("g_ent", g_ent)
        if micro_batches is None:
            mbs = [list(range(n))]
        else:
            mbs = [[operator.index(i) for i in mb] for mb in micro_batches]
        grads, logp, entropy = self._c.gradients(toks, tgts, glp, gent, mbs, float(temperature))
        return dict(grads), list(logp), list(entropy)

    def update_weights(
        self,
        state_dict: Mapping[str, Any],
        *,
        partial: bool = False,
        version: Optional[int] = None,
    ) -> int:
        """Replaces the weights (HF names -> numpy arrays or CPU torch tensors, bf16 or f32,
        rounded to bf16 once); every weight unless `partial`. A tied model's lm_head.weight may be
        given along with model.embed_tokens.weight (the same tensor). Returns the new weight
        version (`version`, above the current one, or the current one + 1). Any bad name, shape,
        dtype, device or non-finite value raises lockstep.Error and keeps the old weights."""
        return self._c.update_weights(
            _host_arrays(state_dict), bool(partial), None if version is None else int(version)
        )

    def state_dict(self) -> dict:
        """Copies of the current weights as bf16 torch tensors (HF names; needs torch)."""
        import torch

        return {name: torch.from_dlpack(a) for name, a in self._c.weights().items()}

    def __repr__(self) -> str:
        return (
            f"lockstep.Engine({self.config.get('num_hidden_layers')} layers, "
            f"weight_version={self.weight_version}; {self._c.options()})"
        )
