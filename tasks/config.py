"""Typed config: dataclasses loaded from TOML plus ``section.key=value`` overrides.

Every threshold and size lives in a stage's config dataclass with its default in one place.
Unknown keys are errors (a typo such as ``train.stpes`` must never silently become a default).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import fsspec

from tasks.errors import UserError

T = TypeVar("T")


class ConfigError(UserError):
    """A user mistake in a config file or override; the message names the key and the fix."""


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``, recursing into nested dataclasses; reject unknown keys."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown config key {where + unknown[0]!r}; known keys here: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, where + name)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"bad config in [{where.rstrip('.') or 'top level'}]: {e}") from e


def _coerce(hint: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} must be a table, got {value!r}")
        return from_dict(hint, value, key + ".")
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, key) if len(args) == 1 else value
    if origin in (list, tuple):
        (item,) = typing.get_args(hint)[:1] or (Any,)
        seq = [_coerce(item, v, key) for v in value] if isinstance(value, (list, tuple)) else None
        if seq is None:
            raise ConfigError(f"config key {key!r} must be a list, got {value!r}")
        return seq if origin is list else tuple(seq)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} must be a table, got {value!r}")
        return dict(value)
    if hint is bool:
        if isinstance(value, str):
            if value.lower() in ("true", "1", "yes"):
                return True
            if value.lower() in ("false", "0", "no"):
                return False
        if not isinstance(value, bool):
            raise ConfigError(f"config key {key!r} must be true or false, got {value!r}")
        return value
    if hint in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):  # true is not 1
            raise ConfigError(f"config key {key!r} must be a number, got {value!r}")
        try:
            number = float(value) if hint is float else int(float(value)) if isinstance(value, str) else value
        except (ValueError, OverflowError):
            raise ConfigError(f"config key {key!r} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(f"config key {key!r} must be a finite number, got {value!r}")
        if hint is int and (isinstance(value, float) and not float(value).is_integer()):
            raise ConfigError(f"config key {key!r} must be an integer, got {value!r}")
        return hint(number)
    if hint is str:
        if isinstance(value, (list, tuple, dict)):
            raise ConfigError(f"config key {key!r} must be a string, got {value!r}")
        return str(value)
    return value


def check_at_least(section: str, config: Any, minimum: float, *names: str) -> None:
    """Raise one sentence for the first of ``names`` below ``minimum`` (for ``__post_init__`` checks)."""
    for name in names:
        value = getattr(config, name)
        if not value >= minimum:  # also catches NaN from direct construction
            raise ValueError(f"{section}.{name} must be at least {minimum}, got {value!r}")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.optim.lr=3e-4"`` → (["train", "optim", "lr"], "3e-4"); values are coerced later."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    key, value = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        pass  # a bare string such as a URL
    return key.strip().split("."), value


def merge_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {part!r} is not a section")
        node[path[-1]] = value
    return data


def load(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
         section: str | None = None) -> T:
    """Load ``cls`` from a TOML or JSON file at a path or any fsspec URL (optional) and overrides.

    The one config loader (the CLI's run config, the torchrun entry point's train config). With
    ``section``, a file that is a whole run config contributes only its ``[section]`` table.
    """
    data: dict[str, Any] = {}
    if path is not None:
        text = str(path)
        fs, fs_path = fsspec.core.url_to_fs(text)
        if not fs.exists(fs_path):
            raise ConfigError(f"config file {text} does not exist")
        raw = fs.cat_file(fs_path).decode()
        try:
            data = json.loads(raw) if text.endswith(".json") else tomllib.loads(raw)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"config file {text} cannot be parsed: {e}") from e
        if section is not None and isinstance(data.get(section), dict):
            data = data[section]
    return from_dict(cls, merge_overrides(data, overrides or []))


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)
