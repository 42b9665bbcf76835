"""`asrdist.optim.light`: SGD with torch.optim.SGD's updates to the bit and its state_dict layout
(checkpoints load either way), and no `torch._dynamo` in a process that builds and steps it."""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from asrdist.optim.adagrad import CntkAdaGrad
from asrdist.optim.light import SGD


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=gen)), torch.nn.Parameter(torch.randn(3, generator=gen))]


def _grads(step: int, params) -> None:
    gen = torch.Generator().manual_seed(100 + step)
    for k, p in enumerate(params):
        # the bias has no gradient on odd steps: a parameter without a grad is skipped, as torch skips it
        p.grad = None if (k == 1 and step % 2) else torch.randn(p.shape, generator=gen)


@pytest.mark.parametrize("options", [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    dict(lr=0.2, momentum=0.5, dampening=0.1, maximize=True),
    dict(lr=0.1, momentum=0.9, foreach=True),
])
def test_every_step_is_torchs_to_the_bit(options):
    ours, theirs = _params(), _params()
    groups = lambda ps: [{"params": [ps[0]]}, {"params": [ps[1]], "lr": options["lr"] / 2}]  # noqa: E731
    a, b = SGD(groups(ours), **options), torch.optim.SGD(groups(theirs), **options)
    for step in range(6):
        _grads(step, ours)
        _grads(step, theirs)
        a.step()
        b.step()
        a.zero_grad()
        b.zero_grad()
    for p, q in zip(ours, theirs):
        assert torch.equal(p, q)
    assert all(p.grad is None for p in ours)


def test_state_dicts_load_both_ways_and_training_goes_on_identically():
    options = dict(lr=0.1, momentum=0.9, nesterov=True)
    ours, theirs = _params(), _params()
    a, b = SGD(ours, **options), torch.optim.SGD(theirs, **options)
    for step in range(3):
        _grads(step, ours), _grads(step, theirs)
        a.step(), b.step()
    state = a.state_dict()
    assert set(state) == {"state", "param_groups"} and set(state["state"]) == {0, 1}
    assert state["param_groups"][0]["params"] == [0, 1]
    # ours into torch's and torch's into ours, on fresh copies of the parameters
    ours2 = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    theirs2 = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
    b2, a2 = torch.optim.SGD(theirs2, **options), SGD(ours2, **options)
    b2.load_state_dict(copy.deepcopy(state))  # as from a checkpoint: torch.optim keeps what it is given
    a2.load_state_dict(b.state_dict())
    for step in range(3, 6):
        for ps in (ours, theirs, ours2, theirs2):
            _grads(step, ps)
        for opt in (a, b, a2, b2):
            opt.step()
    for p, q, r, s in zip(ours, theirs, ours2, theirs2):
        assert torch.equal(p, q) and torch.equal(p, r) and torch.equal(p, s)
    with pytest.raises(ValueError, match="different number"):
        SGD(_params()[:1], lr=0.1).load_state_dict(state)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        SGD([], lr=0.1)
    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="more than one"):
        SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(ValueError, match="Nesterov"):
        SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError):
        SGD([p], lr=-1.0)
    assert "SGD(lr=0.1" in repr(SGD([p], lr=0.1))


def test_a_process_that_trains_with_them_never_imports_torch_dynamo():
    """torch.optim's optimizers import torch._dynamo (about 1.9 CPU-s) when built and at each
    SGD step; these do not."""
    code = """
import sys, torch
from asrdist.optim.light import SGD
from asrdist.optim.adagrad import CntkAdaGrad
for cls, kw in ((SGD, dict(lr=0.1, momentum=0.9, nesterov=True)), (CntkAdaGrad, dict(lr=0.1, momentum=0.5))):
    p = torch.nn.Parameter(torch.ones(4))
    opt = cls([p], **kw)
    (p * p).sum().backward()
    opt.step(); opt.zero_grad(); opt.load_state_dict(opt.state_dict())
print("torch._dynamo" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_cntk_adagrad_keeps_its_state_across_a_state_dict():
    ps, qs = _params(), _params()
    a, b = CntkAdaGrad(ps, lr=0.1, momentum=0.5), CntkAdaGrad(qs, lr=0.1, momentum=0.5)
    for step in range(2):
        _grads(step, ps), _grads(step, qs)
        a.step(), b.step()
    fresh = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    c = CntkAdaGrad(fresh, lr=0.1, momentum=0.5)
    c.load_state_dict(a.state_dict())
    assert set(c.state[fresh[0]]) == {"sum_sq", "momentum_buffer"}
    for step in range(2, 4):
        _grads(step, ps), _grads(step, fresh)
        a.step(), c.step()
    assert all(torch.equal(p, q) for p, q in zip(ps, fresh))
