"""The plan of a sample crawl: which pages exist, of what category, at which URL, in what order.

Categories and their shares of the crawl (the rest is ``prose_en``):

    code 8%  exact_dup 5%  near_dup 5%  non_english 10%  low_quality 12%  malformed ~1%

Every duplicate comes after its original in crawl order, so "keep the first" is the right
answer for dedup. Each component draws from its own RNG seeded with ``(seed, component)``:
changing how many code pages there are does not change the prose pages.
"""

from __future__ import annotations

import dataclasses
import random

from tasks.sample import content, sources
from tasks.sample.content import Content
from tasks.sample.templates import LAYOUTS, UI, Site

CATEGORIES = ("prose_en", "code", "exact_dup", "near_dup", "non_english", "low_quality", "malformed")
SHARES = {"code": 0.08, "exact_dup": 0.05, "near_dup": 0.05, "non_english": 0.10, "low_quality": 0.12}
MALFORMED_SHARE = 0.01
MALFORMED_KINDS = ("truncated", "undecodable", "empty", "non_html")
MIN_PER_MALFORMED_KIND = 2
LOW_QUALITY_KINDS = tuple(content.LOW_QUALITY_BUILDERS)
MIN_PAGES = 40  # the smallest crawl with every category, language and subtype at least once
# Originals of duplicates are taken from the first part of the crawl so their copies can follow.
ORIGINAL_WINDOW = 0.85
# One exact duplicate in this many copies an original that already has one (clusters of three).
THIRD_COPY_EVERY = 6
PAGES_PER_SITE = 40

EN_HOSTS = ("docs.example-{}.org", "www.example-{}.com", "blog.example-{}.net", "wiki.example-{}.org",
            "learn.example-{}.io")
SECTIONS = ("library", "guide", "articles", "notes", "reference", "howto")
FOREIGN_SECTIONS = {"de": ("artikel", "magazin"), "fr": ("articles", "magazine"),
                    "es": ("articulos", "revista"), "it": ("articoli", "rivista")}
SITE_WORDS = ("Quiet", "Blue", "Copper", "Paper", "Maple", "Harbor", "Signal", "Orbit", "Lantern",
              "Cedar", "Pixel", "Summit")
SITE_NOUNS = ("Notes", "Journal", "Docs", "Review", "Digest", "Library", "Workshop", "Almanac")
SERVERS = ("nginx", "Apache", "nginx/1.24.0", "Apache/2.4.58 (Ubuntu)", "cloudflare")


@dataclasses.dataclass
class Page:
    """One planned page. ``content`` is None for payloads that are not HTML (empty, image)."""

    category: str
    lang: str | None
    content: Content | None
    site: Site
    url: str = ""
    note: str = ""
    dup_of: Page | None = None
    edit_rate: float | None = None
    malformed: str | None = None


def rng_for(seed: int, component: str) -> random.Random:
    # A str seed is hashed with SHA-512 by random.seed, independent of PYTHONHASHSEED.
    return random.Random(f"smelt-sample:{seed}:{component}")


def category_counts(pages: int) -> dict[str, int]:
    """How many pages of each category a crawl of ``pages`` pages holds."""
    if pages < MIN_PAGES:
        raise ValueError(f"a sample crawl needs at least {MIN_PAGES} pages to hold every category; got pages={pages}")
    counts = {name: round(pages * share) for name, share in SHARES.items()}
    per_kind = max(MIN_PER_MALFORMED_KIND, round(pages * MALFORMED_SHARE / len(MALFORMED_KINDS)))
    counts["malformed"] = per_kind * len(MALFORMED_KINDS)
    counts["prose_en"] = pages - sum(counts.values())
    return {name: counts[name] for name in CATEGORIES}


def split_evenly(total: int, names: tuple[str, ...]) -> list[str]:
    """``total`` labels cycling through ``names``: 10 over (a, b, c) gives 4 a, 3 b, 3 c."""
    return [names[i % len(names)] for i in range(total)]


class SiteDirectory:
    """The sites of the crawl and the URLs taken on them; every URL is handed out once."""

    def __init__(self, pages: int, rng: random.Random):
        self.rng = rng
        self._taken: set[str] = set()
        self._number = 0
        self.by_lang: dict[str, list[Site]] = {"en": [self._site("en") for _ in range(max(4, pages // PAGES_PER_SITE))]}
        for lang in sources.FOREIGN_LANGS:
            self.by_lang[lang] = [self._site(lang) for _ in range(max(1, pages // (PAGES_PER_SITE * 10)))]

    def _site(self, lang: str) -> Site:
        self._number += 1
        n = self._number
        host = self.rng.choice(EN_HOSTS).format(n) if lang == "en" else f"www.example-{n}.{lang}"
        return Site(
            host=host,
            name=f"{self.rng.choice(SITE_WORDS)} {self.rng.choice(SITE_NOUNS)}",
            lang=lang,
            layout=self.rng.randrange(LAYOUTS),
            cookie_text=self.rng.randrange(len(UI[lang]["cookies"])),
            server=self.rng.choice(SERVERS),
            charset=self.rng.choice(("utf-8", "utf-8", "UTF-8")),
            tracking_id=f"ST-{self.rng.randrange(16**8):08X}",
        )

    def pick(self, lang: str, avoid: Site | None = None) -> Site:
        candidates = [s for s in self.by_lang[lang] if s is not avoid] or self.by_lang[lang]
        return self.rng.choice(candidates)

    def claim(self, site: Site, path: str) -> str:
        """``https://host/path``, with ``-2``, ``-3``… before the extension if already taken."""
        stem, dot, ext = path.rpartition(".")
        url, n = f"https://{site.host}{path}", 1
        while url in self._taken:
            n += 1
            url = f"https://{site.host}{stem}-{n}{dot}{ext}"
        self._taken.add(url)
        return url

    def page_url(self, site: Site, title: str) -> str:
        sections = SECTIONS if site.lang == "en" else FOREIGN_SECTIONS[site.lang]
        return self.claim(site, f"/{self.rng.choice(sections)}/{content.slugify(title)}.html")


def _malformed_content(kind: str, stream: content.ProseStream, rng: random.Random) -> Content | None:
    """Truncated and undecodable pages carry real prose; empty and image payloads carry none."""
    return content.prose_page(stream, rng) if kind in ("truncated", "undecodable") else None


def base_pages(counts: dict[str, int], sites: SiteDirectory, seed: int) -> list[Page]:
    """Every page that is not a duplicate, grouped by category (not yet in crawl order)."""
    prose_rng, stream = rng_for(seed, "prose"), content.ProseStream(rng_for(seed, "prose-stream"))
    pages = []
    for _ in range(counts["prose_en"]):
        article = content.prose_page(stream, prose_rng)
        pages.append(Page("prose_en", "en", article, sites.pick("en"), note=article.note))
    for article in content.code_pages(counts["code"], rng_for(seed, "code")):
        pages.append(Page("code", "en", article, sites.pick("en"), note=article.note))
    foreign_rng = rng_for(seed, "non_english")
    for lang in split_evenly(counts["non_english"], sources.FOREIGN_LANGS):
        article = content.foreign_page(lang, foreign_rng)
        pages.append(Page("non_english", lang, article, sites.pick(lang), note=article.note))
    low_rng = rng_for(seed, "low_quality")
    for kind in split_evenly(counts["low_quality"], LOW_QUALITY_KINDS):
        article = content.LOW_QUALITY_BUILDERS[kind](low_rng)
        lang = None if kind == "lorem_ipsum" else "en"  # placeholder Latin is no language
        pages.append(Page("low_quality", lang, article, sites.pick("en"), note=kind))
    malformed_rng = rng_for(seed, "malformed")
    for kind in split_evenly(counts["malformed"], MALFORMED_KINDS):
        article = _malformed_content(kind, stream, malformed_rng)
        lang = "en" if article is not None else None
        pages.append(Page("malformed", lang, article, sites.pick("en"), note=kind, malformed=kind))
    for page in pages:
        if page.malformed == "non_html":
            image = f"{content.slugify(page.site.name)}-{sites.rng.randrange(10**6)}"
            page.url = sites.claim(page.site, f"/images/{image}.png")
        elif page.content is None:
            page.url = sites.claim(page.site, f"/{sites.rng.choice(SECTIONS)}/index.html")
        else:
            page.url = sites.page_url(page.site, page.content.title)
    return pages


def _copy_url(original: Page, sites: SiteDirectory) -> tuple[Site, str]:
    """A duplicate lives on a mirror site under the same path, or on a print view of the same site."""
    path = original.url.split(original.site.host, 1)[1]
    if sites.rng.random() < 0.6:
        site = sites.pick("en", avoid=original.site)
        return site, sites.claim(site, path)
    return original.site, sites.claim(original.site, "/print" + path)


def duplicate_pages(
    originals: list[Page], counts: dict[str, int], sites: SiteDirectory, seed: int
) -> list[Page]:
    """Exact and near duplicates of prose pages; ``originals`` are the eligible prose pages."""
    rng = rng_for(seed, "duplicates")
    n_exact, n_near = counts["exact_dup"], counts["near_dup"]
    n_third = n_exact // THIRD_COPY_EVERY
    if len(originals) < n_exact - n_third + n_near:
        raise ValueError("too few prose pages to duplicate; ask for more pages")
    picked = rng.sample(originals, n_exact - n_third + n_near)
    exact_sources = picked[: n_exact - n_third]
    exact_sources += [rng.choice(exact_sources) for _ in range(n_third)]
    copies = []
    for original in exact_sources:
        site, url = _copy_url(original, sites)
        copies.append(Page("exact_dup", "en", original.content, site, url, note="exact copy", dup_of=original))
    for original in picked[n_exact - n_third :]:
        paragraphs, words, ops = content.edit_words(original.content.paragraphs, rng)
        edits = sum(ops.values())
        edited = Content(original.content.title, paragraphs)
        site, url = _copy_url(original, sites)
        note = ", ".join(f"{n} {op}" for op, n in ops.items() if n)
        copies.append(Page("near_dup", "en", edited, site, url, note=f"{edits} word edits ({note})",
                           dup_of=original, edit_rate=round(edits / words, 4)))
    return copies


def plan_crawl(pages: int, seed: int) -> list[Page]:
    """All pages of the crawl in crawl order; each duplicate after its original."""
    counts = category_counts(pages)
    sites = SiteDirectory(pages, rng_for(seed, "sites"))
    base = base_pages(counts, sites, seed)
    order_rng = rng_for(seed, "order")
    order_rng.shuffle(base)
    window = int(len(base) * ORIGINAL_WINDOW)
    originals = [p for p in base[:window] if p.category == "prose_en"]
    copies = duplicate_pages(originals, counts, sites, seed)
    position = {id(page): i for i, page in enumerate(base)}
    keyed = [(float(i), i, page) for i, page in enumerate(base)]
    for n, copy in enumerate(copies):
        after = position[id(copy.dup_of)]
        keyed.append((order_rng.uniform(after + 0.5, len(base)), len(base) + n, copy))
    keyed.sort(key=lambda item: item[:2])
    return [page for _, _, page in keyed]
