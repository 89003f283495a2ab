"""Accelerators' dense bf16 peak FLOP/s: the one table that MFU (tasks/train/metrics.py) divides by and the
planner's GPU catalogue (infra/catalogue.py) starts from. No torch: the planner imports it.
"""

from __future__ import annotations

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets, FLOP/s. Longer names
# first: "H100 PCIe" must match before "H100".
GPU_PEAK_BF16 = [
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM
    ("H200", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("B100", 1750e12),
    ("A100", 312e12),
    ("A10G", 70e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("MI300X", 1307e12),
]


def peak_bf16(name: str) -> float | None:
    """The peak of the first table entry whose key is in ``name`` (a device name as torch reports it, or a
    catalogue label); None for an accelerator the table does not know."""
    return next((peak for key, peak in GPU_PEAK_BF16 if key in name), None)
