"""`smelt`: the command line. Each command runs a Prefect flow (local mode unless PREFECT_API_URL is set).

User mistakes (bad URL, bad config, missing input) end in one clear sentence and exit code 2.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from infra.launch.job import JOB_DEFAULTS

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="smelt: raw web-and-code crawl in, filtered, deduplicated, tokenized data and a trained, "
                       "evaluated model out.")
tokenizer_app = typer.Typer(no_args_is_help=True, help="Train or inspect tokenizers.")
classifier_app = typer.Typer(no_args_is_help=True, help="fastText quality classifier.")
server_app = typer.Typer(no_args_is_help=True, help="A local Prefect server with smelt's deployments and a worker.")
app.add_typer(tokenizer_app, name="tokenizer")
app.add_typer(server_app, name="server")
app.add_typer(classifier_app, name="quality-classifier")
console = Console(stderr=True)


def _out() -> Console:
    """Tables on stdout; wide enough for drop reasons when stdout is a file or a pipe."""
    return Console() if sys.stdout.isatty() else Console(width=160)

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="Run config TOML (default configs/demo.toml).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: section.key=value (repeatable).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object on stdout.")]
DaskOpt = Annotated[Optional[str], typer.Option("--dask-address", envvar="SMELT_DASK_ADDRESS",
                                                help="Scheduler of an existing Dask cluster (default: a LocalCluster).")]
RootOpt = Annotated[str, typer.Option("--root", help="Where stage outputs land: <root>/<stage>/<fingerprint>/ (any fsspec URL).")]


def _prefect_env() -> None:
    """Quiet, local-first Prefect defaults; a user's own settings win."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "tasks,flows")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    # The temporary local server can take well over the default 20 s to start on a busy 2-core machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def _reachable(dask_address: Optional[str] = None) -> None:
    """First thing in every command that starts a flow (before its slow imports): the Prefect server named
    by PREFECT_API_URL and the Dask scheduler answer, or the command ends in one sentence."""
    from flows.local_server import check_api_url

    check_api_url()
    if dask_address:
        from flows.dask_runtime import check_scheduler

        check_scheduler(dask_address)


def _config(path: Optional[Path], overrides: Optional[list[str]]):
    from flows.config import load_run_config

    return load_run_config(path, overrides or [])


def _emit(result: dict, as_json: bool, render) -> None:
    if as_json:
        print(json.dumps(result, sort_keys=True, default=str))
    else:
        render(result)


@app.command()
def sample(
    output: Annotated[str, typer.Option("--output", "-o", help="Folder or fsspec URL for the sample crawl.")] = "smelt-data/sample",
    pages: Annotated[int, typer.Option(help="Number of pages (≥ 1000 for the full mix of planted cases).")] = 1200,
    files: Annotated[int, typer.Option(help="Number of WARC files.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed: the same seed writes byte-identical files.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Write the generated sample: a crawl (gzipped WARC + ground_truth.jsonl) and source code under code/."""
    from tasks import storage
    from tasks.sample.code import write_sample_code
    from tasks.sample.crawl import write_sample_crawl

    summary = write_sample_crawl(output, pages=pages, files=files, seed=seed)
    summary["code"] = write_sample_code(storage.join(storage.normalize_url(output), "code"), seed=seed)
    _emit(summary, as_json, lambda s: console.print(f"wrote sample crawl to {output}: {s}"))


@app.command()
def run(
    input: Annotated[Optional[list[str]], typer.Option("--input", "-i", help="Crawl files/globs (default: the sample crawl, generated if missing).")] = None,
    code_input: Annotated[Optional[list[str]], typer.Option("--code-input", help="Source code: JSONL/Parquet records, tar/zip archives or folders; adds the code branch and a web/code mixture.")] = None,
    root: RootOpt = "smelt-data",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    nproc: Annotated[Optional[int], typer.Option(help="Training processes (default: launch.nproc).")] = None,
    dask_address: DaskOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Crawl → ingest → dedup → tokenize → train → eval, reusing every finished stage."""
    _reachable(dask_address)
    from flows.crawl_to_model import crawl_to_model
    from flows.summary import render_run_summary

    overrides = list(set_ or []) + ([f"launch.nproc={nproc}"] if nproc else [])
    cfg = _config(config, overrides)  # validate before starting Prefect
    del cfg
    result = crawl_to_model(inputs=input, code_inputs=code_input, root=root, config_path=str(config) if config else None,
                            overrides=overrides, dask_address=dask_address)
    _emit(result, as_json, lambda r: render_run_summary(r, _out()))


def _check_inputs(section: str, inputs: list[str]) -> None:
    """Fail fast, before any flow starts, on inputs that do not exist or are not complete datasets."""
    from tasks import contract, storage

    if section == "ingest":
        from tasks.ingest.readers import expand_inputs

        expand_inputs(inputs)
    elif section == "ingest_code":
        from tasks.ingest.code.readers import expand_code_inputs

        expand_code_inputs(inputs)
    elif section == "dedup":  # a documents dataset, or raw JSONL/Parquet files (globs allowed)
        for url in inputs:
            fs, path = storage.filesystem(url)
            if contract.read_manifest(url) is None and not fs.glob(path):
                raise contract.DatasetError(f"no documents dataset or files at {url}")
    else:
        for url in inputs:
            contract.open_dataset(url, kind="documents")


def _stage_command(flow_fn, section: str, inputs: list[str], output: Optional[str], root: str,
                   config: Optional[Path], set_: Optional[list[str]], as_json: bool, **kwargs) -> None:
    from flows.config import section as config_section
    from flows.summary import render_stage

    cfg = _config(config, set_)
    _check_inputs(section, inputs)
    result = flow_fn(inputs=inputs, root=root, config=config_section(cfg, section), output=output, **kwargs)
    _emit(result, as_json, lambda r: render_stage(r, _out()))


@app.command()
def ingest(
    input: Annotated[list[str], typer.Option("--input", "-i", help="WARC/WET/JSONL/Parquet files, globs or URLs.")],
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Output dataset URL (default <root>/ingest/<fingerprint>).")] = None,
    root: RootOpt = "smelt-data",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    dask_address: DaskOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Extract, language-filter, quality-filter and PII-mask crawl records into documents."""
    _reachable(dask_address)
    from flows.ingest import ingest_flow

    _stage_command(ingest_flow, "ingest", input, output, root, config, set_, as_json, dask_address=dask_address)


@app.command("ingest-code")
def ingest_code(
    input: Annotated[list[str], typer.Option("--input", "-i", help="Source files: JSONL/Parquet records, tar/zip archives, folders, globs.")],
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Output dataset URL (default <root>/ingest_code/<fingerprint>).")] = None,
    root: RootOpt = "smelt-data",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    dask_address: DaskOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Filter source code with The Stack / StarCoder-style rules into code documents."""
    _reachable(dask_address)
    from flows.ingest import code_ingest_flow

    _stage_command(code_ingest_flow, "ingest_code", input, output, root, config, set_, as_json, dask_address=dask_address)


@app.command()
def dedup(
    input: Annotated[list[str], typer.Option("--input", "-i", help="Documents dataset URL(s), or JSONL/Parquet files with id and text.")],
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Output dataset URL.")] = None,
    threshold: Annotated[Optional[float], typer.Option(help="Jaccard similarity above which documents are duplicates.")] = None,
    root: RootOpt = "smelt-data",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    dask_address: DaskOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove exact and near-duplicate documents (MinHash LSH)."""
    _reachable(dask_address)
    from flows.dedup import dedup_flow

    overrides = list(set_ or []) + ([f"dedup.threshold={threshold}"] if threshold is not None else [])
    _stage_command(dedup_flow, "dedup", input, output, root, config, overrides, as_json, dask_address=dask_address)


@app.command()
def tokenize(
    input: Annotated[list[str], typer.Option("--input", "-i", help="Documents dataset URL(s).")],
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Output token dataset URL.")] = None,
    tokenizer: Annotated[Optional[str], typer.Option(help="Tokenizer dataset or tokenizer.json URL (default: train one).")] = None,
    root: RootOpt = "smelt-data",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    dask_address: DaskOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Encode documents into uint16/uint32 token shards with a held-out validation split."""
    _reachable(dask_address)
    from flows.config import section
    from flows.tokenization import tokenize_flow

    _stage_command(tokenize_flow, "tokenize", input, output, root, config, set_, as_json,
                   tokenizer=tokenizer, dask_address=dask_address,
                   tokenizer_config=section(_config(config, set_), "tokenizer"))


@tokenizer_app.command("train")
def tokenizer_train(
    input: Annotated[list[str], typer.Option("--input", "-i", help="Documents dataset URL(s).")],
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Tokenizer dataset URL.")] = None,
    vocab_size: Annotated[Optional[int], typer.Option(help="Vocabulary size, special tokens included.")] = None,
    root: RootOpt = "smelt-data",
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Train a byte-level BPE tokenizer on a sample of documents."""
    _reachable()
    from flows.tokenization import tokenizer_flow

    overrides = list(set_ or []) + ([f"tokenizer.vocab_size={vocab_size}"] if vocab_size else [])
    _stage_command(tokenizer_flow, "tokenizer", input, output, root, config, overrides, as_json)


@app.command()
def train(
    data: Annotated[Optional[list[str]], typer.Option("--data", "-d", help="Token dataset URL, or name=URL for a mixture (repeatable).")] = None,
    root: RootOpt = "smelt-data",
    run_dir: Annotated[Optional[str], typer.Option(help="Run folder (default <root>/train/<run identity>: model, data, batch contract, seed; a longer train.steps or a code fix continues it).")] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    nproc: Annotated[Optional[int], typer.Option(help="Processes for torchrun (default: launch.nproc).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the layout, per-rank parameters and accumulation; train nothing.")] = False,
    init_from: Annotated[Optional[str], typer.Option(help="Start from this Hugging Face Llama folder (continued pretraining).")] = None,
    as_json: JsonOpt = False,
    simulate_world: Annotated[Optional[int], typer.Option(help="With --dry-run: build and step one rank of an N-rank job on fake tensors; its peak memory beside the plan's.")] = None,
    rank: Annotated[int, typer.Option(help="The rank --simulate-world builds (its mesh coordinates).")] = 0,
    resume_from: Annotated[Optional[int], typer.Option(metavar="STEP", help="Continue from this retained checkpoint (any world size); the later ones are kept as a superseded branch.")] = None,
    skip_steps: Annotated[Optional[str], typer.Option(metavar="A:B", help="With --resume-from: skip the samples of steps A..B (PaLM's remedy for a spike).")] = None,
) -> None:
    """Launch torchrun to train (or resume) a model on token datasets."""
    if not data and not (dry_run and simulate_world):
        raise typer.BadParameter("--data is required (unless --dry-run --simulate-world)", param_hint="--data")
    if dry_run and simulate_world:
        from flows.config import section
        from tasks.config import from_dict
        from tasks.train.config import TrainConfig
        from tasks.train.main import simulate

        cfg = _config(config, list(set_ or []))
        report = simulate(from_dict(TrainConfig, section(cfg, "train")), data, simulate_world, rank)
        _emit(report, as_json, lambda r: console.print_json(json.dumps(r, default=str)))
        return
    if not dry_run:
        _reachable()
    from flows.config import section
    from flows.summary import render_train
    from flows.train import dry_run_report, train_flow

    overrides = list(set_ or []) + ([f"launch.nproc={nproc}"] if nproc else [])
    overrides += [f"train.init_from={init_from}"] if init_from else []
    cfg = _config(config, overrides)
    report = dry_run_report(data, section(cfg, "train"), cfg.launch.nproc)  # user mistakes: one sentence, now
    if dry_run:
        _emit(report, as_json, lambda r: console.print_json(json.dumps(r, default=str)))
        return
    result = train_flow(data=data, root=root, config=section(cfg, "train"), launch=section(cfg, "launch"), run_dir=run_dir,
                        resume_from=resume_from, skip_steps=skip_steps)
    _emit(result, as_json, lambda r: render_train(r, _out()))


@app.command("eval")
def evaluate(
    checkpoint: Annotated[str, typer.Option("--checkpoint", help="A checkpoint step-NNNNNNNN URL or a run folder (its newest committed checkpoint).")],
    data: Annotated[Optional[str], typer.Option("--data", "-d", help="Token dataset with a val split (default: every one the run trained on, scored per split).")] = None,
    root: Annotated[Optional[str], typer.Option("--root", help="Where the result lands: <root>/eval/<fingerprint>/ (default: the run's root).")] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Validation loss, perplexity and bits per byte of a checkpoint, plus probe completions."""
    _reachable()
    from flows.config import section
    from flows.evaluation import eval_flow
    from flows.summary import render_eval

    cfg = _config(config, set_)
    result = eval_flow(checkpoint=checkpoint, data=data, root=root, config=section(cfg, "eval"))
    if result.get("skipped"):
        _emit(result, as_json, lambda r: console.print(f"eval skipped: {r['checkpoint']}: {r['reason']}"))
        return
    _emit(result, as_json, lambda r: render_eval(r, _out()))


@app.command()
def trace(
    run: Annotated[str, typer.Option("--run", help="Run folder (any fsspec URL).")],
    step: Annotated[Optional[int], typer.Option(help="List this step's sequences by loss, with their documents.")] = None,
    top: Annotated[int, typer.Option(help="Sequences listed per step.")] = 5,
    spikes: Annotated[bool, typer.Option("--spikes", help="Every rejected step and loss outlier, with its top documents.")] = False,
    z: Annotated[float, typer.Option(help="--spikes: robust standard deviations above the neighbouring steps.")] = 4.0,
    document: Annotated[Optional[str], typer.Option(help="When the document at this URL was trained on.")] = None,
    ledger: Annotated[bool, typer.Option("--ledger", help="How many applied updates each sample entered.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Which documents made that step: from training steps back to the crawl (tasks/trace)."""
    from tasks.trace.report import answer, render

    result = answer(run, step=step, top=top, spikes_=spikes, z=z, document_url=document, ledger_=ledger)
    _emit(result, as_json, lambda r: print(render(r)))


@app.command()
def report(
    run_dir: Annotated[str, typer.Argument(help="A run folder: <root>/train/<run identity> (any fsspec URL).")],
    output: Annotated[Optional[str], typer.Option("--output", "-o", help="Where to write the page (default <run folder>/report.html).")] = None,
    root: Annotated[Optional[str], typer.Option("--root", help="Where the run's evaluations are (default: the run's root).")] = None,
) -> None:
    """One self-contained HTML page of a run: config, curves, goodput, faults, stragglers, checkpoints, data funnel."""
    from tasks.contract import DatasetError
    from tasks.report.publish import write_report

    if not os.path.isdir(run_dir) and "://" not in run_dir:
        raise DatasetError(f"no run folder at {run_dir}")
    written = write_report(run_dir, output=output, root=root)
    console.print(f"wrote {written['url']} ({written['bytes']:,} bytes); TensorBoard: tensorboard --logdir "
                  f"{run_dir.rstrip('/')}/tensorboard", soft_wrap=True)


@server_app.command("start")
def server_start(
    port: Annotated[Optional[int], typer.Option(help="Port on 127.0.0.1 (default: a free one).")] = None,
    state_dir: Annotated[Path, typer.Option(help="Where the pids, the API URL and the logs are kept.")] = Path(".smelt-server"),
) -> None:
    """Start a Prefect server on 127.0.0.1, the work pool, every deployment (prefect.yaml) and a process worker."""
    from flows.local_server import ServerError, start

    try:
        info = start(state_dir, port=port)
    except ServerError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(1) from None
    console.print(f"Prefect UI at {info.ui_url}; worker on pool smelt-process; logs in {info.state_dir}. "
                  f"Point smelt and prefect at it with:")
    print(f"export PREFECT_API_URL={info.api_url}")


@server_app.command("stop")
def server_stop(
    state_dir: Annotated[Path, typer.Option(help="The folder `smelt server start` used.")] = Path(".smelt-server"),
) -> None:
    """Stop the worker and the server that `smelt server start` started."""
    from flows.local_server import stop

    info = stop(state_dir)
    console.print(f"stopped the server at {info.ui_url} and its worker" if info else f"no server recorded in {state_dir}")


@app.command()
def export(
    checkpoint: Annotated[str, typer.Option("--checkpoint", help="Checkpoint step URL or run folder.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Folder URL of the Hugging Face Llama folder to write.")],
    dtype: Annotated[Optional[str], typer.Option(help="Cast the weights: bf16 | fp32 | fp16 (default: as saved).")] = None,
    max_shard_size: Annotated[str, typer.Option(help="Split the weights into safetensors files of at most this size.")] = "5GB",
    as_json: JsonOpt = False,
) -> None:
    """Export a checkpoint as a Hugging Face Llama folder (transformers, vLLM, lm-eval load it)."""
    from tasks.train.export import export_checkpoint, parse_size

    manifest = export_checkpoint(checkpoint, output, dtype=dtype, max_shard_bytes=parse_size(max_shard_size))
    result = {"url": manifest.meta["url"], "checkpoint": manifest.meta.get("checkpoint"),
              "files": [s.name for s in manifest.shards], "bytes": sum(s.bytes for s in manifest.shards)}
    _emit(result, as_json, lambda r: console.print(f"exported {r['checkpoint']} to {r['url']} ({r['bytes']:,} bytes)"))


@app.command()
def launch(
    engine: Annotated[str, typer.Argument(help="slurm (render + sbatch) or kubernetes (a PyTorchJob manifest).")],
    data: Annotated[list[str], typer.Option("--data", "-d", help="Token dataset URL, or name=URL for a mixture (repeatable).")],
    root: RootOpt = "smelt-data",
    run_dir: Annotated[Optional[str], typer.Option(help="Run folder (default <root>/train/<run identity>); every node must reach it.")] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    nodes: Annotated[int, typer.Option(help="Nodes (one torchrun agent each).")] = JOB_DEFAULTS["nodes"],
    procs_per_node: Annotated[int, typer.Option(help="Ranks per node (one per GPU).")] = JOB_DEFAULTS["procs_per_node"],
    gpus_per_node: Annotated[int, typer.Option(help="GPUs to request per node (0: a CPU job).")] = JOB_DEFAULTS["gpus_per_node"],
    cpus_per_node: Annotated[int, typer.Option(help="CPUs to request per node (0: the scheduler's default).")] = JOB_DEFAULTS["cpus_per_node"],
    max_restarts: Annotated[int, typer.Option(help="torchrun restarts of all ranks inside one job.")] = JOB_DEFAULTS["max_restarts"],
    time_limit_minutes: Annotated[int, typer.Option(help="Job time limit (0: the partition's).")] = JOB_DEFAULTS["time_limit_minutes"],
    stop_lead_s: Annotated[int, typer.Option(help="SIGUSR1 this many seconds before the limit: final checkpoint, requeue.")] = JOB_DEFAULTS["stop_lead_s"],
    rdzv_port: Annotated[int, typer.Option(help="c10d rendezvous port on the first node.")] = JOB_DEFAULTS["rdzv_port"],
    name: Annotated[str, typer.Option(help="Job name (default smelt-<hash of the run folder>).")] = JOB_DEFAULTS["name"],
    partition: Annotated[str, typer.Option(help="Slurm partition.")] = JOB_DEFAULTS["partition"],
    account: Annotated[str, typer.Option(help="Slurm account.")] = JOB_DEFAULTS["account"],
    log_dir: Annotated[str, typer.Option(help="Folder for the job's output and the rendered script (default smelt-logs/ in the checkout).")] = JOB_DEFAULTS["log_dir"],
    image: Annotated[str, typer.Option(help="Kubernetes: container image with smelt installed.")] = JOB_DEFAULTS["image"],
    namespace: Annotated[str, typer.Option(help="Kubernetes namespace.")] = JOB_DEFAULTS["namespace"],
    store_secret: Annotated[str, typer.Option(help="Kubernetes Secret holding the AWS_* object store variables.")] = JOB_DEFAULTS["store_secret"],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the script or manifest; write and submit nothing.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Train on a cluster: render a Slurm batch script (and submit it) or a Kubernetes PyTorchJob."""
    options = {name: value for name, value in locals().items() if name in JOB_DEFAULTS}  # JobSpec's fields
    from flows.config import section
    from flows.train import parse_data, run_dir_for
    from infra.launch.submit import launch as launch_job
    from tasks.config import from_dict
    from tasks.train.config import TrainConfig

    cfg = _config(config, set_)
    train_cfg = section(cfg, "train")
    sources = parse_data(data)
    url = run_dir or run_dir_for(sources, root, from_dict(TrainConfig, train_cfg))[0]
    result = launch_job(engine, data=sources, config=train_cfg, run_dir=url, dry_run=dry_run, **options)
    if as_json:
        print(json.dumps(result, sort_keys=True))
    elif dry_run:
        print(result["text"], end="")
    elif result["job_id"]:
        console.print(f"submitted Slurm job {result['job_id']} ({result['path']}); run folder {result['run_dir']}")
    else:
        console.print(f"wrote {result['path']}; start it with: kubectl apply -f {result['path']}")


@classifier_app.command("train")
def classifier_train(
    positive: Annotated[str, typer.Option(help="Documents dataset of good examples.")],
    negative: Annotated[str, typer.Option(help="Documents dataset of bad examples.")],
    output: Annotated[str, typer.Option("--output", "-o", help="URL of the fastText model to write.")],
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Train a fastText quality classifier and report held-out precision and recall."""
    from tasks.ingest.classifier import train_classifier_from_datasets

    cfg = _config(config, set_)
    report = train_classifier_from_datasets(positive, negative, output, cfg.ingest.classifier)
    _emit(report, as_json, lambda r: console.print_json(json.dumps(r, default=str)))


def _register_planner() -> None:
    from infra.commands import plan_command, simulate_command

    app.command("plan")(plan_command)
    app.command("simulate")(simulate_command)


def _preflight_stores(argv: list[str]) -> None:
    """Every object store URL on the command line must name a reachable, readable bucket: a wrong
    endpoint, key or bucket fails here in seconds with one sentence, not deep inside a flow."""
    from tasks.contract import DatasetError
    from tasks.objectstore import preflight_all

    preflight_all(argv)


def main() -> None:
    """Entry point: user errors (tasks.errors.UserError, ConfigError among them) are one sentence, exit 2; bugs keep a traceback."""
    from tasks.contract import DatasetError
    from tasks.errors import StageFailed, UserError

    from infra.launch.job import SubmitError
    from tasks.objectstore import StoreError

    _prefect_env()
    _register_planner()
    try:
        _preflight_stores(sys.argv[1:])
        app()
    except StageFailed:
        sys.exit(2)  # the flow run's last log line is already the sentence (flows/common.fails_in_one_sentence)
    except (UserError, DatasetError, FileNotFoundError, StoreError, SubmitError) as e:
        # messages name [sections]: not markup; one line however long, so a log keeps it whole
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
