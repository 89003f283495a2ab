"""torchrun entry point: one process per rank trains (or resumes) the run in ``--run-dir``.

    torchrun ... -m tasks.train.main --config FILE.toml --data TOKENS_URL[,name=URL...] \
        --run-dir URL [--set key=value ...]
    python -m tasks.train.main --config FILE.toml --data URL --dry-run --nproc 8

``--config`` is a train config (TOML or JSON, any fsspec URL) or a run config whose ``[train]``
section is used. ``--set optim.lr=3e-4`` overrides one key. A user mistake exits with status 2
and one line saying what to fix; anything else is a crash with its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tomllib

from tasks import datasets as contract
from tasks.config import ConfigError, from_dict, merge_overrides
from tasks.train.config import TrainConfig

log = logging.getLogger("tasks.train.main")

_NAMED = re.compile(r"^([A-Za-z_][\w.-]*)=(.+)$")


def parse_data(text: str) -> dict[str, str]:
    """``URL`` or ``name=URL,name=URL`` → {name: normalised URL}; a lone unnamed URL is "main"."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    out: dict[str, str] = {}
    for item in items:
        match = _NAMED.match(item)
        if match and "://" not in match.group(1):
            name, url = match.groups()
        elif len(items) == 1:
            name, url = "main", item
        else:
            raise ConfigError(f"--data item {item!r} needs a name when several datasets are given: name=URL")
        if name in out:
            raise ConfigError(f"--data names dataset {name!r} twice; give each dataset its own name")
        out[name] = contract.normalize_url(url)
    if not out:
        raise ConfigError("--data is empty; pass a tokens dataset URL")
    return out


def load_config(url: str | None, overrides: list[str]) -> TrainConfig:
    data: dict = {}
    if url is not None:
        fs, path = contract.filesystem(url)
        if not fs.exists(path):
            raise ConfigError(f"config file {url} does not exist")
        text = fs.cat_file(path).decode()
        try:
            data = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"config file {url} cannot be parsed: {e}") from e
        if isinstance(data.get("train"), dict):  # a whole run config: take its train section
            data = data["train"]
    return from_dict(TrainConfig, merge_overrides(data, overrides))


def _setup_logging() -> None:
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank{rank}] %(name)s %(levelname)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.train.main", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="train config (TOML/JSON) or run config with a [train] section")
    parser.add_argument("--data", required=True, help="tokens dataset URL, or name=URL,name=URL for a mixture")
    parser.add_argument("--run-dir", help="run folder: metrics, summary, checkpoints (required unless --dry-run)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key, e.g. --set optim.lr=3e-4 (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="print the layout, memory and batch walk as JSON")
    parser.add_argument("--nproc", type=int, default=1, help="world size to describe with --dry-run")
    args = parser.parse_args(argv)
    _setup_logging()

    from tasks.train.trainer import Trainer, describe_layout  # torch import: after argument errors

    try:
        cfg = load_config(args.config, args.overrides)
        sources = parse_data(args.data)
        if args.dry_run:
            vocab = max(int(contract.open_dataset(u, kind="tokens").meta["vocab_size"]) for u in sources.values())
            print(json.dumps(describe_layout(cfg, world_size=args.nproc, vocab_size=vocab), indent=2))
            return 0
        if not args.run_dir:
            raise ConfigError("--run-dir is required to train")
        trainer = Trainer(cfg, sources, args.run_dir)
    except (ConfigError, ValueError, contract.DatasetError) as e:
        log.error("%s", e)
        return 2
    with trainer:
        trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
