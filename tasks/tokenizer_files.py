"""A tokenizer's files: loading the ``tokenizer.json`` of a tokenizer or tokens dataset (verified),
and the Hugging Face tokenizer files an export carries.

Shared core: tokenize loads what it trained, eval decodes held-out text, export writes the files
transformers loads. Special tokens are control ids, never text (``tasks/tokenize/tokenizer.py``
says why): ``load_tokenizer`` sets ``encode_special_tokens`` and ``hf_tokenizer_files`` sets
``split_special_tokens``, so every reader encodes a text alike. Training one is the tokenize stage's.
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer, processors

from tasks import contract, storage
from tasks.checksums import bytes_checksum

TOKENIZER_FILE = "tokenizer.json"


def tokenizer_json_url(url: str) -> str:
    """The ``tokenizer.json`` URL for a tokenizer or tokens dataset URL, or a ``.json`` URL itself."""
    url = storage.normalize_url(url)
    if url.endswith(".json"):
        return url
    manifest = contract.open_dataset(url)
    if manifest.kind not in ("tokenizer", "tokens"):
        raise contract.DatasetError(f"dataset at {url} holds {manifest.kind!r}, not a tokenizer or tokens dataset")
    return storage.join(url, TOKENIZER_FILE)


def load_tokenizer(url: str) -> Tokenizer:
    """The tokenizer at a tokenizer (or tokens) dataset URL or at any ``tokenizer.json`` URL."""
    json_url = tokenizer_json_url(url)
    fs, path = storage.filesystem(json_url)
    if not fs.exists(path):
        raise contract.DatasetError(
            f"no tokenizer at {json_url}; train one (`smelt tokenizer train`) or pass a tokenizer.json URL"
        )
    blob = fs.cat_file(path)
    if json_url != storage.normalize_url(url):  # inside a dataset: verified like any shard
        manifest = contract.open_dataset(url)
        listed = {s.name: s.checksum for s in manifest.shards}.get(TOKENIZER_FILE)
        expected = listed or manifest.meta.get("tokenizer_checksum")
        if expected and bytes_checksum(blob, expected) != expected:
            raise contract.DatasetError(f"{json_url} does not match the checksum its dataset records: "
                                        "the dataset is corrupt; re-run the stage that wrote it")
    try:
        tokenizer = Tokenizer.from_str(blob.decode("utf-8"))
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise contract.DatasetError(f"{json_url} is not a valid tokenizer.json: {e}") from e
    tokenizer.encode_special_tokens = True
    return tokenizer


def hf_tokenizer_files(tokenizer_json: str, *, bos_id: int | None, eos_id: int, pad_id: int | None,
                       add_bos: bool, max_length: int) -> dict[str, bytes]:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` for transformers.

    The roles (bos/eos/pad) come from the tokens dataset's ids. ``split_special_tokens`` keeps
    special-token strings in text as text, as ``load_tokenizer`` does; a BOS-prefixed corpus
    (``add_bos``) gets a post-processor that prepends BOS, so ``tokenizer(text)`` matches training.
    """
    tokenizer = Tokenizer.from_str(tokenizer_json)
    roles = {role: tokenizer.id_to_token(i) for role, i in (("bos_token", bos_id), ("eos_token", eos_id),
                                                             ("pad_token", pad_id)) if i is not None}
    if add_bos and bos_id is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{roles['bos_token']} $A", pair=f"{roles['bos_token']} $A $B",
            special_tokens=[(roles["bos_token"], bos_id)])
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **roles,
        "split_special_tokens": True,
        "add_bos_token": bool(add_bos),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    return {
        TOKENIZER_FILE: tokenizer.to_str().encode("utf-8"),
        "tokenizer_config.json": json.dumps(config, indent=2).encode(),
        "special_tokens_map.json": json.dumps(roles, indent=2).encode(),
    }
