"""Benchmark: smelt dedup vs datasketch MinHash + MinHashLSH on a corpus with planted duplicates.

Prints one JSON line. The corpus is seeded "real-looking" English: words drawn with the
frequencies they have in the docstrings of Python's standard library, in sentences with
capitals and punctuation. A share of documents are planted copies of others, each with its own
word edit rate (substitutions, insertions, deletions), some exact copies rendered differently
(case, punctuation), some copies of copies, so the true Jaccard of word 5-gram sets falls on
both sides of the threshold.

Truth: the exact Jaccard of word 5-gram sets (shingles identified by their word ids) for every
pair that can reach the threshold. Pairs are found with prefix filtering (each set sorted in one
global order; two sets with Jaccard ≥ t must share a token among each one's first
|A| − ⌈t·|A|⌉ + 1), which is exact: every pair it skips shares no shingle there and is provably
below t. True duplicates are the connected components of the ≥ t graph; within each, all but
one document should go. precision = correct removals / removals; recall = correct removals /
Σ(component size − 1).

Speed, in documents per CPU-second of one core (CPU time, not wall time, so other load on a
shared machine skews the ratio less; smelt and datasketch run ``--repeat`` times alternating and
the fastest of each counts): ``docs_per_s`` is the whole smelt stage (read Parquet,
signatures, shuffle, verify, cluster, write Parquet) in one process, serial;
``signature_lsh_docs_per_s`` its signature and pair phases only. ``datasketch_docs_per_s`` is
datasketch ``MinHash(num_perm=128)`` (default SHA-1 hash) + ``MinHashLSH(threshold)`` insert and
query over the same normalised shingles, in this run, on up to ``--datasketch-docs`` documents.
``peak_rss_mb`` is the smelt process's peak resident memory (of the fastest run). The clock
starts after the imports a worker has already paid for (pyarrow, and the pandas it loads).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import multiprocessing
import os
import re
import resource
import sysconfig
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

SHINGLE = 5


def docstring_vocabulary(max_files: int = 400, max_words: int = 30_000) -> tuple[list[str], np.ndarray]:
    """English words and their frequencies from the standard library's docstrings."""
    counts: Counter[str] = Counter()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py"))[:max_files]:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    counts.update(re.findall(r"[a-z]{2,}", doc.lower()))
    words, freq = zip(*counts.most_common(max_words))
    return list(words), np.array(freq, dtype=np.float64) / sum(freq)


class Corpus:
    """Seeded documents as word-id sequences, with planted duplicate clusters."""

    def __init__(self, n_docs: int, seed: int, dup_share: float = 0.3):
        self.rng = np.random.default_rng(seed)
        self.vocab, freq = docstring_vocabulary()
        self.cdf = np.cumsum(freq)
        self.tokens: list[np.ndarray] = []
        self.render_seed: list[int] = []
        n_variants = int(n_docs * dup_share)
        n_base = n_docs - n_variants
        lengths = np.clip(self.rng.lognormal(math.log(250), 0.5, size=n_base), 40, 2000).astype(np.int64)
        chunks = np.array_split(lengths, max(1, n_base // 20_000))  # bounds the float draws in memory
        words = np.concatenate([self._words(int(chunk.sum())) for chunk in chunks])
        self.tokens = np.split(words, np.cumsum(lengths)[:-1]) if n_base else []
        family: dict[int, list[int]] = {}
        for _ in range(n_variants):
            root = int(self.rng.integers(n_base))
            members = family.setdefault(root, [root])
            source = members[-1] if len(members) > 1 and self.rng.random() < 0.3 else root  # copies of copies
            rate = 0.0 if self.rng.random() < 0.15 else float(self.rng.uniform(0.0, 0.07))
            members.append(len(self.tokens))
            self.tokens.append(self._edit(self.tokens[source], rate))
        order = self.rng.permutation(len(self.tokens))  # duplicates spread over every shard
        self.tokens = [self.tokens[i] for i in order]
        self.render_seed = self.rng.integers(1 << 31, size=len(self.tokens)).tolist()

    def _words(self, n: int) -> np.ndarray:
        return np.searchsorted(self.cdf, self.rng.random(n) * self.cdf[-1]).astype(np.int32)

    def _edit(self, tokens: np.ndarray, rate: float) -> np.ndarray:
        op = self.rng.random(len(tokens))
        edited = np.where(op < rate / 2, self._words(len(tokens)), tokens)  # substitute
        keep = ~((op >= rate / 2) & (op < 3 * rate / 4))  # delete
        insert_after = (op >= 3 * rate / 4) & (op < rate)
        for i in np.flatnonzero(insert_after)[::-1]:
            edited = np.insert(edited, i + 1, self._words(1))
            keep = np.insert(keep, i + 1, True)
        out = edited[keep]
        return out if len(out) else tokens

    def text(self, i: int) -> str:
        """Document ``i`` as prose: sentences with capitals, commas and full stops."""
        rng = np.random.default_rng(self.render_seed[i])
        words = [self.vocab[t] for t in self.tokens[i]]
        shout = rng.random() < 0.05
        pos = 0
        while pos < len(words):
            words[pos] = words[pos].capitalize()
            end = min(len(words), pos + int(rng.integers(6, 20)))
            words[end - 1] += "." if rng.random() < 0.8 else "?"
            if end - pos > 8:
                words[pos + 4] += ","
            pos = end
        text = " ".join(words)
        return text.upper() if shout else text


# --------------------------------------------------------------------------------------------
# truth


def shingle_sets(corpus: Corpus) -> list[np.ndarray]:
    """Sorted distinct 64-bit ids of each document's word 5-grams (from word ids, not text)."""
    mult = np.random.default_rng(12345).integers(1, 1 << 62, size=SHINGLE, dtype=np.uint64) | np.uint64(1)
    out = []
    for tokens in corpus.tokens:
        t = tokens.astype(np.uint64)  # documents have at least 40 words, so always ≥ 1 full shingle
        key = np.zeros(len(t) - SHINGLE + 1, dtype=np.uint64)
        for k in range(SHINGLE):
            key += t[k : len(t) - SHINGLE + 1 + k] * mult[k]
        out.append(np.unique(key))
    return out


def true_components(sets: list[np.ndarray], threshold: float) -> tuple[int, list[np.ndarray]]:
    """(number of pairs with Jaccard ≥ threshold, components of size ≥ 2) by prefix filtering."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    sizes = np.array([len(s) for s in sets])
    prefix = [s[: len(s) - math.ceil(threshold * len(s)) + 1] for s in sets]
    tokens = np.concatenate(prefix)
    docs = np.repeat(np.arange(len(sets)), [len(p) for p in prefix])
    order = np.lexsort((docs, tokens))
    tokens, docs = tokens[order], docs[order]
    starts = np.flatnonzero(np.r_[True, tokens[1:] != tokens[:-1]])
    ends = np.r_[starts[1:], len(tokens)]
    pairs = set()
    for lo, hi in zip(starts[ends - starts > 1], ends[ends - starts > 1]):
        group = docs[lo:hi].tolist()
        for i in range(len(group)):
            for j in range(i + 1, len(group)):
                a, b = group[i], group[j]
                if min(sizes[a], sizes[b]) >= threshold * max(sizes[a], sizes[b]):
                    pairs.add((a, b))
    true_a, true_b = [], []
    for a, b in pairs:
        inter = len(np.intersect1d(sets[a], sets[b], assume_unique=True))
        if inter / (sizes[a] + sizes[b] - inter) >= threshold:
            true_a.append(a)
            true_b.append(b)
    n = len(sets)
    graph = coo_matrix((np.ones(len(true_a)), (true_a, true_b)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    counts = np.bincount(labels)
    components = [np.flatnonzero(labels == label) for label in np.flatnonzero(counts > 1)]
    return len(true_a), components


# --------------------------------------------------------------------------------------------
# runs


def write_corpus(corpus: Corpus, url: str, shard_docs: int):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks import contract
    from tasks.documents import document_schema

    shards = []
    for k, lo in enumerate(range(0, len(corpus.tokens), shard_docs)):
        idx = range(lo, min(lo + shard_docs, len(corpus.tokens)))
        n = len(idx)
        table = pa.table(
            {
                "id": [f"doc-{i:08d}" for i in idx],
                "url": [""] * n,
                "source": ["web"] * n,
                "lang": ["en"] * n,
                "lang_score": pa.array(np.ones(n), pa.float32()),
                "quality_score": pa.array(np.full(n, np.nan), pa.float32()),
                "text": [corpus.text(i) for i in idx],
                "meta": ["{}"] * n,
            },
            schema=document_schema(),
        )
        def write(f, table=table) -> int:
            pq.write_table(table, f)
            return table.num_rows

        shards.append(contract.write_shard(url, f"docs-{k:05d}.parquet", write))
    return contract.commit(url, "documents", "bench-input", shards, {})


def peak_rss_mb() -> float:
    """This process's peak resident memory. On Linux VmHWM, which (unlike ru_maxrss) does not
    count the pages of the parent that a spawned child shared between fork and exec."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_smelt(input_url: str, output_url: str, threshold: float, queue) -> None:
    """Child process: the dedup stage, serial, timing each phase."""
    # Imported before the clock starts, as a worker that has done a shard has them: pyarrow loads
    # pandas the first time it builds a table, ~0.5 CPU-s once per process.
    from tasks import contract
    import pandas  # noqa: F401
    import pyarrow.compute  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from tasks.dedup.config import DedupConfig
    from tasks.dedup.stage import run_dedup

    phase_seconds: dict[str, float] = {}
    phase_peak_mb: dict[str, float] = {}  # peak so far at the end of each phase

    def timed_map(fn, items, *, label=""):
        start = time.process_time()
        out = [fn(item) for item in items]
        phase_seconds[label] = time.process_time() - start
        phase_peak_mb[label] = peak_rss_mb()
        return out

    start, wall = time.process_time(), time.perf_counter()
    manifest = run_dedup([contract.open_dataset(input_url)], output_url, DedupConfig(threshold=threshold),
                         fingerprint="bench", map_fn=timed_map)
    seconds, wall = time.process_time() - start, time.perf_counter() - wall
    queue.put({"seconds": seconds, "wall_seconds": wall, "phases": phase_seconds, "peak_rss_mb": peak_rss_mb(),
               "phase_peak_mb": phase_peak_mb,
               "stats": manifest.stats, "meta": manifest.meta,
               "shards": [contract.shard_url(manifest, s) for s in manifest.shards]})


def run_datasketch(corpus: Corpus, n_docs: int, threshold: float) -> float:
    """docs per CPU-second of datasketch MinHash + MinHashLSH insert and query on the same shingles."""
    from datasketch import MinHash, MinHashLSH

    from tasks.dedup.minhash import shingle_strings
    from tasks.dedup.normalize import normalized_words

    texts = [corpus.text(i) for i in range(n_docs)]
    start = time.process_time()
    lsh = MinHashLSH(threshold=threshold, num_perm=128)
    for i, text in enumerate(texts):
        minhash = MinHash(num_perm=128)
        minhash.update_batch([s.encode("utf-8") for s in shingle_strings(normalized_words(text), SHINGLE)])
        lsh.query(minhash)
        lsh.insert(i, minhash)
    return n_docs / (time.process_time() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=10_000, help="documents in the corpus (default 10000)")
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--shard-docs", type=int, default=10_000, help="documents per input shard")
    parser.add_argument("--datasketch-docs", type=int, default=2_000, help="documents timed for datasketch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, alternating; the fastest counts")
    parser.add_argument("--workdir", default=None, help="where to write the corpus and output (default: a temp dir)")
    args = parser.parse_args()

    corpus = Corpus(args.docs, args.seed)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        input_url, output_url = f"file://{tmp}/input", f"file://{tmp}/output"
        write_corpus(corpus, input_url, args.shard_docs)
        spawn = multiprocessing.get_context("spawn")
        datasketch_docs = min(args.datasketch_docs, args.docs)
        results, datasketch_rates = [], []
        for r in range(args.repeat):  # alternating, so a burst of load elsewhere hits both alike
            queue = spawn.Queue()
            child = spawn.Process(target=run_smelt, args=(input_url, f"{output_url}-{r}", args.threshold, queue))
            child.start()
            results.append(queue.get())
            child.join()
            datasketch_rates.append(run_datasketch(corpus, datasketch_docs, args.threshold))
        result = min(results, key=lambda res: res["seconds"])
        datasketch_rate = max(datasketch_rates)

        import pyarrow.parquet as pq

        kept = set()
        for url in result["shards"]:
            kept.update(pq.read_table(url.removeprefix("file://"), columns=["id"]).column("id").to_pylist())
    removed = {i for i in range(len(corpus.tokens)) if f"doc-{i:08d}" not in kept}

    pairs_true, components = true_components(shingle_sets(corpus), args.threshold)
    removable = sum(len(c) - 1 for c in components)
    correct = sum(min(len(removed.intersection(c.tolist())), len(c) - 1) for c in components)
    phases = result["phases"]
    docs_per_s = args.docs / result["seconds"]
    print(json.dumps({
        "docs": args.docs,
        "threshold": args.threshold,
        "pairs_true": pairs_true,
        "removal_precision": round(correct / max(1, len(removed)), 4),
        "removal_recall": round(correct / max(1, removable), 4),
        "docs_per_s": round(docs_per_s, 1),
        "datasketch_docs_per_s": round(datasketch_rate, 1),
        "speedup_vs_datasketch": round(docs_per_s / datasketch_rate, 2),
        "peak_rss_mb": round(result["peak_rss_mb"], 1),
        "signature_lsh_docs_per_s": round(args.docs / (phases["dedup-signatures"] + phases["dedup-pairs"]), 1),
        "removed": len(removed),
        "removable_true": removable,
        "bands": result["meta"]["bands"],
        "rows": result["meta"]["rows"],
        "candidate_pairs": result["stats"].get("dedup.candidate_pairs", 0),
        "verified_pairs": result["stats"].get("dedup.verified_pairs", 0),
        "phase_cpu_seconds": {k: round(v, 2) for k, v in phases.items()},
        "phase_peak_rss_mb": {k: round(v) for k, v in result["phase_peak_mb"].items()},
        "smelt_wall_seconds": round(result["wall_seconds"], 1),
        "datasketch_docs_timed": datasketch_docs,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
