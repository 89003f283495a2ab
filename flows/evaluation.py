"""Eval flow: score a checkpoint (by URL) on every validation split; each checkpoint is evaluated once.

The result is a dataset like any stage's (``<root>/eval/<fingerprint>/`` with a manifest) whose
fingerprint covers the checkpoint itself (run, step, manifest checksums), the eval config and the
scored data: re-evaluating the same checkpoint is a lookup, and evaluations of different
checkpoints, even at once, never share a folder. The flow keeps a per-run table artifact of every
evaluated checkpoint and a plot of validation loss against step beside the training curve; a
deployment runs it on every ``smelt.checkpoint.committed`` event. A checkpoint that retention
deleted before its eval ran is reported as skipped, not as a failure.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import (StageOutcome, artifact_key, fails_in_one_sentence, one_sentence_failures, planned_output,
                          publish_run_report, retry_options)
from tasks import contract, eval_holds, storage
from tasks.checkpoint_reader import resolve as resolve_checkpoint, run_dir_of, step_of
from tasks.config import from_dict
from tasks.eval.config import EvalConfig
from tasks.eval.evaluate import checkpoint_identity, evaluate_checkpoint
from tasks.eval.harness import score_with_harness
from tasks.eval.report import plot_losses, read_metrics, results_table, run_evaluations, validation_curves
from tasks.objectstore import preflight_all
from tasks.train.export import export_checkpoint

STAGE = "eval"
REPORT = "report.json"
PLOT = "loss.png"
FIGURES = ("val_loss", "perplexity", "bits_per_byte")


def _write_file(f, data: bytes) -> int:
    """A one-record shard (the report, the plot)."""
    f.write(data)
    return 1


def root_of(run_dir: str) -> str:
    """``<root>/train/<run identity>`` → ``<root>``: where a run's evaluations belong."""
    return run_dir.rsplit("/", 2)[0]


def _skipped(checkpoint: str, reason: str) -> dict:
    get_run_logger().warning(f"eval: skipped {checkpoint}: {reason}")
    return {"stage": STAGE, "skipped": True, "reason": reason, "checkpoint": checkpoint,
            "step": step_of(checkpoint), "reused": False}


def _run_has_checkpoints(step_url: str) -> bool:
    """True if the step's run folder still holds its checkpoints folder (so the step was there, not mistyped)."""
    fs, path = storage.filesystem(step_url.rstrip("/").rsplit("/", 1)[0])
    return fs.isdir(path)


def _data_sources(step_url: str, data: str | None) -> dict[str, str]:
    """Split name → tokens URL: the given dataset (named as the run named it), else every one the run used."""
    trained_on = {n: storage.normalize_url(u) for n, u in contract.read_manifest(step_url).meta["data"].items()}
    if not data:
        return trained_on
    url = storage.normalize_url(data)
    return {next((n for n, u in trained_on.items() if u == url), "data"): url}


def _with_run_results(root: str, run_dir: str, meta: dict) -> list[dict]:
    """Every finished evaluation of the run's checkpoints, with this one (``meta``) in its place."""
    return sorted([e for e in run_evaluations(root, run_dir) if e["step"] != meta["step"] or e["branch"] is not None]
                  + [{**meta, "branch": None}], key=lambda e: (e["branch"] or 0, e["step"]))


def _loss_plot(run_dir: str, evaluations: list[dict]) -> bytes | None:
    """Training loss against step with every split's validation loss beside it, if the run logged metrics."""
    metrics = read_metrics(run_dir)
    if not metrics:
        return None
    latest = evaluations[-1]["total"]
    return plot_losses(metrics, validation_curves(evaluations), f"{run_dir.rsplit('/', 1)[-1]}: val loss "
                       f"{latest['val_loss']:.3f}, perplexity {latest['perplexity']:.1f} at step {evaluations[-1]['step']}")


@task(name="eval", cache_policy=NO_CACHE, **retry_options(1, delay_s=0))
@one_sentence_failures(STAGE)
def eval_task(checkpoint: str, data: str | None, root: str | None, config: dict) -> dict:
    """Evaluate (or look up the evaluation of) one checkpoint; returns a StageOutcome dict + metrics,
    or ``skipped`` with the reason when the checkpoint is gone. Either way its eval hold is released
    (tasks/eval_holds.py: retention may delete it now); a failed eval keeps it, for a retry, until it expires."""
    outcome = _eval_checkpoint(checkpoint, data, root, config)
    step_url = outcome["checkpoint"]
    if step_of(step_url) is not None:
        eval_holds.release(run_dir_of(step_url), step_of(step_url))
    return outcome


def _eval_checkpoint(checkpoint: str, data: str | None, root: str | None, config: dict) -> dict:
    logger = get_run_logger()
    cfg = from_dict(EvalConfig, config)
    requested = storage.normalize_url(checkpoint)
    if step_of(requested) is not None and checkpoint_identity(requested) is None and _run_has_checkpoints(requested):
        return _skipped(requested, "no committed checkpoint there any more: retention removed it "
                                   "(it keeps the newest train.checkpoint.keep_last)")
    step_url = resolve_checkpoint(checkpoint)
    identity = checkpoint_identity(step_url)
    if identity is None:
        return _skipped(step_url, "the checkpoint was removed while its eval started")
    run_dir = run_dir_of(step_url)
    root = storage.normalize_url(root) if root else root_of(run_dir)
    sources = _data_sources(step_url, data)
    inputs = [contract.canonical_json(identity)] + [
        f"{n}:{contract.open_dataset(u, kind='tokens').fingerprint}" for n, u in sorted(sources.items())]
    # eval.threads pins torch's threads while scoring: it changes how fast, never what, so it is no part of
    # the result's identity (the demo's own eval and the deployment's triggered one are one dataset)
    url, fp = planned_output(root, STAGE, dataclasses.replace(cfg, threads=0), inputs, "tasks.eval")
    manifest, seconds = contract.finished_dataset(url, fp), 0.0
    reused = manifest is not None
    if reused:
        logger.info(f"eval: reusing evaluation {url}")
    else:
        try:
            manifest, seconds = _evaluate(step_url, identity, sources, root, url, fp, cfg)
        except contract.DatasetError:
            # The same checkpoint evaluated at once elsewhere (the run's own eval and the triggered
            # one) and committed first: its result is this one's.
            manifest, reused = contract.finished_dataset(url, fp), True
            if manifest is None:
                raise
    outcome = StageOutcome(STAGE, url, fp, manifest.kind, reused, seconds, int(manifest.stats["tokens_scored"]),
                           dict(manifest.stats)).to_dict()
    outcome.update(checkpoint=step_url, run=run_dir, step=manifest.meta["step"], splits=manifest.meta["splits"],
                   total=manifest.meta["total"], probes=manifest.meta["probes"])
    if not reused:
        publish_run_report(run_dir, root)  # the run's report and TensorBoard gain this checkpoint's evaluation
    return outcome


def _evaluate(step_url: str, identity: dict, sources: dict[str, str], root: str, url: str, fp: str,
              cfg: EvalConfig) -> tuple[contract.Manifest, float]:
    """Score the checkpoint, commit the eval dataset (report + plot), publish the run's table and plot."""
    run_dir = run_dir_of(step_url)
    report = evaluate_checkpoint(step_url, sources, cfg)
    splits = {n: {k: s[k] for k in (*FIGURES, "baselines", "tokens_scored", "bytes_scored", "weight", "data",
                                    "samples")}
              for n, s in report["splits"].items()}
    meta = {"checkpoint": step_url, "run": run_dir, "step": report["step"], "tokens": report["tokens"],
            "identity": identity, "splits": splits, "total": {k: report[k] for k in (*FIGURES, "baselines")},
            "probes": report["probes"]}
    evaluations = _with_run_results(root, run_dir, meta)
    shards = [contract.write_shard(url, REPORT, functools.partial(_write_file, data=json.dumps(report, indent=2).encode()))]
    plot = _loss_plot(run_dir, evaluations)
    if plot is not None:
        shards.append(contract.write_shard(url, PLOT, functools.partial(_write_file, data=plot)))
    stats = {k: report[k] for k in (*FIGURES, "tokens_scored", "bytes_scored")}
    stats.update({f"{n}.{k}": s[k] for n, s in splits.items() for k in FIGURES})
    stats.update({f"{n}.{c}_bits_per_byte": bpb for n, s in [*splits.items(), ("total", report)]
                  for c, bpb in s["baselines"].items()})
    # -- lm-evaluation-harness on the Hugging Face export, when eval.harness.enabled (tasks/eval/harness.py) --
    if cfg.harness.enabled:
        with tempfile.TemporaryDirectory(prefix="smelt-export-") as export_dir:  # the harness scores the HF export
            export_checkpoint(step_url, export_dir, dtype="fp32")
            harness_shards, harness = score_with_harness(export_dir, next(iter(sources.values())), cfg.harness, url)
        shards += harness_shards
        stats.update({f"harness.{k}": v for k, v in harness["metrics"].items()})
        meta["harness"] = harness
        create_table_artifact(key=artifact_key(f"smelt-harness-{run_dir.rsplit('/', 1)[-1]}"),
                              table=[{"step": report["step"], "task": harness["task"], "items": harness["items"],
                                      **harness["metrics"]}],
                              description=f"lm-evaluation-harness (model hf) on the export of {step_url}")
    # -- end lm-evaluation-harness --
    manifest = contract.commit(url, kind="eval", fp=fp, shards=shards, stats=stats,
                               inputs=[contract.read_manifest(step_url)], config=cfg, meta=meta)
    run_name = run_dir.rsplit("/", 1)[-1]
    create_table_artifact(key=artifact_key(f"smelt-evals-{run_name}"), table=results_table(evaluations),
                          description=f"validation loss, perplexity and bits per byte of every evaluated "
                                      f"checkpoint of {run_dir}")
    if plot is not None:
        create_link_artifact(key=artifact_key(f"smelt-eval-plot-{run_name}"), link=storage.join(url, PLOT),
                             link_text=f"loss curves up to step {report['step']}")
    per_split = ", ".join(f"{n} {s['val_loss']:.4f} ({s['bits_per_byte']:.3f} bits/byte, xz -9e "
                          f"{s['baselines']['xz']:.3f})" for n, s in splits.items())
    get_run_logger().info(f"eval: step {report['step']} val loss {report['val_loss']:.4f} ({per_split}) "
                          f"perplexity {report['perplexity']:.2f} bits/byte {report['bits_per_byte']:.3f}")
    return manifest, report["seconds"]


@flow(name="eval")
@fails_in_one_sentence
def eval_flow(checkpoint: str, data: str | None = None, root: str | None = None, config: dict | None = None) -> dict:
    """Evaluate a checkpoint URL (a step folder or a run folder's newest committed checkpoint) on every
    validation split of the run's data; results land under ``root`` (default: the run's own root)."""
    preflight_all(checkpoint, data, root)
    return eval_task(checkpoint, data, root, config or {})
