"""Language by file name and extension, the language step's reasons, and the table's validation."""

from __future__ import annotations

import pytest

from tasks.config import ConfigError, from_dict
from tasks.counters import Stats
from tasks.documents import Document
from tasks.ingest.code.config import CodeIngestConfig, LanguageConfig
from tasks.ingest.code.language import CodeLanguageFilter, LanguageTable


@pytest.mark.parametrize("path,language", [
    ("src/app.py", "Python"),
    ("stubs/os.pyi", "Python"),
    ("SRC/MAIN.PY", "Python"),  # extensions match in any case
    ("web/index.ts", "TypeScript"),
    ("web/view.jsx", "JavaScript"),
    ("kernel/sched.c", "C"),
    ("lib/vector.hpp", "C++"),
    ("cmd/main.go", "Go"),
    ("src/lib.rs", "Rust"),
    ("scripts/build.sh", "Shell"),
    ("README.md", "Markdown"),
    ("Makefile", "Makefile"),
    ("deps/zlib/CMakeLists.txt", "CMake"),  # the whole name wins over ".txt"
    ("docker/Dockerfile", "Dockerfile"),
    ("home/.bashrc", "Shell"),
    ("notes.txt", ""),
    ("backup.tar.gz", ""),
    (".gitignore", ""),  # a leading dot starts a name, not an extension
    ("LICENSE", ""),
    ("", ""),
])
def test_language_comes_from_the_file_name_then_the_extension(path, language):
    assert LanguageTable(LanguageConfig()).language_of(path) == language


def run_language(cfg: LanguageConfig, *paths: str) -> tuple[list[Document], Stats]:
    docs = [Document(id=p, url="", text="x = 1\n", source="code", meta={"path": p}) for p in paths]
    stats = Stats()
    return list(CodeLanguageFilter(cfg).run(docs, stats)), stats


def test_the_language_step_tags_lang_and_meta_and_drops_unknown_files():
    kept, stats = run_language(LanguageConfig(), "a.py", "b.go", "notes.txt")
    assert [(d.lang, d.meta["language"]) for d in kept] == [("Python", "Python"), ("Go", "Go")]
    assert stats["dropped.code_unknown_language"] == 1 and stats["out"] == 2


def test_unknown_files_are_kept_when_asked_with_an_empty_language():
    kept, stats = run_language(LanguageConfig(keep_unknown=True), "notes.txt")
    assert [d.lang for d in kept] == [""] and "dropped.code_unknown_language" not in stats


def test_only_the_listed_languages_are_kept_when_a_list_is_given():
    kept, stats = run_language(LanguageConfig(keep_languages=["Go"]), "a.py", "b.go")
    assert [d.lang for d in kept] == ["Go"]
    assert stats["dropped.code_language_not_kept"] == 1


def test_the_language_table_can_be_replaced_from_config():
    cfg = from_dict(CodeIngestConfig, {"language": {"languages": {"Starlark": [".bzl"]}, "file_names": {}}})
    table = LanguageTable(cfg.language)
    assert table.language_of("rules/defs.bzl") == "Starlark" and table.language_of("a.py") == ""


@pytest.mark.parametrize("section,message", [
    ({"languages": {"Python": [".py"], "Snake": [".py"]}}, "listed for both"),
    ({"languages": {"Python": ["py"]}}, "with the dot"),
    ({"languages": {"Python": [".PY"]}}, "lower case"),
    ({"languages": {"Python": ".py"}}, "must be a list"),
    ({"keep_languages": ["Cobol"]}, "not in the language table"),
])
def test_a_bad_language_table_is_a_config_error_naming_the_problem(section, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(CodeIngestConfig, {"language": section})


@pytest.mark.parametrize("data,message", [
    ({"reader": {"format": "rar"}}, "reader.format"),
    ({"reader": {"folders": "both"}}, "reader.folders"),
    ({"reader": {"encodings": ["no-such-codec"]}}, "unknown encoding"),
    ({"reader": {"max_file_bytes": 0}}, "max_file_bytes"),
    ({"alphanum": {"min_fraction": 1.5}}, "alphanum.min_fraction"),
    ({"size": {"data_min_chars": 6000}}, "data_min_chars"),
    ({"line_length": {"max_line_lenght": 10}}, "unknown config key"),
])
def test_bad_code_ingest_settings_are_config_errors(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(CodeIngestConfig, data)
