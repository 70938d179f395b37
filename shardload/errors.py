"""The one exception hierarchy of shardload.

Every error that shardload raises on purpose is a :class:`ShardloadError`, so a
caller can catch them all with one clause, or one branch of the tree::

    ShardloadError
     +-- InputError (ValueError)          bad input to prepare/write; names the file and the sample
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

A name in parentheses is a second, built-in base class: ``except ValueError``
also catches bad input and bad batching options, ``except OSError`` also
catches output problems, ``except ImportError`` also catches a missing optional
package, and ``except RuntimeError`` also catches a dead or
stuck worker (as for torch's own errors). The command line maps each branch to an exit status
(see ``shardload.cli``).

Messages name the file, the shard or the sample, and say what to do about it.
"""

from __future__ import annotations

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


class ShardloadError(Exception):
    """Base class of every error shardload raises on purpose."""


class InputError(ShardloadError, ValueError):
    """Input to ``prepare``/``write`` is malformed.

    The message names the source file and the sample (row, line or member)
    and what was wrong with it.
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

    Raised for failures that may pass (HTTP 5xx, throttling, timeouts, dropped
    connections) once the retries are spent, naming the URL, the number of tries
    and the last error; and at once for an answer that another try would not
    change (``400 Bad Request``, a URL with an empty path segment), naming the
    URL, the call and the status. A missing object or a refused credential is
    reported as what it is.

    Attributes:
        url: the object (or prefix) that could not be read or written.
    """

    def __init__(self, message: str, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class RemoteAccessError(RemoteError, PermissionError):
    """Object storage refused the request's credentials, or there were none to send.

    Not retried (waiting does not help); the message names the URL and where
    credentials come from. A :class:`RemoteError` (``except RemoteError``
    catches every storage failure; the command line exits with status 8) and a
    ``PermissionError``.

    Attributes:
        url: the object (or prefix) that was refused.
    """


class MissingDependencyError(ShardloadError, ImportError):
    """An optional package that the work needs is not installed (zarr, for Zarr shards).

    The message names the package and the ``pip install`` command; the command
    line exits with status 2, as for any missing optional dependency.
    """
