"""fastText quality classifier: train it from two document streams, apply it as a filter.

Training writes labelled lines (``__label__hq <text>``) to a local temporary file, interleaving the
two classes and shuffling them in bounded blocks so SGD never sees one class for a whole stretch;
every ``round(1/valid_fraction)``-th document of each class is held out for precision/recall on
the positive label. The model is saved locally and then copied to its fsspec URL.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import math
import os
import random
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO, Any

from tasks import contract, storage, verified_reads
from tasks.documents import Document
from tasks.ingest.config import ClassifierConfig
from tasks.ingest.langid import LABEL_PREFIX, load_fasttext_model, model_fingerprint, one_utf8_line, predict_top
from tasks.ingest.text import ProseFilter, is_code

log = logging.getLogger(__name__)

SHUFFLE_BLOCK_LINES = 65_536
EVAL_BATCH_LINES = 1024


M_PERTURB = -6  # glibc mallopt parameter


@contextlib.contextmanager
def zeroed_allocations() -> Iterator[None]:
    """Make glibc zero-fill every allocation while fastText trains.

    fastText 0.9.3 allocates its input matrix without initializing it and then randomizes only
    ``thread``/10 of it; the rest is whatever the heap held. Matrices large enough to be mmapped
    come back as zero pages, but small ones reuse freed memory, and training then depends on
    earlier allocations in the process: different models from the same data and seed, or
    "Encountered NaN". With M_PERTURB = 0xFF glibc fills new allocations with 0x00, which gives
    every model the zero rows a fresh mmap would. Elsewhere (no glibc) this does nothing.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        log.debug("no glibc mallopt here: fastText trains on uninitialized memory as it would")
        yield
        return
    mallopt(M_PERTURB, 0xFF)
    try:
        yield
    finally:
        mallopt(M_PERTURB, 0)


def normalize_for_classifier(text: str, cfg: ClassifierConfig) -> str:
    """One line of single-spaced text (fastText's input unit), identical at training and predict time."""
    if cfg.max_chars:
        text = text[: cfg.max_chars]
    text = " ".join(one_utf8_line(text).split())
    return text.lower() if cfg.lowercase else text


def _interleave(first: Iterable[Any], second: Iterable[Any]) -> Iterator[Any]:
    """a1, b1, a2, b2, …, then the rest of the longer stream."""
    sentinel = object()
    for pair in itertools.zip_longest(first, second, fillvalue=sentinel):
        yield from (item for item in pair if item is not sentinel)


def _labelled(texts: Iterable[str], label: str, cfg: ClassifierConfig, counts: dict[str, int]) -> Iterator[tuple[str, str]]:
    """(label, normalized text) for each non-empty text, at most ``cfg.max_docs_per_class`` of them."""
    taken = 0
    for text in texts:
        line = normalize_for_classifier(text or "", cfg)
        if not line:
            counts["skipped_empty"] += 1
            continue
        yield label, line
        taken += 1
        if cfg.max_docs_per_class and taken >= cfg.max_docs_per_class:
            return


def _write_split(
    examples: Iterator[tuple[str, str]], train: IO[str], held_out: IO[str], cfg: ClassifierConfig, counts: dict[str, int]
) -> None:
    every = max(2, round(1 / cfg.valid_fraction))
    seen: dict[str, int] = {}
    rng = random.Random(cfg.seed)
    block: list[str] = []
    for label, line in examples:
        seen[label] = seen.get(label, 0) + 1
        out = f"{LABEL_PREFIX}{label} {line}\n"
        if seen[label] % every == 0:
            held_out.write(out)
            counts[f"held_out_{label}"] += 1
            continue
        counts[f"train_{label}"] += 1
        block.append(out)
        if len(block) >= SHUFFLE_BLOCK_LINES:
            rng.shuffle(block)
            train.writelines(block)
            block.clear()
    rng.shuffle(block)
    train.writelines(block)


def evaluate(model: Any, held_out_path: str, cfg: ClassifierConfig) -> dict[str, float]:
    """Precision, recall and F1 of the positive label, and accuracy, on the held-out file."""
    tp = fp = fn = tn = 0
    with open(held_out_path, encoding="utf-8") as f:
        while lines := list(itertools.islice(f, EVAL_BATCH_LINES)):
            truths, texts = zip(*(line.rstrip("\n").split(" ", 1) for line in lines))
            labels, _ = predict_top(model, list(texts))
            for truth, (predicted,) in zip(truths, labels):
                actual_positive = truth == LABEL_PREFIX + cfg.positive_label
                predicted_positive = predicted == cfg.positive_label
                tp += actual_positive and predicted_positive
                fp += predicted_positive and not actual_positive
                fn += actual_positive and not predicted_positive
                tn += not actual_positive and not predicted_positive
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    total = tp + fp + fn + tn
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": (tp + tn) / total if total else 0.0}


def train_quality_classifier(
    positive_texts: Iterable[str], negative_texts: Iterable[str], output_path: str, cfg: ClassifierConfig
) -> dict[str, Any]:
    """Train a supervised fastText model (positive vs negative), save it to ``output_path``.

    Returns a report: model URL, documents used for training and held out per class, empty texts
    skipped, and held-out precision / recall / F1 (positive label) and accuracy.
    """
    import fasttext

    output_url = storage.normalize_url(output_path)
    pos, neg = cfg.positive_label, cfg.negative_label
    counts = {key: 0 for key in (f"train_{pos}", f"train_{neg}", f"held_out_{pos}", f"held_out_{neg}", "skipped_empty")}
    with tempfile.TemporaryDirectory(prefix="smelt-classifier-") as tmp:
        train_path, held_out_path = os.path.join(tmp, "train.txt"), os.path.join(tmp, "held_out.txt")
        examples = _interleave(_labelled(positive_texts, pos, cfg, counts), _labelled(negative_texts, neg, cfg, counts))
        with open(train_path, "w", encoding="utf-8") as train, open(held_out_path, "w", encoding="utf-8") as held_out:
            _write_split(examples, train, held_out, cfg, counts)
        every = max(2, round(1 / cfg.valid_fraction))
        for label in (pos, neg):
            if counts[f"held_out_{label}"] == 0:
                raise ValueError(
                    f"too few {label!r} documents to train and evaluate a classifier: need at least {every} "
                    f"non-empty documents per class (got {counts[f'train_{label}']}); add data or raise classifier.valid_fraction"
                )

        log.info("training fastText classifier on %d documents", counts[f"train_{pos}"] + counts[f"train_{neg}"])
        with zeroed_allocations():
            model = fasttext.train_supervised(
                input=train_path,
                lr=cfg.lr,
                epoch=cfg.epoch,
                wordNgrams=cfg.word_ngrams,
                dim=cfg.dim,
                minCount=cfg.min_count,
                bucket=cfg.bucket,
                thread=cfg.threads,
                seed=cfg.seed,
                loss="softmax",
                verbose=0,
            )
            if cfg.quantize:
                model.quantize(input=train_path, retrain=True, thread=cfg.threads, verbose=0)
        metrics = evaluate(model, held_out_path, cfg)

        model_path = os.path.join(tmp, "model.ftz" if cfg.quantize else "model.bin")
        model.save_model(model_path)
        with open(model_path, "rb") as src, storage.atomic_write(output_url) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)

    report = {
        "model_url": output_url,
        "labels": {"positive": pos, "negative": neg},
        "train_docs": {pos: counts[f"train_{pos}"], neg: counts[f"train_{neg}"]},
        "held_out_docs": {pos: counts[f"held_out_{pos}"], neg: counts[f"held_out_{neg}"]},
        "skipped_empty": counts["skipped_empty"],
        **metrics,
    }
    log.info("quality classifier saved to %s: %s", output_url, metrics)
    return report


def iter_dataset_texts(url: str) -> Iterator[str]:
    """The ``text`` column of every document shard of the smelt documents dataset at ``url``, each
    shard verified against the manifest as it is read."""
    manifest = contract.open_dataset(url, kind="documents")
    for shard in manifest.shards:
        if not shard.name.endswith(".parquet"):
            continue
        parquet = verified_reads.open_parquet(contract.shard_url(manifest, shard), shard)
        for batch in parquet.iter_batches(columns=["text"], batch_size=1024):
            yield from batch.column(0).to_pylist()


def train_classifier_from_datasets(positive_url: str, negative_url: str, output_url: str, cfg: ClassifierConfig) -> dict[str, Any]:
    """``smelt quality-classifier train``: two documents datasets in, a fastText model and its report out."""
    positive = iter_dataset_texts(positive_url)
    negative = iter_dataset_texts(negative_url)
    report = train_quality_classifier(positive, negative, output_url, cfg)
    report["positive_dataset"] = storage.normalize_url(positive_url)
    report["negative_dataset"] = storage.normalize_url(negative_url)
    return report


class QualityClassifierFilter(ProseFilter):
    """Scores prose documents with the trained classifier and drops those below the threshold.

    Sets ``doc.quality_score`` to P(positive label); code documents keep NaN and pass
    (``skipped.code``). Reason: quality_classifier_low.
    """

    name = "quality_classifier"

    def __init__(self, cfg: ClassifierConfig):
        super().__init__(cfg)
        self.batch_size = cfg.batch_size
        self.model_stamp = ""
        if cfg.enabled:
            fs, path = storage.filesystem(cfg.model_url)
            if not fs.exists(path):
                raise ValueError(f"classifier.model_url {cfg.model_url} does not exist: train one with `smelt quality-classifier train` or fix the URL")
            self.model_stamp = model_fingerprint(cfg.model_url)

    def score(self, texts: list[str]) -> list[float]:
        """P(positive label) for each text."""
        model = load_fasttext_model(self.cfg.model_url, self.model_stamp)
        labels_in_model = model.get_labels()
        if LABEL_PREFIX + self.cfg.positive_label not in labels_in_model:
            raise ValueError(
                f"the model at {self.cfg.model_url} has no label {self.cfg.positive_label!r} "
                f"(it has {', '.join(l[len(LABEL_PREFIX):] for l in labels_in_model)}): set classifier.positive_label"
            )
        labels, probs = predict_top(model, [normalize_for_classifier(t, self.cfg) for t in texts], k=len(labels_in_model))
        return [min(dict(zip(row_labels, row_probs)).get(self.cfg.positive_label, 0.0), 1.0) for row_labels, row_probs in zip(labels, probs)]

    def prepare(self, docs: list[Document]) -> None:
        prose = [doc for doc in docs if not is_code(doc)]
        if prose:
            for doc, score in zip(prose, self.score([d.text for d in prose])):
                doc.quality_score = score

    def keep(self, doc: Document) -> bool | tuple[bool, str]:
        if math.isnan(doc.quality_score) or doc.quality_score < self.cfg.threshold:
            return False, "quality_classifier_low"
        return True
