"""The one exception hierarchy of shardload.

Every error that shardload raises on purpose is a :class:`ShardloadError`, so a
caller can catch them all with one clause, or one branch of the tree::

    ShardloadError
     +-- InputError (ValueError)          bad input to prepare/write (names the file and the sample), or to a model helper
     +-- ShardSetError                    a shard set on disk cannot be used as it is
     |    +-- ManifestError               manifest missing, unreadable, of a newer format, inconsistent
     |    +-- CorruptShardError           shard missing, truncated, or its checksum does not match
     |    +-- ShardSetChangedError        the set was re-prepared while a job had it open
     |    +-- MergeError                  parts cannot be merged: one is missing, unfinished, foreign or different
     +-- OutputError (OSError)            prepare cannot write where it was told to
     |    +-- OutputExistsError           a shard set is there and overwrite was not given
     |    +-- OutputLockedError           another prepare is writing into the same output
     +-- PlanError (ValueError)           invalid batching or loader options, or a plan cannot be built
     |    +-- PlanMismatchError           ranks disagree: batch counts or plan fingerprints differ
     |    +-- MixtureError                a mixture's weights, sources or fields do not fit together
     +-- WorkerError (RuntimeError)       a DataLoader worker died or sent no batch within the timeout
     +-- RemoteError (OSError)            object storage kept failing after every retry, or rejected a request; names the URL
     |    +-- RemoteAccessError (PermissionError)  it refused the credentials, or there were none (not retried)
     +-- MissingDependencyError (ImportError)  an optional package a format needs (zarr) is not installed

A name in parentheses is a second, built-in base class, so ``except ValueError``
(``OSError``, ``ImportError``, ``RuntimeError``) catches those errors too. The
command line maps each branch to an exit status (docs/cli.md, "Exit status").
Messages name the file, the shard or the sample, and say what to do about it.
No message holds a credential: every string given to a :class:`ShardloadError` passes
through the mask of :mod:`shardload._base.redact` (URL passwords, secret options).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "CorruptShardError",
    "InputError",
    "ManifestError",
    "MergeError",
    "MissingDependencyError",
    "MixtureError",
    "OutputError",
    "OutputExistsError",
    "OutputLockedError",
    "PlanError",
    "PlanMismatchError",
    "RemoteAccessError",
    "RemoteError",
    "ShardSetChangedError",
    "ShardSetError",
    "ShardloadError",
    "WorkerError",
]


def _unmasked(text: str) -> str:
    return text


#: what masks credentials in every message; shardload._base.redact, which this lowest layer cannot
#: import, installs its mask here (through _install_mask) when it is imported, before any URL is read
_mask: Callable[[str], str] = _unmasked


def _install_mask(mask: Callable[[str], str]) -> None:
    global _mask
    _mask = mask


class ShardloadError(Exception):
    """Base class of every error shardload raises on purpose.

    Its string arguments (the message, an ``OSError``'s text and file name) are masked: a URL's
    password or a secret storage option never reaches ``str()``, ``repr()`` or a traceback.
    """

    def __init__(self, *args: object, **kwargs: Any) -> None:  # keywords: ImportError's name= and path=
        super().__init__(*(_mask(a) if isinstance(a, str) else a for a in args), **kwargs)


class InputError(ShardloadError, ValueError):
    """Input to ``prepare``/``write`` is malformed, or a model helper was given what does not fit the batch.

    The message names the source file and the sample (row, line or member)
    and what was wrong with it; for ``ExactMean`` and the attention masks,
    the shapes or keys that do not fit.
    """


class ShardSetError(ShardloadError):
    """A shard set on disk cannot be used as it is."""


class ManifestError(ShardSetError):
    """The manifest is missing, unreadable, of a newer format, or inconsistent."""


class CorruptShardError(ShardSetError):
    """A shard file is missing, truncated, or does not match its checksum."""


class ShardSetChangedError(ShardSetError):
    """The shard set was rewritten while a job that opened it was running."""


class MergeError(ShardSetError):
    """The parts of a set cannot be merged: one is missing, not finished, from another run, or different.

    The message names the part (``parts/00003-of-00008``) and what to do.
    """


class OutputError(ShardloadError, OSError):
    """``prepare`` cannot write its output where it was asked to."""


class OutputExistsError(OutputError):
    """The output already holds a shard set and ``overwrite`` was not given."""


class OutputLockedError(OutputError):
    """Another ``prepare`` is writing into the same output directory."""


class PlanError(ShardloadError, ValueError):
    """Batching or loader options are invalid, or a plan cannot be built from them."""


class PlanMismatchError(PlanError):
    """Ranks disagree about the plan (batch counts or fingerprints differ)."""


class MixtureError(PlanError):
    """A mixture of shard sets cannot be planned or read as asked.

    Weights missing, negative or all zero; a source named twice; sources whose
    fields differ; a source that would be repeated more than ``max_repeats``
    times. The message names the source and what to change.
    """


class WorkerError(ShardloadError, RuntimeError):
    """A DataLoader worker died, or no batch came from the workers within ``timeout``.

    The message names the worker, the signal or state, and the likely cause.
    """


class RemoteError(ShardloadError, OSError):
    """Object storage (S3, GCS, Azure, HTTP) kept failing after every retry, or rejected a request.

    Raised once the retries of a failure that may pass (5xx, throttling,
    timeouts) are spent, and at once for an answer another try would not change
    (``400 Bad Request``); the message names the URL, the tries or the call, and
    the last error (docs/remote.md, "Failure messages").

    Attributes:
        url: the object (or prefix) that could not be read or written.
    """

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.url = _mask(url)


class RemoteAccessError(RemoteError, PermissionError):
    """Object storage refused the request's credentials, or there were none to send.

    Not retried (waiting does not help); the message names the URL and where
    credentials come from. Also a ``PermissionError``.

    Attributes:
        url: the object (or prefix) that was refused.
    """


class MissingDependencyError(ShardloadError, ImportError):
    """An optional package that the work needs is not installed (zarr for Zarr shards; FlexAttention in torch).

    The message names the package and the ``pip install`` command; the command
    line exits with status 2, as for any missing optional dependency.
    """
