"""The tokenize stage: documents datasets + a tokenizer -> one tokens dataset (docs/design.md §3).

One work item per document shard ``n`` (counting across all inputs, in order) writes
``train-NNNNN.bin/.idx`` and ``val-NNNNN.bin/.idx`` (a split with no documents writes nothing).
A document goes to ``val`` iff ``hash_fraction(val_seed, id) < val_fraction``, so the held-out set
depends on the document alone, not on sharding or order. Each shard's tokens are held in memory
until written (about 2-4 bytes per token: memory is bounded by the document shard size).

Lineage (issue 42): beside each token shard, ``<split>-NNNNN.docs.parquet`` has one row per document in
token order (``LINEAGE_COLUMNS``): where it came from (documents dataset, shard, row), where it starts in the
token shard and how many tokens and text bytes it has, and what ingest and dedup knew of it (URL, source,
language and its score, classifier score, ``meta``: WARC file and offset, repository and path, ...). With the
loader's order (tasks/train/data.py) any trained token maps back to its document (tasks/trace).
"""

from __future__ import annotations

import functools
import logging

import numpy as np
from tokenizers import Tokenizer

from tasks import contract, storage
from tasks.checksums import file_checksum
from tasks.counters import Stats
from tasks.parallel import MapFn, serial_map
from tasks.tokenize.config import SpecialTokens, TokenizeConfig
from tasks.tokenize.shards import document_shards, iter_document_batches, join_documents
from tasks.tokenize.tokenizer import hash_fraction, special_ids
from tasks.tokenizer_files import TOKENIZER_FILE, load_tokenizer, tokenizer_json_url
from tasks.token_shards import lineage_name, token_dtype, write_token_shard

log = logging.getLogger(__name__)

STAGE = "tokenize"
SPLITS = ("train", "val")


@functools.lru_cache(maxsize=2)
def _tokenizer(url: str, sha256: str) -> Tokenizer:
    """One parsed tokenizer per worker process and file content (a 128k vocabulary parses slowly)."""
    return load_tokenizer(url)


# Columns of a documents shard copied into the lineage (``text`` is read but not copied).
CARRIED = ("id", "url", "source", "lang", "lang_score", "quality_score", "meta")
LINEAGE_COLUMNS = (*CARRIED, "documents", "shard", "row", "token_start", "tokens", "text_bytes")


class _SplitBuffer:
    """Token arrays of one split of one shard, and their documents' lineage rows, joined when written."""

    def __init__(self) -> None:
        self.tokens: list[np.ndarray] = []
        self.starts: list[np.ndarray] = []
        self.length = 0
        self.lineage: dict[str, list] = {name: [] for name in LINEAGE_COLUMNS}

    def append(self, tokens: np.ndarray, starts: np.ndarray) -> None:
        self.tokens.append(tokens)
        self.starts.append(starts + self.length)
        self.lineage["token_start"].extend((starts + self.length).tolist())
        self.lineage["tokens"].extend(np.diff(np.append(starts, len(tokens))).tolist())
        self.length += len(tokens)

    def write_lineage(self, f) -> int:
        import pyarrow as pa
        import pyarrow.parquet as pq

        types = {"lang_score": pa.float32(), "quality_score": pa.float32(), "row": pa.int64(),
                 "token_start": pa.int64(), "tokens": pa.int64(), "text_bytes": pa.int64()}
        table = pa.table({name: pa.array(values, types.get(name, pa.string())) for name, values in self.lineage.items()})
        pq.write_table(table, f, compression="zstd", use_dictionary=["documents", "shard", "source", "lang"])
        return 0  # a shard's rows count tokens (tasks/token_shards.py): the lineage adds none

    def joined(self) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate(self.tokens), np.concatenate(self.starts)


def tokenize_shard(item: tuple[int, str, contract.ShardInfo, str], output_url: str, cfg: TokenizeConfig,
                   ids: dict[str, int | None], tokenizer_sha256: str) -> contract.ShardResult:
    """Encode document shard ``item = (n, url, shard info, documents fingerprint)`` into the train/val token
    shards numbered ``n``; ``ids`` are the special tokens' (``special_ids``). The lineage names the documents
    dataset by fingerprint, not URL, so a moved dataset writes the same bytes (the tokens manifest's
    lineage inputs map it to a URL).

    Stats: ``in``, ``out`` (documents encoded), ``docs.<split>``, ``tokens.<split>``, ``bytes.text``,
    ``dropped.empty_text``.
    """
    number, url, shard, documents_fp = item
    tokenizer = _tokenizer(storage.join(output_url, TOKENIZER_FILE), tokenizer_sha256)
    bos_id = ids["bos_id"] if cfg.add_bos else None
    dtype = token_dtype(tokenizer.get_vocab_size(with_added_tokens=True))
    stats = Stats()
    buffers = {split: _SplitBuffer() for split in SPLITS}
    row = 0
    for batch in iter_document_batches(url, shard, ["text", *CARRIED], cfg.batch_docs):
        texts: dict[str, list[str]] = {split: [] for split in SPLITS}
        carried = {name: batch.column(name).to_pylist() for name in CARRIED}
        for i, text in enumerate(batch.column("text").to_pylist()):
            row += 1
            stats.add("in")
            if not text:
                stats.add("dropped.empty_text")
                continue
            key = carried["id"][i] or text  # a document without an id is placed by its content
            split = "val" if hash_fraction(cfg.val_seed, key) < cfg.val_fraction else "train"
            texts[split].append(text)
            lineage = buffers[split].lineage
            for name in CARRIED:
                lineage[name].append(carried[name][i])
            lineage["documents"].append(documents_fp)
            lineage["shard"].append(shard.name)
            lineage["row"].append(row - 1)
            lineage["text_bytes"].append(len(text.encode("utf-8")))
        everything = texts["train"] + texts["val"]  # one call keeps all encoder threads busy
        encoded = [e.ids for e in tokenizer.encode_batch_fast(everything, add_special_tokens=False)]
        stats.add("bytes.text", sum(len(t.encode("utf-8")) for t in everything))
        cut = len(texts["train"])
        for split, part in (("train", encoded[:cut]), ("val", encoded[cut:])):
            if part:
                buffers[split].append(*join_documents(part, ids["eos_id"], bos_id, dtype))
                stats.add(f"docs.{split}", len(part))
                stats.add("out", len(part))
    shards = []
    for split, buffer in buffers.items():
        if buffer.tokens:
            tokens, starts = buffer.joined()
            stats.add(f"tokens.{split}", len(tokens))
            shards += write_token_shard(output_url, f"{split}-{number:05d}", split, tokens, starts)
            shards.append(contract.write_shard(output_url, lineage_name(f"{split}-{number:05d}.bin"),
                                               buffer.write_lineage, split=split, docs=len(starts)))
    return contract.ShardResult(shards, stats)


def _run_item(item: tuple[int, str, contract.ShardInfo, str], output_url: str, cfg: TokenizeConfig,
              ids: dict[str, int | None], tokenizer_sha256: str) -> contract.ShardResult:
    work = functools.partial(tokenize_shard, item, output_url, cfg, ids, tokenizer_sha256)
    return contract.run_shard(output_url, f"docs-{item[0]:05d}", work)


def _copy_tokenizer(tokenizer_url: str, output_url: str) -> str:
    """Store the tokenizer inside the tokens dataset (train and eval decode from it alone); its checksum."""
    source = tokenizer_json_url(tokenizer_url)
    load_tokenizer(source)  # a clear error now beats one per worker later
    fs, path = storage.filesystem(source)
    blob = fs.cat_file(path)
    with storage.atomic_write(storage.join(output_url, TOKENIZER_FILE)) as f:
        f.write(blob)
    out_fs, out_path = storage.filesystem(storage.join(output_url, TOKENIZER_FILE))
    return file_checksum(out_fs, out_path)


def run_tokenize(
    inputs: list[contract.Manifest],
    tokenizer_url: str,
    output_url: str,
    cfg: TokenizeConfig,
    *,
    special: SpecialTokens = SpecialTokens(),
    fingerprint: str,
    map_fn: MapFn = serial_map,
) -> contract.Manifest:
    """Encode every document shard of ``inputs`` with the tokenizer at ``tokenizer_url``, whose
    special tokens are named by ``special`` (the ``[tokenizer]`` section's names).

    Writes a ``tokens`` dataset (format in ``tasks/contract.py``) with ``tokenizer.json`` inside;
    manifest meta: dtype, vocab_size, eos_id, bos_id, pad_id, tokenizer_checksum, val_fraction.
    """
    tokenizer_sha256 = _copy_tokenizer(tokenizer_url, output_url)
    tokenizer = load_tokenizer(storage.join(output_url, TOKENIZER_FILE))
    ids = special_ids(tokenizer, special)
    if cfg.add_bos and ids["bos_id"] is None:
        raise ValueError(f"tokenize.add_bos is set but the tokenizer has no {special.bos_token!r} token")
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    items = [(n, contract.shard_url(m, s), s, m.fingerprint) for n, (m, s) in enumerate(document_shards(inputs))]
    work = functools.partial(_run_item, output_url=output_url, cfg=cfg, ids=ids, tokenizer_sha256=tokenizer_sha256)
    results = map_fn(work, items, label="tokenize")
    stats = sum((r.stats for r in results), Stats())
    stats.add("shards.in", len(items))
    shards = [s for r in results for s in r.shards]
    log.info("tokenized %d documents into %d train and %d val tokens", stats.get("in", 0),
             stats.get("tokens.train", 0), stats.get("tokens.val", 0))
    meta = {
        "dtype": token_dtype(vocab_size).name,
        "vocab_size": vocab_size,
        **ids,
        "tokenizer_checksum": tokenizer_sha256,
        "val_fraction": cfg.val_fraction,
    }
    return contract.commit(output_url, "tokens", fingerprint, shards, stats,
                           inputs=[*inputs, tokenizer_url], config=cfg, meta=meta)
