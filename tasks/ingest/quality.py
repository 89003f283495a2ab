"""Heuristic quality rules: Gopher quality, Gopher repetition, C4 and FineWeb.

Each filter answers one question per document and names the rule that failed (``dropped.<reason>``).
Thresholds and their published defaults live in ``tasks/ingest/config.py``. Code documents are not
judged by these prose rules (see ``ProseFilter``).

Where we differ from datatrove's implementations, on purpose:
- blank lines are ignored when computing line fractions (they are layout; trafilatura emits none,
  so on FineWeb's own input this changes nothing);
- stop words are matched case-insensitively;
- repetition fractions over n-grams are measured against the characters of all words, and
  duplicated n-grams mark word positions so overlapping repeats are not counted twice.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter

from tasks.documents import Document
from tasks.ingest.config import C4Config, FineWebConfig, GopherQualityConfig, GopherRepetitionConfig
from tasks.ingest.text import (
    ProseFilter,
    count_sentences,
    count_words_without_letters,
    duplicates,
    lowercase_words,
    non_empty_lines,
    split_paragraphs,
    split_words,
)

ELLIPSES = ("...", "…")


class GopherQualityFilter(ProseFilter):
    """Gopher's document-level quality rules.

    Reasons: gopher_short_doc, gopher_long_doc, gopher_mean_word_length, gopher_symbol_ratio,
    gopher_bullet_lines, gopher_ellipsis_lines, gopher_alpha_words, gopher_too_few_stop_words.
    """

    name = "gopher_quality"
    cfg: GopherQualityConfig

    def keep(self, doc: Document) -> bool | tuple[bool, str]:
        cfg, text = self.cfg, doc.text
        words = split_words(text)
        n_words = len(words)

        # between min_words and max_words words
        if n_words < cfg.min_words or n_words == 0:
            return False, "gopher_short_doc"
        if n_words > cfg.max_words:
            return False, "gopher_long_doc"

        # mean word length between 3 and 10 characters
        mean_length = sum(map(len, words)) / n_words
        if not cfg.min_mean_word_length <= mean_length <= cfg.max_mean_word_length:
            return False, "gopher_mean_word_length"

        # at most 0.1 hash symbols per word, and at most 0.1 ellipses per word
        hashes = text.count("#") / n_words
        if hashes > cfg.max_symbol_word_ratio:
            return False, "gopher_symbol_ratio"
        ellipses = sum(text.count(e) for e in ELLIPSES) / n_words
        if ellipses > cfg.max_symbol_word_ratio:
            return False, "gopher_symbol_ratio"

        # at most 90% of lines start with a bullet, at most 30% end with an ellipsis
        lines = non_empty_lines(text)
        bullets = tuple(cfg.bullets)
        bullet_lines = sum(line.startswith(bullets) for line in lines) / len(lines)
        if bullet_lines > cfg.max_bullet_lines_frac:
            return False, "gopher_bullet_lines"
        ellipsis_lines = sum(line.endswith(ELLIPSES) for line in lines) / len(lines)
        if ellipsis_lines > cfg.max_ellipsis_lines_frac:
            return False, "gopher_ellipsis_lines"

        # at least 80% of words hold an alphabetic character
        alpha_words = (n_words - count_words_without_letters(words)) / n_words
        if alpha_words < cfg.min_alpha_words_frac:
            return False, "gopher_alpha_words"

        # at least 2 of the English stop words (a proxy for coherent English prose)
        stop_words = {w.lower() for w in cfg.stop_words}
        n_stop = sum(map(stop_words.__contains__, lowercase_words(words)))
        if n_stop < cfg.min_stop_words:
            return False, "gopher_too_few_stop_words"
        self.record(doc, {"words": n_words, "mean_word_length": mean_length, "hash_per_word": hashes,
                          "ellipsis_per_word": ellipses, "bullet_lines": bullet_lines, "ellipsis_lines": ellipsis_lines,
                          "alpha_words": alpha_words, "stop_words": n_stop})
        return True


def ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    return list(zip(*(words[i:] for i in range(n))))


def top_ngram_char_frac(words: list[str], n: int, total_chars: int) -> float:
    """Characters inside all occurrences of the most frequent n-gram (if it repeats) / all word characters."""
    grams = ngrams(words, n)
    if not grams or total_chars == 0:
        return 0.0
    gram, count = Counter(grams).most_common(1)[0]
    return 0.0 if count < 2 else count * sum(map(len, gram)) / total_chars


def dup_ngram_char_frac(words: list[str], n: int, total_chars: int) -> float:
    """Characters of words covered by a repeated occurrence (not the first) of any n-gram / all word characters."""
    grams = ngrams(words, n)
    if total_chars == 0 or len(set(grams)) == len(grams):  # the common case: nothing repeats
        return 0.0
    seen: set[tuple[str, ...]] = set()
    covered = bytearray(len(words))
    for start, gram in enumerate(grams):
        if gram in seen:
            covered[start : start + n] = b"\x01" * n
        else:
            seen.add(gram)
    return sum(itertools.compress(map(len, words), covered)) / total_chars


class GopherRepetitionFilter(ProseFilter):
    """Gopher's repetition rules: repeated lines, paragraphs and n-grams.

    Reasons: gopher_dup_para_frac, gopher_dup_para_char_frac, gopher_dup_line_frac,
    gopher_dup_line_char_frac, gopher_top_<n>_gram, gopher_dup_<n>_gram.
    """

    name = "gopher_repetition"
    cfg: GopherRepetitionConfig

    def keep(self, doc: Document) -> bool | tuple[bool, str]:
        cfg, text = self.cfg, doc.text
        if not text.strip():
            return True  # nothing repeats; emptiness is the quality rules' business
        n_chars = len(text)
        values: dict[str, float] = {}

        # repeated paragraphs, then repeated lines: by count and by characters
        for split, max_frac, max_char_frac, reason in (
            (split_paragraphs, cfg.max_dup_para_frac, cfg.max_dup_para_char_frac, "gopher_dup_para"),
            (non_empty_lines, cfg.max_dup_line_frac, cfg.max_dup_line_char_frac, "gopher_dup_line"),
        ):
            dup_count, dup_chars = duplicates(pieces := split(text))
            name = reason.removeprefix("gopher_")
            values[f"{name}_frac"], values[f"{name}_char_frac"] = dup_count / len(pieces), dup_chars / n_chars
            if values[f"{name}_frac"] > max_frac:
                return False, f"{reason}_frac"
            if values[f"{name}_char_frac"] > max_char_frac:
                return False, f"{reason}_char_frac"

        words = lowercase_words(split_words(text))
        total_chars = sum(map(len, words))
        # If no n-gram of some size repeats, no longer one does: those checks are skipped.
        no_repeats_from = math.inf
        # the most frequent short n-gram must not dominate the text (top), nor repeated longer
        # n-grams cover much of it (dup)
        for kind, measure, limits in (("top", top_ngram_char_frac, cfg.max_top_ngram_char_frac),
                                      ("dup", dup_ngram_char_frac, cfg.max_dup_ngram_char_frac)):
            for n, max_frac in limits.items():
                frac = measure(words, n, total_chars) if n < no_repeats_from else 0.0
                values[f"{kind}_{n}_gram"] = frac
                if frac > max_frac:
                    return False, f"gopher_{kind}_{n}_gram"
                if frac == 0.0:
                    no_repeats_from = min(no_repeats_from, n)
        self.record(doc, values)
        return True


CITATION_RE = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]", re.IGNORECASE)


def c4_clean_lines(text: str, cfg: C4Config) -> tuple[list[str], int, Counter]:
    """C4's line rules: (lines kept, sentences in them, removed-line counts by reason)."""
    terminal = tuple(cfg.terminal_punctuation)
    policy_phrases = [p.lower() for p in cfg.policy_phrases]
    kept, sentences, removed = [], 0, Counter()
    for line in non_empty_lines(text):
        words = line.split()
        # (a line no longer than the limit cannot hold a longer word)
        if cfg.max_word_length and len(line) > cfg.max_word_length and max(map(len, words)) > cfg.max_word_length:
            removed["too_long_word"] += 1
            continue
        if cfg.remove_citations:
            line = CITATION_RE.sub("", line).strip()
        if cfg.drop_lines_without_terminal_punct and (not line.endswith(terminal) or line.endswith("...")):
            removed["no_terminal_punct"] += 1
            continue
        if len(words) < cfg.min_words_per_line:
            removed["too_few_words"] += 1
            continue
        lowered = line.lower()
        if cfg.drop_javascript_lines and "javascript" in lowered:
            removed["javascript"] += 1
            continue
        if cfg.drop_policy_lines and any(p in lowered for p in policy_phrases):
            removed["policy"] += 1
            continue
        sentences += count_sentences(line)
        kept.append(line)
    return kept, sentences, removed


class C4QualityFilter(ProseFilter):
    """C4's rules: remove bad lines, drop pages that are boilerplate or too short.

    Lines are removed (the document is kept, its text rewritten with the remaining lines) when
    they hold an over-long word, lack terminal punctuation, have too few words, mention javascript
    or a cookie/terms policy; each removal is counted as ``lines_removed.<why>``.
    Whole documents are dropped for: c4_lorem_ipsum, c4_curly_bracket (anywhere on the page, as the
    paper says) and c4_too_few_sentences (counted over the lines kept).
    """

    name = "c4_quality"
    cfg: C4Config

    def keep(self, doc: Document) -> bool | tuple[bool, str]:
        cfg = self.cfg
        # pages with placeholder text or code-like braces are dropped whole
        if cfg.drop_lorem_ipsum and "lorem ipsum" in doc.text.lower():
            return False, "c4_lorem_ipsum"
        if cfg.drop_curly_bracket and "{" in doc.text:
            return False, "c4_curly_bracket"

        kept, sentences, removed = c4_clean_lines(doc.text, cfg)
        for why, count in removed.items():
            self.count(f"lines_removed.{why}", count)
        # at least min_sentences sentences must survive line removal
        if not kept or sentences < cfg.min_sentences:
            return False, "c4_too_few_sentences"
        doc.text = "\n".join(kept)
        self.record(doc, {"sentences": sentences, "lines_kept": len(kept), "lines_removed": sum(removed.values())})
        return True


class FineWebQualityFilter(ProseFilter):
    """FineWeb's own rules, aimed at lists, menus and boilerplate that Gopher and C4 miss.

    Reasons: fineweb_line_punct_ratio, fineweb_short_line_ratio, fineweb_dup_line_chars,
    fineweb_newline_ratio.
    """

    name = "fineweb_quality"
    cfg: FineWebConfig

    def keep(self, doc: Document) -> bool | tuple[bool, str]:
        cfg, text = self.cfg, doc.text
        lines = non_empty_lines(text)
        if not lines:
            return False, "fineweb_line_punct_ratio"

        # enough lines end like sentences
        stop_chars = tuple(cfg.stop_chars)
        punct_lines = sum(line.endswith(stop_chars) for line in lines) / len(lines)
        if punct_lines <= cfg.min_line_punct_frac:
            return False, "fineweb_line_punct_ratio"

        # not mostly short lines
        short_lines = sum(len(line) <= cfg.short_line_length for line in lines) / len(lines)
        if short_lines >= cfg.max_short_line_frac:
            return False, "fineweb_short_line_ratio"

        # little text in repeated lines
        _, dup_chars = duplicates(lines)
        dup_line_chars = dup_chars / len(text.replace("\n", ""))
        if dup_line_chars >= cfg.max_dup_line_char_frac:
            return False, "fineweb_dup_line_chars"

        # not a list: few newlines per word
        n_words = len(split_words(text))
        if n_words == 0 or text.count("\n") / n_words > cfg.max_newline_word_ratio:
            return False, "fineweb_newline_ratio"
        self.record(doc, {"line_punct": punct_lines, "short_lines": short_lines, "dup_line_chars": dup_line_chars,
                          "newlines_per_word": text.count("\n") / n_words})
        return True
