"""What every stage flow shares: fingerprinted output URLs, reuse of finished stages, artifacts.

A stage is reused when a manifest exists at its fingerprinted URL (docs/design.md §2). smelt does not
lean on Prefect's result cache for this: that cache can outlive (or miss) the data it points at,
while the manifest is the data's own proof of completeness. So a retried flow run, from the UI or
the CLI, skips finished stages whether or not Prefect kept anything.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_link_artifact, create_table_artifact
from prefect.states import Failed

from flows.dask_runtime import dask_map
from tasks import contract, errors
from tasks.lease import Lease, LeaseRecord, acquire
from tasks.parallel import MapFn

STAGE_LEASE_TIMEOUT_S = 60.0  # a computing run that stops renewing its output's lease this long is taken over


@dataclasses.dataclass
class StageOutcome:
    """What a stage task hands on: a URL and a summary, never data."""

    stage: str
    url: str
    fingerprint: str
    kind: str
    reused: bool
    seconds: float
    rows: int
    stats: dict[str, Any]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)  # the manifest's scalar meta

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def planned_output(root: str, stage: str, cfg: Any, input_fingerprints: list[str], *packages: str) -> tuple[str, str]:
    """(output URL, fingerprint) of a stage: computable before anything runs."""
    fp = contract.fingerprint(stage, cfg, input_fingerprints, contract.code_version(*packages))
    return contract.stage_url(root, stage, fp), fp


def reuse_or_run(stage: str, url: str, fp: str, compute: Callable[[], contract.Manifest]) -> StageOutcome:
    """Return the finished dataset at ``url`` or run ``compute`` to make it; log which.

    Computed once across concurrent runs: the one that takes the output folder's lease (tasks/lease.py)
    computes; the others wait for it, then find its manifest and reuse it. A computing run that dies
    stops renewing, and a waiting one takes over after ``STAGE_LEASE_TIMEOUT_S`` (at once on its host)."""
    logger = get_run_logger()
    start = time.perf_counter()
    manifest = contract.finished_dataset(url, fp)
    reused = manifest is not None
    if not reused:
        with _stage_lease(stage, url, logger.info):
            manifest = contract.finished_dataset(url, fp)  # made by the run we waited for
            reused = manifest is not None
            if not reused:
                logger.info(f"{stage}: computing {url}")
                manifest = compute()
    if reused:
        logger.info(f"{stage}: reusing finished dataset {url}")
    outcome = StageOutcome(
        stage=stage,
        url=url,
        fingerprint=fp,
        kind=manifest.kind,
        reused=reused,
        seconds=round(time.perf_counter() - start, 2),
        rows=manifest.rows,
        stats=dict(manifest.stats),
        meta=scalar_meta(manifest),
    )
    if not reused:
        publish_stats(stage, manifest)
    return outcome


def _stage_lease(stage: str, url: str, log: Callable[[str], None]) -> Lease:
    """The lease on a stage's output folder, waiting (without bound) while another run holds it."""
    def on_wait(held: LeaseRecord) -> None:
        log(f"{stage}: another run is computing {url} ({held.describe()}); waiting for its manifest")

    return acquire(url, timeout_s=STAGE_LEASE_TIMEOUT_S, wait=True, on_wait=on_wait)


def scalar_meta(manifest: contract.Manifest) -> dict[str, Any]:
    """The manifest's small meta values (vocab size, dtype, …) worth showing in summaries."""
    return {k: v for k, v in manifest.meta.items() if isinstance(v, (int, float, str, bool))}


def run_on_dask(stage: str, url: str, fp: str, dask_address: str | None,
                run: Callable[[MapFn], contract.Manifest]) -> dict:
    """Reuse the stage's dataset or run it, fanning its work items out over Dask; a StageOutcome dict."""
    log = get_run_logger().info

    def compute() -> contract.Manifest:
        with dask_map(dask_address, log) as map_fn:
            return run(map_fn)

    return reuse_or_run(stage, url, fp, compute).to_dict()


def artifact_key(text: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def publish_stats(stage: str, manifest: contract.Manifest) -> None:
    """The stage's counters as a Prefect table artifact: the ordered funnel when the stage records one
    (documents in → out of every step, with drop reasons), else every counter."""
    from tasks.counters import funnel

    if any(k.startswith("funnel.") for k in manifest.stats):
        rows = [{"step": name, "documents": count} for name, count in funnel(manifest)]
    else:
        rows = [{"counter": k, "value": v} for k, v in sorted(manifest.stats.items())]
    create_table_artifact(
        key=artifact_key(f"smelt-{stage}-stats"),
        table=rows,
        description=f"{stage} stats for {manifest.meta.get('url', '')} (fingerprint {manifest.fingerprint})",
    )


def publish_run_report(run_dir: str, root: str | None = None) -> str | None:
    """Rewrite the run's report page and derived TensorBoard scalars (tasks/report) and publish the page as
    a new version of the run's ``smelt-report-<run>`` link artifact; a failure here is logged, never raised:
    a report must not stop a run. Returns the page's URL."""
    from tasks.report.publish import write_report

    name = run_dir.rstrip("/").rsplit("/", 1)[-1]
    try:
        written = write_report(run_dir, root=root)
    except Exception as e:  # noqa: BLE001 - any reader of a half-written run folder
        get_run_logger().warning(f"report: could not write the report of {run_dir}: {errors.one_sentence(e)}")
        return None
    create_link_artifact(key=artifact_key(f"smelt-report-{name}"), link=written["url"], link_text="run report",
                         description=f"config, curves, goodput, faults, stragglers, checkpoints and data funnel of "
                                     f"{run_dir}; TensorBoard: tensorboard --logdir {run_dir}/tensorboard")
    return written["url"]


# -- failures: permanent ones in one sentence, at once; transient ones retried (tasks/errors.py) ----------


def retry_options(retries: int, delay_s: float = 5.0) -> dict[str, Any]:
    """Prefect task options that retry a transient failure up to ``retries`` times and never a permanent one.

    Prefect logs a failure with its traceback when a task has no retries left, so a task configured with
    none gets one that its retry condition refuses: a permanent failure then ends in one line either way."""

    def transient_within_budget(task, task_run, state) -> bool:
        exc = _state_exception(state)
        return exc is not None and not errors.is_permanent(exc) and task_run.run_count <= retries

    return {"retries": max(1, retries), "retry_delay_seconds": delay_s, "retry_condition_fn": transient_within_budget}


def _state_exception(state) -> BaseException | None:
    try:
        state.result(raise_on_failure=True)
    except BaseException as e:  # noqa: BLE001 - the state's own exception, whatever it is
        return e
    return None


def one_sentence_failures(stage: str) -> Callable:
    """A stage task's body: a permanent failure becomes ``errors.StageFailed`` (one sentence naming the fix
    and the log file with the traceback), which ``retry_options`` never retries."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except errors.StageFailed:
                raise
            except Exception as e:
                if not errors.is_permanent(e):
                    raise
                raise errors.stage_failure(stage, e) from None

        return run

    return wrap


def fails_in_one_sentence(fn: Callable) -> Callable:
    """A flow's body: a permanent failure (a stage's ``StageFailed``, or a bad parameter found before any
    stage ran) ends the flow run in a Failed state whose message is the sentence, with no traceback in
    the log; the caller of the flow gets the exception (``smelt`` exits 2)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if not errors.is_permanent(e):
                raise
            failure = e if isinstance(e, errors.StageFailed) else errors.stage_failure(fn.__name__.removesuffix("_flow"), e)
            return Failed(message=str(failure), data=failure)

    return run
