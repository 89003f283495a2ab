"""Programming language of a source file from its name: whole file name first, then extension.

The whole name wins because names such as ``Makefile`` or ``CMakeLists.txt`` say more than their
extension. Extensions are matched lower case and longest first, so ``.d.ts``-style compound
extensions could be listed beside ``.ts``.
"""

from __future__ import annotations

from tasks.documents import Document

from tasks.ingest.base import Filter
from tasks.ingest.code.config import LanguageConfig

UNKNOWN = ""


class LanguageTable:
    """Lookup built once from ``LanguageConfig`` (extension → language, file name → language)."""

    def __init__(self, cfg: LanguageConfig):
        self.by_name = dict(cfg.file_names)
        self.by_extension = {ext: language for language, exts in cfg.languages.items() for ext in exts}
        self._longest = max((ext.count(".") for ext in self.by_extension), default=1)

    def language_of(self, path: str) -> str:
        """The language of the file at ``path`` (any folder prefix), or ``""`` when unknown."""
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        if name in self.by_name:
            return self.by_name[name]
        lowered = name.lower()
        parts = lowered.split(".")
        # ".tar.gz"-style compound extensions first; a leading dot (".bashrc") is a name, not an extension.
        for n in range(min(self._longest, len(parts) - 1), 0, -1):
            ext = "." + ".".join(parts[-n:])
            if ext != lowered and ext in self.by_extension:
                return self.by_extension[ext]
        return UNKNOWN


class CodeLanguageFilter(Filter):
    """Sets ``lang`` and ``meta.language`` from ``meta.path``; drops unknown or unwanted languages.

    Reasons: ``code_unknown_language`` (not in the table, unless ``keep_unknown``),
    ``code_language_not_kept`` (not in ``keep_languages`` when that list is set).
    """

    name = "code_language"

    def __init__(self, cfg: LanguageConfig):
        self.cfg = cfg
        self.table = LanguageTable(cfg)
        self.keep_languages = frozenset(cfg.keep_languages)

    def keep(self, doc: Document) -> bool | tuple[bool, str]:
        language = self.table.language_of(doc.meta.get("path", ""))
        doc.lang = language
        doc.meta["language"] = language
        # the table does not know this file type
        if language == UNKNOWN and not self.cfg.keep_unknown:
            return False, "code_unknown_language"
        # only some languages are wanted
        if self.keep_languages and language not in self.keep_languages:
            return False, "code_language_not_kept"
        return True
