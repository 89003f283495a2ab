"""The object-store preflight finds every bucket among a flow's parameters (the store itself: tests/engines/test_s3.py)."""

from __future__ import annotations

import copy
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


S3_SETTINGS = {"connect_timeout": 5.0, "read_timeout": 60.0, "retries": {"max_attempts": 3, "mode": "standard"}}


def attempts(config: dict) -> dict:
    """``config`` with its retries as total attempts: botocore rewrites ``retries.max_attempts`` (retries) into
    ``total_max_attempts`` (retries + 1) in the dict it is given, in place, once any client was built."""
    config = copy.deepcopy(config)
    retries = config["retries"]
    if "max_attempts" in retries:
        retries["total_max_attempts"] = retries.pop("max_attempts") + 1
    return config


def test_every_s3_client_smelt_opens_keeps_the_5_s_timeout_and_3_retries():
    """One home for the S3 client's settings: ``storage.filesystem`` (every reader and writer of datasets) and
    DCP's checkpoint writer and reader get the same ones. fsspec replaces a config key passed as an argument
    whole, so a second ``config_kwargs`` anywhere would drop the retries here. Building a client opens no
    connection."""
    from tasks import storage
    from tasks.checkpoint_reader import storage_reader
    from tasks.train.checkpoint_writer import storage_writer

    fs, _ = storage.filesystem("s3://smelt-nowhere/a/b")
    assert attempts(fs.config_kwargs) == attempts(S3_SETTINGS)
    writer = storage_writer("s3://smelt-nowhere/run/checkpoints/step-00000001").fs.fs.config_kwargs
    reader = storage_reader("s3://smelt-nowhere/run/checkpoints/step-00000001").fs.fs.config_kwargs
    assert attempts(writer) == attempts(reader) == attempts(S3_SETTINGS)


def test_a_callers_own_timeouts_replace_only_the_timeouts():
    from tasks.objectstore import remote_options

    options = remote_options("s3://smelt-nowhere/x", 2.0, 7.0)
    assert list(options) == ["config_kwargs"]
    assert attempts(options["config_kwargs"]) == attempts({**S3_SETTINGS, "connect_timeout": 2.0, "read_timeout": 7.0})
    assert remote_options("file:///tmp/x") == {} and remote_options("memory://x", 2.0, 7.0) == {}
    timeout = remote_options("https://example.org/x", read_s=9.0)["client_kwargs"]["timeout"]
    assert (timeout.sock_connect, timeout.sock_read) == (30.0, 9.0)
