"""Stripe's v1 wire format and parameter checks, as the test server applies them.

Stripe v1 takes ``application/x-www-form-urlencoded`` bodies (and query strings for GET) with nested keys
written in brackets: ``metadata[tenant_id]=7``, ``expand[0]=customer``, ``period[start]=1700000000``.
:func:`decode_form` turns such pairs into nested dicts; the :class:`Param` types below check one value each
and raise :class:`ApiError` with the messages and codes Stripe uses (``parameter_unknown``,
``parameter_missing``, ``parameter_invalid_integer``, ``parameter_invalid_empty``, ...).

Error object reference: https://docs.stripe.com/api/errors (type, code, message, param, doc_url).
"""

from __future__ import annotations

import re
from typing import Any

ERROR_DOCS = "https://docs.stripe.com/error-codes/"


class ApiError(Exception):
    """An answer in Stripe's error shape: ``{"error": {"type", "code", "message", "param", "doc_url"}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.code:
            error["code"] = self.code
            error["doc_url"] = ERROR_DOCS + self.code.replace("_", "-")
        if self.param:
            error["param"] = self.param
        return {"error": error}


def unknown(name: str) -> ApiError:
    return ApiError(400, f"Received unknown parameter: {name}", code="parameter_unknown", param=name)


def missing(name: str) -> ApiError:
    return ApiError(400, f"Missing required param: {name}.", code="parameter_missing", param=name)


def invalid(name: str, message: str, code: str = "parameter_invalid") -> ApiError:
    return ApiError(400, message, code=code, param=name)


# --- form decoding ----------------------------------------------------------------------------------------

_KEY = re.compile(r"^([^\[\]]+)((?:\[[^\[\]]*\])*)$")
_PART = re.compile(r"\[([^\[\]]*)\]")


def decode_form(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """``[("metadata[a]", "1"), ("expand[0]", "x")]`` → ``{"metadata": {"a": "1"}, "expand": {"0": "x"}}``.
    ``a[]=x`` appends to a list. Indexed arrays stay dicts of digit keys until a type reads them as lists."""
    root: dict[str, Any] = {}
    for raw_key, value in pairs:
        match = _KEY.match(raw_key)
        if not match:
            raise invalid(raw_key, f"Invalid parameter name: {raw_key}")
        parts = [match.group(1), *_PART.findall(match.group(2))]
        node: Any = root
        for depth, part in enumerate(parts):
            name = parts[0] + "".join(f"[{p}]" for p in parts[1:depth + 1])
            last = depth == len(parts) - 1
            if isinstance(node, list):
                if part != "" or not last:
                    raise invalid(name, f"Invalid array: {name}")
                node.append(value)
                break
            if part == "":
                raise invalid(name, f"Invalid parameter name: {raw_key}")
            if last:
                if part in node:
                    raise invalid(name, f"Received the parameter {name} more than once.")
                node[part] = value
            else:
                following = parts[depth + 1]
                child = node.setdefault(part, [] if following == "" else {})
                if isinstance(child, str) or (following == "") != isinstance(child, list):
                    raise invalid(name, f"Invalid hash: {name} was sent both as a value and as a hash or array.")
                node = child
    return root


# --- parameter types --------------------------------------------------------------------------------------


class Param:
    """One documented parameter. ``parse`` returns the Python value or raises :class:`ApiError`."""

    def __init__(self, *, required: bool = False):
        self.required = required

    def parse(self, value: Any, name: str) -> Any:
        raise NotImplementedError

    def _scalar(self, value: Any, name: str, kind: str) -> str:
        if not isinstance(value, str):
            raise invalid(name, f"Invalid {kind}: {name} must be a single value, not a hash or array.",
                          code=f"parameter_invalid_{kind}")
        return value


class String(Param):
    def __init__(self, *, max_length: int = 5000, emptyable: bool = False, pattern: str | None = None,
                 required: bool = False):
        super().__init__(required=required)
        self.max_length = max_length
        self.emptyable = emptyable
        self.pattern = re.compile(pattern) if pattern else None

    def parse(self, value: Any, name: str) -> str | None:
        value = self._scalar(value, name, "string")
        if value == "":
            if self.emptyable:
                return None
            raise invalid(name, f"You passed an empty string for '{name}'. We assume empty values are an attempt "
                                f"to unset a parameter; however '{name}' cannot be unset. You should remove "
                                f"'{name}' from your request or supply a non-empty value.",
                          code="parameter_invalid_empty")
        if len(value) > self.max_length:
            raise invalid(name, f"Invalid string: {value[:40]}...; must be at most {self.max_length} characters",
                          code="parameter_invalid_string")
        if self.pattern and not self.pattern.fullmatch(value):
            raise invalid(name, f"Invalid {name}: {value!r}", code="parameter_invalid_string")
        return value


class Integer(Param):
    def __init__(self, *, minimum: int | None = None, maximum: int | None = None, required: bool = False):
        super().__init__(required=required)
        self.minimum = minimum
        self.maximum = maximum

    def parse(self, value: Any, name: str) -> int:
        value = self._scalar(value, name, "integer")
        if not re.fullmatch(r"-?\d+", value):
            raise invalid(name, f"Invalid integer: {value}", code="parameter_invalid_integer")
        number = int(value)
        if not -(2**63) <= number < 2**63:
            raise invalid(name, f"Invalid integer: {value}", code="parameter_invalid_integer")
        if self.minimum is not None and number < self.minimum:
            raise invalid(name, f"This value must be greater than or equal to {self.minimum}.",
                          code="parameter_invalid_integer")
        if self.maximum is not None and number > self.maximum:
            raise invalid(name, f"This value must be less than or equal to {self.maximum}.",
                          code="parameter_invalid_integer")
        return number


class Timestamp(Integer):
    def __init__(self, *, required: bool = False):
        super().__init__(minimum=0, required=required)


class Boolean(Param):
    def parse(self, value: Any, name: str) -> bool:
        value = self._scalar(value, name, "boolean")
        if value not in ("true", "false"):
            raise invalid(name, f"Invalid boolean: {value}", code="parameter_invalid_boolean")
        return value == "true"


class Enum(Param):
    def __init__(self, *values: str, required: bool = False):
        super().__init__(required=required)
        self.values = values

    def parse(self, value: Any, name: str) -> str:
        value = self._scalar(value, name, "string")
        if value not in self.values:
            choices = ", ".join(self.values[:-1]) + f" or {self.values[-1]}" if len(self.values) > 1 else self.values[0]
            raise invalid(name, f"Invalid {name}: must be one of {choices}", code="parameter_invalid_string")
        return value


# Presentment currencies Stripe supports (a subset is enough for a test server; all are real ISO 4217 codes
# from https://docs.stripe.com/currencies).
CURRENCIES = frozenset({
    "usd", "aed", "aud", "bgn", "brl", "cad", "chf", "cny", "czk", "dkk", "eur", "gbp", "hkd", "huf", "idr", "ils",
    "inr", "isk", "jpy", "krw", "mxn", "myr", "nok", "nzd", "php", "pln", "ron", "sek", "sgd", "thb", "try", "twd",
    "zar",
})


class Currency(Param):
    def parse(self, value: Any, name: str) -> str:
        value = self._scalar(value, name, "string")
        if value.lower() not in CURRENCIES:
            raise invalid(name, f"Invalid currency: {value}. Stripe currently supports these currencies: "
                                f"{', '.join(sorted(CURRENCIES))}", code="parameter_invalid_string")
        return value.lower()


class Id(Param):
    """The id of another object (``cus_…``, ``in_…``); whether it exists is checked when the request runs."""

    def __init__(self, prefix: str, *, required: bool = False):
        super().__init__(required=required)
        self.prefix = prefix

    def parse(self, value: Any, name: str) -> str:
        value = self._scalar(value, name, "string")
        if value == "":
            String().parse(value, name)  # raises Stripe's "empty string" error
        return value


class Metadata(Param):
    """Up to 50 keys, keys up to 40 characters without square brackets, values up to 500 characters
    (https://docs.stripe.com/api/metadata). An empty value unsets a key; ``metadata=`` unsets all."""

    def parse(self, value: Any, name: str) -> dict[str, str]:
        if value == "":
            return {}
        if not isinstance(value, dict):
            raise invalid(name, f"Invalid object: {name} must be a hash of keys and values",
                          code="parameter_invalid_object")
        if len(value) > 50:
            raise invalid(name, "Invalid metadata: metadata can have up to 50 keys")
        out = {}
        for key, item in value.items():
            if not isinstance(item, str):
                raise invalid(f"{name}[{key}]", f"Invalid metadata: the value of {name}[{key}] must be a string")
            if len(key) > 40:
                raise invalid(f"{name}[{key}]", f"Invalid metadata: keys can be at most 40 characters ({key})")
            if len(item) > 500:
                raise invalid(f"{name}[{key}]", f"Invalid metadata: values can be at most 500 characters ({key})")
            if item != "":
                out[key] = item
        return out


class StringList(Param):
    """An array of strings, sent as ``name[0]=…&name[1]=…`` (or ``name[]=…``)."""

    def __init__(self, *, choices: tuple[str, ...] | None = None, required: bool = False):
        super().__init__(required=required)
        self.choices = choices

    def parse(self, value: Any, name: str) -> list[str]:
        if value == "":
            return []
        if isinstance(value, dict):
            if not all(key.isdigit() for key in value):
                raise invalid(name, f"Invalid array: {name} must be an array")
            value = [value[key] for key in sorted(value, key=int)]
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise invalid(name, f"Invalid array: {name} must be an array of strings", code="parameter_invalid_array")
        if self.choices is not None:
            for item in value:
                if item not in self.choices:
                    raise invalid(name, f"This property cannot be expanded ({item}).")
        return value


class Hash(Param):
    """A nested object with its own documented keys."""

    def __init__(self, fields: dict[str, Param], *, required: bool = False):
        super().__init__(required=required)
        self.fields = fields

    def parse(self, value: Any, name: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise invalid(name, f"Invalid object: {name} must be a hash", code="parameter_invalid_object")
        return parse_params(self.fields, value, prefix=name)


class Unsupported(Param):
    """Documented by Stripe for this endpoint but not modelled here: using it is an error that says so, so a
    test never passes against behaviour the server only pretends to have."""

    def parse(self, value: Any, name: str) -> Any:
        raise ApiError(400, f"The parameter {name} is documented by Stripe for this endpoint, but this test server "
                            "does not implement it; extend tests/stripe_server before relying on it.",
                       code="parameter_not_implemented_by_test_server", param=name)


def parse_params(spec: dict[str, Param], values: dict[str, Any], *, prefix: str = "") -> dict[str, Any]:
    """Check ``values`` against ``spec`` in Stripe's order: unknown names, then missing ones, then values."""

    def full(key: str) -> str:
        return f"{prefix}[{key}]" if prefix else key

    for key in values:
        if key not in spec:
            raise unknown(full(key))
    for key, param in spec.items():
        if param.required and key not in values:
            raise missing(full(key))
    parsed = {}
    for key, value in values.items():
        result = spec[key].parse(value, full(key))
        if result is not None:
            parsed[key] = result
    return parsed


class DecimalNumber(Param):
    """A decimal number sent as text (``percentage=19.5``; the SDK types it ``float``), within ``minimum`` ..
    ``maximum`` and with at most ``places`` decimal places; returned as the text Stripe would echo, a float."""

    def __init__(self, *, minimum: float, maximum: float, places: int = 4, required: bool = False):
        super().__init__(required=required)
        self.minimum = minimum
        self.maximum = maximum
        self.places = places

    def parse(self, value: Any, name: str) -> float:
        value = self._scalar(value, name, "decimal")
        match = re.fullmatch(r"-?\d+(?:\.(\d+))?", value)
        if not match or len(match.group(1) or "") > self.places:
            raise invalid(name, f"Invalid decimal: {value} (at most {self.places} decimal places)",
                          code="parameter_invalid_decimal")
        number = float(value)
        if not self.minimum <= number <= self.maximum:
            raise invalid(name, f"{name} must be between {self.minimum:g} and {self.maximum:g}.",
                          code="parameter_invalid_decimal")
        return number


class HashList(Param):
    """An array of objects with their own documented keys, sent as ``lines[0][type]=…&lines[1][type]=…``."""

    def __init__(self, fields: dict[str, Param], *, max_items: int = 100, required: bool = False):
        super().__init__(required=required)
        self.fields = fields
        self.max_items = max_items

    def parse(self, value: Any, name: str) -> list[dict[str, Any]]:
        if not isinstance(value, dict) or not value or not all(key.isdigit() for key in value):
            raise invalid(name, f"Invalid array: {name} must be an array of hashes", code="parameter_invalid_array")
        if len(value) > self.max_items:
            raise invalid(name, f"Invalid array: {name} has more than {self.max_items} items")
        out = []
        for key in sorted(value, key=int):
            item = value[key]
            if not isinstance(item, dict):
                raise invalid(f"{name}[{key}]", f"Invalid object: {name}[{key}] must be a hash",
                              code="parameter_invalid_object")
            out.append(parse_params(self.fields, item, prefix=f"{name}[{key}]"))
        return out
