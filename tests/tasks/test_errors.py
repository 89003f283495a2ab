"""Which failures are retried, and the one sentence with the traceback's log file (tasks/errors.py)."""

from __future__ import annotations

import errno
import pickle

import pytest

from tasks import errors
from tasks.config import ConfigError
from tasks.contract import DatasetError
from tasks.objectstore import StoreError


@pytest.mark.parametrize("exc", [
    DatasetError("shard x does not match its manifest checksum"),   # corrupt data
    ConfigError("dedup.threshold must be in (0, 1], got 1.5"),       # a bad config value
    ValueError("no fastText model at /nowhere.bin"),                  # a bad input
    FileNotFoundError(errno.ENOENT, "No such file", "s3://b/k"),      # a missing object
    PermissionError(errno.EACCES, "Access Denied"),                   # refused credentials
    StoreError("the key was refused by the object store"),
    KeyError("model.dim"),
], ids=lambda e: type(e).__name__)
def test_what_a_retry_cannot_fix_is_permanent(exc):
    assert errors.is_permanent(exc)


@pytest.mark.parametrize("exc", [
    ConnectionResetError(errno.ECONNRESET, "reset by peer"),
    TimeoutError("read timed out"),
    OSError(errno.EIO, "remote read cut short"),
    RuntimeError("something unrecognised"),  # unknown: keeps the retries it always had
], ids=lambda e: type(e).__name__)
def test_the_environments_failures_and_unknown_ones_keep_their_retries(exc):
    assert not errors.is_permanent(exc)


def test_a_killed_worker_is_transient_and_an_exception_may_declare_itself():
    from distributed.scheduler import KilledWorker

    assert not errors.is_permanent(KilledWorker("sign_shard-1", "tcp://127.0.0.1:1", 3))
    declared = RuntimeError("checkpoint layout differs")
    declared.permanent = True
    assert errors.is_permanent(declared)


def test_the_failure_is_one_sentence_naming_the_log_file_that_holds_the_whole_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv(errors.LOG_DIR_ENV, str(tmp_path / "logs"))
    try:
        raise DatasetError("shard docs-00002.parquet of file:///d does not match its manifest checksum:\n"
                           "the dataset is corrupt")
    except DatasetError as e:
        e.remote_traceback = "Traceback (most recent call last):\n  File \"signatures.py\", line 114\n"
        failure = errors.stage_failure("dedup", e)
    sentence = str(failure)
    assert "\n" not in sentence and sentence.startswith("dedup failed: shard docs-00002.parquet")
    assert "not retried" in sentence and failure.log_path in sentence
    logged = open(failure.log_path).read()
    assert "Traceback" in logged and "signatures.py" in logged and "test_errors.py" in logged
    assert errors.is_permanent(failure)


def test_a_guarded_function_returns_permanent_failures_and_raises_transient_ones():
    def corrupt(x):
        raise DatasetError(f"shard {x} is corrupt")

    result = pickle.loads(pickle.dumps(errors.Guarded(corrupt)(7)))  # as it comes back from a worker
    assert isinstance(result, errors.RemoteFailure)
    with pytest.raises(DatasetError, match="shard 7 is corrupt") as raised:
        result.reraise()
    assert "corrupt" in raised.value.remote_traceback

    def reset(x):
        raise ConnectionResetError("reset")

    with pytest.raises(ConnectionResetError):
        errors.Guarded(reset)(1)
