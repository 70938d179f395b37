"""What interrupts a run from outside (a signal), as opposed to a failure of the code it runs.

A guard around user code (:func:`shardload.prepare.mapping.user_code`'s callers) reports whatever the
code raises as the code's failure, except ``KeyboardInterrupt`` and an :class:`Interruption`: those are
Ctrl-C and SIGTERM arriving while the code ran, and end the command as such.
"""

from __future__ import annotations

__all__ = ["Interruption"]


class Interruption(BaseException):
    """Base of the exceptions a signal handler raises to stop a command (the CLI's SIGTERM: ``Terminated``).

    A ``BaseException``, like ``KeyboardInterrupt``, so that no ``except Exception`` swallows it.
    """
