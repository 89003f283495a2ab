"""Export cost: a model preset built on meta, allocated and filled, saved as a DCP checkpoint, then exported
to a Hugging Face folder by ``python -m tasks.train.export`` in its own process, whose wall time and
peak RSS are measured. Prints one JSON line, with a linear extrapolation to the 70B preset.

    .venv/bin/python bench/export_hf.py [--preset 1b] [--dtype bf16] [--max-shard-size 1GB] [--dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from tasks.checkpoint_reader import step_url
from tasks.llama import Transformer
from tasks.model_config import preset
from tasks.train.checkpoint_writer import CheckpointManager
from tasks.train.config import CheckpointConfig
from tasks.train.export import DTYPES, parse_size


def child(step: str, output: str, dtype: str, max_shard_size: str) -> None:
    """The export alone, in a fresh process: its wall time, its peak RSS and the RSS of the imports alone."""
    from tasks.train.export import export_checkpoint

    base = _high_water_gib()
    start = time.perf_counter()
    export_checkpoint(step, output, dtype=dtype, max_shard_bytes=parse_size(max_shard_size))
    print(json.dumps({"export_s": round(time.perf_counter() - start, 1), "import_rss_gib": base,
                      "peak_rss_gib": _high_water_gib()}))


def _high_water_gib() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited from the parent across fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 2**20, 2)
    return float("nan")


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        return child(*sys.argv[2:6])
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="1b")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--max-shard-size", default="1GB")
    parser.add_argument("--dir", default=None, help="work folder (default: a temporary one, removed after)")
    args = parser.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="smelt-export-bench-"))
    try:
        cfg = preset(args.preset)
        start = time.perf_counter()
        with torch.device("meta"):
            model = Transformer(cfg)
        model.to(dtype=DTYPES[args.dtype]).to_empty(device="cpu")  # the checkpoint in the export's dtype: half the RAM
        with torch.no_grad():  # the values do not change what export costs; filling them is a memset
            for param in model.parameters():
                param.fill_(0.01)
        init_s = time.perf_counter() - start
        start = time.perf_counter()
        mgr = CheckpointManager(str(work / "run"), CheckpointConfig(async_mode="off"), rank=0, world_size=1,
                                config_fingerprint="bench")
        # The module itself as the app state: only the weights, without a consolidated copy of them.
        mgr.maybe_save(1, {"model": model}, {"model": dataclasses.asdict(cfg)}, force=True)
        mgr.close()
        save_s = time.perf_counter() - start
        del model
        proc = subprocess.run([sys.executable, __file__, "--child", step_url(str(work / "run"), 1), str(work / "export"),
                               args.dtype, args.max_shard_size], check=True, capture_output=True, text=True)
        measured = json.loads(proc.stdout.strip().splitlines()[-1])
        export_s, peak_rss_gib = measured["export_s"], measured["peak_rss_gib"]
        out_bytes = sum(p.stat().st_size for p in (work / "export").glob("*.safetensors"))
        params = cfg.num_params()
        big = preset("70b")
        scale = big.num_params() / params
        print(json.dumps({
            "preset": args.preset, "params": params, "dtype": args.dtype,
            "max_shard_bytes": parse_size(args.max_shard_size),
            "weight_files": len(list((work / "export").glob("*.safetensors"))), "export_bytes": out_bytes,
            "init_s": round(init_s, 1), "dcp_save_s": round(save_s, 1), "export_s": round(export_s, 1),
            "export_gb_per_s": round(out_bytes / 1e9 / export_s, 3), "export_peak_rss_gib": peak_rss_gib, "import_rss_gib": measured["import_rss_gib"],
            "fp32_model_gib": round(params * 4 / 2**30, 2),
            "70b_export_bytes": int(out_bytes * scale), "70b_export_s_at_this_rate": round(export_s * scale),
            "70b_peak_rss_note": "bounded by the shard size (one shard's source tensors + its bytes), not the model",
            "torch_dtype": str(DTYPES[args.dtype]),
        }))
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
