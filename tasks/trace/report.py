"""The answers of ``smelt trace``: a step's sequences by loss, the spikes, when a document was trained on.

Each answer is a JSON-ready dict (``--json`` prints it; ``render`` writes it for a terminal).
"""

from __future__ import annotations

import numpy as np

from tasks.trace.documents import Documents
from tasks.trace.ledger import kept_ranges, ledger
from tasks.trace.losses import of_attempt, read_losses
from tasks.trace.run import Run, TraceError, open_run, samples_of

MAD_TO_SIGMA = 1.4826  # as the loss guard's robust z (tasks/train/loss_guard.py)


def _sequences(run: Run, docs: Documents, losses: dict, step: int, samples: tuple[int, int], top: int,
               excerpt_chars: int) -> tuple[list[dict], int]:
    """The ``top`` sequences of one attempt of ``step`` by loss, with their documents; and how many were recorded."""
    index, loss = of_attempt(losses, step, samples)
    order = np.argsort(-loss, kind="stable")[:top]
    out = []
    for at in order.tolist():
        sample = int(index[at])
        k, start, end = docs.window(sample)
        out.append({"sample": sample, "row": sample - samples[0], "loss": float(loss[at]), "dataset": docs.names[k],
                    "stream_tokens": [start, end], "documents": docs.describe(docs.pieces(k, start, end), excerpt_chars)})
    return out, len(index)


def trace_step(run: Run, step: int, top: int = 5, excerpt_chars: int = 240) -> dict:
    """Step ``step``'s sequences by loss, each with the documents it was cut from."""
    record = run.steps.get(step)
    rejected = False
    if record is None:
        tries = [r for r in run.attempts if r["step"] == step]
        if not tries:
            raise TraceError(f"step {step} was never trained in {run.url} (its final step is {run.final_step})")
        record, rejected = tries[-1], "rolled_back_to" in tries[-1]
    samples = samples_of(record)
    if samples is None:
        raise TraceError(f"step {step} of {run.url} has no sample range in metrics.jsonl (trained before issue 42)")
    docs = Documents(run.lineage)
    losses = read_losses(run.url, step, step)
    sequences, recorded = _sequences(run, docs, losses, step, samples, top, excerpt_chars)
    return {"run": run.url, "step": step, "loss": record.get("loss"), "final_trajectory": step in run.steps and not rejected,
            "branch": None if record is run.steps.get(step) else run.branch_of(record),
            "rolled_back_to": record.get("rolled_back_to"), "samples": list(samples), "recorded": recorded,
            "sequences": sequences}


def neighbour_z(losses: np.ndarray, window: int) -> np.ndarray:
    """Each loss's robust z against the ``window`` losses on either side of it (itself left out)."""
    n = len(losses)
    if n < 3:
        return np.zeros(n)
    padded = np.r_[np.full(window, np.nan), losses.astype(np.float64), np.full(window, np.nan)]
    views = np.lib.stride_tricks.sliding_window_view(padded, 2 * window + 1).copy()
    views[:, window] = np.nan
    median = np.nanmedian(views, axis=1)
    mad = np.nanmedian(np.abs(views - median[:, None]), axis=1)
    scale = MAD_TO_SIGMA * np.maximum(mad, np.maximum(1e-3 * np.abs(median), 1e-12))
    return (losses - median) / scale


def spikes(run: Run, z: float = 4.0, window: int = 25, top: int = 3, limit: int = 20, excerpt_chars: int = 160) -> dict:
    """Every step the loss guard rejected, and every kept step more than ``z`` robust standard deviations above
    its ``window`` neighbours on each side, worst first (at most ``limit`` traced), each with its top sequences."""
    steps = np.asarray(list(run.steps), dtype=np.int64)
    values = np.asarray([float(r["loss"]) for r in run.steps.values()], dtype=np.float64)
    scores = neighbour_z(values, window)
    found = [{"step": int(s), "loss": float(v), "z": float(q), "kind": "outlier", "samples": samples_of(run.steps[int(s)])}
             for s, v, q in zip(steps, values, scores) if q > z]
    skipped = {int(s["step"]): s for s in run.skipped}
    for record in run.attempts:
        if "rolled_back_to" in record:
            reason = skipped.get(record["step"], {}).get("reason", "rejected")
            found.append({"step": record["step"], "loss": record.get("loss"), "z": None, "kind": reason,
                          "rolled_back_to": record["rolled_back_to"], "samples": samples_of(record)})
    found.sort(key=lambda f: (f["kind"] == "outlier", -(f["z"] or 0.0), f["step"]))
    docs = Documents(run.lineage) if found else None
    for spike in found[:limit]:
        if spike["samples"] is not None:
            losses = read_losses(run.url, spike["step"], spike["step"])
            spike["sequences"], spike["recorded"] = _sequences(run, docs, losses, spike["step"], spike["samples"], top,
                                                               excerpt_chars)
        spike["samples"] = list(spike["samples"]) if spike["samples"] else None
    return {"run": run.url, "z": z, "window": window, "steps": len(steps), "spikes": found}


def document(run: Run, url: str, chunk: int = 1 << 20) -> dict:
    """When the document(s) at ``url`` were trained on: the steps of the final trajectory whose sequences held
    any of their tokens, and how many times."""
    docs = Documents(run.lineage)
    found = docs.find_url(url)
    if not found:
        raise TraceError(f"no document with URL {url!r} is in the tokens datasets {run.url} trained on")
    seq_len = docs.seq_len
    wanted: dict[int, set[int]] = {}
    for doc in found:  # windows [s·L, s·L + L + 1) that overlap the document's tokens
        a, b = doc["stream_tokens"]
        first, last = max(0, (a - 1) // seq_len), (b - 1) // seq_len
        wanted.setdefault(doc["k"], set()).update(range(first, last + 1))
    ranges, _ = kept_ranges(run)
    hits: list[tuple[int, int]] = []  # (step, sample)
    wanted_arrays = {k: np.asarray(sorted(v), dtype=np.int64) for k, v in wanted.items()}
    # all kept samples at once, in chunks: the order is a pure function of the index
    if ranges:
        starts = np.asarray([a for _, a, _ in ranges], dtype=np.int64)
        ends = np.asarray([b for _, _, b in ranges], dtype=np.int64)
        step_of = np.asarray([s for s, _, _ in ranges], dtype=np.int64)
        total = int(ends.max())
        for lo in range(0, total, chunk):
            index = np.arange(lo, min(total, lo + chunk), dtype=np.int64)
            which, sample = docs.sources(index)
            hit = np.zeros(len(index), dtype=bool)
            for k, values in wanted_arrays.items():
                hit |= (which == k) & np.isin(sample, values)
            found_index = index[hit]
            at = np.searchsorted(starts, found_index, side="right") - 1
            inside = (at >= 0) & (found_index < ends[np.maximum(at, 0)])  # not in a skipped or superseded window
            hits += zip(step_of[at[inside]].tolist(), found_index[inside].tolist())
    steps = sorted({s for s, _ in hits})
    return {"run": run.url, "url": url, "documents": [{k: v for k, v in d.items() if k != "k"} for d in found],
            "times": len(hits), "steps": steps, "samples": [i for _, i in hits]}


def answer(run_url: str, *, step: int | None = None, top: int = 5, spikes_: bool = False, z: float = 4.0,
           document_url: str | None = None, ledger_: bool = False) -> dict:
    """The one question asked of ``smelt trace`` (exactly one of step, spikes, document, ledger)."""
    asked = [name for name, on in (("--step", step is not None), ("--spikes", spikes_), ("--document", document_url),
                                   ("--ledger", ledger_)) if on]
    if len(asked) != 1:
        raise TraceError("smelt trace answers one question at a time: give exactly one of --step, --spikes, "
                         f"--document or --ledger (got {', '.join(asked) or 'none'})")
    if top < 1:
        raise TraceError(f"--top must be at least 1, got {top}")
    run = open_run(run_url)
    if step is not None:
        return trace_step(run, step, top)
    if spikes_:
        return spikes(run, z=z, top=min(top, 3))
    if document_url:
        return document(run, document_url)
    return ledger(run)


# -- rendering -------------------------------------------------------------------------------------------


def _doc_lines(piece: dict) -> list[str]:
    scores = [f"lang {piece['lang']} {piece['lang_score']:.2f}" if piece.get("lang_score") is not None else f"lang {piece['lang']}",
              f"quality {piece['quality_score']:.3f}" if piece.get("quality_score") is not None else "quality -",
              f"cluster {piece['cluster_size']}" if piece.get("cluster_size") is not None else "cluster -"]
    where = f"{piece['dataset']}/{piece['shard']} tokens {piece['doc_tokens'][0]}-{piece['doc_tokens'][1]} of {piece['doc_length']}"
    excerpt = (piece.get("excerpt") or "").replace("\n", " ")[:120]
    meta = piece.get("meta") or {}
    record = f"  record {meta['warc_record_id']}" if meta.get("warc_record_id") else ""
    lines = [f"      {piece['url'] or piece['id']}  ({piece['source']}; {', '.join(scores)}){record}",
             f"        {where}: \"{excerpt}\""]
    rules = "; ".join(f"{name} " + " ".join(f"{k}={v:g}" for k, v in values.items())
                      for name, values in (meta.get("quality") or {}).items())
    if rules:  # what the ingest rules measured on it (all of them in --json)
        lines.append(f"        rules: {rules[:200]}{'…' if len(rules) > 200 else ''}")
    return lines


def _sequence_lines(seq: dict) -> list[str]:
    lines = [f"  sample {seq['sample']} (row {seq['row']}, {seq['dataset']})  loss {seq['loss']:.4f}"]
    for piece in seq["documents"]:
        lines += _doc_lines(piece)
    return lines


def render(answer: dict) -> str:
    """A terminal rendering of any answer of this module or of the ledger."""
    if "sequences" in answer and "spikes" not in answer:
        head = (f"step {answer['step']} of {answer['run']}: loss {answer['loss']:.4f}, samples "
                f"[{answer['samples'][0]}, {answer['samples'][1]}), {answer['recorded']} per-sample losses")
        if answer.get("branch") is not None:
            head += f" (superseded branch {answer['branch']})"
        if not answer["final_trajectory"]:
            head += f" (rejected: rolled back to step {answer['rolled_back_to']})"
        return "\n".join([head, *[line for seq in answer["sequences"] for line in _sequence_lines(seq)]])
    if "spikes" in answer:
        lines = [f"{len(answer['spikes'])} spike(s) in {answer['steps']} steps (z > {answer['z']} over ±{answer['window']} steps)"]
        for spike in answer["spikes"]:
            z = f"z {spike['z']:.1f}" if spike["z"] is not None else f"rolled back to {spike.get('rolled_back_to')}"
            lines.append(f"step {spike['step']}: {spike['kind']}, loss {spike['loss']}, {z}")
            for seq in spike.get("sequences", []):
                lines += _sequence_lines(seq)
        return "\n".join(lines)
    if "times" in answer:
        lines = [f"{answer['url']}: trained on {answer['times']} time(s), at steps {answer['steps']}"]
        lines += [f"  {d['dataset']}/{d['shard']} id {d['id']} stream tokens {d['stream_tokens']}" for d in answer["documents"]]
        return "\n".join(lines)
    verdict = "exactly once" if answer["exactly_once"] else "NOT exactly once"
    lines = [f"ledger of {answer['run']}: {answer['samples']} samples up to step {answer['final_step']}: {verdict}",
             f"  counts: {answer['counts']}"]
    for s in answer["skipped"]:
        lines.append(f"  skipped [{s['start']}, {s['end']}): {s['reason']} at step {s['step']}, rolled back to {s['rolled_back_to']}")
    for key in ("never_trained", "trained_more_than_once", "trained_in_skipped_windows", "inferred_steps",
                "unrecorded_steps", "superseded_steps"):
        if answer[key]:
            lines.append(f"  {key.replace('_', ' ')}: {answer[key]}")
    for b in answer.get("branches", []):
        skip = f", skipped steps {b['skip_steps']} (samples {b['skip_samples']})" if b["skip_steps"] else ""
        lines.append(f"  branch {b['branch']} (superseded, {b['url']}): left at step {b['from_step']}, steps "
                     f"{b['steps']}, checkpoints {b['checkpoints']}{skip}")
    return "\n".join(lines)
