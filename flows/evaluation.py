"""Eval flow: score a checkpoint (by URL) on held-out tokens; each checkpoint is evaluated once.

The result is a dataset like any stage's (``<root>/eval/<fingerprint>/`` with a manifest), so
re-evaluating the same checkpoint with the same config is a lookup. The flow publishes a table
artifact and a loss plot; a deployment can run it on every ``smelt.checkpoint.committed`` event.
"""

from __future__ import annotations

import functools
import json

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import StageOutcome, artifact_key, planned_output
from tasks import datasets
from tasks.config import from_dict
from tasks.eval.config import EvalConfig
from tasks.eval.evaluate import evaluate_checkpoint
from tasks.eval.report import plot_losses, read_metrics
from tasks.train.checkpoint import CHECKPOINTS_DIR
from tasks.train.export import resolve_checkpoint

STAGE = "eval"
REPORT = "report.json"
PLOT = "loss.png"


def _write_file(f, data: bytes) -> int:
    """A one-record shard (the report, the plot)."""
    f.write(data)
    return 1


def _loss_plot(step_url: str, report: dict) -> bytes | None:
    """The run's training loss curve with this checkpoint's validation loss, if the run logged metrics."""
    run_dir = step_url.rsplit(f"/{CHECKPOINTS_DIR}/", 1)[0]
    metrics = read_metrics(run_dir)
    if not metrics:
        return None
    return plot_losses(metrics, [(report["step"], report["val_loss"])], f"{run_dir.rsplit('/', 1)[-1]}: "
                       f"val loss {report['val_loss']:.3f}, perplexity {report['perplexity']:.1f}")


@task(name="eval", cache_policy=NO_CACHE, retries=1)
def eval_task(checkpoint: str, data: str | None, root: str, config: dict) -> dict:
    """Evaluate (or look up the evaluation of) one checkpoint; returns a StageOutcome dict + metrics."""
    logger = get_run_logger()
    cfg = from_dict(EvalConfig, config)
    step_url = resolve_checkpoint(checkpoint)
    ckpt = datasets.open_dataset(step_url, kind="checkpoint")
    inputs = [ckpt.fingerprint] + ([datasets.open_dataset(data, kind="tokens").fingerprint] if data else [])
    url, fp = planned_output(root, STAGE, cfg, inputs, "tasks.eval")
    manifest = datasets.read_manifest(url)
    reused = manifest is not None
    if reused:
        logger.info(f"eval: reusing evaluation {url}")
    else:
        report = evaluate_checkpoint(step_url, data, cfg)
        shards = [datasets.write_shard(url, REPORT, functools.partial(_write_file, data=json.dumps(report, indent=2).encode()))]
        plot = _loss_plot(step_url, report)
        if plot is not None:
            shards.append(datasets.write_shard(url, PLOT, functools.partial(_write_file, data=plot)))
        manifest = datasets.commit(
            url, kind="eval", fp=fp, shards=shards,
            stats={k: report[k] for k in ("val_loss", "perplexity", "bits_per_byte", "tokens_scored", "bytes_scored")},
            inputs=[ckpt], config=cfg, meta={"checkpoint": step_url, "step": report["step"], "probes": report["probes"]},
        )
        create_table_artifact(
            key=artifact_key("smelt-eval"),
            table=[{"checkpoint": step_url, "step": report["step"], **{k: manifest.stats[k] for k in
                    ("val_loss", "perplexity", "bits_per_byte")}}],
            description=f"evaluation of {step_url}",
        )
        if plot is not None:
            create_link_artifact(key=artifact_key("smelt-eval-plot"), link=datasets.join(url, PLOT),
                                 link_text=f"loss curve, step {report['step']}")
        logger.info(f"eval: step {report['step']} val loss {report['val_loss']:.4f} "
                    f"perplexity {report['perplexity']:.2f} bits/byte {report['bits_per_byte']:.3f}")
    outcome = StageOutcome(STAGE, url, fp, manifest.kind, reused, 0.0 if reused else report["seconds"], int(manifest.stats["tokens_scored"]),
                           dict(manifest.stats)).to_dict()
    outcome.update(checkpoint=step_url, step=manifest.meta["step"], probes=manifest.meta["probes"])
    return outcome


@flow(name="eval")
def eval_flow(checkpoint: str, data: str | None = None, root: str = "smelt-data", config: dict | None = None) -> dict:
    """Evaluate a checkpoint URL (a step folder or a run folder's newest committed checkpoint)."""
    return eval_task(checkpoint, data, root, config or {})
