"""Tokenize stage and token loader throughput, as ratios against a bare encode in the same run.

Builds a documents dataset from the Python standard library's own source files (real prose and
code, no download), trains a tokenizer on it (untimed), then times:

- ``encode_batch``: a bare ``Tokenizer.encode_batch`` of all the texts, already in memory;
- the stage: ``run_tokenize`` on the same texts (Parquet read, split, encode, EOS, shard writes,
  checksums, manifest), serially in this process;
- the loader: ``TokenLoader.next_batch`` on the stage's output, pinned to one core, no prefetch.

Prints one JSON line: mb, mb_per_s, tokens_per_s, overhead_vs_encode_batch (stage time over bare
encode time; goal <= 1.25) and loader_tokens_per_s (goal >= 5,000,000).
"""

from __future__ import annotations

import argparse
import json
import os
import sysconfig
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tasks import contract
from tasks.documents import DOCUMENT_COLUMNS, document_schema
from tasks.tokenize.config import TokenizeConfig, TokenizerConfig
from tasks.tokenize.stage import run_tokenize
from tasks.tokenize.tokenizer import train_tokenizer
from tasks.tokenizer_files import load_tokenizer
from tasks.train.data import TokenLoader


def stdlib_texts(megabytes: float) -> list[str]:
    """Standard-library source files as documents, cycled until ``megabytes`` of UTF-8 text."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    texts, size, budget = [], 0, int(megabytes * 1e6)
    while size < budget:
        for path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            texts.append(text)
            size += len(text.encode("utf-8"))
            if size >= budget:
                break
    return texts


def write_documents(url: str, texts: list[str], shards: int) -> contract.Manifest:
    infos = []
    for k in range(shards):
        part = texts[k::shards]
        columns = {name: [None] * len(part) for name in DOCUMENT_COLUMNS}
        columns["id"] = [f"doc-{k}-{i}" for i in range(len(part))]
        columns["text"] = part
        table = pa.table(columns, schema=document_schema())

        def write(f, table=table) -> int:
            pq.write_table(table, f, row_group_size=1024)
            return table.num_rows

        infos.append(contract.write_shard(url, f"docs-{k:05d}.parquet", write))
    return contract.commit(url, "documents", "bench-docs", infos, {"docs": len(texts)})


def time_encode_batch(tokenizer_url: str, texts: list[str]) -> float:
    tokenizer = load_tokenizer(tokenizer_url)  # fresh: no warm BPE cache
    start = time.perf_counter()
    tokenizer.encode_batch(texts, add_special_tokens=False)
    return time.perf_counter() - start


def time_stage(docs: contract.Manifest, tokenizer_url: str, out: str, cfg: TokenizeConfig) -> tuple[float, contract.Manifest]:
    start = time.perf_counter()
    manifest = run_tokenize([docs], tokenizer_url, out, cfg, fingerprint="bench")
    return time.perf_counter() - start, manifest


def loader_tokens_per_s(url: str, seq_len: int, global_batch: int, seconds: float) -> float:
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if cores:
        os.sched_setaffinity(0, {min(cores)})
    try:
        with TokenLoader({"bench": url}, None, split="train", seq_len=seq_len, global_batch=global_batch,
                         dp_rank=0, dp_size=1, seed=0, prefetch=0) as loader:
            loader.next_batch()
            tokens, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                inputs, _ = loader.next_batch()
                tokens += inputs.numel()
            return tokens / (time.perf_counter() - start)
    finally:
        if cores:
            os.sched_setaffinity(0, cores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=4.0, help="megabytes of text to tokenize")
    parser.add_argument("--shards", type=int, default=4, help="documents shards (stage work items)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=2, help="timings per side; the fastest counts")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--loader-seconds", type=float, default=3.0)
    args = parser.parse_args()

    texts = stdlib_texts(args.mb)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    cfg, tokenizer_cfg = TokenizeConfig(), TokenizerConfig(vocab_size=args.vocab_size, sample_docs=2000)
    with tempfile.TemporaryDirectory(prefix="smelt-bench-") as tmp:
        docs = write_documents(os.path.join(tmp, "docs"), texts, args.shards)
        tokenizer_url = train_tokenizer([docs], os.path.join(tmp, "tokenizer"), tokenizer_cfg, fingerprint="bench").meta["url"]
        bare, stage = [], []
        for r in range(args.repeats):
            bare.append(time_encode_batch(tokenizer_url, texts))
            seconds, tokens = time_stage(docs, tokenizer_url, os.path.join(tmp, f"tokens-{r}"), cfg)
            stage.append(seconds)
        loader_rate = loader_tokens_per_s(tokens.meta["url"], args.seq_len, args.global_batch, args.loader_seconds)
    print(json.dumps({
        "mb": round(mb, 2),
        "mb_per_s": round(mb / min(stage), 3),
        "tokens_per_s": round(tokens.rows / min(stage)),
        "overhead_vs_encode_batch": round(min(stage) / min(bare), 3),
        "loader_tokens_per_s": round(loader_rate),
    }))


if __name__ == "__main__":
    main()
