"""A run at a glance (issue 43): `smelt report`'s page of a finished demo run opened in real headless
Chromium, the run's TensorBoard event files read back with TensorBoard's own reader, and the report
artifact the flows publish. One small crawl-to-model run (a 200-page sample, two ranks, 16 steps, a rank
killed at step 7) serves every test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tasks import jsonlog, storage
from tasks.report.page import SECTIONS
from tests.flows.browser import CHROMIUM, open_page
from tests.flows.tiny_run import TINY_RUN

pytestmark = pytest.mark.slow

OVERRIDES = [*TINY_RUN, "train.steps=16", "train.checkpoint.interval_steps=4", "train.log_every=4", "launch.nproc=2",
             "train.faults.inject=kill:rank=1,step=7", "train.stragglers.every_steps=2"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, prefect_harness) -> str:
    from flows.crawl_to_model import crawl_to_model
    from tasks.sample.code import write_sample_code
    from tasks.sample.crawl import write_sample_crawl

    root = tmp_path_factory.mktemp("report-root")
    write_sample_crawl(str(root / "sample"), pages=200, files=2)
    write_sample_code(str(root / "sample" / "code"))
    summary = crawl_to_model(root=str(root), overrides=OVERRIDES)
    train = next(s for s in summary["stages"] if s["stage"] == "train")
    assert train["summary"]["goodput"]["restarts"] == 1  # the killed rank: the fault timeline has a row
    return train["url"]


# Answered by the rendered page: each section's heading, and each plot's marks with the size Chromium
# laid them out at (a mark of zero width and height was not drawn).
DOM_QUERY = """JSON.stringify({
  sections: [...document.querySelectorAll('section')].map(s => ({
    id: s.id, heading: s.querySelector('h2').textContent,
    empty: [...s.querySelectorAll('.empty')].map(e => e.textContent),
    tables: s.querySelectorAll(':scope > table').length,
    plots: [...s.querySelectorAll('svg.plot')].map(p => ({
      title: p.getAttribute('aria-label'), declared: +p.dataset.marks,
      drawn: [...p.querySelectorAll('.mark')].filter(m => {
        const b = m.getBBox(); return b.width > 0 || b.height > 0; }).length,
      width: p.getBoundingClientRect().width }))})),
  rows: [...document.querySelectorAll('#faults table tr')].length - 1,
  title: document.title})"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium; .ci/run does)")
def test_the_report_of_a_finished_run_draws_every_section_in_chromium_without_errors(run_dir, tmp_path):
    page = tmp_path / "report.html"
    result = subprocess.run([sys.executable, "-m", "flows.cli", "report", run_dir, "--output", str(page)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    opened = open_page(page, DOM_QUERY, tmp_path / "report.png")  # the screenshot stays beside the test output
    assert opened["errors"] == []
    assert all(url.startswith(("file:", "data:", "about:")) for url in opened["requests"]), opened["requests"]
    dom = json.loads(opened["value"])
    assert [s["id"] for s in dom["sections"]] == list(SECTIONS)
    by_id = {s["id"]: s for s in dom["sections"]}
    assert by_id["config"]["tables"] == 1 and by_id["config"]["plots"] == []  # config and layout: a table
    for section in dom["sections"][1:]:
        assert section["plots"], f"section {section['id']} drew no plot: {section['empty']}"
        for plot in section["plots"]:
            assert plot["declared"] > 0 and plot["drawn"] == plot["declared"] and plot["width"] > 0, (section["id"], plot)
    assert len(by_id["loss"]["plots"]) == 2  # losses with each split's validation, and bits per byte
    assert len(by_id["funnel"]["plots"]) == 2  # the web and the code branch, crawl to tokens
    assert dom["rows"] == 1  # the one restart, with its cause, steps lost and recovery seconds
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_the_tensorboard_event_files_hold_every_metric_the_goodput_split_the_restart_and_each_split_eval(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = Path(storage.filesystem(run_dir)[1], "tensorboard")
    train = EventAccumulator(str(folder / "train"), size_guidance={"scalars": 0})
    train.Reload()
    records = jsonlog.read(run_dir, "metrics.jsonl")
    final = {r["step"]: r for r in records}  # the restart redid nothing (resumed from memory at step 6)
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_mem_gib", "checkpoint_s",
                "checkpoint_blocked_s"):
        points = {e.step: e.value for e in train.Scalars(f"train/{key}")}
        assert sorted(points) == sorted(final), key
        assert points == pytest.approx({s: r[key] for s, r in final.items()}, rel=1e-6), key

    run = EventAccumulator(str(folder / "run"), size_guidance={"scalars": 0})
    run.Reload()
    summary = json.loads(Path(storage.filesystem(run_dir)[1], "summary.json").read_text())
    for part in ("productive_s", "checkpoint_s", "restart_s", "lost_s", "other_s", "wall_s"):
        (point,) = run.Scalars(f"goodput/{part}")
        assert (point.step, point.value) == (16, pytest.approx(summary["goodput"][part], rel=1e-5))
    (restart,) = run.Scalars("faults/restarts")
    assert restart.value == 1 and run.Scalars("faults/recovery_s")[0].value > 0
    evaluation = json.loads(Path(storage.filesystem(run_dir)[1]).parent.parent.joinpath("eval").glob(
        "*/manifest.json").__next__().read_text())["meta"]
    for split in ("web", "code", "total"):
        figures = evaluation["total"] if split == "total" else evaluation["splits"][split]
        (loss,) = run.Scalars(f"eval/{split}/loss")
        (bpb,) = run.Scalars(f"eval/{split}/bits_per_byte")
        assert loss.step == bpb.step == 16
        assert (loss.value, bpb.value) == (pytest.approx(figures["val_loss"], rel=1e-6),
                                           pytest.approx(figures["bits_per_byte"], rel=1e-6))


def test_the_flows_publish_the_report_at_every_checkpoint_and_after_the_eval(run_dir):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.common import artifact_key

    key = artifact_key(f"smelt-report-{run_dir.rsplit('/', 1)[-1]}")
    with get_client(sync_client=True) as client:
        versions = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    published = json.loads(Path(storage.filesystem(run_dir)[1], "published.json").read_text())
    # one per poll that found new checkpoints (one or more each), the finished run's, and the eval's
    assert len(versions) >= 3 and published
    assert {v.data for v in versions} == {f"[run report]({storage.join(run_dir, 'report.html')})"}  # a link
    assert "<svg" in Path(storage.filesystem(run_dir)[1], "report.html").read_text()
