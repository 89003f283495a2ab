"""Train a byte-level BPE tokenizer on a sample of documents (loading one: ``tasks/tokenizer_files.py``).

Byte-level BPE (ByteLevel pre-tokenizer and decoder, the 256 byte symbols as the initial alphabet,
no normalizer) encodes any text and decodes it back byte for byte. The special tokens BOS, EOS
and PAD get ids 0, 1, 2 in a tokenizer trained here.

Special tokens are control ids, never text: a document that contains the literal string ``<|eos|>``
is encoded as the bytes of that string, and only the tokenize stage inserts EOS (and BOS) ids.
``load_tokenizer`` (tokenize, eval) sets ``encode_special_tokens`` for that, and the Hugging Face
tokenizer files of an export (``hf_tokenizer_files``) say the same to transformers
(``split_special_tokens``), so training, eval and the exported tokenizer encode every text alike;
both live in the shared core (``tasks/tokenizer_files.py``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tasks import contract
from tasks.counters import Stats
from tasks.tokenize.config import SpecialTokens, TokenizerConfig
from tasks.tokenize.shards import document_shards, iter_row_groups
from tasks.tokenizer_files import TOKENIZER_FILE

log = logging.getLogger(__name__)

TOKENIZER_STAGE = "tokenizer"  # the stage name under which flows fingerprint train_tokenizer


def hash_fraction(seed: int, key: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, key): the basis of every by-document choice."""
    digest = hashlib.blake2b(f"{seed}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def special_ids(tokenizer: Tokenizer, cfg: SpecialTokens) -> dict[str, int | None]:
    """``bos_id``, ``eos_id``, ``pad_id`` of the configured special tokens; EOS must exist."""
    ids = {
        "bos_id": tokenizer.token_to_id(cfg.bos_token),
        "eos_id": tokenizer.token_to_id(cfg.eos_token),
        "pad_id": tokenizer.token_to_id(cfg.pad_token),
    }
    if ids["eos_id"] is None:
        raise ValueError(
            f"the tokenizer has no {cfg.eos_token!r} token; set tokenizer.eos_token to its end-of-document token"
        )
    return ids


def sample_texts(inputs: list[contract.Manifest], cfg: TokenizerConfig, stats: Stats) -> Iterator[list[str]]:
    """Batches of a seeded sample of about ``cfg.sample_docs`` documents spread over every shard.

    A document is picked iff ``hash_fraction(sample_seed, id) < sample_docs / total_docs``, so the
    sample is the same on every run and draws from the whole corpus. Row groups are streamed and
    their text is read only when one of their ids is picked.
    """
    total = sum(m.rows for m in inputs)
    rate = cfg.sample_docs / max(total, 1)
    taken = 0
    for manifest, shard in document_shards(inputs):
        for parquet, group in iter_row_groups(contract.shard_url(manifest, shard), shard):
            ids = parquet.read_row_group(group, columns=["id"]).column("id").to_pylist()
            keys = [doc_id or f"{shard.name}/{group}/{i}" for i, doc_id in enumerate(ids)]  # no id: its position
            picked = [i for i, key in enumerate(keys) if hash_fraction(cfg.sample_seed, key) < rate]
            if not picked:
                continue
            texts = parquet.read_row_group(group, columns=["text"]).column("text").take(picked).to_pylist()
            batch = []
            for text in texts:
                if not text:
                    stats.add("dropped.empty_text")
                    continue
                batch.append(text)
                stats.add("bytes.sampled", len(text.encode("utf-8")))
            batch = batch[: cfg.sample_docs - taken]
            taken += len(batch)
            stats.add("out", len(batch))
            yield batch
            if taken >= cfg.sample_docs:
                return


def build_tokenizer(cfg: TokenizerConfig, batches: Iterator[list[str]]) -> Tokenizer:
    """Train byte-level BPE on ``batches`` of texts (held in memory only as word counts)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=[cfg.bos_token, cfg.eos_token, cfg.pad_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(batches, trainer)
    return tokenizer


def train_tokenizer(inputs: list[contract.Manifest], output_url: str, cfg: TokenizerConfig, *, fingerprint: str) -> contract.Manifest:
    """Train on a sample of the documents datasets ``inputs``; write a ``tokenizer`` dataset.

    Output: ``tokenizer.json`` (one shard, rows = vocabulary size). Stats: ``out`` (documents trained on),
    ``bytes.sampled``, ``dropped.empty_text``. Meta: vocab_size, bos_id, eos_id, pad_id.
    """
    stats = Stats()
    tokenizer = build_tokenizer(cfg, sample_texts(inputs, cfg, stats))
    if not stats.get("out"):
        raise contract.DatasetError("no non-empty documents to train the tokenizer on; check the input datasets")
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def write(f) -> int:
        f.write(tokenizer.to_str().encode("utf-8"))
        return vocab_size

    shard = contract.write_shard(output_url, TOKENIZER_FILE, write)
    log.info("trained a %d-token tokenizer on %d documents", vocab_size, stats["out"])
    meta = {"vocab_size": vocab_size, **special_ids(tokenizer, cfg)}
    return contract.commit(output_url, "tokenizer", fingerprint, [shard], stats, inputs=list(inputs), config=cfg, meta=meta)
