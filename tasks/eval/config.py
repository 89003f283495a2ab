"""Evaluation config: how much held-out data to score, the samples to show, and optional probes."""

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
class SamplesConfig:
    """``[eval.samples]``: continuations of the held-out documents' own beginnings (tasks/eval/samples.py)."""

    docs: int = 1  # documents per validation split whose beginnings become prompts (0: none)
    prompt_tokens: int = 32  # the prompt: the document's first tokens
    new_tokens: int = 48  # tokens generated (greedy, and sampled), ending early at EOS
    temperature: float = 0.8  # of the sampled continuation
    seed: int = 0  # of the sampled continuation: the same checkpoint always shows the same sample

    def __post_init__(self) -> None:
        check_at_least("eval.samples", self, 0, "docs")
        check_at_least("eval.samples", self, 1, "prompt_tokens", "new_tokens")
        if not self.temperature > 0:
            raise ValueError(f"eval.samples.temperature must be positive, got {self.temperature}")


@dataclass
class EvalConfig:
    split: str = "val"
    seq_len: int = 0  # 0: the training sequence length
    batch_size: int = 8
    max_tokens: int = 2_000_000  # cap on scored tokens, so eval cost stays bounded on huge val sets
    # torch threads while scoring (0: torch's default). On a busy small machine 1 is far faster: with
    # 2 threads a small model's matmuls waited on each other whenever another process held a core.
    threads: int = 0
    samples: SamplesConfig = field(default_factory=SamplesConfig)
    probe_prompts: list[str] = field(default_factory=list)  # extra prompts of your own, completed greedily
    probe_tokens: int = 16
    harness: HarnessConfig = field(default_factory=HarnessConfig)

    def __post_init__(self) -> None:
        if not self.split:
            raise ValueError("eval.split must name a split of the tokens dataset, e.g. 'val'")
        check_at_least("eval", self, 0, "seq_len", "probe_tokens", "threads")
        check_at_least("eval", self, 1, "batch_size", "max_tokens")
