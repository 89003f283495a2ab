"""GPU catalogue: the few numbers per accelerator that the planner needs, each overridable.

Peak is dense BF16 tensor-core throughput (no 2:4 sparsity). Bandwidths are per GPU and per direction,
in GB/s: ``nvlink_gbps`` inside a node, ``internode_gbps`` through the GPU's own NIC (400 Gb/s = 50 GB/s).
Prices are round ballpark rates per GPU-hour for a multi-month reservation in 2025 (H100 near $2 after the
2024 rental price drop), not quotes: pass your contract's price with ``--price``.
Sources: NVIDIA A100, H100, H200 and HGX B200 datasheets; the peaks are tasks/train/peaks.py's, which MFU uses too.

``compute_efficiency`` is the fraction of peak the training GEMMs reach when nothing waits on the network
(infra/timing.py). H100: the Meta stack's, fitted on Llama 3 405B's 430 TFLOP/s on 8,192 GPUs
(infra/stacks.py, FITTED["meta"]). A100: that times the A100/H100 ratio fitted on LLM Foundry's MPT-7B
runs (FITTED["a100"]). H200 and B200 reuse the H100 figure (same die for H200; B200 unmeasured).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tasks.train.peaks import peak_bf16


@dataclass(frozen=True)
class GPU:
    name: str
    label: str
    memory_gb: float
    nvlink_gbps: float
    internode_gbps: float
    gpus_per_node: int
    price_per_hour: float
    host_copy_gbps: float  # device → host copy (PCIe) for checkpoint staging
    hbm_tbps: float  # device memory bandwidth, TB/s (memory-bound recomputation)
    compute_efficiency: float  # achievable fraction of peak for the training math
    peak_tflops: float = 0.0  # dense bf16; 0: the peak tasks/train/peaks.py lists for the label (MFU's too)

    def __post_init__(self) -> None:
        if not self.peak_tflops:
            object.__setattr__(self, "peak_tflops", peak_bf16(self.label) / 1e12)

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12


CATALOGUE: dict[str, GPU] = {
    "a100": GPU("a100", "A100 80GB SXM", memory_gb=80, nvlink_gbps=300, internode_gbps=25,
                gpus_per_node=8, price_per_hour=1.20, host_copy_gbps=25, hbm_tbps=2.039,
                compute_efficiency=0.7396),
    "h100": GPU("h100", "H100 SXM 80GB", memory_gb=80, nvlink_gbps=450, internode_gbps=50,
                gpus_per_node=8, price_per_hour=2.00, host_copy_gbps=50, hbm_tbps=3.35, compute_efficiency=0.6241),
    "h200": GPU("h200", "H200 SXM 141GB", memory_gb=141, nvlink_gbps=450, internode_gbps=50,
                gpus_per_node=8, price_per_hour=2.50, host_copy_gbps=50, hbm_tbps=4.8, compute_efficiency=0.6241),
    "b200": GPU("b200", "B200 180GB (HGX)", memory_gb=180, nvlink_gbps=900, internode_gbps=50,
                gpus_per_node=8, price_per_hour=3.50, host_copy_gbps=50, hbm_tbps=8.0, compute_efficiency=0.6241),
}
# Variants that published runs used (infra/published_runs.py): A100 40GB; the H100 in Meta's Grand Teton hosts
# that torchtitan benchmarked (96 GB HBM2e at 2.4 TB/s, 500 W power limit, so below the SXM peak by an
# unpublished amount: torchtitan's benchmarks/llama3_h100_202412_torchtitan.md).
CATALOGUE["a100-40gb"] = dataclasses.replace(CATALOGUE["a100"], name="a100-40gb", label="A100 40GB SXM", memory_gb=40,
                                             hbm_tbps=1.555)
CATALOGUE["h100-96gb-500w"] = dataclasses.replace(CATALOGUE["h100"], name="h100-96gb-500w",
                                                  label="H100 96GB HBM2e, 500 W", memory_gb=96, hbm_tbps=2.4)
ALIASES = {"a100-80gb": "a100", "h100-sxm": "h100", "h100-80gb": "h100", "h200-141gb": "h200"}


def gpu(name: str, **overrides: float) -> GPU:
    """Catalogue entry ``name`` with any field replaced, e.g. ``gpu("h100", price_per_hour=2.4)``."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in CATALOGUE:
        raise ValueError(f"unknown GPU {name!r}; choose one of {', '.join(CATALOGUE)}")
    fields = {f.name: f for f in dataclasses.fields(GPU)}
    for field_name, value in overrides.items():
        if field_name not in fields or field_name in ("name", "label"):
            numeric = ", ".join(f for f in fields if f not in ("name", "label"))
            raise ValueError(f"unknown GPU field {field_name!r}; overridable fields: {numeric}")
        if value <= 0 or (field_name == "compute_efficiency" and value > 1):
            raise ValueError(f"GPU field {field_name} must be positive (efficiency at most 1), got {value}")
    typed = {k: (int(v) if fields[k].type in (int, "int") else float(v)) for k, v in overrides.items()}
    return dataclasses.replace(CATALOGUE[key], **typed)


def parse_overrides(items: list[str]) -> dict[str, float]:
    """``["memory_gb=96", "price_per_hour=2.4"]`` → ``{"memory_gb": 96.0, ...}``."""
    out: dict[str, float] = {}
    for item in items:
        field_name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"GPU override {item!r} must look like field=value, e.g. memory_gb=96")
        try:
            out[field_name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"GPU override {item!r} needs a number after '='") from None
    return out
