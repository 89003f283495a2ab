"""Ingest throughput, the share of it spent in HTML extraction, and the speed-up of 2 Dask workers.

On the generated sample crawl (``tasks/sample/crawl.py``) or ``--input URL`` (e.g.
``../shared/data/realcrawl-dev/*.warc.gz``), the whole ingest stage (``run_ingest`` with the
default config) runs on two Dask ``LocalCluster``s of worker processes with one thread each: one
with 1 worker, one with ``--workers``; runs alternate between them ``--repeat`` times and the
fastest run of each counts, so a burst of load from elsewhere does not decide the ratio. Workers
are warmed first (imports, the language model), so the timings are the stage itself. Each run
writes a fresh dataset.

- ``docs``: records read (pages in); ``mb``: input bytes (as stored, compressed) / 1e6;
- ``docs_per_s``, ``mb_per_s``: with ``--workers`` workers;
- ``extract_share``: HTML extraction time (summed by the extract step) / wall time of the
  1-worker stage; goal ≥ 0.75 (everything else costs under a quarter);
- ``speedup_2_workers``: 1-worker wall time / 2-worker wall time; goal ≥ 1.7 on 2 cores.

``--split N`` re-packs WARC inputs round-robin into N files first, so a crawl of a few files still
gives every worker work (one work item per file).

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from tasks.ingest.base import Document
from tasks.ingest.config import IngestConfig
from tasks.ingest.pipeline import build_steps, run_steps
from tasks.ingest.readers import expand_inputs, open_input
from tasks.ingest.stage import run_ingest

WARM_PAGE = "<html><body><article>" + "<p>The quick brown fox jumps over the lazy dog near the river bank.</p>" * 20 + "</article></body></html>"


def split_warcs(urls: list[str], files: int, folder: Path) -> list[str]:
    """Copy the WARC response records of ``urls`` round-robin into ``files`` gzipped WARC files."""
    from warcio.archiveiterator import ArchiveIterator
    from warcio.warcwriter import WARCWriter

    outputs = [(folder / f"split-{i:05d}.warc.gz").open("wb") for i in range(files)]
    writers = [WARCWriter(f, gzip=True) for f in outputs]
    n = 0
    for url in urls:
        with open_input(url) as raw:
            for record in ArchiveIterator(raw):
                if record.rec_type == "response":
                    writers[n % files].write_record(record)
                    n += 1
    for f in outputs:
        f.close()
    return ["file://" + f.name for f in outputs]


def warm_worker(cfg: IngestConfig) -> None:
    """Import and load everything a shard needs, so the timed runs measure the stage alone."""
    doc = Document(id="warm", url="https://warm.example/", text=WARM_PAGE, meta={"format": "html"})
    list(run_steps([doc], build_steps(cfg), {}))


class DaskStage:
    """A warmed LocalCluster of ``workers`` single-thread worker processes that runs the stage."""

    def __init__(self, cfg: IngestConfig, workers: int):
        from distributed import Client, LocalCluster

        self.cfg, self.workers, self.runs = cfg, workers, 0
        self.cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                    dashboard_address=":0", silence_logs=logging.ERROR)
        self.client = Client(self.cluster)
        self.client.run(warm_worker, cfg)
        for name in list(logging.root.manager.loggerDict):  # the in-process scheduler's shutdown chatter
            if name.startswith("distributed"):
                logging.getLogger(name).setLevel(logging.CRITICAL)

    def map(self, fn, items, *, label=""):
        return self.client.gather(self.client.map(fn, list(items), pure=False))

    def run(self, inputs: list[str], work: Path) -> tuple[float, dict]:
        """(wall seconds, manifest stats) of one run of the stage into a fresh dataset."""
        self.runs += 1
        out = str(work / f"out-{self.workers}-{self.runs}")
        started = time.perf_counter()
        manifest = run_ingest(inputs, out, self.cfg, fingerprint=f"bench-{self.workers}-{self.runs}", map_fn=self.map)
        return time.perf_counter() - started, manifest.stats

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", action="append", help="input URL or glob (repeatable); default: a generated sample crawl")
    parser.add_argument("--pages", type=int, default=640, help="pages of the generated sample crawl")
    parser.add_argument("--files", type=int, default=8, help="files of the generated sample crawl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", type=int, default=0, help="re-pack WARC inputs into this many files (0: as given)")
    parser.add_argument("--workers", type=int, default=2, help="workers of the parallel run (the baseline has 1)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each (alternating); the fastest counts")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="smelt-bench-ingest-"))
    try:
        if args.input:
            inputs = expand_inputs(args.input)
            source = ",".join(args.input)
        else:
            from tasks.sample.crawl import write_sample_crawl

            write_sample_crawl(str(work / "crawl"), pages=args.pages, files=args.files, seed=args.seed)
            inputs = expand_inputs(str(work / "crawl" / "*.warc.gz"))
            source = f"sample(pages={args.pages}, files={args.files}, seed={args.seed})"
        if args.split:
            (work / "split").mkdir()
            inputs = split_warcs(inputs, args.split, work / "split")
        cfg = IngestConfig()
        one, many = DaskStage(cfg, 1), DaskStage(cfg, args.workers)
        try:
            runs = [(one.run(inputs, work), many.run(inputs, work)) for _ in range(args.repeat)]
        finally:
            one.close()
            many.close()
        (one_s, stats), _ = min(runs, key=lambda r: r[0][0])
        _, (many_s, many_stats) = min(runs, key=lambda r: r[1][0])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    docs = int(stats.get("in", 0))
    mb = stats.get("funnel.read.bytes_in", 0) / 1e6
    print(json.dumps({
        "docs": docs,
        "mb": round(mb, 3),
        "docs_per_s": round(docs / many_s, 2),
        "mb_per_s": round(mb / many_s, 3),
        "workers": args.workers,
        "extract_share": round(stats.get("time.extract_s", 0.0) / one_s, 3),
        f"speedup_{args.workers}_workers": round(one_s / many_s, 2),
        "docs_out": int(stats.get("out", 0)),
        "files": len(inputs),
        "one_worker_s": round(one_s, 2),
        "one_worker_in_shards_s": round(stats.get("time.shard_s", 0.0), 2),
        f"{args.workers}_workers_s": round(many_s, 2),
        "same_output": stats.get("out") == many_stats.get("out"),
        "input": source,
        "cpus": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
