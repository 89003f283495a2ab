"""Learning-rate schedule, weight-decay groups and global-norm clipping."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tasks.train.config import OptimConfig
from tasks.train.optim import Optimizers, clip_grad_norm_, lr_at

CFG = OptimConfig(lr=1.0, min_lr_ratio=0.1, warmup_steps=4)


def test_warmup_rises_linearly_to_the_peak():
    assert [lr_at(s, CFG, 20) for s in (1, 2, 4)] == [0.25, 0.5, 1.0]


def test_cosine_decays_from_the_peak_to_the_floor():
    assert lr_at(12, CFG, 20) == pytest.approx(0.55)  # halfway: (1 + 0.1) / 2
    assert lr_at(20, CFG, 20) == pytest.approx(0.1)
    assert lr_at(25, CFG, 20) == pytest.approx(0.1)  # past the budget (a longer resumed run)
    lrs = [lr_at(s, CFG, 20) for s in range(4, 21)]
    assert lrs == sorted(lrs, reverse=True)


def test_no_warmup_starts_at_the_peak():
    assert lr_at(1, OptimConfig(lr=2.0, warmup_steps=0), 10) == pytest.approx(2.0, rel=0.05)


def test_norm_gains_get_no_weight_decay():
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.LayerNorm(4, bias=False))
    (opt,) = Optimizers([model], OptimConfig(weight_decay=0.1), "cpu").optimizers
    decay, no_decay = opt.param_groups
    assert [p.shape for p in decay["params"]] == [(4, 4)] and decay["weight_decay"] == 0.1
    assert [p.shape for p in no_decay["params"]] == [(4,)] and no_decay["weight_decay"] == 0.0


def test_set_lr_reaches_every_group():
    opts = Optimizers([nn.Linear(2, 2), nn.Linear(2, 2)], OptimConfig(), "cpu")
    opts.set_lr(0.125)
    assert {g["lr"] for o in opts.optimizers for g in o.param_groups} == {0.125}


def test_clipping_scales_to_the_global_norm_and_returns_the_norm_before():
    params = [nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(1))]
    params[0].grad, params[1].grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
    norm = clip_grad_norm_(params, max_norm=1.0)
    assert norm.item() == pytest.approx(5.0)
    torch.testing.assert_close(params[0].grad, torch.tensor([0.6, 0.0]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(params[1].grad, torch.tensor([0.8]), rtol=1e-5, atol=1e-6)


def test_zero_max_norm_only_measures():
    param = nn.Parameter(torch.zeros(2))
    param.grad = torch.tensor([3.0, 4.0])
    assert clip_grad_norm_([param], max_norm=0).item() == pytest.approx(5.0)
    torch.testing.assert_close(param.grad, torch.tensor([3.0, 4.0]))
