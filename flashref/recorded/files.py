"""Reading a recorded results file: JSON with every field checked.

``read_json(path)`` refuses NaN and infinity (they are not measurements) and anything but an
object; ``check_fields(obj, fields, where)`` checks each field's presence and type, and that
a number (``NUM``) is >= 0, each error naming the file, the entry and the field. The
readers of this package (``training``, ``backward``) use them, so that a chapter never prints
from a broken file. The standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path

NUM = (int, float)  # a measurement: an int or float >= 0

__all__ = ["NUM", "read_json", "check_fields"]


def read_json(path: Path) -> dict:
    def no_constant(name):  # json.loads takes NaN and Infinity unless told not to
        raise ValueError(f"{path}: {name} is not a measurement")

    data = json.loads(path.read_text(encoding="utf-8"), parse_constant=no_constant)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def check_fields(obj, fields: dict, where: str) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object, got {type(obj).__name__}")
    for key, kind in fields.items():
        if key not in obj:
            raise ValueError(f"{where} has no {key!r}")
        value = obj[key]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            raise ValueError(f"{where}[{key!r}] = {value!r:.60}; expected {kind}")
        if kind is NUM and not value >= 0:
            raise ValueError(f"{where}[{key!r}] = {value!r}; expected a number >= 0")
