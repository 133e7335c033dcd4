"""The receiver-side signature check of webhooks, read from docs/notifications.md (the snippet tenants copy)."""

from __future__ import annotations

import re

from core.processes import ROOT

DOCS = ROOT / "docs" / "notifications.md"


def documented_verify():
    """The ``verify`` function of the receiver snippet in docs/notifications.md, executed as written."""
    text = DOCS.read_text()
    section = text.split("### Verifying a delivery", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, str(DOCS), "exec"), namespace)  # our own documentation's snippet
    return namespace["verify"]
