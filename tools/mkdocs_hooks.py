"""MkDocs hooks for the documentation site (wired in mkdocs.yml under ``hooks:``).

The docstrings name other objects with Sphinx roles (:class:`X`, :func:`~a.b`),
which Markdown renders as a literal ``:class:`` before the code span. Keep the
code span and drop the role, and shorten ``~a.b.c`` to ``c`` as Sphinx would.
A paragraph that ends in ``::`` (it introduces a literal block) ends in ``:``.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):(<code>)(~?)([^<]*)(</code>)")


def _strip_role(match: re.Match[str]) -> str:
    open_tag, tilde, target, close_tag = match.groups()
    return open_tag + (target.rsplit(".", 1)[-1] if tilde else target) + close_tag


def on_page_content(html: str, **kwargs: Any) -> str:
    """Render the Sphinx markup of docstrings the way Sphinx would."""
    return _ROLE.sub(_strip_role, html).replace("::</p>", ":</p>")
