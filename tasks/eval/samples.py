"""Samples a person can read: the model continuing the beginnings of the held-out documents.

The prompts are the validation split's own text (its first documents, cut after a few tokens), so a
sample shows what the model learned of the data it trained on, beside what the document really says
next. Each prompt is completed twice: greedily, and sampled at a temperature with a fixed seed, so
the same checkpoint always shows the same samples.
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.eval.config import SamplesConfig
from tasks.token_shards import TokenStream

SCAN_CHUNK = 65_536  # held-out tokens read at a time while looking for documents long enough


@torch.no_grad()
def continue_rows(model, ids: list[int], new_tokens: int, temperatures: list[float], *, context: int | None = None,
                  generator: torch.Generator | None = None, stop_id: int | None = None) -> list[list[int]]:
    """One continuation of ``ids`` per temperature, ``new_tokens`` long, generated side by side in one
    batch: temperature 0 takes the most likely token each time, a positive one draws from the softmax
    at that temperature with ``generator``. A row ends after ``stop_id``. The model sees at most the
    last ``context`` tokens (default: its ``max_seq_len``)."""
    context = context or model.cfg.max_seq_len
    rows = torch.tensor([list(ids)] * len(temperatures))
    new: list[list[int]] = [[] for _ in temperatures]
    done = [False] * len(temperatures)
    for _ in range(new_tokens):
        logits = model(rows[:, -context:])[:, -1].float()  # (rows, vocab)
        picked = []
        for r, temperature in enumerate(temperatures):
            if temperature > 0:
                probs = torch.softmax(logits[r] / temperature, dim=-1)
                picked.append(int(torch.multinomial(probs, 1, generator=generator)))
            else:
                picked.append(int(logits[r].argmax()))
            if not done[r]:
                new[r].append(picked[-1])
                done[r] = picked[-1] == stop_id
        if all(done):
            break
        rows = torch.cat([rows, torch.tensor(picked)[:, None]], dim=1)
    return new


def complete(model, ids: list[int], new_tokens: int, *, context: int | None = None) -> list[int]:
    """The greedy continuation of ``ids``, ``new_tokens`` long."""
    return continue_rows(model, ids, new_tokens, [0.0], context=context)[0]


def document_beginnings(stream: TokenStream, eos_id: int | None, docs: int, min_tokens: int) -> list[np.ndarray]:
    """The first ``min_tokens`` tokens of each of the first ``docs`` documents of the stream that have
    at least that many (documents end with EOS, as the tokenize stage writes them)."""
    found: list[np.ndarray] = []
    doc_start, position, taken = 0, 0, False
    while len(found) < docs and position < stream.total:
        n = min(SCAN_CHUNK, stream.total - position)
        chunk = np.empty(n, dtype=np.int64)
        stream.read(position, n, chunk)
        ends = (np.flatnonzero(chunk == eos_id) + position).tolist() if eos_id is not None else []
        for end, is_eos in [*((e, True) for e in ends), (position + n, False)]:
            if not taken and end - doc_start >= min_tokens:  # long enough, finished or not
                ids = np.empty(min_tokens, dtype=np.int64)
                stream.read(doc_start, min_tokens, ids)
                found.append(ids)
                taken = True
                if len(found) == docs:
                    return found
            if is_eos:
                doc_start, taken = end + 1, False
        position += n
    return found


def validation_samples(model, tokenizer, stream: TokenStream, cfg: SamplesConfig, seq_len: int) -> list[dict]:
    """For each of the first ``cfg.docs`` held-out documents long enough: its beginning (the prompt),
    the model's greedy and sampled continuations, and the document's real continuation."""
    eos_id = stream.meta.get("eos_id")
    need = cfg.prompt_tokens + cfg.new_tokens
    out = []
    for ids in document_beginnings(stream, eos_id, cfg.docs, need):
        prompt, actual = ids[:cfg.prompt_tokens].tolist(), ids[cfg.prompt_tokens:].tolist()
        generator = torch.Generator().manual_seed(cfg.seed)
        greedy, sampled = continue_rows(model, prompt, cfg.new_tokens, [0.0, cfg.temperature], context=seq_len,
                                        generator=generator, stop_id=eos_id)
        out.append({"prompt": tokenizer.decode(prompt), "greedy": tokenizer.decode(greedy),
                    "sampled": tokenizer.decode(sampled), "actual": tokenizer.decode(actual),
                    "temperature": cfg.temperature, "seed": cfg.seed})
    return out
