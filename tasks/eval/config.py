"""Evaluation config: how much held-out data to score, and the probes to run."""

from dataclasses import dataclass, field

from tasks.config import check_at_least


@dataclass
class HarnessConfig:
    """lm-evaluation-harness on a last-word cloze task built from held-out documents (tasks/eval/harness.py)."""

    enabled: bool = False
    docs: int = 200  # cloze items (the first held-out documents long enough)
    min_words: int = 8  # a document needs this many words before its target word
    max_words: int = 64  # the passage is cut to this many words
    max_tokens: int = 500_000  # held-out tokens read to find the documents
    batch_size: int = 8


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

    def __post_init__(self) -> None:
        if not self.split:
            raise ValueError("eval.split must name a split of the tokens dataset, e.g. 'val'")
        check_at_least("eval", self, 0, "seq_len", "probe_tokens")
        check_at_least("eval", self, 1, "batch_size", "max_tokens")
    harness: HarnessConfig = field(default_factory=HarnessConfig)
