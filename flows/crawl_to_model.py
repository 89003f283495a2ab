"""The end-to-end flow: crawl (and source code) → ingest → dedup → tokenize → train → eval.

Every stage lands at ``<root>/<stage>/<fingerprint>/``; a rerun with the same inputs and config
reuses each finished stage in seconds, and a run killed during training resumes from its newest
committed checkpoint without touching the data stages. With code inputs, the code branch runs
beside the web branch (its own ingest rules, the same dedup stage), one tokenizer is trained on
both, and training draws from the two token datasets with the configured mixture weights.
"""

from __future__ import annotations

import contextlib
import time

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import fails_in_one_sentence, retry_options
from flows.config import RunConfig, load_run_config, section
from flows.dask_runtime import dask_cluster
from flows.dedup import dedup_output, dedup_task
from flows.evaluation import eval_task
from flows.ingest import code_ingest_output, code_ingest_task, ingest_output, ingest_task
from flows.tokenization import tokenize_task, tokenizer_output, tokenizer_task, tokens_output
from flows.train import train_task
from tasks import contract, storage
from tasks.errors import UserError
from tasks.ingest.code.readers import expand_code_inputs
from tasks.ingest.readers import expand_inputs
from tasks.objectstore import preflight_all

SAMPLE_DIR = "sample"


@task(name="sample-crawl", cache_policy=NO_CACHE)
def sample_task(root: str) -> dict[str, list[str]]:
    """The bundled sample (web crawl + source code) under ``<root>/sample``, generated if missing."""
    from tasks.sample.code import write_sample_code
    from tasks.sample.crawl import write_sample_crawl

    url = storage.join(storage.normalize_url(root), SAMPLE_DIR)
    code_url = storage.join(url, "code")
    fs, path = storage.filesystem(storage.join(url, "ground_truth.jsonl"))
    if not fs.exists(path):
        get_run_logger().info(f"writing the sample crawl to {url}")
        write_sample_crawl(url)
    cfs, cpath = storage.filesystem(storage.join(code_url, "code_ground_truth.jsonl"))
    if not cfs.exists(cpath):
        get_run_logger().info(f"writing the sample source code to {code_url}")
        write_sample_code(code_url)
    return {"web": [storage.join(url, "*.warc.gz")], "code": [storage.join(code_url, "code-*.jsonl.gz")]}


def data_graph(steps, web: list[str], code: list[str]) -> tuple[dict, dict, dict, dict]:
    """The data stages, spelled once: ingest each branch (web, and code if given), dedup each, train one
    tokenizer on all of them, tokenize each. ``steps`` either runs each stage (``_Run``: outcome dicts) or only
    names its output (``_Planned``: url and fingerprint), so the stages the flow plans are the stages it runs.
    Returns (ingested, deduped, tokenizer, tokens), the per-branch ones by branch name."""
    ingested = {"web": steps.ingest(web)}
    if code:
        ingested["code"] = steps.ingest_code(code)
    deduped = {name: steps.dedup(out) for name, out in ingested.items()}
    tokenizer = steps.tokenizer(list(deduped.values()))
    tokens = {name: steps.tokenize(out, tokenizer) for name, out in deduped.items()}
    return ingested, deduped, tokenizer, tokens


class _Planned:
    """Each data stage's output (url, fingerprint) without running it; ``urls`` collects them."""

    def __init__(self, root: str, cfg: RunConfig) -> None:
        self.root, self.cfg, self.urls = root, cfg, []

    def _output(self, url: str, fp: str) -> dict:
        self.urls.append(url)
        return {"url": url, "fingerprint": fp}

    def ingest(self, inputs: list[str]) -> dict:
        return self._output(*ingest_output(inputs, self.root, self.cfg.ingest)[1:])

    def ingest_code(self, inputs: list[str]) -> dict:
        return self._output(*code_ingest_output(inputs, self.root, self.cfg.ingest_code)[1:])

    def dedup(self, ingested: dict) -> dict:
        return self._output(*dedup_output([ingested["fingerprint"]], self.root, self.cfg.dedup))

    def tokenizer(self, deduped: list[dict]) -> dict:
        return self._output(*tokenizer_output([d["fingerprint"] for d in deduped], self.root, self.cfg.tokenizer))

    def tokenize(self, deduped: dict, tokenizer: dict) -> dict:
        return self._output(*tokens_output([deduped["fingerprint"]], tokenizer["fingerprint"], self.root,
                                           self.cfg.tokenize, self.cfg.tokenizer.special()))


class _Run:
    """Each data stage run as its Prefect task (reused where its output is complete)."""

    def __init__(self, root: str, cfg: RunConfig, dask_address: str | None) -> None:
        self.root, self.cfg, self.dask_address = root, cfg, dask_address

    def ingest(self, inputs: list[str]) -> dict:
        return ingest_task(inputs, self.root, section(self.cfg, "ingest"), self.dask_address)

    def ingest_code(self, inputs: list[str]) -> dict:
        return code_ingest_task(inputs, self.root, section(self.cfg, "ingest_code"), self.dask_address)

    def dedup(self, ingested: dict) -> dict:
        return dedup_task([ingested["url"]], self.root, section(self.cfg, "dedup"), self.dask_address)

    def tokenizer(self, deduped: list[dict]) -> dict:
        return tokenizer_task([d["url"] for d in deduped], self.root, section(self.cfg, "tokenizer"))

    def tokenize(self, deduped: dict, tokenizer: dict) -> dict:
        return tokenize_task([deduped["url"]], tokenizer["url"], self.root, section(self.cfg, "tokenize"),
                             self.dask_address, tokenizer_config=section(self.cfg, "tokenizer"))


def planned_data_urls(web: list[str], code: list[str], root: str, cfg: RunConfig) -> list[str]:
    """The output URL of every data stage the flow runs for these inputs, in order."""
    planned = _Planned(root, cfg)
    data_graph(planned, web, code)
    return planned.urls


def data_stages_pending(web: list[str], code: list[str], root: str, cfg: RunConfig) -> bool:
    """True if any data stage still has to run: only then is a Dask cluster worth starting."""
    return any(contract.read_manifest(u) is None for u in planned_data_urls(web, code, root, cfg))


@flow(name="crawl-to-model")
@fails_in_one_sentence
def crawl_to_model(inputs: list[str] | None = None, code_inputs: list[str] | None = None,
                   root: str = "smelt-data", config_path: str | None = None,
                   overrides: list[str] | None = None, dask_address: str | None = None) -> dict:
    """Run every stage in order and return the run summary (stage outcomes, loss, perplexity).

    With no inputs at all, the bundled sample (web crawl and source code) is used.
    """
    start = time.perf_counter()
    preflight_all(inputs, code_inputs, root)
    cfg = load_run_config(config_path, overrides or [])
    root = storage.normalize_url(root)
    if not inputs and not code_inputs:
        sample = sample_task(root)
        inputs, code_inputs = sample["web"], sample["code"]
    if not inputs:
        raise UserError("give crawl inputs (--input) as well as code inputs: the web branch is required")
    # globbed once: every stage below (and its fingerprint) reads these lists of files
    inputs = expand_inputs(inputs)
    code_inputs = expand_code_inputs(code_inputs, cfg.ingest_code.reader) if code_inputs else []

    stages = []
    with contextlib.ExitStack() as stack:
        if dask_address is None and data_stages_pending(inputs, code_inputs, root, cfg):
            dask_address = stack.enter_context(dask_cluster())
        branches, deduped, tokenizer, tokens = data_graph(_Run(root, cfg, dask_address), inputs, code_inputs)
    for name in branches:
        stages += [_label(branches[name], name), _label(deduped[name], name)]
    stages.append(tokenizer)
    stages += [_label(t, name) for name, t in tokens.items()]

    train_cfg = section(cfg, "train")
    if len(tokens) > 1 and not train_cfg["data"]["mixture"]:
        train_cfg["data"]["mixture"] = {name: cfg.mixture[name] for name in tokens}
    train = train_task.with_options(**retry_options(cfg.launch.task_retries))(
        [f"{name}={t['url']}" for name, t in tokens.items()], root, train_cfg, section(cfg, "launch"))
    evaluation = eval_task(train["checkpoint"], None, root, section(cfg, "eval"))  # every split
    stages += [train, evaluation]

    summary = {
        "root": root,
        "stages": stages,
        "mixture": train_cfg["data"]["mixture"] or {"web": 1.0},
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    create_table_artifact(
        key="smelt-run-summary",
        table=[{"stage": s["stage"], "reused": s["reused"], "rows": s["rows"], "seconds": s["seconds"], "url": s["url"]}
               for s in stages],
        description=f"crawl-to-model run under {root}",
    )
    return summary


def _label(outcome: dict, branch: str) -> dict:
    """Name a stage outcome after its branch in the summary (ingest[web], dedup[code], …)."""
    return {**outcome, "stage": f"{outcome['stage']}[{branch}]", "branch": branch}
