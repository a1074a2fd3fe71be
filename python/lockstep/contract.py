"""The deployment's contract settings (include/lockstep/contract/config.h) as a Python value.

Every setting that can change bits: chosen once per deployment (never by batch size or thread
count), the same in rollout and training.
"""

from __future__ import annotations

import dataclasses

from lockstep import _C


@dataclasses.dataclass(frozen=True)
class Contract:
    """``lockstep::ContractConfig``: GEMM K segments, attention KV chunk, log-prob vocab tiling."""

    gemm_segments: int = 1  # 1, 2, 4 or 8: K segments of every GEMM (the maximum TP degree)
    kv_chunk: int = 1024  # keys per canonical attention KV chunk (a multiple of 64)
    vocab_tile: int = 256  # log-prob vocab entries per tile
    vocab_segments: int = 1  # log-prob vocab segments (tree-combined)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"Contract.{field.name} must be an int, got {value!r}")
        self.to_c().validate()  # lockstep.Error with the library's message

    def to_c(self) -> _C.ContractConfig:
        return _C.ContractConfig(
            self.gemm_segments, self.kv_chunk, self.vocab_tile, self.vocab_segments
        )

    def __str__(self) -> str:
        return repr(self.to_c())
