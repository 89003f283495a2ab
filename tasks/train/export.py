"""Export a committed checkpoint as a Hugging Face Llama folder that transformers and vLLM load.

The export is a dataset (kind ``model``) at the output URL, written shard by shard and
``manifest.json`` last:

- ``model.safetensors`` (or ``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``
  above ``max_shard_bytes``, 5 GB by default) under transformers' tensor names and RoPE layout
  (``tasks/train/hf.py``); tied embeddings are written once;
- ``config.json`` (``LlamaForCausalLM``) and ``generation_config.json``;
- ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json`` from the run's tokens
  dataset (``tasks/tokenizer_files.py`` writes them; ``tasks/tokenize/tokenizer.py`` says what special
  tokens mean);
- ``smelt_meta.json``: smelt's own record (run, step, tokens, checkpoint, data lineage, model shape).

The weights stream from the DCP checkpoint one output shard at a time (only the model's keys,
never the optimizer state), so memory is one shard, not the model. Reading it back needs neither
torch.distributed nor pickle.

    python -m tasks.train.export --checkpoint <run_dir or step URL> --output <URL> [--dtype bf16|fp32]
        [--max-shard-size 5GB]
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import struct
import sys
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from tasks import checkpoint_reader, contract, storage
from tasks.model_config import ModelConfig
from tasks.train import hf

log = logging.getLogger(__name__)

KIND = "model"
META = hf.SMELT_META
FORMAT = "smelt-hf-llama-1"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_SHARD_BYTES = 5 * 10**9


def _plan_shards(entries: dict[str, TensorStorageMetadata], names: list[str], dtype: torch.dtype | None,
                 max_bytes: int) -> list[list[str]]:
    """Consecutive groups of tensors (transformers' order), each at most ``max_bytes`` unless one
    tensor alone is larger."""
    groups: list[list[str]] = [[]]
    size = 0
    for name in names:
        md = entries[name]
        nbytes = md.size.numel() * (dtype or md.properties.dtype).itemsize
        if groups[-1] and size + nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def _shard_file(i: int, n: int) -> str:
    return hf.SINGLE_FILE if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _tokens_dataset(meta: dict) -> contract.Manifest | None:
    """The run's (first) tokens dataset, whose tokenizer and special ids the export carries."""
    data = meta.get("data") or {}
    for url in data.values():
        return contract.open_dataset(url, kind="tokens")
    return None


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, indent=2, sort_keys=True).encode()


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def _write_safetensors(f, tensors: dict[str, torch.Tensor]) -> int:
    """The safetensors format (8-byte header length, JSON header, raw little-endian bytes) written
    tensor by tensor: ``safetensors.torch.save`` would first build the whole file in memory."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as the library writes it
    f.write(struct.pack("<Q", len(blob)) + blob)
    for tensor in tensors.values():
        f.write(memoryview(tensor.contiguous().flatten().view(torch.uint8).numpy()))
    return len(tensors)


def _write_file(f, blob: bytes, rows: int = 1) -> int:
    f.write(blob)
    return rows


def export_checkpoint(checkpoint_url: str, output_url: str, *, dtype: str | None = None,
                      max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> contract.Manifest:
    """Write the Hugging Face folder (manifest last) for a checkpoint; returns the manifest."""
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"export dtype {dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
    if max_shard_bytes <= 0:
        raise ValueError("the export's max shard size must be positive")
    out_dtype = DTYPES[dtype] if dtype else None
    step_url = checkpoint_reader.resolve(checkpoint_url)
    meta, prefix, entries = checkpoint_reader.model_entries(step_url)
    if not isinstance(meta.get("model"), dict):
        raise contract.DatasetError(f"checkpoint {step_url} has no model config ('model') in its manifest meta; "
                                    "the trainer must save meta={'model': dataclasses.asdict(model_cfg), ...}")
    model_cfg = ModelConfig(**meta["model"])
    for name in entries:
        try:
            hf.hf_name(name)
        except ValueError as e:
            raise contract.DatasetError(f"checkpoint {step_url} is not a smelt Llama model: {e}") from None
    names = sorted((n for n in entries if not (model_cfg.tie_embeddings and n == "output.weight")), key=hf.hf_order)
    saved = {entries[n].properties.dtype for n in names}
    final_dtype = out_dtype or (saved.pop() if len(saved) == 1 else torch.float32)
    groups = _plan_shards(entries, names, final_dtype, max_shard_bytes)
    output_url = storage.normalize_url(output_url)

    shards, weight_map, total = [], {}, 0
    for i, group in enumerate(groups):
        file = _shard_file(i, len(groups))
        part = {prefix + n: torch.empty(entries[n].size, dtype=entries[n].properties.dtype) for n in group}
        checkpoint_reader.load_state(part, step_url)
        tensors = {}
        for n in group:
            key, value = hf.to_hf(n, part.pop(prefix + n).to(final_dtype), model_cfg.head_dim)
            tensors[key] = value
            weight_map[key] = file
            total += value.numel() * value.element_size()
        shards.append(contract.write_shard(output_url, file, functools.partial(_write_safetensors, tensors=tensors)))
        del tensors
        log.info("export: wrote %s (%d tensors)", file, len(group))
    if len(groups) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        shards.append(contract.write_shard(output_url, hf.INDEX, functools.partial(_write_file, blob=_json_bytes(index))))

    tokens = _tokens_dataset(meta)
    ids = {k: (tokens.meta.get(k) if tokens else None) for k in ("bos_id", "eos_id", "pad_id")}
    files = {
        hf.CONFIG: _json_bytes(hf.hf_config(model_cfg, dtype=final_dtype, **ids)),
        hf.GENERATION_CONFIG: _json_bytes(hf.generation_config(**ids)),
    }
    from tasks.tokenizer_files import TOKENIZER_FILE, hf_tokenizer_files

    fs, path = storage.filesystem(storage.join(tokens.meta["url"], TOKENIZER_FILE)) if tokens else (None, None)
    if tokens is not None and fs.exists(path):
        add_bos = bool((tokens.lineage.get("config") or {}).get("add_bos", False))
        files.update(hf_tokenizer_files(fs.cat_file(path).decode("utf-8"), add_bos=add_bos,
                                        max_length=model_cfg.max_seq_len, **ids))
    else:
        log.warning("export: checkpoint %s names no tokens dataset with a tokenizer; the export has none", step_url)
    params = sum(entries[n].size.numel() for n in names)
    smelt_meta = {
        "format": FORMAT, "model": meta["model"], "step": meta.get("step"), "tokens": meta.get("tokens"),
        "dtype": hf.TORCH_DTYPES[final_dtype], "params": params, "checkpoint": step_url,
        "run": checkpoint_reader.run_dir_of(step_url),
        "config_fingerprint": meta.get("config_fingerprint"), "data": meta.get("data"),
        "tokens_dataset": tokens.meta["url"] if tokens else None,
        "tokens_fingerprint": tokens.fingerprint if tokens else None,
    }
    files[META] = _json_bytes(smelt_meta)
    for name, blob in files.items():
        shards.append(contract.write_shard(output_url, name, functools.partial(_write_file, blob=blob)))
    inputs = [str(meta.get("config_fingerprint")), str(meta.get("step")), step_url]
    fp = contract.fingerprint("export", {"dtype": hf.TORCH_DTYPES[final_dtype], "max_shard_bytes": max_shard_bytes},
                              inputs, contract.code_version("tasks.train.export", "tasks.train.hf"))
    manifest = contract.commit(output_url, KIND, fp, shards, {"params": params, "tensors": len(names),
                                                             "weight_files": len(groups)},
                               inputs=[step_url] + ([tokens] if tokens else []),
                               meta={"step": meta.get("step"), "tokens": meta.get("tokens"), "checkpoint": step_url,
                                     "format": FORMAT})
    log.info("exported %s (%d params, %d weight files) to %s", step_url, params, len(groups), output_url)
    return manifest


def load_exported(url: str, *, verify: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(weights under smelt's names and layout, smelt_meta)`` of an export; no torch.distributed,
    no unpickling."""
    manifest = contract.open_dataset(url, kind=KIND)
    if verify and (bad := contract.verify(manifest)):
        raise contract.DatasetError(f"export at {manifest.meta['url']} is corrupt: {', '.join(bad)} "
                                    "fail their checksums; export it again")
    folder = hf.local_folder(manifest.meta["url"])
    return hf.HFWeights(folder).state_dict(), json.loads((folder / META).read_text())


def parse_size(text: str) -> int:
    """``5GB``, ``500MB``, ``2KiB`` or plain bytes → bytes (decimal units, like transformers)."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.strip().upper()
    number = t.rstrip("KMGIB")
    try:
        return int(float(number) * units[t[len(number):]])
    except (KeyError, ValueError):
        raise ValueError(f"{text!r} is not a size; write e.g. 5GB, 500MB or a number of bytes") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export a smelt checkpoint as a Hugging Face Llama folder.")
    parser.add_argument("--checkpoint", required=True,
                        help="step-NNNNNNNN URL, or a run directory (its newest good checkpoint)")
    parser.add_argument("--output", required=True, help="output folder URL")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="cast floating weights (default: as saved)")
    parser.add_argument("--max-shard-size", default="5GB", help="split the weights into files of at most this size")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        manifest = export_checkpoint(args.checkpoint, args.output, dtype=args.dtype,
                                     max_shard_bytes=parse_size(args.max_shard_size))
    except (ValueError, contract.DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"output": manifest.meta["url"], "step": manifest.meta["step"],
                      "params": manifest.stats["params"], "weight_files": manifest.stats["weight_files"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
