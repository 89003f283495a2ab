"""Train flow: launch torchrun on token datasets, follow its checkpoints, publish each commit.

The task starts torchrun in its own process group (so cancelling the flow kills every rank),
watches the run folder for committed checkpoints and publishes each one as a new version of a
per-run link artifact and as a ``smelt.checkpoint.committed`` event, which the eval flow (or a
deployment trigger) consumes by URL.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import threading
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

from flows.common import (StageOutcome, artifact_key, fails_in_one_sentence, one_sentence_failures, publish_run_report,
                          retry_options)
from flows.config import LaunchConfig
from tasks import contract, eval_holds, storage
from tasks.config import from_dict
from prefect.runtime import flow_run

from tasks.branches import check_request, parse_skip_steps
from tasks.checkpoint_reader import finished_run, is_committed, list_committed, named_checkpoint, relative_step
from tasks.lease import Lease, LeaseError
from tasks.objectstore import preflight_all
from tasks.train.config import TrainConfig, parse_data
from tasks.train.identity import STAGE, run_identity
from tasks.train.node_launch import RUN_KIND, launch_training, preflight, take_run_lease
from tasks.train.stragglers import REPORT as STRAGGLER_REPORT

CHECKPOINT_EVENT = "smelt.checkpoint.committed"
PUBLISHED = "published.json"  # steps whose commit was published


def run_dir_for(data: dict[str, str], root: str, cfg: TrainConfig) -> tuple[str, str, dict[str, contract.Manifest]]:
    """(run folder, run identity, tokens manifests): ``<root>/train/<identity>``, where the identity is what
    makes the run's checkpoints meaningful (tasks/train/identity.py), not the whole config nor the code, so a
    longer step budget, another layout or a code fix continues the same run from its newest checkpoint."""
    manifests = {name: contract.open_dataset(url, kind="tokens") for name, url in data.items()}
    identity = run_identity(cfg, manifests)
    return contract.stage_url(root, STAGE, identity), identity, manifests


class CheckpointPublisher:
    """Publishes every newly committed checkpoint of a run once (artifact version + event).

    Published steps are recorded in ``<run_dir>/published.json``, so a task retry or a UI retry of
    the flow run, which starts a new publisher on the same run folder, never republishes a commit.
    """

    def __init__(self, run_dir: str, run_name: str, root: str, hold_minutes: float):
        self.run_dir, self.run_name, self.root, self.hold_minutes = run_dir, run_name, root, hold_minutes
        self.marker = storage.join(run_dir, PUBLISHED)
        fs, path = storage.filesystem(self.marker)
        self.published: set[int] = set(json.loads(fs.cat_file(path))) if fs.exists(path) else set()

    def poll(self) -> None:
        new = [c for c in list_committed(self.run_dir, checksums=False) if c["step"] not in self.published]
        for ckpt in new:
            # Held before the event goes out, so retention keeps it for its eval (tasks/eval_holds.py); one that
            # retention deleted in between is not published at all.
            eval_holds.hold(self.run_dir, ckpt["step"], self.hold_minutes)
            if not is_committed(ckpt["url"]):
                eval_holds.release(self.run_dir, ckpt["step"])
                continue
            create_link_artifact(
                key=artifact_key(f"smelt-checkpoint-{self.run_name}"),
                link=ckpt["url"],
                link_text=f"step {ckpt['step']}",
                description=f"checkpoint step {ckpt['step']} of run {self.run_name}: loss {ckpt.get('loss')}, "
                            f"tokens {ckpt.get('tokens')}",
            )
            emit_event(
                event=CHECKPOINT_EVENT,
                resource={"prefect.resource.id": f"smelt.run.{self.run_name}", "smelt.run_dir": self.run_dir},
                payload={"url": ckpt["url"], "step": ckpt["step"], "root": self.root, "run_dir": self.run_dir,
                         "loss": ckpt.get("loss"), "tokens": ckpt.get("tokens")},
            )
            self.published.add(ckpt["step"])
            with storage.atomic_write(self.marker, "w") as f:
                f.write(json.dumps(sorted(self.published)))
        if new:  # the report follows the run checkpoint by checkpoint
            publish_run_report(self.run_dir, self.root)

    def follow(self, stop: threading.Event, every_s: float = 2.0) -> None:
        while not stop.wait(every_s):
            self.poll()


def publish_run_reports(run_dir: str, run_name: str) -> None:
    """Straggler flags and the goodput split of a finished launch as Prefect table artifacts."""
    fs, path = storage.filesystem(storage.join(run_dir, STRAGGLER_REPORT))
    if fs.exists(path):
        flagged = json.loads(fs.cat_file(path)).get("flagged", [])
        if flagged:
            get_run_logger().warning(f"train: {len(flagged)} straggler flag(s) in {run_dir}: {flagged}")
        create_table_artifact(key=artifact_key(f"smelt-stragglers-{run_name}"),
                              table=flagged or [{"rank": None, "note": "no rank flagged"}],
                              description=f"ranks flagged as stragglers in {run_dir}")
    sfs, spath = storage.filesystem(storage.join(run_dir, "summary.json"))
    if sfs.exists(spath):
        goodput = json.loads(sfs.cat_file(spath)).get("goodput")
        if goodput:
            create_table_artifact(key=artifact_key(f"smelt-goodput-{run_name}"),
                                  table=[{"part": k, "value": v} for k, v in goodput.items() if not isinstance(v, list)],
                                  description=f"wall-time split of {run_dir}")
    publish_loss_by_source(run_dir, run_name)


def publish_loss_by_source(run_dir: str, run_name: str) -> None:
    """Loss by data source, quality bucket and language per evaluation interval (tasks/trace/by_source.py),
    beside the eval table: a table artifact and a link to its plot in the run folder."""
    from tasks.trace.by_source import write_report
    from tasks.trace.run import TraceError

    try:
        rows, plot_url = write_report(run_dir)
    except TraceError as e:  # a run trained before per-sample losses were recorded
        get_run_logger().info(f"train: no loss-by-source report for {run_dir}: {e}")
        return
    create_table_artifact(key=artifact_key(f"smelt-loss-by-source-{run_name}"),
                          table=rows or [{"by": None, "note": "no per-sample losses recorded"}],
                          description=f"mean sequence loss by source, quality bucket and language per interval: {run_dir}")
    create_link_artifact(key=artifact_key(f"smelt-loss-by-source-plot-{run_name}"), link=plot_url,
                         description=f"loss by source, quality and language: {run_dir}")


@task(name="train", cache_policy=NO_CACHE, **retry_options(0))
@one_sentence_failures(STAGE)
def train_task(data: list[str], root: str, config: dict, launch: dict, run_dir: str | None = None,
               resume_from: int | None = None, skip_steps: str | None = None) -> dict:
    """Train, continue or reuse the run ``config`` names on ``data``; returns a StageOutcome dict whose url is
    the run folder. A finished run is reused when it reached ``steps``; one that stopped short continues.

    The run folder's lease is taken first and held until its manifest is committed: a retried or concurrent
    flow run waits for it (``launch.lease_wait_minutes``) and then finds the run finished, or is refused.

    ``resume_from``: continue from that older retained checkpoint (a finished run too), the later ones kept as a
    superseded branch; ``skip_steps`` ``"A:B"`` skips the samples of steps A..B (tasks/branches.py)."""
    logger = get_run_logger()
    cfg = from_dict(TrainConfig, config)
    sources = parse_data(data)
    url, fp, manifests = run_dir_for(sources, root, cfg)
    url = storage.normalize_url(run_dir) if run_dir else url
    lease = take_run_lease(url, wait_s=float(launch.get("lease_wait_minutes", LaunchConfig.lease_wait_minutes)) * 60,
                           timeout_s=float(launch.get("lease_timeout_minutes", LaunchConfig.lease_timeout_minutes)) * 60,
                           log=logger.info)
    try:
        return _train_leased(sources, root, cfg, config, launch, url, fp, manifests, lease,
                             {"resume_from": resume_from, "skip_steps": parse_skip_steps(skip_steps),
                              "branch_request": flow_run.id})  # a retry continues the branch it declared
    finally:
        with contextlib.suppress(LeaseError):
            lease.release()


def _train_leased(sources: dict[str, str], root: str, cfg: TrainConfig, config: dict, launch: dict, url: str,
                  fp: str, manifests: dict, lease: Lease, branch: dict) -> dict:
    """``train_task`` once it holds the run folder's lease."""
    logger = get_run_logger()
    finished = finished_run(url)  # None also when its final checkpoint fails verification: resume and rewrite it
    if finished is not None and finished.fingerprint != fp:
        raise contract.DatasetError(f"{url} holds run {finished.fingerprint}, not {fp}: the model, data, batch "
                                    "contract or seed differ; choose another run folder")
    if finished is not None and int(finished.meta["step"]) >= cfg.steps and branch["resume_from"] is None:
        if int(finished.meta["step"]) > cfg.steps:
            logger.warning(f"train: run {url} already reached step {finished.meta['step']}, past train.steps = "
                           f"{cfg.steps}; its final checkpoint is the result")
        logger.info(f"train: reusing finished run {url}")
        return _outcome(url, finished, reused=True, seconds=0.0)
    if finished is not None:  # launch_training (prepare_run) unfinishes it and records what changed
        logger.info(f"train: run {url} finished at step {finished.meta['step']}; continuing to step {cfg.steps}")

    publisher = CheckpointPublisher(url, fp, storage.normalize_url(root), cfg.checkpoint.eval_hold_minutes)
    stop = threading.Event()
    # The follower runs in a copy of this task's context so its artifacts and events belong to the task run.
    follower = threading.Thread(target=contextvars.copy_context().run, args=(publisher.follow, stop), daemon=True)
    follower.start()
    try:
        result = launch_training(
            data=sources, config=config, run_dir=url, nproc=int(launch["nproc"]),
            max_restarts=int(launch["max_restarts"]), timeout_s=float(launch["timeout_minutes"]) * 60,
            restart=launch.get("restart", LaunchConfig.restart), lease=lease, log=logger.info, **branch,
        )
    finally:
        stop.set()
        follower.join(timeout=10)
    with lease.keep_alive():  # verifying a large final checkpoint may outlast the lease's timeout
        publisher.poll()
        publish_run_reports(url, fp)
        summary = result["summary"]
        committed = list_committed(url)
        if not committed:
            raise RuntimeError(f"training finished but {url} holds no committed checkpoint")
        final = committed[-1]
        lease.fence()  # the run's result is this launch's only while no newer one took it over
        manifest = contract.commit(
            url, kind=RUN_KIND, fp=fp, shards=[],
            stats={"steps": summary["steps"], "tokens": summary["tokens"], "restarts": result.get("restarts", 0)},
            inputs=list(manifests.values()), config=cfg,
            meta={"checkpoint": relative_step(final["step"]), "step": final["step"], "summary": summary,
                  "data": sources},
        )
    publish_run_report(url, storage.normalize_url(root))  # finished, with the final summary's goodput
    return _outcome(url, manifest, reused=False, seconds=result["seconds"])


def _outcome(url: str, manifest: contract.Manifest, reused: bool, seconds: float) -> dict:
    outcome = StageOutcome(STAGE, url, manifest.fingerprint, manifest.kind, reused, round(seconds, 2),
                           int(manifest.stats.get("tokens", 0)), dict(manifest.stats)).to_dict()
    outcome["checkpoint"] = named_checkpoint(manifest)
    outcome["summary"] = manifest.meta["summary"]
    return outcome


def dry_run_report(data: list[str], config: dict, nproc: int) -> dict[str, Any]:
    """Layout, per-rank parameters and derived accumulation, without launching anything."""
    return preflight(from_dict(TrainConfig, config), parse_data(data), [nproc])


@flow(name="train")
@fails_in_one_sentence
def train_flow(data: list[str], root: str = "smelt-data", config: dict | None = None,
               launch: dict | None = None, run_dir: str | None = None, resume_from: int | None = None,
               skip_steps: str | None = None) -> dict:
    """Launch torchrun on token datasets; Prefect retries the whole launch when the agent gives up.
    ``resume_from`` / ``skip_steps`` (``"A:B"``): continue from an older retained checkpoint (tasks/branches.py)."""
    check_request(resume_from, parse_skip_steps(skip_steps))  # one sentence, before any retry
    preflight_all(data, root, run_dir)
    launch = launch or dataclasses.asdict(LaunchConfig())
    dry_run_report(data, config or {}, int(launch["nproc"]))  # user mistakes: one sentence, before any retry
    return train_task.with_options(**retry_options(int(launch["task_retries"])))(data, root, config or {}, launch, run_dir,
                                                                                  resume_from, skip_steps)
