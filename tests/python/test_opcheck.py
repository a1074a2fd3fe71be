"""torch.library.opcheck on every lockstep op: schema, autograd registration, fake tensors and
AOT dispatch (the forward and backward traced with dynamic shapes)."""

import pytest
import torch

import cases

CASES = cases.op_cases(torch.Generator().manual_seed(7))


@pytest.mark.parametrize("name,op,args", CASES, ids=[c[0] for c in CASES])
def test_opcheck(name, op, args):
    torch.library.opcheck(op, args)


def test_every_op_is_checked():
    checked = {str(c[1]).split(".")[1] for c in CASES}
    registered = {
        n.split("::")[1]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("lockstep::")
    }
    assert len(registered) == 19
    assert checked == registered
