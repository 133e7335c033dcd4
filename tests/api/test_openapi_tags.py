"""The OpenAPI document for people and generators (issue 29): every operation in one group of config/openapi.py
(its tags, in the document's order), every list paginated as core/openapi.py documents it, and every moment an
ISO 8601 date-time."""

from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator

from config.openapi import GROUPS, UNGROUPED, tag_of

METHODS = ("get", "post", "put", "patch", "delete")
# GET operations that answer a bare array, each with its reason. (An object with its own groups, such as /quotas or
# /usage, is one answer, not a list route.)
UNPAGINATED_LISTS: dict[str, str] = {
    "/api/v1/workloads/{name}/profiles": "one profile per slice of the catalogue at most: bounded by gpus, not data",
}


@pytest.fixture(scope="module")
def schema(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        return SchemaGenerator().get_schema(request=None, public=True)


def _operations(schema):
    for path, item in schema["paths"].items():
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def test_openapi_every_operation_has_one_group_in_order(schema):
    names = [name for name, _, _ in GROUPS]
    assert [tag["name"] for tag in schema["tags"]] == names
    ungrouped = [f"{method.upper()} {path}" for path, method, op in _operations(schema) if op["tags"] != [tag_of(path)]
                 or op["tags"] == [UNGROUPED]]
    assert not ungrouped, f"operations in no group of config/openapi.py: {ungrouped}"
    used = {op["tags"][0] for _, _, op in _operations(schema)}
    assert used == set(names), f"groups with no operation: {set(names) - used}"
    assert tag_of("/api/v1/leases/{id}/samples") == "auto-tiering" and tag_of("/api/v1/leases/{id}") == "leases"
    assert tag_of("/api/v1/tenants/{slug}/billing-terms") == "staff: billing"
    assert tag_of("/api/v1/tenants/{slug}/projects") == "staff: tenants" and tag_of("/api/v1/tenant") == "tenancy"


def _resolve(schema, node):
    while isinstance(node, dict) and "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def test_openapi_every_list_route_is_paginated(schema):
    bare, unbounded = [], []
    for path, method, op in _operations(schema):
        if method != "get":
            continue
        body = op["responses"].get("200", {}).get("content", {}).get("application/json", {}).get("schema")
        body = _resolve(schema, body)
        if isinstance(body, dict) and body.get("type") == "array" and path not in UNPAGINATED_LISTS:
            bare.append(path)
        if isinstance(body, dict) and {"count", "results", "next", "previous"} <= set(body.get("properties", {})):
            params = {p["name"] for p in op.get("parameters", [])}
            if not {"limit", "offset"} <= params:
                unbounded.append(path)
    assert not bare, f"list routes answering a bare array (paginate them, core.api.paginate): {bare}"
    assert not unbounded, f"paginated routes that do not document limit and offset: {unbounded}"


def test_openapi_moments_are_iso_8601(schema):
    """Every property whose name says it is a moment (``*_at``, ``effective_from``/``_to``, and ``start``/``end``
    when they are strings: a warm instance's ``start`` is a slot number) is a ``date-time`` string in the document
    (DRF writes them ISO 8601, UTC with ``Z``)."""
    wrong = []
    for name, component in schema["components"]["schemas"].items():
        for prop, spec in component.get("properties", {}).items():
            spec = _resolve(schema, spec)
            named = prop.endswith("_at") or prop in ("effective_from", "effective_to")
            moment = named or (prop in ("start", "end", "from", "to") and spec.get("type") == "string")
            if moment and spec.get("format") not in ("date-time", "date") and not {"allOf", "oneOf"} & set(spec):
                wrong.append(f"{name}.{prop}: {spec}")
    assert not wrong, wrong
