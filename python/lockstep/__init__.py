"""lockstep: bitwise-reproducible LLM ops (docs/contract.md).

``lockstep._C`` holds the library's ops over DLPack arrays (inputs and preallocated outputs, the
op's settings as plain values); ``lockstep.torch`` makes them PyTorch custom ops with autograd
(``pip install .[torch]``); ``lockstep.Engine`` runs the rollout engine and the training forward
of a Qwen3 model (``lockstep.engine``). Every contract check raises :class:`lockstep.Error` (a
RuntimeError) with the library's message.
"""

from lockstep._C import (
    ContractConfig,
    Error,
    contract_version,
    cuda_build,
    num_threads,
    set_num_threads,
)
from lockstep.contract import Contract
from lockstep.engine import Completion, Engine, Sampling, Scores

__all__ = [
    "Completion",
    "Contract",
    "ContractConfig",
    "Engine",
    "Error",
    "contract_version",
    "cuda_build",
    "num_threads",
    "Sampling",
    "Scores",
    "set_num_threads",
]
__version__ = "0.1.0"
