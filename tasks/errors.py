"""Which failures a retry can fix, and the one sentence a person reads when it cannot.

A stage that fails on corrupt data, a bad config value or input, a missing object, refused
credentials or an incompatible checkpoint fails the same way on every retry: retrying only buries
the cause under copies of the traceback. Such failures are *permanent*: the stage stops at once,
the person reads one sentence naming what to fix, and the full traceback goes to a log file that
the sentence names. Network errors, preemption and killed workers are *transient* and keep their
retries; so does anything unrecognised, which keeps the behaviour retries always had.

On Dask workers, ``Guarded`` returns a permanent failure as a value (``RemoteFailure``) instead of
raising it, so Dask neither logs "Compute Failed" with the traceback nor reruns the item
(``tasks/parallel.py`` raises it once, in the client).
"""

from __future__ import annotations

import errno
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

LOG_DIR_ENV = "SMELT_LOG_DIR"
DEFAULT_LOG_DIR = "smelt-logs"  # beside the launch renderer's job logs (infra/launch)

# Errors of the environment, not of the input: worth another try.
_TRANSIENT_ERRNOS = {errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
                     errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EAGAIN, errno.EBUSY}
_TRANSIENT_NAMES = {"KilledWorker", "CommClosedError", "StreamClosedError", "CancelledError", "TimeoutError",
                    "Preempted", "LaunchError", "LeaseLost"}
_PERMANENT_NAMES = {"DatasetError", "ManifestError", "UnsafeCheckpointError", "ConfigError", "CorruptData",
                    "InputError", "StoreError", "LeaseHeld", "Fenced", "SubmitError", "TraceError",
                    "StageFailed"}


def is_permanent(exc: BaseException) -> bool:
    """True when retrying cannot help: corrupt data, a bad config value or input, a missing object,
    refused credentials, an incompatible checkpoint. An exception may say so itself (``permanent``)."""
    declared = getattr(exc, "permanent", None)
    if isinstance(declared, bool):
        return declared
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & _TRANSIENT_NAMES:
        return False
    if names & _PERMANENT_NAMES:
        return True
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)):
        return True  # a missing object, refused credentials (s3fs raises PermissionError on 403)
    if isinstance(exc, (ConnectionError, TimeoutError)) or (isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS):
        return False
    if isinstance(exc, OSError):
        return False  # remote reads cut short (RemoteReadError), a full disk freed later: retried as before
    # A bad value (config, input, a decoded file) or a mistyped key: the same on every try.
    return isinstance(exc, (ValueError, KeyError, UnicodeError))


def one_sentence(exc: BaseException) -> str:
    """The exception's message on one line; smelt's own errors are written as a sentence that names the
    fix, anything else is prefixed with its type so the person knows what kind of failure it was."""
    text = " ".join(str(exc).split()) or repr(exc)
    if type(exc).__module__.startswith("tasks") or type(exc).__name__ in _PERMANENT_NAMES:
        return text
    if isinstance(exc, KeyError):
        return f"missing key {text}"
    return f"{type(exc).__name__}: {text}"


class UserError(ValueError):
    """The person's input is at fault (a config value, a command-line argument, a missing or refused
    input), not smelt's code: the CLI prints its one sentence and exits 2. A plain ValueError is a
    bug's and keeps its traceback. A ValueError subclass so callers that catch ValueError still do."""

    permanent = True


class StageFailed(Exception):
    """A stage stopped on a permanent error; ``str()`` is the one sentence, ``log_path`` holds the traceback."""

    permanent = True

    def __init__(self, sentence: str, log_path: str | None = None, cause: str = "") -> None:
        super().__init__(sentence)
        self.log_path, self.cause = log_path, cause


def log_dir() -> str:
    return os.environ.get(LOG_DIR_ENV) or DEFAULT_LOG_DIR


def write_traceback(stage: str, exc: BaseException, remote: str = "") -> str:
    """Write the full traceback of ``exc`` (and ``remote``, a worker's, if any) to a new file under
    ``$SMELT_LOG_DIR`` (default ``./smelt-logs``); returns its path."""
    folder = log_dir()
    os.makedirs(folder, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in stage) or "stage"
    path = os.path.join(folder, f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
    with open(path, "w") as f:
        f.write(f"{stage}: {type(exc).__name__}: {exc}\n\n")
        f.write("".join(traceback.format_exception(exc)))
        if remote:
            f.write("\nOn the worker that ran it:\n" + remote)
    return path


def stage_failure(stage: str, exc: BaseException) -> StageFailed:
    """The one-sentence failure of ``stage`` for a permanent ``exc``, its traceback written to a log file."""
    path = write_traceback(stage, exc, getattr(exc, "remote_traceback", ""))
    sentence = f"{stage} failed: {one_sentence(exc)} (not retried: a retry cannot fix this; traceback in {path})"
    return StageFailed(sentence, path, type(exc).__name__)


class RemoteFailure:
    """A permanent failure returned by a worker instead of raised: the exception and its traceback text."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.traceback = "".join(traceback.format_exception(exc))

    def reraise(self) -> None:
        self.exc.remote_traceback = self.traceback
        raise self.exc.with_traceback(None)


class Guarded:
    """``fn`` for a Dask worker: permanent failures come back as ``RemoteFailure`` values; transient
    ones are raised, so Dask's retries rerun the item. A class (not a closure) so it pickles."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", getattr(getattr(fn, "func", None), "__name__", "map"))

    def __call__(self, item: Any) -> Any:
        try:
            return self.fn(item)
        except Exception as e:
            if is_permanent(e):
                return RemoteFailure(e)
            raise
