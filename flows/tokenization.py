"""Tokenize flow: documents → a trained BPE tokenizer → token shards with a validation split."""

from __future__ import annotations

import dataclasses

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import (fails_in_one_sentence, one_sentence_failures, planned_output, retry_options, reuse_or_run,
                          run_on_dask)
from tasks import contract, storage
from tasks.config import from_dict
from tasks.objectstore import preflight_all
from tasks.tokenize.config import SpecialTokens, TokenizeConfig, TokenizerConfig
from tasks.tokenize.stage import STAGE, run_tokenize
from tasks.tokenize.tokenizer import TOKENIZER_STAGE, train_tokenizer


def tokenizer_output(input_fps: list[str], root: str, cfg: TokenizerConfig) -> tuple[str, str]:
    return planned_output(root, TOKENIZER_STAGE, cfg, input_fps, "tasks.tokenize")


def tokens_output(input_fps: list[str], tokenizer_fp: str, root: str, cfg: TokenizeConfig,
                  special: SpecialTokens) -> tuple[str, str]:
    """Encoding's fingerprint: its own section and the special tokens' names it looks up."""
    config = {"tokenize": dataclasses.asdict(cfg), "special": dataclasses.asdict(special)}
    return planned_output(root, STAGE, config, [*input_fps, tokenizer_fp], "tasks.tokenize")


@task(name="train-tokenizer", cache_policy=NO_CACHE, **retry_options(1, delay_s=0))
@one_sentence_failures(TOKENIZER_STAGE)
def tokenizer_task(inputs: list[str], root: str, config: dict, output: str | None = None) -> dict:
    """Train (or reuse) a byte-level BPE tokenizer on documents datasets (``config``: ``[tokenizer]``)."""
    cfg = from_dict(TokenizerConfig, config)
    manifests = [contract.open_dataset(u, kind="documents") for u in inputs]
    url, fp = tokenizer_output([m.fingerprint for m in manifests], root, cfg)
    url = storage.normalize_url(output) if output else url
    return reuse_or_run(TOKENIZER_STAGE, url, fp,
                        lambda: train_tokenizer(manifests, url, cfg, fingerprint=fp)).to_dict()


@task(name="tokenize", cache_policy=NO_CACHE, **retry_options(1))
@one_sentence_failures(STAGE)
def tokenize_task(inputs: list[str], tokenizer_url: str, root: str, config: dict,
                  dask_address: str | None = None, output: str | None = None,
                  tokenizer_config: dict | None = None) -> dict:
    """Encode documents into token shards (or reuse them); returns a StageOutcome dict.

    ``config`` is ``[tokenize]``; of ``[tokenizer]`` (``tokenizer_config``) only the special tokens' names count."""
    cfg = from_dict(TokenizeConfig, config)
    special = from_dict(TokenizerConfig, tokenizer_config or {}).special()
    manifests = [contract.open_dataset(u, kind="documents") for u in inputs]
    tokenizer = contract.read_manifest(tokenizer_url)
    tokenizer_fp = tokenizer.fingerprint if tokenizer else contract.raw_input_fingerprints([tokenizer_url])[0]
    url, fp = tokens_output([m.fingerprint for m in manifests], tokenizer_fp, root, cfg, special)
    url = storage.normalize_url(output) if output else url
    return run_on_dask(STAGE, url, fp, dask_address,
                       lambda map_fn: run_tokenize(manifests, tokenizer_url, url, cfg, special=special,
                                                    fingerprint=fp, map_fn=map_fn))


@flow(name="tokenize")
@fails_in_one_sentence
def tokenize_flow(inputs: list[str], root: str = "smelt-data", config: dict | None = None,
                  tokenizer: str | None = None, dask_address: str | None = None, output: str | None = None,
                  tokenizer_config: dict | None = None) -> dict:
    """Train a tokenizer (unless one is given as a tokenizer dataset or tokenizer.json URL), then encode.

    ``config`` is ``[tokenize]``, ``tokenizer_config`` is ``[tokenizer]``."""
    preflight_all(inputs, root, tokenizer, output)
    tokenizer_config = tokenizer_config or {}
    tokenizer_url = tokenizer or tokenizer_task(inputs, root, tokenizer_config)["url"]
    return tokenize_task(inputs, tokenizer_url, root, config or {}, dask_address, output, tokenizer_config)


@flow(name="train-tokenizer")
@fails_in_one_sentence
def tokenizer_flow(inputs: list[str], root: str = "smelt-data", config: dict | None = None,
                   output: str | None = None) -> dict:
    """Train a byte-level BPE tokenizer on documents datasets."""
    preflight_all(inputs, root, output)
    return tokenizer_task(inputs, root, config or {}, output)
