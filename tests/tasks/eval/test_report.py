"""The run picture: metrics read back per step, plotted as a PNG."""

import json

from tasks.eval.report import plot_losses, read_metrics


def test_a_step_redone_after_a_restart_keeps_its_last_record(tmp_path):
    rows = [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.5}, {"step": 2, "loss": 4.4}, {"step": 3, "loss": 4.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert [(m["step"], m["loss"]) for m in read_metrics(str(tmp_path))] == [(1, 5.0), (2, 4.4), (3, 4.0)]


def test_a_run_without_metrics_has_none(tmp_path):
    assert read_metrics(str(tmp_path)) == []


def test_plot_is_a_png():
    png = plot_losses([{"step": s, "loss": 5 - 0.1 * s} for s in range(1, 20)], {"web": [(10, 3.6), (19, 3.2)], "total": [(10, 3.5), (19, 3.1)]}, "run")
    assert png.startswith(b"\x89PNG") and len(png) > 5000
