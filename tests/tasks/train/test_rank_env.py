"""Ranks start with glibc's allocator keeping freed memory (node_launch.RANK_MALLOC_ENV), unless the caller says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

from tasks.train import node_launch


def test_ranks_keep_freed_memory_unless_the_caller_sets_the_allocator(monkeypatch):
    for key in node_launch.RANK_MALLOC_ENV:
        monkeypatch.delenv(key, raising=False)
    assert node_launch.rank_malloc_env() == {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**30)}
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "65536")
    assert node_launch.rank_malloc_env() == {"MALLOC_TRIM_THRESHOLD_": str(2**30)}


def test_a_rank_step_stops_page_faulting_its_logits_back_in():
    # a loss over 2,048 x 4,096 fp32 logits (32 MiB, a demo rank's step): glibc's defaults unmap them and their
    # gradients when freed and fault them in again every step; with the rank settings a warm process reuses its heap
    script = ("import resource, torch, torch.nn.functional as F\n"
              "torch.set_num_threads(1)\n"
              "w, h = torch.randn(4096, 64, requires_grad=True), torch.randn(2048, 64)\n"
              "t = torch.randint(0, 4096, (2048,))\n"
              "step = lambda: F.cross_entropy(h @ w.t(), t).backward()\n"
              "for _ in range(10): step()\n"
              "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
              "for _ in range(10): step()\n"
              "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")
    base = {k: v for k, v in os.environ.items() if k not in node_launch.RANK_MALLOC_ENV}

    def faults(env: dict[str, str]) -> int:
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                             check=True)
        return int(out.stdout.split()[-1])

    default, rank = faults(base), faults({**base, **node_launch.rank_malloc_env()})
    assert default > 10 * 2**25 // 4096  # at least one 32 MiB block (8,192 pages) faulted in per step
    # at least 4x fewer: alone here over 10x; 6.7x inside the full suite (328,233 against 49,057 faults)
    assert rank < default / 4, (default, rank)
