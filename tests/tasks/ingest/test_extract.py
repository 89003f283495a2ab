import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tasks.counters import Stats
from tasks.documents import Document
from tasks.ingest.config import ExtractConfig
from tasks.ingest.config import EXTRACT_ENGINES
from tasks.ingest.extract import Extract, ExtractTimeout, code_blocks, extract_text, time_limit
from tests.tasks.ingest.crawl_files import article_page, prose

CODE = "\n".join(
    ["def accumulate(items):", "    total = 0"]
    + [f"    total += compute_value(item_{i}, factor={i})" for i in range(25)]
    + ["    return total"]
)


def html_doc(html: str, url: str = "https://a.example/") -> Document:
    return Document(id="d", url=url, text=html, meta={"format": "html"})


def run(docs, **cfg):
    stats = Stats()
    out = list(Extract(ExtractConfig(**cfg)).run(docs, stats))
    return out, stats


@pytest.fixture(params=EXTRACT_ENGINES)
def engine(request):
    return request.param


def reasons(stats):
    return {k: v for k, v in stats.items() if k.startswith(("dropped.", "failed."))}


def test_extracts_the_article_and_leaves_navigation_and_footer_out(engine):
    (doc,), stats = run([html_doc(article_page("Flood", prose(0)))], engine=engine)
    assert "The river rose slowly after three days" in doc.text
    assert "About us" not in doc.text and "Imprint" not in doc.text
    assert doc.meta["format"] == "text"
    assert stats["in"] == stats["out"] == 1 and stats["time.extract_s"] > 0


def test_a_page_without_main_text_is_dropped_as_empty(engine):
    docs, stats = run([html_doc("<html><head><title>t</title><script>var a = 1;</script></head><body> <img src='a.png'> </body></html>")], engine=engine)
    assert docs == [] and reasons(stats) == {"dropped.extract_empty": 1}


def test_html_over_the_size_cap_is_dropped_before_parsing():
    page = article_page("Flood", prose(0))
    docs, stats = run([html_doc(page)], max_html_bytes=len(page) - 1)
    assert docs == [] and reasons(stats) == {"dropped.extract_too_large": 1}
    assert "time.extract_s" not in stats


def test_the_size_cap_counts_utf8_bytes_not_characters():
    page = article_page("Flood", prose(0)).replace("river", "rivière")
    extra = len(page.encode()) - len(page)
    assert extra > 0
    docs, stats = run([html_doc(page)], max_html_bytes=len(page) + extra - 1)
    assert reasons(stats) == {"dropped.extract_too_large": 1}


def test_documents_that_are_not_html_pass_through_untouched():
    doc = Document(id="t", url="", text="already text", meta={"format": "text"})
    (out,), stats = run([doc])
    assert out is doc and out.text == "already text" and stats == {"in": 1, "out": 1}


# ---------------------------------------------------------------------------------------------
# Time limit


def _spin_until_interrupted(seconds: float) -> float:
    started = time.monotonic()
    try:
        with time_limit(seconds):
            while True:
                pass
    except ExtractTimeout:
        return time.monotonic() - started


def test_time_limit_interrupts_a_busy_loop_in_the_main_thread():
    assert 0.1 <= _spin_until_interrupted(0.1) < 2.0


def test_time_limit_interrupts_busy_loops_in_worker_threads_independently():
    # Dask runs tasks in worker threads, where signal-based timeouts cannot work.
    with ThreadPoolExecutor(2) as pool:
        short, long = pool.map(_spin_until_interrupted, [0.05, 0.3])
    assert 0.05 <= short < 2.0 and 0.3 <= long < 3.0
    assert threading.current_thread() is threading.main_thread()


def test_a_deadline_never_fires_after_its_block_has_ended():
    # Deadlines close to the end of the block: the timeout may hit inside the block (allowed, and
    # caught around it) but never later, in code that runs without a limit.
    for _ in range(300):
        try:
            with time_limit(0.001):
                sum(range(2000))
        except ExtractTimeout:
            pass
    deadline = time.monotonic() + 0.1
    while time.monotonic() < deadline:  # bytecode running past every deadline set above
        sum(range(100))


def test_a_slow_extraction_is_dropped_as_a_timeout_and_the_next_page_still_extracted():
    # trafilatura: a Python loop over lxml calls, which the watchdog interrupts (about 3 s of work here, 60 times
    # the limit). resiliparse's one native call holds the interpreter until it returns (0.1 s here), so whether its
    # deadline fires before the block ends is a race; the size cap bounds that engine instead.
    rows = "".join(f"<div><p>Row {i} of a very long table of words and things.</p><span>{i}</span></div>" for i in range(20_000))
    slow = html_doc(f"<html><body>{rows}</body></html>", url="https://slow.example/")
    fine = html_doc(article_page("Flood", prose(0)))
    started = time.monotonic()
    docs, stats = run([slow], engine="trafilatura", timeout_s=0.05)
    assert time.monotonic() - started < 3.0
    assert docs == [] and reasons(stats) == {"dropped.extract_timeout": 1}
    docs, stats = run([fine], timeout_s=5.0)
    assert len(docs) == 1


# ---------------------------------------------------------------------------------------------
# Code pages


def _code_page(body: str) -> str:
    return (
        "<html><head><title>accumulate.py</title></head><body>"
        "<header><nav><a href='/'>Sign in</a> <a href='/pricing'>Pricing</a></nav></header>"
        f"<main>{body}</main><footer>Terms Privacy</footer></body></html>"
    )


@pytest.mark.parametrize("layout", ["pre", "highlighted_pre", "code_table", "code_without_pre"])
def test_code_pages_keep_their_code(layout, engine):
    lines = CODE.split("\n")
    body = {
        "pre": f"<pre>{CODE}</pre>",
        "highlighted_pre": "<div class='highlight'><pre>" + "\n".join(f"<span class='k'>{line}</span>" for line in lines) + "</pre></div>",
        "code_table": "<table class='highlight'>" + "".join(
            f"<tr><td class='blob-num'>{i}</td><td class='blob-code'>{line}</td></tr>" for i, line in enumerate(lines, 1)
        ) + "</table>",
        "code_without_pre": f"<article><h2>Example</h2><p>Sum the values in a loop.</p><code>{CODE}</code></article>",
    }[layout]
    (doc,), stats = run([html_doc(_code_page(body))], engine=engine)
    assert "total += compute_value(item_24, factor=24)" in doc.text
    assert "def accumulate(items):" in doc.text
    assert doc.meta["format"] == "code" and stats["code_pages"] == 1


def test_a_prose_page_with_a_small_snippet_stays_prose(engine):
    page = article_page("Flood", prose(0, 16)).replace("</article>", "<pre>x = 1\ny = 2\nprint(x + y)  # add them up</pre></article>")
    (doc,), stats = run([html_doc(page)], engine=engine)
    assert doc.meta["format"] == "text" and "code_pages" not in stats


def test_line_number_gutters_are_not_code_blocks():
    from trafilatura.utils import load_html

    numbers = "\n".join(str(i) for i in range(1, 40))
    page = f"<html><body><table><tr><td><pre>{numbers}</pre></td><td class='code'><pre>{CODE}</pre></td></tr></table></body></html>"
    assert code_blocks(load_html(page), 40) == [CODE]


def test_extract_text_returns_empty_for_markup_without_text(engine):
    assert extract_text("<html><body></body></html>", ExtractConfig(engine=engine)) == ("", False)


def test_an_unknown_engine_is_refused_at_load():
    with pytest.raises(ValueError, match="extract.engine must be one of resiliparse, trafilatura"):
        ExtractConfig(engine="boilerpipe")
