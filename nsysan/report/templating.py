"""The Jinja2 templates of the Markdown and HTML reports (``nsysan/report/templates``).

HTML templates autoescape every value, so a kernel or NVTX range named ``<script>`` prints as
text; Markdown templates escape only the ``|`` that would end a table cell (``escape_pipes``).
"""

from __future__ import annotations

from typing import Any

import jinja2


def escape_pipes(text: str) -> str:
    """Text that stays inside one Markdown table cell."""
    return text.replace("|", "\\|")


_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("nsysan.report", "templates"),
    autoescape=jinja2.select_autoescape(enabled_extensions=("html",), default_for_string=False),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
_ENVIRONMENT.filters["escape_pipes"] = escape_pipes


def render(template: str, **context: Any) -> str:
    """One template of ``nsysan/report/templates`` filled in with ``context``."""
    return _ENVIRONMENT.get_template(template).render(**context)
