"""The text formats reports and diffs are written in, by name: what ``--format`` offers.

Its own module so the command line can list them without importing the renderers (rich) or the
document builder (pandas).
"""

from __future__ import annotations

FORMATS = ("terminal", "json", "markdown", "html")
