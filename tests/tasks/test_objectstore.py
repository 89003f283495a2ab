"""The object-store preflight finds every bucket among a flow's parameters (the store itself: tests/engines/test_s3.py)."""

from __future__ import annotations

import time

import pytest

from tasks.objectstore import BUCKET_URL_RE, StoreError, preflight_all


def test_buckets_are_found_in_urls_name_url_pairs_and_command_lines():
    text = 'web=s3://crawl-a/x,code=s3a://code-b/y --root "s3://out-c" s3://crawl-a/again'
    assert BUCKET_URL_RE.findall(text) == ["s3://crawl-a", "s3a://code-b", "s3://out-c", "s3://crawl-a"]


def test_local_values_pass_without_touching_a_store(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # would refuse, were it asked
    preflight_all("/data/crawl/*.warc.gz", ["file:///r", "web=/data/tokens"], None, [])


def test_an_s3_value_anywhere_is_checked_and_a_dead_endpoint_is_one_sentence(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # a closed port on loopback
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    start = time.monotonic()
    with pytest.raises(StoreError, match="cannot connect to the object store at http://127.0.0.1:9") as e:
        preflight_all("/local/root", ["web=s3://smelt-nowhere/tokens"])
    assert time.monotonic() - start < 15 and "\n" not in str(e.value)
