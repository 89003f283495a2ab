"""The run picture: metrics read back per step, plotted as a PNG."""

import json

from tasks.eval.report import plot_losses, read_metrics, results_table


def test_a_step_redone_after_a_restart_keeps_its_last_record(tmp_path):
    rows = [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.5}, {"step": 2, "loss": 4.4}, {"step": 3, "loss": 4.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert [(m["step"], m["loss"]) for m in read_metrics(str(tmp_path))] == [(1, 5.0), (2, 4.4), (3, 4.0)]


def test_a_run_without_metrics_has_none(tmp_path):
    assert read_metrics(str(tmp_path)) == []


def test_plot_is_a_png():
    png = plot_losses([{"step": s, "loss": 5 - 0.1 * s} for s in range(1, 20)], {"web": [(10, 3.6), (19, 3.2)], "total": [(10, 3.5), (19, 3.1)]}, "run")
    assert png.startswith(b"\x89PNG") and len(png) > 5000


def test_the_table_carries_each_splits_compressor_baselines_beside_the_model():
    figures = {"val_loss": 3.0, "perplexity": 20.09, "bits_per_byte": 1.5}
    new = {"step": 300, "tokens": 1000, "splits": {"web": {**figures, "baselines": {"xz": 2.4, "zstd": 2.5, "zlib": 2.6}}},
           "total": {**figures, "baselines": {"xz": 2.4, "zstd": 2.5, "zlib": 2.6}}}
    old = {"step": 100, "tokens": 300, "splits": {"web": figures}, "total": figures}  # evaluated before baselines
    rows = results_table([old, new])
    assert rows[1]["web bits/byte"] == 1.5 and rows[1]["web xz -9e bits/byte"] == 2.4
    assert rows[1]["web zstd -19 bits/byte"] == 2.5 and rows[1]["total zlib -9 bits/byte"] == 2.6
    assert rows[0]["web xz -9e bits/byte"] is None and rows[0]["web bits/byte"] == 1.5
