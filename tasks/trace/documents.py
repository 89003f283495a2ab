"""From a trained sequence to the documents it was cut from, exactly.

A global sample index goes through the loader's own order (``data.SampleSources``, built from the run's
``lineage.json``) to a window of one tokens dataset's training stream, ``[s·seq_len, s·seq_len + seq_len + 1)``;
the stream is the split's ``.bin`` shards in order (``token_shards.stream_shards``), and each shard's lineage
(``.docs.parquet``, written by tokenize) says which document starts where. The excerpt is cut from the
document's text in its documents dataset at the character offsets the tokenizer gives when it encodes
that text again; the encoding is compared with the shard's tokens, so ``exact`` says the mapping holds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from tasks import contract, storage, verified_reads
from tasks.tokenizer_files import TOKENIZER_FILE, load_tokenizer
from tasks.token_shards import lineage_name, read_token_shard, stream_shards
from tasks.trace.run import TraceError
from tasks.train.data import SampleSources

EXCERPT_CHARS = 240
CARRIED = ("id", "url", "source", "lang", "lang_score", "quality_score", "meta")


@dataclass
class _Stream:
    """One tokens dataset's training stream: its shards, where each begins, their lineage (loaded lazily)."""

    name: str
    manifest: contract.Manifest
    shards: list[contract.ShardInfo]
    starts: np.ndarray  # stream position of each shard's first token, and the total last

    def lineage(self, i: int, columns: list[str] | None = None):
        by_name = {s.name: s for s in self.manifest.shards}
        info = by_name.get(lineage_name(self.shards[i].name))
        if info is None:
            raise TraceError(f"tokens dataset {self.manifest.meta['url']} has no lineage shard for {self.shards[i].name}: "
                             "it was tokenized before smelt kept document lineage (issue 42); tokenize it again")
        return verified_reads.read_parquet(contract.shard_url(self.manifest, info), info, columns)


class Documents:
    """Maps samples and stream positions of a run's tokens datasets to documents (module docstring).

    Everything read is cached for the life of the object: one trace answer reads each shard once."""

    def __init__(self, lineage: dict) -> None:
        self.names: list[str] = list(lineage["names"])
        self.seq_len = int(lineage["seq_len"])
        self.split = lineage.get("split", "train")
        self.urls: dict[str, str] = dict(lineage["datasets"])
        self.fingerprints: dict[str, str] = dict(lineage.get("fingerprints", {}))
        self.sources = SampleSources(self.names, lineage["weights"], [int(n) for n in lineage["samples"]],
                                     int(lineage["seed"]))
        self._streams: dict[int, _Stream] = {}
        self._lineage: dict[tuple[int, int], dict] = {}
        self._texts: dict[tuple[str, str], list] = {}
        self._clusters: dict[str, dict[str, int] | None] = {}
        self._tokenizers: dict[int, object] = {}
        self._tokens: dict[tuple[int, int], np.ndarray] = {}

    # -- streams ------------------------------------------------------------------------------------

    def stream(self, k: int) -> _Stream:
        if k not in self._streams:
            name = self.names[k]
            try:
                manifest = contract.open_dataset(self.urls[name], kind="tokens")
            except contract.DatasetError as e:
                raise TraceError(f"the run trained on tokens dataset {name!r} at {self.urls[name]}, which cannot be "
                                 f"read now: {e}") from e
            if self.fingerprints.get(name, manifest.fingerprint) != manifest.fingerprint:
                raise TraceError(f"tokens dataset {self.urls[name]} is not the one the run trained on (fingerprint "
                                 f"{manifest.fingerprint}, the run's {self.fingerprints[name]})")
            shards = stream_shards(manifest, self.split)
            tokens = [int(s.extra.get("tokens", s.rows)) for s in shards]
            self._streams[k] = _Stream(name, manifest, shards, np.concatenate([[0], np.cumsum(tokens)]).astype(np.int64))
        return self._streams[k]

    def lineage(self, k: int, i: int) -> dict:
        """Shard ``i`` of stream ``k``'s lineage as columns (numpy for offsets, lists for the rest)."""
        if (k, i) not in self._lineage:
            table = self.stream(k).lineage(i)
            columns = {name: table.column(name).to_pylist() for name in table.column_names}
            columns["token_start"] = np.asarray(columns["token_start"], dtype=np.int64)
            self._lineage[(k, i)] = columns
        return self._lineage[(k, i)]

    def window(self, sample: int) -> tuple[int, int, int]:
        """(dataset number, first and end stream position) of the window a global sample index reads."""
        which, s = self.sources(np.asarray([sample]))
        start = int(s[0]) * self.seq_len
        return int(which[0]), start, start + self.seq_len + 1

    # -- documents ------------------------------------------------------------------------------------

    def pieces(self, k: int, start: int, end: int) -> list[dict]:
        """The documents stream ``k``'s positions ``[start, end)`` cover, one piece each, in order."""
        stream = self.stream(k)
        out = []
        first = int(np.searchsorted(stream.starts, start, side="right")) - 1
        for i in range(first, len(stream.shards)):
            base = int(stream.starts[i])
            if base >= end:
                break
            lo, hi = max(start, base) - base, min(end, int(stream.starts[i + 1])) - base
            lin = self.lineage(k, i)
            j = int(np.searchsorted(lin["token_start"], lo, side="right")) - 1
            while j < len(lin["token_start"]) and lin["token_start"][j] < hi:
                doc_start = int(lin["token_start"][j])
                doc_end = doc_start + int(lin["tokens"][j])
                piece = {name: lin[name][j] for name in CARRIED}
                piece["meta"] = json.loads(piece["meta"]) if piece["meta"] else {}
                piece.update(
                    dataset=stream.name, tokens_dataset=stream.manifest.meta["url"], shard=stream.shards[i].name,
                    stream_tokens=[base + max(lo, doc_start), base + min(hi, doc_end)],
                    doc_tokens=[max(lo, doc_start) - doc_start, min(hi, doc_end) - doc_start],
                    doc_length=doc_end - doc_start, documents=self._documents_url(k, lin["documents"][j]),
                    documents_shard=lin["shard"][j], row=lin["row"][j], text_bytes=lin["text_bytes"][j],
                    _at=(k, i, j),
                )
                for key in ("lang_score", "quality_score"):
                    if piece[key] is not None and math.isnan(piece[key]):
                        piece[key] = None
                out.append(piece)
                j += 1
        return out

    def describe(self, pieces: list[dict], excerpt_chars: int = EXCERPT_CHARS) -> list[dict]:
        """Add each piece's excerpt (verbatim, with its byte range), exactness and dedup cluster size."""
        for piece in pieces:
            k, i, j = piece.pop("_at")
            piece.update(self._excerpt(k, i, j, piece, excerpt_chars))
            piece["cluster_size"] = self._cluster_size(piece["documents"], piece["id"])
        return pieces

    def _excerpt(self, k: int, i: int, j: int, piece: dict, limit: int) -> dict:
        text = self._text(piece["documents"], piece["documents_shard"], piece["row"])
        if text is None:
            return {"excerpt": None, "byte_range": None, "exact": None}
        lin = self.lineage(k, i)
        start = int(lin["token_start"][j])
        ids = self._shard_tokens(k, i)[start: start + int(lin["tokens"][j])].tolist()
        encoding = self._tokenizer(k).encode(text, add_special_tokens=False)
        meta = self.stream(k).manifest.meta
        lead = 1 if len(ids) == len(encoding.ids) + 2 and ids[0] == meta.get("bos_id") else 0
        exact = ids[lead: lead + len(encoding.ids)] == encoding.ids and ids[-1] == meta.get("eos_id")
        a = min(max(piece["doc_tokens"][0] - lead, 0), len(encoding.ids))
        b = min(max(piece["doc_tokens"][1] - lead, 0), len(encoding.ids))
        if a >= b:  # only the control tokens (BOS, EOS) of the document are in the window
            return {"excerpt": "", "byte_range": None, "exact": exact}
        c0, c1 = encoding.offsets[a][0], encoding.offsets[b - 1][1]
        b0 = len(text[:c0].encode("utf-8"))
        return {"excerpt": text[c0: min(c1, c0 + limit)], "byte_range": [b0, b0 + len(text[c0:c1].encode("utf-8"))],
                "exact": exact}

    def _shard_tokens(self, k: int, i: int) -> np.ndarray:
        if (k, i) not in self._tokens:
            stream = self.stream(k)
            self._tokens[(k, i)] = read_token_shard(stream.manifest, stream.shards[i].name)[0]
        return self._tokens[(k, i)]

    def _tokenizer(self, k: int):
        if k not in self._tokenizers:
            self._tokenizers[k] = load_tokenizer(storage.join(self.stream(k).manifest.meta["url"], TOKENIZER_FILE))
        return self._tokenizers[k]

    def _documents_url(self, k: int, documents: str) -> str:
        """A lineage row's documents dataset (its fingerprint) as the URL the tokens manifest recorded for it."""
        if "://" in documents:  # lineage written before datasets were named by fingerprint
            return documents
        inputs = self.stream(k).manifest.lineage.get("inputs", [])
        return next((i["url"] for i in inputs if i.get("fingerprint") == documents), documents)

    def _text(self, documents: str, shard: str, row: int) -> str | None:
        key = (documents, shard)
        if key not in self._texts:
            try:
                manifest = contract.open_dataset(documents, kind="documents")
                info = next(s for s in manifest.shards if s.name == shard)
                self._texts[key] = verified_reads.read_parquet(contract.shard_url(manifest, info), info, ["text"]).column("text").to_pylist()
            except (contract.DatasetError, StopIteration, FileNotFoundError):
                self._texts[key] = None  # moved or deleted since: the lineage row still names the document
        texts = self._texts[key]
        return texts[row] if texts is not None else None

    def _cluster_size(self, documents: str, doc_id: str) -> int | None:
        """Members of the dedup cluster the document kept (1: it had no duplicate); None without dedup output."""
        if documents not in self._clusters:
            sizes = None
            manifest = contract.read_manifest(storage.join(documents, "clusters"))
            if manifest is not None and manifest.kind == "clusters":
                sizes = {}
                for info in manifest.shards:
                    table = verified_reads.read_parquet(contract.shard_url(manifest, info), info, ["kept", "size"])
                    sizes.update(zip(table.column("kept").to_pylist(), table.column("size").to_pylist()))
            self._clusters[documents] = sizes
        sizes = self._clusters[documents]
        return None if sizes is None else int(sizes.get(doc_id, 1))

    def find_url(self, url: str) -> list[dict]:
        """Every document of the training streams with this URL: (dataset number, stream token range, id)."""
        found = []
        for k in range(len(self.names)):
            stream = self.stream(k)
            for i in range(len(stream.shards)):
                table = stream.lineage(i, ["url", "id", "token_start", "tokens"])
                urls = table.column("url").to_numpy(zero_copy_only=False)
                for j in np.flatnonzero(urls == url).tolist():
                    start = int(stream.starts[i]) + table.column("token_start")[j].as_py()
                    found.append({"dataset": stream.name, "k": k, "id": table.column("id")[j].as_py(),
                                  "shard": stream.shards[i].name,
                                  "stream_tokens": [start, start + table.column("tokens")[j].as_py()]})
        return found
