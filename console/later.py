"""Messages stored untranslated and shown in the reader's language.

A train worker stores why a job waits; whoever reads it later may read another language than
the worker's. ``later(msgid, **params)`` keeps the message (marked for the catalogue with
``gettext_noop``) and its parameters as JSON text; ``shown(text)`` translates it into the
active language. A text stored otherwise (before, or by hand) is shown as it is.
"""

import json

from django.utils.translation import gettext


def later(msgid: str, **params: object) -> str:
    """``msgid`` with ``params``, to be translated when shown."""
    return json.dumps({"msgid": msgid, "params": params}, ensure_ascii=False, sort_keys=True)


def shown(stored: str) -> str:
    """A stored message in the active language."""
    if not stored.startswith("{"):
        return stored
    try:
        data = json.loads(stored)
        text = gettext(data["msgid"])
        return text % data["params"] if data["params"] else text
    except (ValueError, KeyError, TypeError):
        return stored
