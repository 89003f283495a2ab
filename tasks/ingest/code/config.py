"""Config of the code ingest stage: reader limits, the language table and every rule's thresholds.

Defaults follow The Stack and StarCoder data processing (Kocetkov et al. 2022; Li et al. 2023;
bigcode-dataset ``preprocessing``): files over 1 MB skipped, maximum line length 1000, mean line
length 100, alphanumeric fraction 0.25, auto-generated markers in the first 5 lines, encoded data
over 1024 characters or half the file, JSON/YAML kept between 50 and 5000 characters, permissive
licenses only. No heavy imports here: the flows load this to compute fingerprints.
"""

from __future__ import annotations

import codecs
import dataclasses

from tasks.ingest.config import OutputConfig

READER_FORMATS = ("auto", "jsonl", "parquet", "tar", "zip")
FOLDER_MODES = ("auto", "tree", "records")


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a fraction between 0 and 1, got {value}")


def _check_positive(section: str, obj: object, *names: str) -> None:
    for name in names:
        if getattr(obj, name) < 1:
            raise ValueError(f"{section}.{name} must be at least 1, got {getattr(obj, name)}")


@dataclasses.dataclass
class CodeReaderConfig:
    """How source files are read (tasks/ingest/code/readers.py)."""

    format: str = "auto"  # auto (from the file name) | jsonl | parquet | tar | zip; folders: see ``folders``
    # A folder is a source tree (every file a source file) or a collection of JSONL/Parquet/tar/zip
    # files; "auto" reads it as a collection when all its files have those suffixes.
    folders: str = "auto"  # auto | tree | records
    max_file_bytes: int = 1_000_000  # larger files are skipped unread (dropped.code_too_large), as The Stack
    binary_detection_bytes: int = 8000  # a NUL byte among the first this many bytes means binary (as git)
    encodings: list[str] = dataclasses.field(default_factory=lambda: ["utf-8"])  # tried in order, strictly
    # Folders never read: version-control internals are not source files of the repository.
    # A tree's folder is not entered (read.skipped_dirs); an archive's members in one are counted
    # as dropped.code_skipped_dir.
    skip_dirs: list[str] = dataclasses.field(default_factory=lambda: [".git", ".hg", ".svn", ".bzr"])
    # Field names of JSONL/Parquet records (The Stack's dumps, for one, use other names).
    content_field: str = "content"
    path_field: str = "path"
    repo_field: str = "repo"
    license_field: str = "license"
    # A folder tree is split into work items of at most this many files or bytes.
    dir_chunk_files: int = 2000
    dir_chunk_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.format not in READER_FORMATS:
            raise ValueError(f"reader.format must be one of {', '.join(READER_FORMATS)}, got {self.format!r}")
        if self.folders not in FOLDER_MODES:
            raise ValueError(f"reader.folders must be one of {', '.join(FOLDER_MODES)}, got {self.folders!r}")
        _check_positive("reader", self, "max_file_bytes", "binary_detection_bytes", "dir_chunk_files",
                        "dir_chunk_bytes")
        if not self.encodings:
            raise ValueError("reader.encodings must name at least one encoding, e.g. [\"utf-8\"]")
        for name in self.encodings:
            try:
                codecs.lookup(name)
            except LookupError:
                raise ValueError(f"reader.encodings names an unknown encoding {name!r}") from None


def _default_languages() -> dict[str, list[str]]:
    """Language → file extensions (lower case, with the dot), after The Stack's language list."""
    return {
        "Assembly": [".asm", ".s"],
        "Batchfile": [".bat", ".cmd"],
        "C": [".c", ".h"],
        "C#": [".cs"],
        "C++": [".cc", ".cpp", ".cxx", ".c++", ".hh", ".hpp", ".hxx", ".h++", ".inl"],
        "CMake": [".cmake"],
        "CSS": [".css"],
        "Clojure": [".clj", ".cljs", ".cljc", ".edn"],
        "Dart": [".dart"],
        "Dockerfile": [".dockerfile"],
        "Elixir": [".ex", ".exs"],
        "Erlang": [".erl", ".hrl"],
        "Fortran": [".f", ".f77", ".f90", ".f95", ".f03", ".for"],
        "Go": [".go"],
        "Groovy": [".groovy", ".gradle"],
        "HTML": [".html", ".htm", ".xhtml"],
        "Haskell": [".hs", ".lhs"],
        "JSON": [".json"],
        "Java": [".java"],
        "JavaScript": [".js", ".mjs", ".cjs", ".jsx"],
        "Julia": [".jl"],
        "Kotlin": [".kt", ".kts"],
        "Less": [".less"],
        "Lua": [".lua"],
        "Makefile": [".mk", ".mak"],
        "Markdown": [".md", ".markdown"],
        "OCaml": [".ml", ".mli"],
        "Objective-C": [".m", ".mm"],
        "PHP": [".php"],
        "Perl": [".pl", ".pm"],
        "PowerShell": [".ps1", ".psm1"],
        "Protocol Buffer": [".proto"],
        "Python": [".py", ".pyi", ".pyw"],
        "R": [".r"],
        "Ruby": [".rb", ".rake", ".gemspec"],
        "Rust": [".rs"],
        "SCSS": [".scss"],
        "SQL": [".sql"],
        "Scala": [".scala", ".sc"],
        "Shell": [".sh", ".bash", ".zsh", ".ksh"],
        "Swift": [".swift"],
        "TOML": [".toml"],
        "TeX": [".tex", ".sty", ".cls"],
        "TypeScript": [".ts", ".tsx", ".mts", ".cts"],
        "Vue": [".vue"],
        "XML": [".xml", ".xsd", ".xsl"],
        "YAML": [".yml", ".yaml"],
        "Zig": [".zig"],
        "reStructuredText": [".rst"],
    }


def _default_file_names() -> dict[str, str]:
    """Whole file names (exact case) that tell the language when the extension does not."""
    return {
        "Makefile": "Makefile", "GNUmakefile": "Makefile", "makefile": "Makefile",
        "Dockerfile": "Dockerfile", "Containerfile": "Dockerfile",
        "CMakeLists.txt": "CMake",
        "Rakefile": "Ruby", "Gemfile": "Ruby", "Vagrantfile": "Ruby", "Podfile": "Ruby",
        "Jenkinsfile": "Groovy",
        "BUILD": "Starlark", "BUILD.bazel": "Starlark", "WORKSPACE": "Starlark",
        ".bashrc": "Shell", ".bash_profile": "Shell", ".zshrc": "Shell", ".profile": "Shell",
    }


@dataclasses.dataclass
class LanguageConfig:
    """Language by file name, then by extension (tasks/ingest/code/language.py)."""

    languages: dict[str, list[str]] = dataclasses.field(default_factory=_default_languages)
    file_names: dict[str, str] = dataclasses.field(default_factory=_default_file_names)
    keep_languages: list[str] = dataclasses.field(default_factory=list)  # empty: every language in the table
    keep_unknown: bool = False  # keep files whose language the table does not know (lang "")

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for language, extensions in self.languages.items():
            if isinstance(extensions, str):
                raise ValueError(f"language.languages[{language!r}] must be a list of extensions, e.g. [\".py\"]")
            for ext in extensions:
                if not ext.startswith(".") or ext != ext.lower():
                    raise ValueError(f"language.languages[{language!r}] has {ext!r}; write extensions "
                                     "lower case with the dot, e.g. \".py\"")
                if ext in seen and seen[ext] != language:
                    raise ValueError(f"extension {ext!r} is listed for both {seen[ext]!r} and {language!r} "
                                     "in language.languages")
                seen[ext] = language
        known = set(self.languages) | set(self.file_names.values())
        unknown = [name for name in self.keep_languages if name not in known]
        if unknown:
            raise ValueError(f"language.keep_languages names {unknown[0]!r}, which is not in the language table")


@dataclasses.dataclass
class VendoredConfig:
    """Files inside dependency, build or VCS folders are someone else's code (dropped.code_vendored)."""

    enabled: bool = True
    dirs: list[str] = dataclasses.field(default_factory=lambda: [
        "node_modules", "bower_components", "jspm_packages", "vendor", "vendors", "third_party", "third-party",
        "thirdparty", "site-packages", "dist-packages", ".venv", "Pods", "Carthage", ".git", ".hg", ".svn",
    ])
    case_sensitive: bool = False


@dataclasses.dataclass
class LicenseConfig:
    """Permissive-license allow-list (SPDX ids), applied only to files whose record names a license."""

    enabled: bool = True
    allowed: list[str] = dataclasses.field(default_factory=lambda: [
        "MIT", "MIT-0", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "BSD-3-Clause-Clear", "0BSD", "ISC",
        "Unlicense", "CC0-1.0", "Zlib", "BSL-1.0", "PSF-2.0", "Python-2.0", "WTFPL", "X11", "NCSA",
    ])


@dataclasses.dataclass
class SizeConfig:
    """Size caps beyond the reader's byte limit; JSON/YAML bounds from StarCoder's data-file filter."""

    enabled: bool = True
    min_chars: int = 10  # fewer non-whitespace characters: dropped.code_too_short
    max_lines: int = 100_000  # more lines: dropped.code_too_many_lines
    data_languages: list[str] = dataclasses.field(default_factory=lambda: ["JSON", "YAML"])
    data_min_chars: int = 50  # data files outside [min, max] characters: dropped.code_data_file_size
    data_max_chars: int = 5000

    def __post_init__(self) -> None:
        _check_positive("size", self, "max_lines", "data_max_chars")
        if self.data_min_chars > self.data_max_chars:
            raise ValueError("size.data_min_chars must not exceed size.data_max_chars")


@dataclasses.dataclass
class AutogeneratedConfig:
    """Generated code: a marker in the first lines (as CodeParrot/StarCoder) or a generated file name."""

    enabled: bool = True
    scan_lines: int = 5
    markers: list[str] = dataclasses.field(default_factory=lambda: [
        "auto-generated", "autogenerated", "automatically generated", "generated automatically",
        "generated by", "code generated", "this file was generated", "this file is generated", "do not edit",
    ])  # matched case-insensitively
    file_patterns: list[str] = dataclasses.field(default_factory=lambda: [
        "*_pb2.py", "*_pb2_grpc.py", "*.pb.go", "*.pb.cc", "*.pb.h", "*.designer.cs", "*.g.dart",
        "package-lock.json", "yarn.lock", "pnpm-lock.yaml", "Cargo.lock", "poetry.lock", "composer.lock",
    ])  # fnmatch patterns on the file name

    def __post_init__(self) -> None:
        _check_positive("autogenerated", self, "scan_lines")


@dataclasses.dataclass
class DataLikeConfig:
    """Encoded data (StarCoder): base64 blobs, runs of hex or number literals, runs of escapes."""

    enabled: bool = True
    min_base64_chars: int = 64  # a run of base64 alphabet this long is encoded data
    min_literal_run: int = 8  # this many hex/number literals in a row (``0x1f, 0x8b, …``) are a table
    min_escape_run: int = 8  # this many ``\uXXXX``/``\xXX`` escapes in a row
    max_encoded_chars: int = 1024  # dropped when encoded data spans more characters than this …
    max_encoded_frac: float = 0.5  # … or more than this share of the file
    max_digit_frac: float = 0.5  # or when digits are more than this share of non-whitespace characters

    def __post_init__(self) -> None:
        _check_positive("data_like", self, "min_base64_chars", "min_literal_run", "min_escape_run")
        _check_fraction("data_like.max_encoded_frac", self.max_encoded_frac)
        _check_fraction("data_like.max_digit_frac", self.max_digit_frac)


@dataclasses.dataclass
class MinifiedConfig:
    """Minified files: a minified name, or most characters on long lines with almost no whitespace."""

    enabled: bool = True
    file_patterns: list[str] = dataclasses.field(
        default_factory=lambda: ["*.min.js", "*.min.mjs", "*.min.css", "*-min.js"])  # matched lower case
    long_line_chars: int = 300  # lines longer than this are "long"
    min_long_line_frac: float = 0.5  # minified when long lines hold at least this share of characters …
    max_whitespace_frac: float = 0.1  # … and whitespace is at most this share of their characters

    def __post_init__(self) -> None:
        _check_positive("minified", self, "long_line_chars")
        _check_fraction("minified.min_long_line_frac", self.min_long_line_frac)
        _check_fraction("minified.max_whitespace_frac", self.max_whitespace_frac)


@dataclasses.dataclass
class LineLengthConfig:
    """Codex/The Stack line-length rules: a file is dropped above either maximum."""

    enabled: bool = True
    max_line_length: int = 1000  # characters of the longest line
    max_mean_line_length: float = 100.0  # mean characters per line

    def __post_init__(self) -> None:
        _check_positive("line_length", self, "max_line_length", "max_mean_line_length")


@dataclasses.dataclass
class AlphanumConfig:
    """Codex/The Stack: a file is dropped when less than this share of its characters is alphanumeric."""

    enabled: bool = True
    min_fraction: float = 0.25

    def __post_init__(self) -> None:
        _check_fraction("alphanum.min_fraction", self.min_fraction)


@dataclasses.dataclass
class CodeIngestConfig:
    """The code ingest stage: read → vendored → license → language → size → generated → data-like →
    minified → line length → alphanumeric fraction → documents."""

    reader: CodeReaderConfig = dataclasses.field(default_factory=CodeReaderConfig)
    language: LanguageConfig = dataclasses.field(default_factory=LanguageConfig)
    vendored: VendoredConfig = dataclasses.field(default_factory=VendoredConfig)
    license: LicenseConfig = dataclasses.field(default_factory=LicenseConfig)
    size: SizeConfig = dataclasses.field(default_factory=SizeConfig)
    autogenerated: AutogeneratedConfig = dataclasses.field(default_factory=AutogeneratedConfig)
    data_like: DataLikeConfig = dataclasses.field(default_factory=DataLikeConfig)
    minified: MinifiedConfig = dataclasses.field(default_factory=MinifiedConfig)
    line_length: LineLengthConfig = dataclasses.field(default_factory=LineLengthConfig)
    alphanum: AlphanumConfig = dataclasses.field(default_factory=AlphanumConfig)
    output: OutputConfig = dataclasses.field(default_factory=OutputConfig)
