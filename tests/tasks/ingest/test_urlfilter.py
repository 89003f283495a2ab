import pickle

import pytest

from tasks.counters import Stats
from tasks.documents import Document
from tasks.ingest.config import URLFilterConfig
from tasks.ingest.urlfilter import URLFilter, domain_suffixes, host_of


@pytest.fixture
def lists(tmp_path):
    domains = tmp_path / "domains.txt"
    domains.write_text("# blocked domains\nexample.com\n\nBadSite.ORG  # trailing comment\n")
    words = tmp_path / "words.txt"
    words.write_text("casino\n# comment\nXXX\n")
    return f"file://{domains}", f"file://{words}"


def run(step: URLFilter, *urls: str) -> tuple[list[str], Stats]:
    stats = Stats()
    kept = list(step.run([Document(id=str(i), url=u, text="t") for i, u in enumerate(urls)], stats))
    return [d.url for d in kept], stats


def test_without_lists_every_document_passes():
    kept, stats = run(URLFilter(URLFilterConfig()), "https://example.com/", "")
    assert kept == ["https://example.com/", ""] and stats == {"in": 2, "out": 2, "skipped.no_url": 1}


def test_blocked_domains_block_their_subdomains_only(lists):
    step = URLFilter(URLFilterConfig(blocked_domains_url=lists[0]))
    kept, stats = run(
        step,
        "http://example.com/page",
        "https://shop.EXAMPLE.com:8443/x",
        "https://badsite.org/",
        "https://notexample.com/",
        "https://example.com.mirror.net/",
    )
    assert kept == ["https://notexample.com/", "https://example.com.mirror.net/"]
    assert stats == {"in": 5, "out": 2, "dropped.url_blocked_domain": 3}


def test_banned_words_must_be_whole_url_tokens(lists):
    step = URLFilter(URLFilterConfig(banned_words_url=lists[1]))
    kept, stats = run(step, "https://a.net/best-casino-bonus", "https://a.net/casinos", "https://xxx.a.net/", "https://a.net/sussex")
    assert kept == ["https://a.net/casinos", "https://a.net/sussex"]
    assert stats["dropped.url_banned_word"] == 2


def test_documents_without_url_are_kept_and_counted(lists):
    kept, stats = run(URLFilter(URLFilterConfig(blocked_domains_url=lists[0])), "")
    assert kept == [""] and stats == {"in": 1, "out": 1, "skipped.no_url": 1}


def test_a_missing_list_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="url_filter.banned_words_url points to"):
        URLFilter(URLFilterConfig(banned_words_url=str(tmp_path / "missing.txt")))


def test_disabled_filter_ignores_its_lists(lists):
    kept, stats = run(URLFilter(URLFilterConfig(enabled=False, blocked_domains_url=lists[0])), "http://example.com/")
    assert kept == ["http://example.com/"] and stats == {}


def test_lists_can_live_on_any_fsspec_filesystem():
    import fsspec

    with fsspec.open("memory://test-urlfilter/domains.txt", "w") as f:
        f.write("example.com\n")
    step = pickle.loads(pickle.dumps(URLFilter(URLFilterConfig(blocked_domains_url="memory://test-urlfilter/domains.txt"))))
    assert run(step, "http://www.example.com/", "http://example.net/")[0] == ["http://example.net/"]


def test_hosts_and_their_suffixes():
    assert host_of("HTTPS://User@Sub.Example.COM:80/p?q#f") == "sub.example.com"
    assert host_of("example.com/path") == "example.com"
    assert host_of("http://[::1/") == ""
    assert domain_suffixes("a.b.com") == ["a.b.com", "b.com", "com"]
