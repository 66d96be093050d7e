"""Cloud Console pages of the logs bucket's objects and folders, for links a person can open.

A `gs://` URI opens nothing in a browser; the console's storage browser shows a folder (an
attempt's output) or an object (an exported log) to whoever may read it. Pure: strings in, a URL
out, every part URL-quoted (object names and a job account's email are user text).
"""

from __future__ import annotations

import re
import urllib.parse

STORAGE_BROWSER = "https://console.cloud.google.com/storage/browser"
_GS_URI = re.compile(r"gs://(?P<bucket>[a-z0-9][a-z0-9._-]{1,220}[a-z0-9])/(?P<name>.*)", re.DOTALL)


def split_gs_uri(uri: str) -> tuple[str, str] | None:
    """(bucket, object name or folder prefix) of `gs://BUCKET/NAME`; None for anything else."""
    match = _GS_URI.fullmatch(uri)
    return (match["bucket"], match["name"]) if match else None


def storage_console_url(uri: str, project: str) -> str | None:
    """The console page of a `gs://` URI: a folder's listing when it ends in `/` (or is the
    bucket), an object's details page otherwise; None when `uri` is no `gs://` URI."""
    parts = split_gs_uri(uri)
    if parts is None:
        return None
    bucket, name = parts
    page = "" if not name or name.endswith("/") else "_details/"
    path = urllib.parse.quote(f"{page}{bucket}/{name}", safe="/")
    return f"{STORAGE_BROWSER}/{path}?project={urllib.parse.quote(project, safe='')}"
