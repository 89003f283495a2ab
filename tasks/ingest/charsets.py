"""Web payload bytes → text: declared charsets first, repair of a few bad bytes, detection last."""

from __future__ import annotations

import codecs
import re

from tasks.ingest.config import ReaderConfig


META_CHARSET_RE = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.IGNORECASE)


def decode_payload(payload: bytes, declared: str, cfg: ReaderConfig) -> tuple[str, str, int] | None:
    """(text, charset, replaced characters) of a web payload, or None when it does not decode.

    First the HTTP header's charset, ``<meta charset>`` and UTF-8, strictly. Then the same with the
    few bad bytes of a damaged page replaced (at most ``max_replacement_frac`` of its characters).
    Then charset_normalizer on the first ``charset_detection_bytes``, for a page whose declared
    charset is simply wrong. Text holding NUL characters is binary data, not a page.
    """
    candidates = _charset_candidates(payload, declared)
    for codec in candidates:
        try:
            return _checked(payload.decode(codec), codec, 0, cfg)
        except UnicodeDecodeError:
            continue
    repaired = [(payload.decode(codec, "replace"), codec) for codec in candidates]
    text, codec = min(repaired, key=lambda tc: tc[0].count("\ufffd"))
    if (decoded := _checked(text, codec, text.count("\ufffd"), cfg)) is not None:
        return decoded
    import charset_normalizer

    best = charset_normalizer.from_bytes(payload[: cfg.charset_detection_bytes]).best()
    if best is None or _codec_name(best.encoding) is None:
        return None
    text = payload.decode(best.encoding, "replace")
    return _checked(text, best.encoding, text.count("\ufffd"), cfg)


def _charset_candidates(payload: bytes, declared: str) -> list[str]:
    names = [declared]
    if match := META_CHARSET_RE.search(payload[:4096]):
        names.append(match.group(1).decode("ascii"))
    names.append("utf-8")
    return list(dict.fromkeys(c for name in names if (c := _codec_name(name)) is not None))


def _checked(text: str, codec: str, replaced: int, cfg: ReaderConfig) -> tuple[str, str, int] | None:
    if replaced > cfg.max_replacement_frac * len(text) or "\x00" in text:
        return None
    return text, codec, replaced


def _codec_name(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return codecs.lookup(name.strip().strip("\"'")).name
    except LookupError:
        return None
