"""Score a checkpoint with lm-evaluation-harness (model type ``hf``) on a task built from smelt's own
held-out documents, so the harness runs offline and the score is comparable across tools.

The task is last-word cloze (LAMBADA's form): each of the first ``docs`` held-out documents with
enough words is cut after a purely alphabetic word; the harness scores the log-likelihood of
`` word`` after the text before it, and whether greedy decoding gives exactly that word (``acc``).
The harness scores the checkpoint's Hugging Face export (a ``model`` dataset that
``tasks/train/export.py`` writes; the eval flow exports before it calls this stage), loaded with
transformers, the same path users take; nothing is downloaded.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from tasks import contract, storage
from tasks.eval.config import HarnessConfig
from tasks.token_shards import TokenStream

log = logging.getLogger(__name__)

TASK = "smelt_last_word"
DOCS_FILE = "harness_cloze.jsonl"
TASK_FILE = "harness_task.yaml"
RESULTS_FILE = "harness.json"
METRICS = ("acc", "perplexity")  # the task file's metric_list


def held_out_documents(tokens_url: str, max_tokens: int) -> list[list[int]]:
    """Token ids of the held-out documents at the start of the val split (EOS-separated, EOS dropped)."""
    stream = TokenStream(tokens_url, "val", 1, cache_dir=None)
    try:
        n = min(stream.total, max_tokens)
        ids = np.empty(n, dtype=np.int64)
        stream.read(0, n, ids)
        eos, bos = stream.meta["eos_id"], stream.meta.get("bos_id")
    finally:
        stream.close()
    cuts = np.flatnonzero(ids == eos)
    docs = [d[d != bos] if bos is not None else d for d in np.split(ids, cuts + 1)[: len(cuts)]]  # whole docs only
    return [d[:-1].tolist() for d in docs]


def cloze_items(texts: list[str], cfg: HarnessConfig) -> list[dict]:
    """``{"context", "target"}`` per usable document: the passage's first ``max_words`` words, cut
    before its last purely alphabetic word (``target`` keeps the leading space, as LAMBADA does)."""
    items = []
    for text in texts:
        words = text.split(" ")[: cfg.max_words]
        last = max((i for i, w in enumerate(words) if w.isalpha() and i >= cfg.min_words - 1), default=None)
        if last is None:
            continue
        items.append({"context": " ".join(words[:last]), "target": " " + words[last]})
        if len(items) == cfg.docs:
            break
    return items


def task_yaml(docs_path: Path, cache_dir: Path) -> str:
    """The local lm-eval task file (LAMBADA's loglikelihood form) over the cloze JSON lines."""
    return "\n".join([
        f"task: {TASK}",
        "dataset_path: json",
        "dataset_kwargs:",
        "  data_files:",
        f"    test: {json.dumps(str(docs_path))}",
        f"  cache_dir: {json.dumps(str(cache_dir))}",
        "test_split: test",
        "output_type: loglikelihood",
        'doc_to_text: "{{context}}"',
        'doc_to_target: "{{target}}"',
        "metric_list:",
        "  - metric: perplexity",
        "    aggregation: perplexity",
        "    higher_is_better: false",
        "  - metric: acc",
        "    aggregation: mean",
        "    higher_is_better: true",
        "metadata:",
        "  version: 1.0",
        "",
    ])


def run_harness(model_dir: str | Path, items: list[dict], workdir: Path, batch_size: int) -> dict:
    """lm-eval's ``simple_evaluate`` with ``model="hf"`` on the cloze ``items``; the task's metrics."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    docs_path = workdir / DOCS_FILE
    docs_path.write_text("".join(json.dumps(item) + "\n" for item in items))
    task_dir = workdir / "tasks"
    task_dir.mkdir(exist_ok=True)
    (task_dir / TASK_FILE).write_text(task_yaml(docs_path, workdir / "datasets-cache"))
    results = lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": str(model_dir), "dtype": "float32"}, tasks=[TASK],
        task_manager=TaskManager(include_path=str(task_dir)), batch_size=batch_size, device="cpu",
        log_samples=False, bootstrap_iters=0,
    )
    raw = {key.split(",")[0]: value for key, value in results["results"][TASK].items()}  # "acc,none" -> "acc"
    return {metric: float(raw[metric]) for metric in METRICS}


def score_with_harness(export_url: str, tokens_url: str, cfg: HarnessConfig, output_url: str) -> tuple[list, dict]:
    """Build the cloze task from ``tokens_url``'s held-out documents and score the Hugging Face export at
    ``export_url`` (on the local filesystem: transformers loads it from there); writes the task's documents,
    task file and results as shards of the eval dataset at ``output_url``.
    Returns ``(shards, results)``; ``results["metrics"]`` holds ``acc`` and ``perplexity``."""
    from tasks.tokenizer_files import load_tokenizer

    start = time.perf_counter()
    export = contract.open_dataset(export_url, kind="model")
    if not export.meta["url"].startswith("file://"):
        raise contract.DatasetError(f"the harness loads the export {export.meta['url']} with transformers from "
                                    "local disk; export the checkpoint to a local folder")
    model_dir = storage.filesystem(export.meta["url"])[1]
    step_url = export.meta["checkpoint"]
    tokenizer = load_tokenizer(tokens_url)
    texts = [tokenizer.decode(doc) for doc in held_out_documents(tokens_url, cfg.max_tokens)]
    items = cloze_items(texts, cfg)
    if not items:
        raise contract.DatasetError(f"the val split of {tokens_url} has no document of at least "
                                    f"{cfg.min_words} words for the harness's cloze task")
    with tempfile.TemporaryDirectory(prefix="smelt-harness-") as tmp:
        workdir = Path(tmp)
        metrics = run_harness(model_dir, items, workdir, cfg.batch_size)
        task_file = (workdir / "tasks" / TASK_FILE).read_bytes()
    results = {"task": TASK, "items": len(items), "metrics": metrics, "model": "hf", "checkpoint": step_url,
               "data": tokens_url, "config": asdict(cfg), "seconds": round(time.perf_counter() - start, 2)}
    log.info("lm-eval %s on %d held-out documents: %s", TASK, len(items), metrics)

    def write(f, blob: bytes, rows: int) -> int:
        f.write(blob)
        return rows

    blobs = {DOCS_FILE: ("".join(json.dumps(i) + "\n" for i in items).encode(), len(items)),
             TASK_FILE: (task_file, 1), RESULTS_FILE: (json.dumps(results, indent=2).encode(), 1)}
    shards = [contract.write_shard(output_url, name, lambda f, b=blob, r=rows: write(f, b, r))
              for name, (blob, rows) in blobs.items()]
    return shards, results
