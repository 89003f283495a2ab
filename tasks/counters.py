"""The counter vocabulary every stage counts in (``Stats``), a stage's steps merged, its funnel read.

Every stage counts ``in``, ``out``, ``dropped.<reason>`` and ``failed.<reason>``; a stage made of
steps (ingest's filters, dedup's phases) gives each step a ``Stats`` of its own in the same
vocabulary and files it under ``funnel.<step>.``. Readers of a manifest (the run summary, the
Prefect artifacts) then need no case per stage: ``in`` and ``out`` are the stage's, and ``funnel``
lists what every step let through and why it dropped the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.contract import Manifest

FUNNEL = "funnel."
REASONS = ("dropped.", "failed.")


class Stats(dict):
    """Named counters (``str -> int | float``). ``a + b`` adds counters key by key.

    One vocabulary for every stage, so summaries and artifacts need no per-stage cases:
    ``in`` (records the stage read), ``out`` (records it wrote), ``dropped.<reason>`` (removed on
    purpose), ``failed.<reason>`` (lost to an error); reason names are API (``gopher_short_doc``).
    A stage made of steps keeps each step's counters, in the same vocabulary, under
    ``funnel.<step>.`` (``funnel.lang.in``, ``funnel.lang.dropped.lang_not_kept``) and sums the
    drops and failures at the top; ``merge_steps`` and ``funnel`` below merge and display them. Anything else is
    a namespaced measurement (``tokens.train``, ``time.shard_s``).
    """

    def add(self, key: str, value: int | float = 1) -> None:
        self[key] = self.get(key, 0) + value

    def __add__(self, other: Mapping[str, int | float] | int) -> "Stats":
        out = Stats(self)
        if isinstance(other, int) and other == 0:  # sum() starts from 0
            return out
        for key, value in other.items():
            out.add(key, value)
        return out

    __radd__ = __add__

    def __iadd__(self, other: Mapping[str, int | float]) -> "Stats":
        for key, value in other.items():
            self.add(key, value)
        return self

    def with_prefix(self, prefix: str) -> dict[str, int | float]:
        return {k[len(prefix):]: v for k, v in sorted(self.items()) if k.startswith(prefix)}


def merge_steps(step_stats: Mapping[str, Mapping[str, int | float]]) -> Stats:
    """A stage's counters from its steps' (in chain order): each step's under ``funnel.<step>.``,
    drops and failures also summed at the top, ``in`` from the first step, ``out`` from the last."""
    total = Stats()
    for name, stats in step_stats.items():
        for key, value in stats.items():
            total.add(f"{FUNNEL}{name}.{key}", value)
            if key.startswith(REASONS):
                total.add(key, value)
    counted = [stats for stats in step_stats.values() if stats]  # a disabled step counts nothing
    if counted:
        total.add("in", counted[0].get("in", 0))
        total.add("out", counted[-1].get("out", 0))
    return total


def funnel_steps(stats: Mapping[str, int | float]) -> list[str]:
    """The steps of a merged ``stats``, in the order their counters first appear."""
    return list(dict.fromkeys(k[len(FUNNEL):].split(".", 1)[0] for k in stats if k.startswith(FUNNEL)))


def funnel(source: Manifest | Mapping[str, int | float], steps: list[str] | None = None) -> list[tuple[str, int]]:
    """Rows for display: ``in``, then each step's ``out`` followed by its drop and failure reasons
    (largest first, named ``dropped.<reason>`` / ``failed.<reason>``), then ``out``.

    ``source`` is a manifest (its ``meta.steps`` gives the order) or merged stats (the order their
    counters appear in, unless ``steps`` is given).
    """
    if isinstance(source, Mapping):
        stats = source
    else:
        stats, steps = source.stats, steps or source.meta.get("steps")
    rows = [("in", int(stats.get("in", 0)))]
    for step in steps or funnel_steps(stats):
        prefix = f"{FUNNEL}{step}."
        rows.append((step, int(stats.get(prefix + "out", 0))))
        reasons = [(k[len(prefix):], int(v)) for k, v in stats.items()
                   if k.startswith(prefix) and k[len(prefix):].startswith(REASONS)]
        rows.extend(sorted(reasons, key=lambda kv: (-kv[1], kv[0])))
    rows.append(("out", int(stats.get("out", 0))))
    return rows
