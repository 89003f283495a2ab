"""Ingest per core for each extractor, how their output differs, the reader's cost, and 2-worker scaling.

On the generated sample crawl (``tasks/sample/crawl.py``) or ``--input URL`` (e.g.
``../shared/data/realcrawl-dev/*.warc.gz``):

1. Extractors, in this process, one at a time: the whole ingest stage (``run_ingest``, default
   config but for ``extract.engine``) runs serially ``--repeat`` times per engine, the engines
   alternating, and the run with the least CPU time counts (CPU time, not wall time, so load from
   elsewhere on a shared machine skews it least). Each engine is warmed first (imports, the
   language model). Per engine:

   - ``docs_per_core_s``: records in / CPU seconds of the stage;
   - ``speedup``: its ``docs_per_core_s`` / the baseline's (``trafilatura``, FineWeb's and
     datatrove's choice; smelt with it matches datatrove's per-core speed here);
   - ``extract_share``: extraction time (summed by the extract step) / the run's wall time;
   - ``kept_jaccard``: Jaccard similarity of the ids the stage kept (after every filter) with the
     baseline's;
   - ``text_f1``: mean token-level F1 of each page's extracted text against trafilatura's, over
     the pages either extracts text from.

2. Reader, per ``reader.warc_engine`` (``smelt``: zlib inflates, warcio parses each framed record;
   ``fastwarc``: FastWARC's gzip reader and header parser, same documents and counts),
   runs alternating ``--repeat`` times, the least CPU counting: ``reader_cpu_s``, the whole
   reader (``read_documents``: decompression, framing, HTTP parsing, charset decoding) over the
   inputs, and ``reader_fastwarc_vs_smelt`` its ratio; ``same_output``, whether both read the same
   documents and counts; ``stage_docs_per_core_s``, the whole default stage with each, and
   ``stage_fastwarc_vs_smelt`` = smelt's stage CPU / fastwarc's; ``fastwarc_frame_cpu_s``, FastWARC
   alone decompressing, framing and parsing the records (no documents, no fault accounting);
   ``reader_share`` = the default reader / the default stage's CPU.

3. Scaling, of the default config: two Dask ``LocalCluster``s of single-thread worker processes,
   one with 1 worker and one with ``--workers``, runs alternating ``--repeat`` times, the fastest
   of each counting; ``speedup_<n>_workers`` = 1-worker wall time / n-worker wall time, goal ≥ 1.8
   on 2 cores. A work item is one input file: ``--split N`` re-packs WARC inputs round-robin into
   N files first, so a crawl of a few uneven files still gives every worker equal work. The
   default sample (3,200 pages in 16 files) gives each worker about 1.5 s of work per run: with
   resiliparse a 640-page sample ran in under a second, where the cluster's fixed cost per run and
   any other load on the machine decide the ratio rather than the stage.

With ``--datatrove`` (datatrove importable, e.g. installed with ``pip install --target DIR
--no-deps datatrove loguru multiprocess dill humanize faust-cchardet python-magic`` and put on
``PYTHONPATH``; it is not a dependency), the same inputs also go through datatrove's ``WarcReader``
and ``Trafilatura`` extractor, FineWeb's first two steps, alternating with the engines: its
``docs_per_core_s`` counts the CPU of its extraction sandbox process too, and it runs no filter,
so it is an upper bound on datatrove's FineWeb pipeline per core. ``vs_datatrove`` is each
engine's ``docs_per_core_s`` over it.

``load_avg_1m`` is the machine's load when the run ended. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import fsspec

from tasks import config, contract, verified_reads
from tasks.counters import Stats
from tasks.documents import Document
from tasks.compression import open_input
from tasks.ingest.config import EXTRACT_ENGINES, WARC_ENGINES, IngestConfig
from tasks.ingest.extract import extract_text
from tasks.ingest.work_item import build_steps, run_steps
from tasks.ingest.readers import expand_inputs, read_documents
from tasks.ingest.stage import run_ingest
from tasks.parallel import ClientMap

WARM_PAGE = "<html><body><article>" + "<p>The quick brown fox jumps over the lazy dog near the river bank.</p>" * 20 + "</article></body></html>"
BASELINE = "trafilatura"


def engine_config(engine: str) -> IngestConfig:
    """The default config with ``extract.engine = engine``."""
    return config.load(IngestConfig, overrides=[f"extract.engine={engine}"])


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


def kept_ids(manifest: contract.Manifest) -> set[str]:
    return {i for s in manifest.shards
            for i in verified_reads.read_parquet(contract.shard_url(manifest, s), s, ["id"]).column("id").to_pylist()}


def token_f1(reference: str, candidate: str) -> float:
    ref, cand = Counter(reference.split()), Counter(candidate.split())
    common = sum((ref & cand).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(cand.values()), common / sum(ref.values())
    return 2 * precision * recall / (precision + recall)


def text_agreement(inputs: list[str], engines: list[str]) -> dict[str, float]:
    """Mean token F1 of each engine's extracted text against trafilatura's, page by page."""
    pages = [d.text for url in inputs for d in read_documents(url, IngestConfig().reader, Stats())
             if d.meta.get("format") == "html"]
    reference_cfg = engine_config(BASELINE).extract
    reference = [extract_text(p, reference_cfg)[0] for p in pages]
    out = {}
    for engine in engines:
        cfg = engine_config(engine).extract
        texts = reference if cfg.engine == reference_cfg.engine else [extract_text(p, cfg)[0] for p in pages]
        scores = [token_f1(r, t) for r, t in zip(reference, texts) if r.strip() or t.strip()]
        out[engine] = round(statistics.mean(scores), 4) if scores else 1.0
    return out


def _cpu_with_children() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def datatrove_run(inputs: list[str]) -> tuple[float, int]:
    """(CPU seconds, records) of datatrove's WarcReader + Trafilatura (precision) over ``inputs``."""
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.readers import WarcReader

    folder = os.path.dirname(inputs[0].removeprefix("file://"))
    reader = WarcReader(folder, glob_pattern="*.warc.gz")
    docs = 0

    def counted():
        nonlocal docs
        for doc in reader.run(None, 0, 1):
            docs += 1
            yield doc

    started = _cpu_with_children()
    for _ in Trafilatura(favour_precision=True, timeout=5.0).run(counted(), 0, 1):
        pass
    return _cpu_with_children() - started, docs  # the sandbox process is reaped when the extractor ends


def measure_engines(inputs: list[str], engines: list[str], repeat: int, work: Path,
                    datatrove: bool = False) -> dict[str, dict]:
    configs = {e: engine_config(e) for e in engines}
    for cfg in configs.values():
        warm_worker(cfg)
    best: dict[str, tuple[float, float, Stats, set[str]]] = {}
    datatrove_best = None
    for r in range(repeat):
        if datatrove:
            cpu, docs = datatrove_run(inputs)
            datatrove_best = min(datatrove_best or (cpu, docs), (cpu, docs))
        for engine, cfg in configs.items():
            out = str(work / f"engine-{engine}-{r}")
            cpu, wall = time.process_time(), time.perf_counter()
            manifest = run_ingest(inputs, out, cfg, fingerprint=f"bench-{engine}-{r}")
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            if engine not in best or cpu < best[engine][0]:
                best[engine] = (cpu, wall, manifest.stats, kept_ids(manifest))
    baseline_ids = best[BASELINE][3] if BASELINE in best else None
    f1 = text_agreement(inputs, engines)
    results = {}
    for engine, (cpu, wall, stats, ids) in best.items():
        results[engine] = {
            "docs": int(stats.get("in", 0)),
            "docs_per_core_s": round(stats.get("in", 0) / cpu, 2),
            "cpu_s": round(cpu, 3),
            "extract_share": round(stats.get("funnel.extract.time.extract_s", 0.0) / wall, 3),
            "kept": len(ids),
            "kept_jaccard": round(len(ids & baseline_ids) / max(1, len(ids | baseline_ids)), 4) if baseline_ids is not None else None,
            "text_f1": f1[engine],
        }
    if BASELINE in results:
        for row in results.values():
            row["speedup"] = round(row["docs_per_core_s"] / results[BASELINE]["docs_per_core_s"], 2)
    if datatrove_best is not None:
        rate = datatrove_best[1] / datatrove_best[0]
        for row in results.values():
            row["vs_datatrove"] = round(row["docs_per_core_s"] / rate, 2)
        results["datatrove_read_extract"] = {"docs": datatrove_best[1], "docs_per_core_s": round(rate, 2),
                                             "cpu_s": round(datatrove_best[0], 3)}
    return results


def read_all(inputs: list[str], cfg: IngestConfig) -> tuple[list[Document], dict]:
    stats = Stats()
    return [d for url in inputs for d in read_documents(url, cfg.reader, stats)], dict(stats)


def measure_reader(inputs: list[str], repeat: int, work: Path) -> dict:
    """The whole reader and the whole stage with each ``reader.warc_engine``, best of ``repeat`` alternating runs."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    configs = {e: config.load(IngestConfig, overrides=[f"reader.warc_engine={e}"]) for e in WARC_ENGINES}
    outputs = {e: read_all(inputs, cfg) for e, cfg in configs.items()}  # also warms imports
    reader_cpu = {e: float("inf") for e in configs}
    stage_cpu = dict(reader_cpu)
    frame_cpu = float("inf")
    docs = 0
    for r in range(repeat):
        for engine, cfg in sorted(configs.items(), reverse=r % 2 == 1):  # each engine goes first every other run
            cpu = time.process_time()
            for _ in range(5):  # one pass over a small crawl is a few ms: too short to time alone
                read_all(inputs, cfg)
            reader_cpu[engine] = min(reader_cpu[engine], (time.process_time() - cpu) / 5)
            cpu = time.process_time()
            manifest = run_ingest(inputs, str(work / f"reader-{engine}-{r}"), cfg, fingerprint=f"bench-reader-{engine}-{r}")
            stage_cpu[engine] = min(stage_cpu[engine], time.process_time() - cpu)
            docs = int(manifest.stats.get("in", 0))
        cpu = time.process_time()
        for _ in range(5):
            for url in inputs:
                with fsspec.open(url, "rb") as stream:  # FastWARC decompresses the gzip itself
                    for record in ArchiveIterator(stream, record_types=WarcRecordType.response, parse_http=True):
                        record.reader.read()
        frame_cpu = min(frame_cpu, (time.process_time() - cpu) / 5)
    default = IngestConfig().reader.warc_engine
    return {
        "default_warc_engine": default,
        "reader_cpu_s": {e: round(c, 4) for e, c in reader_cpu.items()},
        "reader_fastwarc_vs_smelt": round(reader_cpu["fastwarc"] / reader_cpu["smelt"], 3),
        "same_output": outputs["fastwarc"] == outputs["smelt"],
        "fastwarc_frame_cpu_s": round(frame_cpu, 4),
        "stage_docs_per_core_s": {e: round(docs / c, 2) for e, c in stage_cpu.items()},
        "stage_fastwarc_vs_smelt": round(stage_cpu["smelt"] / stage_cpu["fastwarc"], 3),
        "reader_share": round(reader_cpu[default] / stage_cpu[default], 3),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


class DaskStage:
    """A warmed LocalCluster of ``workers`` single-thread worker processes that runs the stage."""

    def __init__(self, cfg: IngestConfig, workers: int):
        from distributed import Client, LocalCluster

        self.cfg, self.workers, self.runs = cfg, workers, 0
        self.cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                    dashboard_address=":0", silence_logs=logging.ERROR)
        self.client = Client(self.cluster)
        self.client.run(warm_worker, cfg)
        self.map = ClientMap(self.client, log_fn=lambda line: None)
        for name in list(logging.root.manager.loggerDict):  # the in-process scheduler's shutdown chatter
            if name.startswith("distributed"):
                logging.getLogger(name).setLevel(logging.CRITICAL)

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


def measure_scaling(inputs: list[str], workers: int, repeat: int, work: Path) -> dict:
    cfg = IngestConfig()
    one, many = DaskStage(cfg, 1), DaskStage(cfg, workers)
    try:
        runs = [(one.run(inputs, work), many.run(inputs, work)) for _ in range(repeat)]
    finally:
        one.close()
        many.close()
    (one_s, stats), _ = min(runs, key=lambda r: r[0][0])
    _, (many_s, many_stats) = min(runs, key=lambda r: r[1][0])
    docs, mb = int(stats.get("in", 0)), stats.get("funnel.read.bytes_in", 0) / 1e6
    return {
        "engine": cfg.extract.engine,
        "files": len(inputs),
        "docs_per_s": round(docs / many_s, 2),
        "mb_per_s": round(mb / many_s, 3),
        f"speedup_{workers}_workers": round(one_s / many_s, 2),
        "one_worker_s": round(one_s, 2),
        f"{workers}_workers_s": round(many_s, 2),
        "same_output": stats.get("out") == many_stats.get("out"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", action="append", help="input URL or glob (repeatable); default: a generated sample crawl")
    parser.add_argument("--pages", type=int, default=3200, help="pages of the generated sample crawl")
    parser.add_argument("--files", type=int, default=16, help="files of the generated sample crawl (one work item each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", default=",".join(EXTRACT_ENGINES), help=f"extractors to compare (baseline {BASELINE})")
    parser.add_argument("--split", type=int, default=0, help="re-pack WARC inputs into this many files for the scaling runs (0: as given)")
    parser.add_argument("--workers", type=int, default=2, help="workers of the parallel run (the baseline has 1); 0 skips scaling")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (alternating); the best counts")
    parser.add_argument("--datatrove", action="store_true", help="also time datatrove's WarcReader + Trafilatura (see above)")
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
        engines = [e for e in args.engines.split(",") if e]
        result = {"input": source, "engines": measure_engines(inputs, engines, args.repeat, work, args.datatrove)}
        result["default_engine"] = IngestConfig().extract.engine
        result["reader"] = measure_reader(inputs, args.repeat, work)
        if args.workers:
            if args.split:
                (work / "split").mkdir()
                inputs = split_warcs(inputs, args.split, work / "split")
            result["scaling"] = measure_scaling(inputs, args.workers, args.repeat, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["cpus"] = os.cpu_count()
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
