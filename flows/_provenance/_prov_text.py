"""How prov (3.x) writes a record's parts as text: qualified names, times and literals.

Each part is written twice, as PROV-N and as PROV-JSON give it (``Name``): a local
part escaped as PROV-N's PN_LOCAL wants it (``qualified``), a recorded time read and
written back as prov reads and writes an ``xsd:dateTime`` (``xsd_time``), and an
attribute value typed as prov types it (``literal``). ``flows._provenance._prov``
writes the records with them.
"""

from __future__ import annotations

import functools
import math
import re
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring_ascii
from typing import Final, NamedTuple

__all__ = [
    "PROV_LABEL",
    "PROV_ROLE",
    "PROV_TYPE",
    "PROV_VALUE",
    "Attributes",
    "Name",
    "Value",
    "literal",
    "qualified",
    "run_name",
    "term",
    "xsd_time",
]

# PROV-N's PN_LOCAL (productions [53]-[55]), with the character classes prov spells
# in ``prov/identifier.py``: the XML NCName characters less '.', the characters that
# may follow but not start a local part, those allowed as they are, and the
# metacharacters written with a backslash.
_PN_CHARS_U: Final = (
    "A-Z_a-z\xc0-\xd6\xd8-\xf6\xf8-\u02ff\u0370-\u037d\u037f-\u1fff\u200c-\u200d"
    "\u2070-\u218f\u2c00-\u2fef\u3001-\ud7ff\uf900-\ufdcf\ufdf0-\ufffd\U00010000-\U000effff"
)
_NOT_FIRST: Final = "\xb7\u0300-\u036f\u203f-\u2040"
_METACHARACTERS: Final = "='(),:;[]"
_WRITABLE: Final = _PN_CHARS_U + "\\-0-9" + _NOT_FIRST + re.escape(f"/@~&+*?#$!{_METACHARACTERS}-.")
_BAD_FIRST: Final = re.compile(f"[{_NOT_FIRST}]")
_UNWRITABLE: Final = re.compile(f"[^{_WRITABLE}]")
_HEX_PAIR: Final = re.compile("[0-9A-Fa-f]{2}")
# A local part this does not match is written as it is: the cases _escape_char
# changes, and '%' (kept before two hex digits). Unlike prov's own test, a '-' or '.'
# inside (as in ``batch/demo-0/task/1``) is let through, as it stays the same.
_NOT_PLAIN: Final = re.compile(
    rf"^[-.{_NOT_FIRST}]|\.\Z|[{re.escape(_METACHARACTERS)}%]|[^{_WRITABLE}]"
)

# prov's reading of an xsd:dateTime (``parse_xsd_datetime``).
_HOUR_24: Final = re.compile(r"T24:00:00(\.0+)?(?=$|[Z+-])")
_FRACTION: Final = re.compile(r"\.(\d+)")

_INT32: Final = 2**31
_INT64: Final = 2**63


class Name(NamedTuple):
    """A qualified name (or a formal time) as written: in PROV-N and as a PROV-JSON string."""

    provn: str
    json: str


# A value of an attribute; None leaves the attribute out, as prov does.
Value = str | int | float | Name | None
Attributes = dict[Name, Value]


def _escape_local(local: str) -> str:
    """Return ``local`` as PROV-N writes a local part (prov's ``_provn_escape_local``).

    Metacharacters, a leading ``-`` or ``.`` and a trailing ``.`` take a backslash;
    a character PN_LOCAL cannot hold, or cannot start with, and a ``%`` not followed
    by two hex digits are percent-encoded as UTF-8.
    """
    if not _NOT_PLAIN.search(local):
        return local
    last = len(local) - 1
    return "".join(_escape_char(local, i, last, char) for i, char in enumerate(local))


def _escape_char(local: str, i: int, last: int, char: str) -> str:
    if i == 0 and _BAD_FIRST.match(char):
        return _percent(char)
    if char == "%":
        return char if _HEX_PAIR.match(local, i + 1) else "%25"
    if (i == 0 and char in "-.") or (i == last and char == ".") or char in _METACHARACTERS:
        return f"\\{char}"
    if _UNWRITABLE.match(char):
        return _percent(char)
    return char


def _percent(char: str) -> str:
    # A lone surrogate is encoded from its code unit, as prov does, not refused.
    return "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))


def qualified(prefix: str, local: str) -> Name:
    return Name(f"{prefix}:{_escape_local(local)}", encode_basestring_ascii(f"{prefix}:{local}"))


def run_name(local: str) -> Name:
    """Return ``run:<local>``, a name in the campaign's own namespace."""
    return qualified("run", local)


@functools.lru_cache(maxsize=256)
def term(local: str) -> Name:
    """Return ``u:<local>``, a term of unattended's vocabulary (few: cached)."""
    return qualified("u", local)


PROV_TYPE: Final = qualified("prov", "type")
PROV_LABEL: Final = qualified("prov", "label")
PROV_VALUE: Final = qualified("prov", "value")
PROV_ROLE: Final = qualified("prov", "role")


def xsd_time(text: str | None) -> Name | None:
    """Return a recorded time as prov writes an ``xsd:dateTime``; None for none (or "").

    prov reads the text (``Z``, hour 24, any number of fraction digits) into a
    datetime and writes its ``isoformat()``, in UTC if the offset is not whole minutes.

    Raises:
        ValueError: ``text`` is not an xsd:dateTime.
    """
    if not text:
        return None
    value = text.strip()
    if "T" not in value:  # a date alone is no xsd:dateTime
        raise ValueError(f"not an xsd:dateTime: {text!r}")
    # prov's rewrites (its regular expressions), each tried only where it can apply:
    # an export's times need none of them.
    end_of_day = "T24:" in value and _HOUR_24.search(value) is not None
    if end_of_day:  # 24:00:00 is the next day's midnight
        value = _HOUR_24.sub("T00:00:00", value)
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    fraction = _FRACTION.search(value)
    if fraction is not None and len(fraction[1]) != 6:
        digits = fraction[1][:6].ljust(6, "0")
        value = f"{value[: fraction.start()]}.{digits}{value[fraction.end() :]}"
    try:
        moment = datetime.fromisoformat(value)
        if end_of_day:
            moment += timedelta(days=1)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"not an xsd:dateTime: {text!r}") from exc
    offset = moment.utcoffset()
    if offset is not None and (offset.total_seconds() % 60 or offset.microseconds):
        moment = moment.astimezone(UTC)
    written = moment.isoformat()
    return Name(written, encode_basestring_ascii(written))


def _string(text: str) -> str:
    """Return ``text`` as a PROV-N string literal: triple-quoted if it holds a line feed."""
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    if "\n" in quoted:
        return f'"""{quoted}"""'
    return '"' + quoted.replace("\r", "\\r") + '"'


def literal(value: str | int | float | Name) -> tuple[str, str]:
    """Return an attribute value as PROV-N and as PROV-JSON write it, typed as prov types it."""
    if isinstance(value, str):
        return _string(value), encode_basestring_ascii(value)
    if isinstance(value, Name):
        return f"'{value.provn}'", f'{{"$": {value.json}, "type": "xsd:QName"}}'
    if isinstance(value, bool):
        text = "true" if value else "false"
        return f'"{text}" %% xsd:boolean', text
    if isinstance(value, int):
        datatype = _integer_type(value)
        typed = f'{{"$": "{value}", "type": "{datatype}"}}'
        # A bare integer is PROV-N's short form of an xsd:int.
        return (str(value) if datatype == "xsd:int" else f'"{value}" %% {datatype}'), typed
    if isinstance(value, float):
        text = _double(value)
        return f'"{text}" %% xsd:double', f'{{"$": "{text}", "type": "xsd:double"}}'
    raise TypeError(f"no PROV literal for {type(value).__name__}")


def _integer_type(value: int) -> str:
    """Return the XSD type prov gives an integer, by its magnitude."""
    if -_INT32 <= value < _INT32:
        return "xsd:int"
    if -_INT64 <= value < _INT64:
        return "xsd:long"
    return "xsd:integer"


def _double(value: float) -> str:
    """Return a float's xsd:double text: NaN, INF or -INF, else its repr()."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "INF" if value > 0 else "-INF"
    return float.__repr__(value)
