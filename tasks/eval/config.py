"""Evaluation config: how much held-out data to score, and the probes to run."""

from dataclasses import dataclass, field


@dataclass
class EvalConfig:
    split: str = "val"
    seq_len: int = 0  # 0: the training sequence length
    batch_size: int = 8
    max_tokens: int = 2_000_000  # cap on scored tokens, so eval cost stays bounded on huge val sets
    probe_prompts: list[str] = field(default_factory=lambda: [
        "The module provides",
        "def main(",
        "This function returns",
    ])
    probe_tokens: int = 16
