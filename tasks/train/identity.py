"""A run's identity: what makes its checkpoints meaningful, and nothing else (docs/design.md §4).

Two launches are the same run, continuing in the same folder from its newest checkpoint, when they
train the same model shape from the same initial weights on the same data in the same order:

- the model's shape (the ModelConfig the data's vocabulary gives, or an ``init_from`` folder's);
- the initial weights: ``train.seed`` (the trainer materialises every parameter from it) and
  ``train.init_from`` (the Hugging Face folder a run starts from);
- the tokens datasets, by fingerprint (which covers their tokenizer and every stage before them);
- the batch contract: ``data.seq_len``, ``data.global_batch``, ``data.mixture`` and ``data.seed``
  (the order of the samples).

Everything else may change between launches of one run: the step budget, the optimizer and its
schedule, the layout and world size, micro-batching and prefetch, checkpoint, watchdog, loss-guard
and straggler settings, injected faults, and the code. The flow names the run folder
``<root>/train/<identity>/`` (flows/train.py), the trainer refuses to resume a checkpoint of another
identity (tasks/train/checkpoint_writer.py), and ``config_changes`` says what a continuing launch changed.

No torch import (the flow and the CLI compute identities), except that an ``init_from`` folder's shape
is read through tasks/train/hf.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tasks import contract, storage
from tasks.model_config import ModelConfig
from tasks.train.config import DataConfig, TrainConfig

STAGE = "train"


def config_fingerprint(model_cfg: ModelConfig, data: DataConfig, dataset_fingerprints: Mapping[str, str], *,
                       seed: int, init_from: str = "") -> str:
    """The run identity of a model shape, its data (name → tokens fingerprint), its batch contract and its
    initial weights (``seed``, ``init_from``). The one definition: the flow's run folder and the trainer's
    resume check both call it."""
    batch = {"seq_len": data.seq_len, "global_batch": data.global_batch, "seed": data.seed,
             "mixture": dict(sorted(data.mixture.items()))}
    weights = {"seed": seed, "init_from": storage.normalize_url(init_from) if init_from else ""}
    inputs = [f"{name}:{fp}" for name, fp in sorted(dataset_fingerprints.items())]
    return contract.fingerprint(STAGE, {"model": dataclasses.asdict(model_cfg), "data": batch, "init": weights},
                                inputs, "")


def run_identity(cfg: TrainConfig, manifests: Mapping[str, contract.Manifest]) -> str:
    """The identity of training ``cfg`` on the tokens datasets ``manifests`` (name → manifest): the model is
    the one the trainer builds for their vocabulary (``cfg.model_for_data``)."""
    vocab = max(int(m.meta["vocab_size"]) for m in manifests.values())
    return config_fingerprint(cfg.model_for_data(vocab), cfg.data, {n: m.fingerprint for n, m in manifests.items()},
                              seed=cfg.seed, init_from=cfg.init_from)


# -- what a continuing launch changed --------------------------------------------------------------------


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value and key != "mixture":  # a mixture is one value
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _complete(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """A train config dict with every default filled in; None when it no longer loads (a key this code does
    not know: a config written by other code)."""
    from tasks.config import from_dict

    try:
        return dataclasses.asdict(from_dict(TrainConfig, dict(config)))
    except (TypeError, ValueError):
        return None


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list]:
    """``{"dotted.key": [old, new]}`` for every train config value that differs, defaults filled in on both
    sides; when one side no longer loads, the two are compared as written (a key only one side has is
    ``None`` on the other)."""
    full_old, full_new = _complete(old), _complete(new)
    if full_old is None or full_new is None:
        full_old, full_new = dict(old), dict(new)
    before, after = _flat(full_old), _flat(full_new)
    return {key: [before.get(key), after.get(key)] for key in sorted(before.keys() | after.keys())
            if before.get(key) != after.get(key)}
