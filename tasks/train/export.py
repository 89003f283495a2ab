"""Export a committed checkpoint as one consolidated safetensors file plus a config JSON.

The export is a dataset (kind ``model``) at the output URL: ``model.safetensors`` (the model's full,
unsharded weights under their plain FQNs), ``config.json`` (model shape and where the weights came
from) and ``manifest.json`` written last. Reading it (``load_exported``) needs neither
torch.distributed nor pickle: safetensors is a flat header plus raw bytes.

Only the model's weights are read from the checkpoint (not the optimizer state), by allocating
full-size tensors for the keys under the manifest's ``model_prefix`` and letting DCP fill them in
one process; memory is the model's full size.

    python -m tasks.train.export --checkpoint <run_dir or step URL> --output <URL> [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from tasks import datasets
from tasks.train import checkpoint

log = logging.getLogger(__name__)

KIND = "model"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
FORMAT = "smelt-safetensors-1"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_checkpoint(url: str) -> str:
    """A step URL from a step URL, a finished run (its final checkpoint) or a run directory (newest good one)."""
    url = datasets.normalize_url(url)
    manifest = datasets.read_manifest(url)
    if manifest is not None and manifest.kind == "checkpoint":
        return url
    if manifest is not None and manifest.kind == "model" and "checkpoint" in manifest.meta:
        return manifest.meta["checkpoint"]
    committed = checkpoint.list_committed(url)
    if not committed:
        raise datasets.DatasetError(f"{url} is neither a committed checkpoint nor a run directory with one; "
                                    "pass a step-NNNNNNNN URL or the run directory")
    return committed[-1]["url"]


def load_consolidated(step_url: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Full (unsharded) model weights of a verified checkpoint under the model's own FQNs, and its manifest meta.

    One process, no process group; the model config the trainer saved is ``meta["model"]``.
    """
    step_url = datasets.normalize_url(step_url)
    problems = checkpoint.verify_checkpoint(step_url)
    if problems:
        raise datasets.DatasetError(f"checkpoint {step_url} cannot be exported: {'; '.join(problems)}")
    manifest = datasets.read_manifest(step_url)
    prefix = manifest.meta.get("model_prefix")
    if not prefix:
        raise datasets.DatasetError(f"checkpoint {step_url} does not record where the model weights are "
                                    "(meta 'model_prefix'); save it under app_state['model'] or pass meta model_prefix")
    reader = checkpoint.storage_reader(step_url)
    entries = reader.read_metadata().state_dict_metadata
    weights = {key: torch.empty(md.size, dtype=md.properties.dtype)
               for key, md in entries.items() if key.startswith(prefix) and isinstance(md, TensorStorageMetadata)}
    if not weights:
        raise datasets.DatasetError(f"checkpoint {step_url} holds no tensors under {prefix!r}")
    dcp.load(weights, storage_reader=checkpoint.storage_reader(step_url), no_dist=True)
    return {key[len(prefix):]: tensor for key, tensor in weights.items()}, manifest.meta


def export_checkpoint(checkpoint_url: str, output_url: str, *, dtype: str | None = None) -> datasets.Manifest:
    """Write ``model.safetensors`` + ``config.json`` (+ manifest last) for a checkpoint; returns the manifest."""
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"export dtype {dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
    step_url = resolve_checkpoint(checkpoint_url)
    weights, meta = load_consolidated(step_url)
    model_config = meta.get("model")
    if not isinstance(model_config, dict):
        raise datasets.DatasetError(f"checkpoint {step_url} has no model config ('model') in its manifest meta; "
                                    "the trainer must save meta={'model': dataclasses.asdict(model_cfg), ...}")
    if dtype is not None:
        weights = {k: v.to(DTYPES[dtype]) if v.is_floating_point() else v for k, v in weights.items()}
    params = sum(t.numel() for t in weights.values())
    config = {
        "format": FORMAT,
        "model": model_config,
        "step": meta.get("step"),
        "tokens": meta.get("tokens"),
        "dtype": dtype or _dtype_name(weights),
        "params": params,
        "checkpoint": step_url,
        "config_fingerprint": meta.get("config_fingerprint"),
    }
    header = {"format": "pt", "smelt_step": str(config["step"]), "smelt_checkpoint": step_url}
    output_url = datasets.normalize_url(output_url)
    weights_blob = safetensors.torch.save(weights, header)
    config_blob = json.dumps(config, indent=2, sort_keys=True).encode()

    def write_weights(f) -> int:
        f.write(weights_blob)
        return len(weights)

    def write_config(f) -> int:
        f.write(config_blob)
        return 1

    shards = [datasets.write_shard(output_url, WEIGHTS, write_weights),
              datasets.write_shard(output_url, CONFIG, write_config)]
    inputs = [str(config["config_fingerprint"]), str(config["step"]), step_url]
    fp = datasets.fingerprint("export", {"dtype": dtype}, inputs, datasets.code_version("tasks.train.export"))
    manifest = datasets.commit(output_url, KIND, fp, shards, {"params": params, "tensors": len(weights)},
                               inputs=[step_url], meta={"step": config["step"], "tokens": config["tokens"],
                                                        "checkpoint": step_url})
    log.info("exported %s (%d params) to %s", step_url, params, output_url)
    return manifest


def load_exported(url: str, *, verify: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(weights, config)`` of an export; no torch.distributed and no unpickling involved."""
    manifest = datasets.open_dataset(url, kind=KIND)
    if verify and (bad := datasets.verify(manifest)):
        raise datasets.DatasetError(f"export at {manifest.meta['url']} is corrupt: {', '.join(bad)} "
                                    "fail their checksums; export it again")
    fs, path = datasets.filesystem(datasets.shard_url(manifest, WEIGHTS))
    weights = safetensors.torch.load(fs.cat_file(path))
    fs, path = datasets.filesystem(datasets.shard_url(manifest, CONFIG))
    return weights, json.loads(fs.cat_file(path))


def _dtype_name(weights: dict[str, torch.Tensor]) -> str:
    names = {str(t.dtype).removeprefix("torch.") for t in weights.values()}
    return names.pop() if len(names) == 1 else "mixed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export a smelt checkpoint to safetensors + config JSON.")
    parser.add_argument("--checkpoint", required=True,
                        help="step-NNNNNNNN URL, or a run directory (its newest good checkpoint)")
    parser.add_argument("--output", required=True, help="output folder URL")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="cast floating weights (default: as saved)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        manifest = export_checkpoint(args.checkpoint, args.output, dtype=args.dtype)
    except (ValueError, datasets.DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"output": manifest.meta["url"], "step": manifest.meta["step"],
                      "params": manifest.stats["params"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
