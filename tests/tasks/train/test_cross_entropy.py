"""The chunked, recomputed cross entropy equals aten's, alone and vocabulary-parallel over 2 gloo ranks."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel

from tasks.train.cross_entropy import token_sum_cross_entropy
from tests.tasks.train.ranks import run_ranks

B, T, V = 2, 13, 40  # 26 tokens: chunks of 3 leave a short last chunk


def _inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(B, T, V, generator=g) * 3).to(dtype)
    return logits, torch.randint(0, V, (B, T), generator=g)


def _reference(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.detach().clone().requires_grad_()
    loss = F.cross_entropy(x.flatten(0, 1).float(), targets.flatten(), reduction="sum")
    loss.backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_logits", [3 * V, 7 * V, 1000 * V, 1])
def test_chunked_loss_and_gradient_equal_the_unchunked_ones(dtype, chunk_logits):
    logits, targets = _inputs(dtype)
    want_loss, want_grad = _reference(logits, targets)
    x = logits.clone().requires_grad_()
    loss = token_sum_cross_entropy(x, targets, chunk_logits=chunk_logits)
    loss.backward()
    assert loss.dtype == torch.float32 and x.grad.dtype == dtype
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(x.grad, want_grad)


def test_the_backward_recomputes_instead_of_saving_the_fp32_softmax():
    # what autograd keeps between forward and backward: with chunks, only the (bf16) logits themselves
    logits, targets = _inputs(torch.bfloat16)
    x = logits.clone().requires_grad_()
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        token_sum_cross_entropy(x, targets, chunk_logits=3 * V)
    assert saved and all(t.dtype != torch.float32 or t.numel() < V for t in saved)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        saved.clear()
        F.cross_entropy(x.flatten(0, 1).float(), targets.flatten(), reduction="sum")
    assert any(t.dtype == torch.float32 and t.numel() == B * T * V for t in saved)  # aten keeps it whole


def _vocab_parallel(rank: int, out_dir: str) -> None:
    mesh = init_device_mesh("cpu", (2,))
    logits, targets = _inputs(torch.float32)
    x = distribute_tensor(logits, mesh, [Shard(2)]).requires_grad_()
    with loss_parallel():
        loss = token_sum_cross_entropy(x, targets, chunk_logits=3 * V)
        loss.backward()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"loss": loss.full_tensor().item(), "grad": x.grad.full_tensor().tolist()}, f)


@pytest.mark.slow
def test_vocabulary_parallel_chunks_equal_the_single_process_loss(tmp_path):
    run_ranks(2, _vocab_parallel, str(tmp_path))
    want_loss, want_grad = _reference(*_inputs(torch.float32))
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["loss"] == pytest.approx(want_loss.item(), rel=1e-6)
        torch.testing.assert_close(torch.tensor(got["grad"]), want_grad)
