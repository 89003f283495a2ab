"""How long ``smelt trace`` takes on a 10,000-step run (issue 42: goal under 5 s per answer).

Synthetic records, real formats: a documents dataset of random-word pages goes through the real tokenizer and
tokenize stages (so the tokens carry their lineage shards), and a run folder is written as the trainer writes one
(``lineage.json``, ``metrics.jsonl`` with each step's samples, ``events.jsonl``, a rollback in ``skipped.jsonl``,
``sample_losses/`` parts every ``--part-steps`` steps, one per data-parallel rank) without training. Each question is
then asked through the command line (``smelt trace``, a fresh process: imports included), as a user would.

Prints one JSON line: steps, global_batch, seq_len, docs, tokens, sample_loss_rows, wall seconds per question
(step, spikes, document, ledger) and the slowest, the CPU seconds of each process (user + system: what the answer
costs when the machine is not shared) and the slowest, cpus, and loadavg (1, 5, 15 min, at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from tasks import contract, jsonlog  # noqa: E402
from tasks.documents import DOCUMENT_COLUMNS, document_schema
from tasks.tokenize.config import TokenizeConfig, TokenizerConfig  # noqa: E402
from tasks.tokenize.stage import run_tokenize  # noqa: E402
from tasks.tokenize.tokenizer import train_tokenizer  # noqa: E402
from tasks.token_shards import TokenStream  # noqa: E402
from tasks.train.data import TokenLoader  # noqa: E402


def write_documents(url: str, docs: int, seed: int = 0) -> contract.Manifest:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    rows = {name: [] for name in DOCUMENT_COLUMNS}
    for n in range(docs):
        rows["id"].append(f"doc-{n}")
        rows["url"].append(f"https://bench.example/{n}")
        rows["source"].append("web")
        rows["lang"].append("en")
        rows["lang_score"].append(0.9)
        rows["quality_score"].append(rng.random())
        rows["text"].append(" ".join(rng.choice(words) for _ in range(rng.randint(80, 300))) + ".")
        rows["meta"].append(json.dumps({"warc_file": "bench.warc.gz", "offset": n * 1000}))
    table = pa.table(rows, schema=document_schema())

    def write(f) -> int:
        pq.write_table(table, f)
        return table.num_rows

    shard = contract.write_shard(url, "docs-00000.parquet", write)
    return contract.commit(url, "documents", "bench-trace-docs", [shard], {"out": docs})


def write_run(run: str, tokens_url: str, steps: int, batch: int, seq_len: int, part_steps: int, ranks: int) -> int:
    """A run folder as the trainer writes one (module docstring); returns the sample-loss rows written."""
    loader = TokenLoader({"web": tokens_url}, None, split="train", seq_len=seq_len, global_batch=batch, dp_rank=0,
                         dp_size=1, seed=0, prefetch=0)
    os.makedirs(os.path.join(run, "sample_losses"), exist_ok=True)
    Path(run, "lineage.json").write_text(json.dumps(loader.order()))
    loader.close()
    rng = np.random.default_rng(0)
    losses = 3.0 + 0.5 * np.exp(-np.arange(steps) / 2000) + rng.normal(0, 0.02, steps)
    spike = steps // 2
    losses[spike + 99] += 1.0  # step spike + 100: an outlier the guard let through
    skip = {"start": (spike - 1) * batch, "end": spike * batch, "step": spike, "rolled_back_to": spike - 1,
            "reason": "loss.spike", "loss": 9.0}
    jsonlog.append(run, "events.jsonl", {"event": "start", "group": 0, "resumed_from": None, "time": 0.0})
    lines, rows, at = [], 0, 0
    parts: dict[int, list] = {}
    for step in range(1, steps + 1):
        if step == spike:  # rejected once, then the step is redone past the skipped window
            lines.append({"step": step, "group": 0, "loss": 9.0, "samples": [at, at + batch], "rolled_back_to": step - 1})
            at += batch
        lines.append({"step": step, "group": 0, "loss": float(losses[step - 1]), "samples": [at, at + batch]})
        parts.setdefault((step - 1) // part_steps, []).append((step, at))
        at += batch
    Path(run, "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    Path(run, "skipped.jsonl").write_text(json.dumps(skip) + "\n")
    local = batch // ranks
    for number, members in parts.items():
        for rank in range(ranks):
            step = np.repeat([s for s, _ in members], local)
            sample = np.concatenate([np.arange(a + rank * local, a + (rank + 1) * local) for _, a in members])
            loss = (rng.normal(0, 0.3, len(step)) + np.repeat([losses[s - 1] for s, _ in members], local)).astype(np.float32)
            first, last = members[0][0], members[-1][0]
            pq.write_table(pa.table({"step": step, "sample": sample, "loss": loss}),
                           os.path.join(run, "sample_losses", f"part-{first:08d}-{last:08d}-r{rank:05d}-{number:020d}.parquet"))
            rows += len(step)
    return rows


def ask(run: str, *args: str) -> tuple[float, float, dict]:
    """(wall seconds, CPU seconds, answer) of one ``smelt trace`` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", "from flows.cli import main; main()", "trace", "--run", run, *args,
                          "--json"], cwd=REPO, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=64, help="global batch (sequences)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--part-steps", type=int, default=100, help="steps per sample-loss part (a checkpoint interval)")
    parser.add_argument("--ranks", type=int, default=8, help="data-parallel ranks writing parts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        docs = write_documents(os.path.join(tmp, "docs"), args.docs)
        tokenizer = train_tokenizer([docs], os.path.join(tmp, "tokenizer"), TokenizerConfig(vocab_size=2048),
                                    fingerprint="bench-tokenizer")
        tokens = run_tokenize([docs], tokenizer.meta["url"], os.path.join(tmp, "tokens"),
                              TokenizeConfig(val_fraction=0.0), fingerprint="bench-tokens")
        run = os.path.join(tmp, "run")
        rows = write_run(run, tokens.meta["url"], args.steps, args.batch, args.seq_len, args.part_steps, args.ranks)
        seconds, cpu = {}, {}
        seconds["step"], cpu["step"], answer = ask(run, "--step", str(args.steps - 17), "--top", "5")
        assert len(answer["sequences"]) == 5 and answer["recorded"] == args.batch
        seconds["spikes"], cpu["spikes"], answer = ask(run, "--spikes")
        assert {s["step"] for s in answer["spikes"]} >= {args.steps // 2, args.steps // 2 + 100}, answer["spikes"]
        url = next(s for s in answer["spikes"] if s.get("sequences"))["sequences"][0]["documents"][0]["url"]
        seconds["document"], cpu["document"], answer = ask(run, "--document", url)
        assert answer["times"] > 0
        seconds["ledger"], cpu["ledger"], answer = ask(run, "--ledger")
        assert answer["exactly_once"], answer
        stream_tokens = TokenStream(tokens.meta["url"], "train", args.seq_len, None).total
    print(json.dumps({
        "steps": args.steps, "global_batch": args.batch, "seq_len": args.seq_len, "docs": args.docs,
        "tokens": stream_tokens, "sample_loss_rows": rows,
        "seconds": {k: round(v, 2) for k, v in seconds.items()}, "slowest_s": round(max(seconds.values()), 2),
        "cpu_seconds": {k: round(v, 2) for k, v in cpu.items()}, "slowest_cpu_s": round(max(cpu.values()), 2),
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }))


if __name__ == "__main__":
    main()
