"""Object stores (S3 and S3-compatible): client defaults that suit many processes sharing one store,
the options every remote fsspec client is opened with (``remote_options``, http(s) too), and a fast
preflight that turns a misconfigured store into one sentence.

Credentials and endpoint come the standard way (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, or fsspec config such as ``FSSPEC_S3_ENDPOINT_URL``); the
defaults below only fill keys the user's fsspec config leaves unset.

- No listings cache: every process of a run (flow, ranks, launcher) writes to the same prefixes,
  and a cached listing hid a checkpoint committed a second earlier.
- Bounded timeouts and retries: a dead endpoint fails in seconds, not after minutes of backoff,
  while transient errors still get a few retries.
"""

from __future__ import annotations

import concurrent.futures
import copy
import re
from typing import Any
from urllib.parse import urlparse

import fsspec

PREFLIGHT_TIMEOUT_S = 10.0
BUCKET_URL_RE = re.compile(r"s3a?://[^/,\s\"']+")
S3_CONNECT_TIMEOUT_S, S3_READ_TIMEOUT_S, S3_MAX_ATTEMPTS = 5.0, 60.0, 3
HTTP_CONNECT_TIMEOUT_S, HTTP_READ_TIMEOUT_S = 30.0, 120.0  # http(s) inputs, which get no retries
S3_DEFAULTS = {
    "use_listings_cache": False,
    "config_kwargs": {"connect_timeout": S3_CONNECT_TIMEOUT_S, "read_timeout": S3_READ_TIMEOUT_S,
                      "retries": {"max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"}},
}


class StoreError(Exception):
    """The object store cannot be used as configured; the message says what to fix."""


def configure() -> None:
    """Fill s3fs defaults into fsspec's config (keys the user set win)."""
    conf = fsspec.config.conf.setdefault("s3", {})
    for key, value in S3_DEFAULTS.items():
        conf.setdefault(key, copy.deepcopy(value))  # botocore rewrites the retries dict it is given, in place


def remote_options(url: str, connect_s: float | None = None, read_s: float | None = None) -> dict[str, Any]:
    """fsspec storage options for ``url``: bounded connect and read timeouts, so a silent server is an error,
    never a hang. Every fsspec client smelt opens takes its options here (storage.filesystem, readers, DCP).

    For S3 the defaults are fsspec's config (``S3_DEFAULTS``, or the user's); a caller's own timeouts replace
    only those two keys. fsspec replaces a config key passed as an argument whole, so an argument
    ``config_kwargs`` of timeouts alone would drop the retries."""
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    if protocol in ("http", "https"):
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s or HTTP_CONNECT_TIMEOUT_S,
                                        sock_read=read_s or HTTP_READ_TIMEOUT_S)
        return {"client_kwargs": {"timeout": timeout}}
    if protocol in ("s3", "s3a") and (connect_s or read_s):
        config = copy.deepcopy(fsspec.config.conf.get("s3", {}).get("config_kwargs", {}))
        config.update({key: s for key, s in (("connect_timeout", connect_s), ("read_timeout", read_s)) if s})
        return {"config_kwargs": config}
    return {}


def _is_s3(url: str) -> bool:
    return urlparse(str(url)).scheme in ("s3", "s3a")


def preflight(url: str, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> None:
    """Check that the bucket of an ``s3://`` URL is reachable and readable with the configured
    credentials; raise StoreError with one sentence otherwise. Other URLs pass untouched."""
    if not _is_s3(url):
        return
    import s3fs

    bucket = urlparse(str(url)).netloc
    options = {**fsspec.config.conf.get("s3", {}), "skip_instance_cache": True,
               "config_kwargs": {"connect_timeout": 3, "read_timeout": 5, "retries": {"max_attempts": 1}}}
    fs = s3fs.S3FileSystem(**options)
    endpoint = fs.client_kwargs.get("endpoint_url") or _endpoint_from_env() or "AWS S3"
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        pool.submit(fs.ls, bucket, refresh=True).result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise StoreError(f"the object store at {endpoint} did not answer within {timeout_s:.0f} s "
                         f"(is AWS_ENDPOINT_URL right and the store up?)") from None
    except Exception as e:  # noqa: BLE001: classify whatever botocore raises into one sentence
        raise StoreError(_explain(e, bucket, endpoint)) from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def preflight_all(*values: str | list[str] | None) -> None:
    """``preflight`` once each bucket named anywhere in ``values`` (URLs, ``name=URL`` pairs, command
    lines; strings, lists of them, or None).

    Flows call it first with their parameters, so a deployment run with a wrong endpoint, key or
    bucket fails in seconds with one sentence, before any task or retry starts."""
    buckets: dict[str, None] = {}
    for group in values:
        for value in [group] if isinstance(group, str) else group or []:
            buckets.update(dict.fromkeys(BUCKET_URL_RE.findall(str(value))))
    for bucket in buckets:
        preflight(bucket)


def _endpoint_from_env() -> str | None:
    import os

    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _explain(error: Exception, bucket: str, endpoint: str) -> str:
    text = f"{type(error).__name__}: {error}"
    if "NoCredentials" in text or "Unable to locate credentials" in text:
        return (f"no credentials for the object store at {endpoint}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or an AWS profile)")
    if isinstance(error, PermissionError) or any(
            s in text for s in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Forbidden", "403")):
        return f"the object store at {endpoint} refused the credentials for bucket {bucket!r} (access denied)"
    if "NoSuchBucket" in text or isinstance(error, FileNotFoundError):
        return f"bucket {bucket!r} does not exist at {endpoint}: create it first"
    if any(s in text for s in ("EndpointConnectionError", "ConnectTimeout", "Could not connect", "Connect call failed",
                               "Cannot connect", "Name or service not known")):
        return f"cannot connect to the object store at {endpoint} (is AWS_ENDPOINT_URL right and the store up?)"
    return f"the object store at {endpoint} failed on bucket {bucket!r}: {text.splitlines()[0]}"


configure()
