import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks import contract
from tasks.documents import document_schema
from tasks.config import from_dict
from tasks.ingest.config import IngestConfig
from tasks.counters import funnel
from tasks.ingest.readers import InputError, expand_inputs
from tasks.ingest.stage import run_ingest
from tests.tasks.ingest.crawl_files import article_page, english_warc, gzip_members, jsonl, prose, response, write

GERMAN = [
    "Der Fluss stieg nach drei Tagen Regen in den Bergen langsam an.",
    "Die Bauern im Tal brachten ihre Tiere vor der Nacht auf höher gelegene Weiden.",
    "Freiwillige füllten Sandsäcke und stapelten sie neben der alten Steinbrücke.",
    "Am Morgen hatte das Wasser die unteren Stufen der Kirche erreicht.",
    "Der Bürgermeister sagte, die Stadt habe sich seit Jahren auf ein solches Hochwasser vorbereitet.",
    "Die meisten Familien erwarten, innerhalb einer Woche in ihre Häuser zurückzukehren.",
]


def crawl(tmp_path: Path) -> list[str]:
    """Two input files: a WARC (2 English pages, a German page, an image) and a JSONL file."""
    records = [
        *english_warc(0, 2),
        response("https://zeitung.example/hochwasser", article_page("Hochwasser", [" ".join(GERMAN)]).encode()),
        response("https://news.example/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(64), "image/png"),
    ]
    warc = write(tmp_path / "in" / "crawl-0.warc.gz", gzip_members(records))
    text = "\n".join(" ".join(prose(16, 8)[i:i + 2]) for i in range(0, 4, 2))
    lines = write(tmp_path / "in" / "crawl-1.jsonl", jsonl([{"id": "j1", "url": "https://bakery.example/", "text": text}]))
    return [warc, lines]


def ingest(inputs, out, cfg=None, fp="fp-test", **kw):
    return run_ingest(expand_inputs(inputs), out, cfg or IngestConfig(), fingerprint=fp, **kw)


def test_ingest_writes_document_shards_a_manifest_and_the_funnel(tmp_path):
    out = "file://" + str(tmp_path / "out")
    manifest = ingest(crawl(tmp_path), out)

    assert manifest.kind == "documents" and manifest.fingerprint == "fp-test"
    assert [s.name for s in manifest.shards] == ["docs-00000.parquet", "docs-00001.parquet"]
    assert [s.rows for s in manifest.shards] == [2, 1]
    assert contract.verify(contract.open_dataset(out, "documents")) == []
    table = pq.read_table(str(tmp_path / "out" / "docs-00000.parquet"))
    assert table.schema.equals(document_schema())
    rows = table.to_pylist()
    assert [r["url"] for r in rows] == ["https://news.example/story-0", "https://news.example/story-1"]
    assert all(r["lang"] == "en" and r["lang_score"] > 0.65 for r in rows)
    assert "The river rose slowly" in rows[0]["text"] and "<p>" not in rows[0]["text"]
    assert json.loads(rows[0]["meta"])["format"] == "text"

    assert funnel(manifest) == [
        ("in", 5),
        ("read", 4),
        ("dropped.read_non_html", 1),
        ("url_filter", 4),
        ("extract", 4),
        ("lang", 3),
        ("dropped.lang_not_kept", 1),
        ("gopher_repetition", 3),
        ("gopher_quality", 3),
        ("c4_quality", 3),
        ("fineweb_quality", 3),
        ("pii", 3),
        ("out", 3),
    ]
    assert manifest.stats["funnel.read.bytes_in"] == sum(os.path.getsize(tmp_path / "in" / n) for n in ("crawl-0.warc.gz", "crawl-1.jsonl"))
    assert manifest.meta["steps"][0] == "read"


def test_a_rerun_after_a_lost_shard_redoes_only_that_shard_byte_identically(tmp_path):
    inputs = crawl(tmp_path)
    out = tmp_path / "out"
    first = ingest(inputs, "file://" + str(out))
    (out / contract.MANIFEST).unlink()
    (out / "docs-00000.parquet").write_bytes(b"half a shard")  # a worker died while moving it in place
    (out / ".tmp-0123abcd-docs-00000.parquet").write_bytes(b"a dead worker's temporary file")

    second = ingest(inputs, "file://" + str(out))

    assert [(s.name, s.checksum) for s in second.shards] == [(s.name, s.checksum) for s in first.shards]
    assert second.stats["shards_reused"] == 1
    assert second.stats["out"] == first.stats["out"]
    assert not list(out.glob(".tmp-*"))


def test_two_runs_into_different_folders_write_identical_bytes(tmp_path):
    inputs = crawl(tmp_path)
    a = ingest(inputs, "file://" + str(tmp_path / "a"))
    b = ingest(inputs, "file://" + str(tmp_path / "b"))
    assert [s.checksum for s in a.shards] == [s.checksum for s in b.shards]


def test_exclusions_are_a_dataset_of_their_own_with_the_reason(tmp_path):
    cfg = from_dict(IngestConfig, {"output": {"write_exclusions": True}})
    out = "file://" + str(tmp_path / "out")
    manifest = ingest(crawl(tmp_path), out, cfg)

    assert all(not s.name.startswith("excluded/") for s in manifest.shards)
    excluded = contract.open_dataset(out + "/excluded", "documents")
    rows = [r for s in excluded.shards for r in pq.read_table(str(tmp_path / "out" / "excluded" / s.name)).to_pylist()]
    assert [(r["url"], json.loads(r["meta"])["dropped_by"]) for r in rows] == [("https://zeitung.example/hochwasser", "lang_not_kept")]
    assert rows[0]["lang"] == "de"


def test_bad_inputs_are_counted_and_never_stop_the_stage(tmp_path):
    good = english_warc(0, 2)
    lying = good[1].replace(b"Content-Length: ", b"Content-Length: 9", 1)
    files = {
        "truncated.warc.gz": gzip_members(good)[:-200],
        "lying.warc": good[0] + lying,
        "empty.warc.gz": b"",
        "not-gzip.warc.gz": b"definitely not gzip",
        "broken.jsonl": b'{"text": "fine document"}\n{"text": \n',
        "undecodable.warc": response("https://x.example/", bytes(range(256)) * 8, "text/html"),
    }
    inputs = [write(tmp_path / "in" / name, data) for name, data in files.items()]

    manifest = ingest(inputs, "file://" + str(tmp_path / "out"))

    failures = {k: v for k, v in manifest.stats.items() if k.startswith(("failed.", "dropped.read"))}
    assert failures == {
        "failed.read_truncated_gzip": 1,
        "failed.read_bad_length": 1,  # the lying record only: the reader resynchronises after it
        "failed.read_bad_record": 1,  # the broken JSON line
        "failed.read_corrupt_gzip": 1,
        "dropped.read_undecodable": 1,
    }
    assert len(manifest.shards) == len(files)


def test_an_unreadable_input_url_stops_the_stage_with_its_name(tmp_path):
    with pytest.raises(InputError, match="missing.warc.gz"):
        ingest(crawl(tmp_path) + [str(tmp_path / "missing.warc.gz")], "file://" + str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_an_output_holding_another_dataset_is_refused(tmp_path):
    inputs = crawl(tmp_path)
    out = "file://" + str(tmp_path / "out")
    ingest(inputs, out, fp="one")
    assert ingest(inputs, out, fp="one").fingerprint == "one"
    with pytest.raises(contract.DatasetError, match="fingerprint one"):
        ingest(inputs, out, fp="two")


def test_a_changed_config_never_reuses_finished_shards(tmp_path):
    inputs = crawl(tmp_path)
    out = tmp_path / "out"
    ingest(inputs, "file://" + str(out))
    (out / contract.MANIFEST).unlink()
    cfg = from_dict(IngestConfig, {"lang": {"keep_languages": ["de"]}})
    manifest = ingest(inputs, "file://" + str(out), cfg)
    assert "shards_reused" not in manifest.stats
    assert manifest.stats["dropped.lang_not_kept"] == 3  # the three English documents


def test_funnel_puts_each_drop_reason_under_its_step_largest_first():
    stats = {
        "in": 10, "funnel.read.out": 8, "funnel.read.dropped.read_empty": 2,
        "funnel.extract.out": 7, "funnel.extract.dropped.extract_empty": 1,
        "funnel.lang.out": 4, "funnel.lang.dropped.lang_low_score": 1, "funnel.lang.dropped.lang_not_kept": 2,
        "out": 4,
    }
    assert funnel(stats) == [
        ("in", 10),
        ("read", 8), ("dropped.read_empty", 2),
        ("extract", 7), ("dropped.extract_empty", 1),
        ("lang", 4), ("dropped.lang_not_kept", 2), ("dropped.lang_low_score", 1),
        ("out", 4),
    ]


# ---------------------------------------------------------------------------------------------
# A real Dask cluster on loopback


def _dask(*args: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    return subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_" + args[0], *args[1:]],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def _many_files(tmp_path: Path, files: int, pages: int) -> list[str]:
    return [write(tmp_path / "in" / f"crawl-{i}.warc.gz", gzip_members(english_warc(i * pages, pages, host=f"site{i}.example")))
            for i in range(files)]


def _held_until_released(fn, markers: str, item):
    """The first work item runs at once; every other one waits until the test has killed a worker.

    This fixes the race's outcome instead of timing it: at the kill exactly one shard is finished and
    the killed worker holds unfinished work, however fast or slow the machine is. A held item leaves
    ``holding-<pid>`` so the test knows which worker process to kill.
    """
    try:
        os.close(os.open(os.path.join(markers, "first"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        Path(markers, f"holding-{os.getpid()}").touch()
        _wait_for(lambda: os.path.exists(os.path.join(markers, "release")), 120, "the test to release the shards")
    return fn(item)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_mid_stage_leaves_output_identical_to_an_undisturbed_run(tmp_path):
    from distributed import Client

    inputs = _many_files(tmp_path, files=8, pages=12)
    reference = ingest(inputs, "file://" + str(tmp_path / "serial"))

    scheduler_file = tmp_path / "scheduler.json"
    procs = [_dask("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                   "--scheduler-file", str(scheduler_file), log=tmp_path / "scheduler.log")]
    try:
        _wait_for(scheduler_file.exists, 60, "the dask scheduler")
        for i in range(2):
            procs.append(_dask("worker", "--scheduler-file", str(scheduler_file), "--nthreads", "1", "--no-nanny",
                               "--host", "127.0.0.1", "--no-dashboard", log=tmp_path / f"worker{i}.log"))
        workers = {proc.pid: proc for proc in procs[1:]}
        out = tmp_path / "dask"
        markers = tmp_path / "markers"
        markers.mkdir()
        killed: list[subprocess.Popen] = []
        finished_at_kill: list[int] = []
        with Client(scheduler_file=str(scheduler_file), timeout="60s") as client:
            client.wait_for_workers(2, timeout=90)

            def killing_map(fn, items, *, label=""):
                held = functools.partial(_held_until_released, fn, str(markers))
                futures = client.map(held, list(items), retries=2, pure=False)
                done_dir = out / "_done"
                _wait_for(lambda: done_dir.exists() and any(done_dir.iterdir()), 120, "a first finished shard")
                _wait_for(lambda: any(markers.glob("holding-*")), 60, "a worker holding a shard")
                victim = workers[int(next(markers.glob("holding-*")).name.split("-")[1])]
                os.killpg(victim.pid, signal.SIGKILL)  # one worker dies mid-stage
                killed.append(victim)
                finished_at_kill.append(len(list(done_dir.iterdir())))
                (markers / "release").touch()
                return client.gather(futures)

            manifest = ingest(inputs, "file://" + str(out), map_fn=killing_map)
        assert killed[0].wait(timeout=10) == -signal.SIGKILL
        assert finished_at_kill == [1]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    assert [(s.name, s.rows, s.checksum) for s in manifest.shards] == [(s.name, s.rows, s.checksum) for s in reference.shards]
    assert manifest.stats["out"] == reference.stats["out"] == 96
