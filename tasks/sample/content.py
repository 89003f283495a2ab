"""The main content of each kind of sample page, built from ``sources`` with a seeded RNG.

Each builder returns a title and plain-text paragraphs (or code, or raw bytes); the crawl
plan decides where a page lives and the templates wrap it in HTML. Every function takes the
``random.Random`` it may use, so the same seed always builds the same pages.
"""

from __future__ import annotations

import dataclasses
import random
import re
import struct
import sys
import unicodedata
import zlib

from tasks.sample import sources

PROSE_MIN_WORDS = 150
PROSE_MAX_WORDS = 600
FOREIGN_MIN_WORDS = 80
FOREIGN_MAX_WORDS = 200
SHORT_MAX_WORDS = 18  # body of a "short" page; with title and any leaked widget it stays under 30
REUSE_MAX_WORDS = 50  # longest paragraph a second page may reuse (see ProseStream)
MIN_EDIT_RATE = 0.01
MAX_EDIT_RATE = 0.05

TITLE_PATTERNS = (
    "Notes on {}", "Understanding {}", "A closer look at {}", "How {} works", "Working with {}",
    "{} explained", "A guide to {}", "{} in practice",
)

SPAM_LINES = (
    "Buy cheap watches online with free shipping worldwide",
    "Click here to claim your free gift card today",
    "Best prices guaranteed, order now and save big",
    "Limited offer: download the full version for free",
    "Top ten deals of the week, do not miss out",
    "Earn money from home, no experience needed",
    "Cheap flights and hotels, book your trip now",
    "Win a brand new phone, enter the contest now",
    "Lose weight fast with this one simple trick",
    "Visit our shop for the best discount codes",
    "Subscribe now to get unlimited access",
    "Call now, our operators are standing by",
    "Free download, no registration required",
    "Read more reviews and compare prices here",
)

SHORT_TITLES = ("Update", "Notice", "Quick note", "Draft", "Coming soon", "Page moved", "Announcement")

LOREM_WORDS = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris "
    "nisi aliquip ex ea commodo consequat duis aute irure in reprehenderit voluptate velit esse "
    "cillum fugiat nulla pariatur excepteur sint occaecat cupidatat non proident sunt culpa qui "
    "officia deserunt mollit anim id est laborum"
).split()
LOREM_OPENING = "Lorem ipsum dolor sit amet, consectetur adipiscing elit."

_TRAILING_PUNCTUATION = ".,;:!?)\"'"
_DEFINED_NAME = re.compile(r"^(?: {4})?(?:async def|def|class) ([A-Za-z_]\w*)", re.MULTILINE)


@dataclasses.dataclass
class Content:
    """What a page shows: a title and paragraphs, or a code listing with an intro paragraph."""

    title: str
    paragraphs: list[str]
    note: str = ""
    code: str | None = None


def slugify(text: str, max_len: int = 60) -> str:
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    return slug[:max_len].rsplit("-", 1)[0] if len(slug) > max_len else slug or "page"


def prose_target_words(rng: random.Random) -> int:
    """150-600 words, most pages short and a long tail, as on documentation sites."""
    return PROSE_MIN_WORDS + round((PROSE_MAX_WORDS - PROSE_MIN_WORDS) * rng.random() ** 6)


class ProseStream:
    """Hands out English paragraphs without repeating one until all have been used.

    The first pass keeps each source's paragraphs together (modules in a seeded order), so a page
    reads as one topic. Later passes, needed when a crawl asks for more prose than the stdlib
    holds, shuffle the short paragraphs only: a page then shares at most a sentence or two with
    any earlier page, never enough to make the two near duplicates.
    """

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.passes = 0
        self._queue: list[sources.Paragraph] = []

    def _refill(self) -> None:
        paragraphs = list(sources.english_paragraphs())
        if self.passes == 0:
            groups: dict[str, list[sources.Paragraph]] = {}
            for paragraph in paragraphs:
                groups.setdefault(paragraph.source.split(".")[0], []).append(paragraph)
            order = sorted(groups)
            self.rng.shuffle(order)
            paragraphs = [p for key in order for p in groups[key]]
        else:
            paragraphs = [p for p in paragraphs if p.words <= REUSE_MAX_WORDS]
            self.rng.shuffle(paragraphs)
        self.passes += 1
        self._queue = paragraphs[::-1]  # pop() from the end is O(1)

    def next(self) -> sources.Paragraph:
        if not self._queue:
            self._refill()
        return self._queue.pop()

    def take(self, target_words: int) -> list[sources.Paragraph]:
        """Paragraphs adding up to at least ``target_words`` and at most ``PROSE_MAX_WORDS``.

        A paragraph that does not fit, or that repeats the page's phrasing (docstrings of one
        module often start alike), is handed to the next page instead, so prose pages pass
        Gopher-style repetition rules as the good pages they are meant to be.
        """
        taken: list[sources.Paragraph] = []
        page_words: list[str] = []
        deferred: list[sources.Paragraph] = []
        words = 0
        while words < target_words:
            candidate = self.next()
            candidate_words = sources.normalized_words(candidate.text)
            too_long = words + candidate.words > PROSE_MAX_WORDS
            if too_long or sources.repeated_share(page_words + candidate_words) > sources.MAX_REPEATED_SHARE:
                deferred.append(candidate)
                if too_long and words >= PROSE_MIN_WORDS:
                    break
                continue
            taken.append(candidate)
            page_words += candidate_words
            words += candidate.words
        self._queue.extend(reversed(deferred))  # the next page starts with them, in order
        return taken


def subject_of(source: str) -> str:
    if source.startswith("reference:"):
        return "Python " + source.split(":", 1)[1].replace("-", " ")
    return source


def prose_page(stream: ProseStream, rng: random.Random) -> Content:
    paragraphs = stream.take(prose_target_words(rng))
    title = rng.choice(TITLE_PATTERNS).format(subject_of(paragraphs[0].source))
    modules = sorted({p.source.split(".")[0] for p in paragraphs})
    shown = ", ".join(modules[:3]) + (", …" if len(modules) > 3 else "")
    # Pass 1 pages have paragraphs no other page has; later passes reuse them in new mixes.
    return Content(title, [p.text for p in paragraphs], note=f"stdlib docs pass {stream.passes}: {shown}")


def code_pages(count: int, rng: random.Random) -> list[Content]:
    """``count`` listings of distinct stdlib files (then further slices of the same files)."""
    files = list(sources.stdlib_source_files())
    rng.shuffle(files)
    slices_by_file = {}
    chosen: list[sources.CodeSlice] = []
    round_ = 0
    while len(chosen) < count:
        progressed = False
        for file in files:
            if len(chosen) == count:
                break
            if file not in slices_by_file:
                slices_by_file[file] = rng.sample(sources.code_slices_of(file), len(sources.code_slices_of(file)))
            if round_ < len(slices_by_file[file]):
                chosen.append(slices_by_file[file][round_])
                progressed = True
        if not progressed:
            raise ValueError(f"the stdlib has fewer than {count} code slices; ask for fewer pages")
        round_ += 1
    return [_code_content(piece, rng) for piece in chosen]


def _code_content(piece: sources.CodeSlice, rng: random.Random) -> Content:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    names = list(dict.fromkeys(_DEFINED_NAME.findall(piece.text)))[:4]
    defines = (f"It defines {', '.join(names[:-1]) + ' and ' if len(names) > 1 else ''}{names[-1]}, "
               "and shows how the standard library structures this part of the module."
               if names else "It continues the module's implementation between two definitions.")
    intro = rng.choice((
        f"The listing below shows lines {piece.first} to {piece.last} of Lib/{piece.file} from the "
        f"CPython {version} standard library. {defines}",
        f"Here is an excerpt of Lib/{piece.file}, lines {piece.first} to {piece.last}, taken from "
        f"the Python {version} sources. {defines}",
    ))
    title = f"Source of {piece.file}, lines {piece.first}-{piece.last}"
    return Content(title, [intro], note=f"Lib/{piece.file}:{piece.first}-{piece.last}", code=piece.text)


def foreign_page(lang: str, rng: random.Random) -> Content:
    """80-200 words of the bundled sentences for ``lang``, in 2-4 sentence paragraphs."""
    sentences = list(sources.foreign_sentences(lang))
    rng.shuffle(sentences)
    target = rng.randint(FOREIGN_MIN_WORDS, FOREIGN_MAX_WORDS)
    chosen: list[str] = []
    words = 0
    for sentence in sentences:
        n = len(sentence.split())
        if words + n > FOREIGN_MAX_WORDS:
            continue
        chosen.append(sentence)
        words += n
        if words >= target:
            break
    paragraphs = []
    while chosen:
        size = rng.randint(2, 4)
        paragraphs.append(" ".join(chosen[:size]))
        chosen = chosen[size:]
    title = " ".join(paragraphs[0].split()[: rng.randint(4, 7)]).rstrip(",.;:")
    return Content(title, paragraphs, note=f"bundled prose: {lang}")


def word_salad_page(rng: random.Random) -> Content:
    vocabulary = sources.english_vocabulary()
    words = [rng.choice(vocabulary) for _ in range(rng.randint(80, 300))]
    paragraphs = []
    while words:
        size = rng.randint(30, 80)
        paragraphs.append(" ".join(words[:size]))
        words = words[size:]
    title = " ".join(rng.choice(vocabulary) for _ in range(3)).title()
    return Content(title, paragraphs, note="word_salad")


def repeated_lines_page(rng: random.Random) -> Content:
    lines = rng.sample(SPAM_LINES, rng.randint(2, 4))
    return Content(lines[0], lines * rng.randint(15, 40), note="repeated_lines")


def short_page(rng: random.Random) -> Content:
    paragraph = rng.choice(sources.english_paragraphs()).text
    first_sentence = paragraph.split(". ")[0].rstrip(".") + "."
    words = first_sentence.split()
    if len(words) > SHORT_MAX_WORDS:
        words = words[: rng.randint(8, SHORT_MAX_WORDS)]
        words[-1] = words[-1].rstrip(".,;:") + "."
    return Content(rng.choice(SHORT_TITLES), [" ".join(words)], note="short")


def lorem_ipsum_page(rng: random.Random) -> Content:
    sentences = [LOREM_OPENING]
    words = len(LOREM_OPENING.split())
    target = rng.randint(80, 250)
    while words < target:
        sentence = [rng.choice(LOREM_WORDS) for _ in range(rng.randint(6, 14))]
        sentences.append(" ".join(sentence).capitalize() + ".")
        words += len(sentence)
    paragraphs = []
    while sentences:
        size = rng.randint(3, 6)
        paragraphs.append(" ".join(sentences[:size]))
        sentences = sentences[size:]
    return Content("Lorem ipsum dolor sit amet", paragraphs, note="lorem_ipsum")


LOW_QUALITY_BUILDERS = {
    "word_salad": word_salad_page,
    "repeated_lines": repeated_lines_page,
    "short": short_page,
    "lorem_ipsum": lorem_ipsum_page,
}


def edit_words(paragraphs: list[str], rng: random.Random) -> tuple[list[str], int, dict[str, int]]:
    """Replace, insert or delete 1-5% of the words of ``paragraphs`` at distinct positions.

    Returns the edited paragraphs, the number of words before editing and the count of each
    operation. Paragraph breaks and sentence ends are kept: a word that ends a clause is
    replaced rather than deleted, and its replacement keeps the punctuation.
    """
    vocabulary = sources.english_vocabulary()
    words = [(i, w) for i, p in enumerate(paragraphs) for w in p.split()]
    total = len(words)
    edits = max(1, round(total * rng.uniform(MIN_EDIT_RATE, MAX_EDIT_RATE)))
    counts = {"replace": 0, "insert": 0, "delete": 0}
    for position in sorted(rng.sample(range(total), edits), reverse=True):
        para, word = words[position]
        core = word.rstrip(_TRAILING_PUNCTUATION)
        op = rng.choice(("replace", "insert", "delete"))
        if op == "delete" and core != word:
            op = "replace"
        counts[op] += 1
        if op == "replace":
            words[position] = (para, _different_word(core, vocabulary, rng) + word[len(core):])
        elif op == "insert":
            words.insert(position + 1, (para, rng.choice(vocabulary)))
        else:
            del words[position]
    edited = [" ".join(w for i, w in words if i == n) for n in range(len(paragraphs))]
    return edited, total, counts


def _different_word(word: str, vocabulary: tuple[str, ...], rng: random.Random) -> str:
    while (choice := rng.choice(vocabulary)) == word.lower():
        pass
    return choice


def png_bytes(rng: random.Random) -> bytes:
    """A small, valid RGB PNG with a random gradient: a real image where HTML was expected."""
    width, height = rng.randint(8, 32), rng.randint(8, 32)
    base = [rng.randrange(256) for _ in range(3)]
    rows = b"".join(
        b"\x00" + bytes((base[c] + 7 * x + 5 * y) % 256 for x in range(width) for c in range(3))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")
