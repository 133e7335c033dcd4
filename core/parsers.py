"""The API's JSON parser: DRF's, plus the limits that keep hostile bodies away from the database.

A body is refused (400 ``parse_error`` naming the place in the body, or 413) when it

- is larger than ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (DRF streams JSON bodies past Django's own check),
- nests arrays/objects deeper than ``MAX_DEPTH`` (deep nesting made serializers and the error renderer
  recurse until ``RecursionError``),
- holds a NUL character or a lone UTF-16 surrogate (``"\\ud800"``) in any string, key or value: PostgreSQL
  text and jsonb cannot store NUL, and a lone surrogate cannot be encoded to UTF-8 by the driver or by
  the response renderer.

Each check runs once, iteratively, on the parsed document, so every view and serializer benefits.

``parse_integer`` is the one reader of a whole number from a query parameter or a form field: ASCII digits
only and within bounds, else 400 naming the parameter (``str.isdigit()`` accepts ``"²"``, which ``int()``
refuses, and ``int()`` accepts ``"١٢"``, ``" 12"``, ``"1_2"``; a day count of twenty digits overflowed
``timedelta``: each was a 500).
"""

from __future__ import annotations

import codecs
import re
from typing import Any

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser, get_encoding
from rest_framework.utils import json

from core.errors import ValidationFailed

MAX_DEPTH = 32
_BAD_CHARACTER = re.compile("[\x00\ud800-\udfff]")
_ASCII_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)
# the largest primary key PostgreSQL's bigint holds: a bound for ``?copy=<id>``-like parameters
MAX_ID = 2**63 - 1
_MAX_INTEGER_CHARACTERS = 40  # leading zeros allowed; longer is refused unread


def parse_integer(raw: str, *, field: str, low: int, high: int, what: str = "a whole number") -> int:
    """``raw`` as an integer in ``low..high``; otherwise ``ValidationFailed`` (400) naming ``field``.

    Only ASCII digits, with a leading ``-`` where ``low`` is negative: no spaces, ``+``, underscores or other
    scripts' digits. The length is checked before ``int()`` runs, so a huge value costs nothing."""
    refused = ValidationFailed(f"{field} must be {what} from {low} to {high}.", field=field)
    if (not isinstance(raw, str) or len(raw) > _MAX_INTEGER_CHARACTERS or not _ASCII_INTEGER.fullmatch(raw)
            or (raw.startswith("-") and low >= 0)):
        raise refused
    value = int(raw)
    if not low <= value <= high:
        raise refused
    return value


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body too large."
    default_code = "request_too_large"


class BodyParseError(exceptions.ParseError):
    """A parse error that names where in the body it is (``field``), e.g. ``gpu.kind`` or ``body``."""

    def __init__(self, detail: str, *, field: str = "body"):
        super().__init__(detail)
        self.field = field


def printable(text: str) -> str:
    """``text`` with NULs and lone surrogates written as escapes, safe to put into an error message."""
    return _BAD_CHARACTER.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]" if path else f"[{key}]"
    return f"{path}.{printable(key)}" if path else printable(key)


def check_document(data: Any) -> None:
    """Raise ``BodyParseError`` naming the first too-deep container or bad string in ``data``."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            if _BAD_CHARACTER.search(value):
                raise BodyParseError(
                    f"{path or 'body'}: strings may not contain NUL characters or lone UTF-16 surrogates.",
                    field=path or "body")
            continue
        if not isinstance(value, dict | list):
            continue
        if depth >= MAX_DEPTH:
            raise BodyParseError(f"body: JSON nested deeper than {MAX_DEPTH} levels.")
        if isinstance(value, dict):
            for key, item in value.items():
                name = _join(path, key)
                if _BAD_CHARACTER.search(key):
                    raise BodyParseError(
                        f"{name}: keys may not contain NUL characters or lone UTF-16 surrogates.", field=name)
                stack.append((item, name, depth + 1))
        else:
            stack.extend((item, _join(path, index), depth + 1) for index, item in enumerate(value))


class SafeJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read() if limit is None else stream.read(limit + 1)  # DRF passes no None stream
        if limit is not None and len(raw) > limit:
            raise RequestTooLarge(f"Request body larger than {limit} bytes.")
        try:
            text = codecs.decode(raw, get_encoding(parser_context))
            data = json.loads(text, parse_constant=json.strict_constant if self.strict else None)
        except RecursionError:
            raise BodyParseError(f"body: JSON nested deeper than {MAX_DEPTH} levels.") from None
        except ValueError as exc:  # includes UnicodeDecodeError
            raise BodyParseError(f"JSON parse error - {exc}") from None
        check_document(data)
        return data
