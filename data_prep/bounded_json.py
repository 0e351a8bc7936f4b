"""`loads_bounded`: json.loads that stops past a number of values and lets other threads run.

Shared by the retriever server (a request body) and its client (an answer): json's C parser
holds the GIL for a whole document and builds all of it before anything can be checked.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from typing import Any, Callable


class TooManyValues(ValueError):
    """A JSON document holds more values than its reader allows (`loads_bounded`)."""


def loads_bounded(text: str, max_values: int) -> Any:
    """`json.loads(text)`, or ValueError once it holds more than `max_values` values (each item of
    an array, each value of an object). Parsed by json's Python scanner, whose C calls are one
    string or number each: run in a thread, it lets the event loop's thread take the GIL between
    them, where json's C parser holds it for the whole document (~2.8 M empty strings in 8 MiB),
    and it stops at the limit instead of building everything first."""
    left = max_values

    def counted(scan_once: Callable) -> Callable:
        def scan(string: str, idx: int) -> Any:
            nonlocal left
            left -= 1
            if left < 0:
                raise TooManyValues(f"more than {max_values} JSON values")
            return scan_once(string, idx)
        return scan

    decoder = json.JSONDecoder()
    decoder.parse_object = lambda s_end, strict, scan_once, *hooks: json.decoder.JSONObject(
        s_end, strict, counted(scan_once), *hooks)
    decoder.parse_array = lambda s_end, scan_once: json.decoder.JSONArray(s_end, counted(scan_once))
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    try:
        return decoder.decode(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
