"""Where a dataset's bytes live: URLs (a bare path becomes ``file://``), the fsspec filesystem behind one, and
writes that land whole or not at all.

Every remote client is opened with ``tasks.objectstore.remote_options`` (bounded timeouts and retries, no
listings cache), so no caller builds a filesystem of its own.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import IO

import fsspec

from tasks.objectstore import remote_options  # and its import sets s3 defaults: no listings cache, bounded retries


def normalize_url(url: str) -> str:
    """Make a bare local path an absolute ``file://`` URL; leave other URLs alone."""
    url = str(url)
    if "://" not in url:
        return "file://" + os.path.abspath(os.path.expanduser(url))
    return url.rstrip("/")


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *[p.strip("/") for p in parts]])


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    url = normalize_url(url)
    fs, path = fsspec.core.url_to_fs(url, **remote_options(url))
    return fs, path


def temporary_beside(path: str) -> str:
    """A fresh hidden name in ``path``'s folder, for a file that is moved onto ``path`` once complete."""
    parent, name = path.rsplit("/", 1)
    return f"{parent}/.tmp-{uuid.uuid4().hex[:8]}-{name}"


@contextlib.contextmanager
def atomic_write(url: str, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file beside ``url``; move it into place only if the block succeeds."""
    fs, path = filesystem(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    tmp = temporary_beside(path)
    try:
        with fs.open(tmp, mode) as f:
            yield f
        fs.mv(tmp, path)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm(tmp)
        raise
