"""The design map, the READMEs and the code's comments stay true: every test, file and design section they cite
exists, and they cite nothing outside the repository."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CITED = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _missing_tests(text: str) -> list[str]:
    missing = []
    for path, name in CITED.findall(text):
        if not (REPO / path).is_file():
            missing.append(path)
        elif name and name not in _test_names(REPO / path):
            missing.append(f"{path}::{name}")
    return missing


@pytest.mark.parametrize("doc", ["docs/design.md", "README.md", "infra/README.md"])
def test_every_cited_test_exists(doc):
    missing = _missing_tests((REPO / doc).read_text())
    assert missing == [], f"{doc} cites tests that do not exist: {missing}"


@pytest.mark.parametrize("doc", ["docs/design.md", "README.md"])
def test_docs_point_only_inside_the_repository(doc):
    text = (REPO / doc).read_text()
    assert "../" not in text, f"{doc} links outside the repository"
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        if not re.match(r"[a-z]+://", link):
            assert (REPO / link).exists(), f"{doc} links to {link}, which is not in the repository"


# Citations checked in prose: a path from the repository root (a file with its extension, or a folder ending in
# "/"), a design section ("docs/design.md §4", "[docs/design.md](docs/design.md) §4") and a markdown file's
# name, which must be one the repository holds.
TOP = r"(?:tasks|flows|infra|bench|tests|configs|docs)/"
FILE = re.compile(rf"(?<![\w/.<>*{{}}-])({TOP}[\w/.-]*?\w\.(?:py|md|toml|ya?ml|json|sh|txt))(?![\w*{{<])")
FOLDER = re.compile(rf"(?<![\w/.<>*{{}}-])({TOP}(?:[\w.-]+/)*)(?![\w*{{<.-])")
SECTION = re.compile(r"((?i:design)\.md)(?:\]\([^)]*\))?\s*§(\d+)")
MARKDOWN = re.compile(r"(?<![\w/.-])([A-Za-z][\w-]*\.md)\b")
DOCS = ["docs/design.md", "README.md", "infra/README.md"]
CODE = ["tasks", "flows", "infra", "bench", "tests"]


def _design_sections() -> set[int]:
    return {int(n) for n in re.findall(r"^## (\d+)\.", (REPO / "docs/design.md").read_text(), re.M)}


def _prose(path: Path) -> str:
    """A Python file's docstrings and comments: where it cites files and sections."""
    text = path.read_text()
    parts = [ast.get_docstring(node, clean=False) or "" for node in ast.walk(ast.parse(text))
             if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    parts += [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type == tokenize.COMMENT]
    return "\n".join(parts)


def _wrong_citations(text: str, markdown_names: set[str], own_sections: bool = False) -> list[str]:
    sections = _design_sections()
    wrong = [path for path in FILE.findall(text) if not (REPO / path).is_file()]
    wrong += [path for path in FOLDER.findall(text) if not (REPO / path).is_dir()]
    wrong += [f"{name} §{n}" for name, n in SECTION.findall(text) if name != "design.md" or int(n) not in sections]
    wrong += [name for name in MARKDOWN.findall(text) if name not in markdown_names]
    if own_sections:  # every "§N" in design.md is one of its own sections
        wrong += [f"§{n}" for n in re.findall(r"§(\d+)", text) if int(n) not in sections]
    return wrong


def _markdown_names() -> set[str]:
    nested = {p.name for folder in [*CODE, "docs"] for p in (REPO / folder).rglob("*.md")}
    return nested | {p.name for p in REPO.glob("*.md")}


@pytest.mark.parametrize("doc", DOCS)
def test_every_file_and_design_section_a_doc_cites_exists(doc):
    wrong = _wrong_citations((REPO / doc).read_text(), _markdown_names(), own_sections=doc == "docs/design.md")
    assert wrong == [], f"{doc} cites files or design sections that do not exist: {wrong}"


def test_every_file_design_section_and_test_a_comment_or_docstring_cites_exists():
    names = _markdown_names()
    wrong = {}
    for folder in CODE:
        for path in sorted((REPO / folder).rglob("*.py")):
            prose = _prose(path)
            if found := _wrong_citations(prose, names) + _missing_tests(prose):
                wrong[str(path.relative_to(REPO))] = found
    assert wrong == {}, f"comments and docstrings cite files or design sections that do not exist: {wrong}"


def test_the_citation_checks_catch_a_missing_section_file_folder_markdown_and_test():
    """The checks above can fail: each kind of wrong citation, in prose as a comment would hold it."""
    prose = ("see DESIGN.md §9 and docs/design.md §99; tasks/nowhere.py, flows/gone/ and STYLE.md say so; "
             "`tests/test_docs.py::test_that_was_renamed`. docs/design.md §1, tasks/contract.py and tasks/ are fine.")
    assert _wrong_citations(prose, _markdown_names()) == ["tasks/nowhere.py", "flows/gone/", "DESIGN.md §9",
                                                          "design.md §99", "DESIGN.md", "STYLE.md"]
    assert _missing_tests(prose) == ["tests/test_docs.py::test_that_was_renamed"]
