"""The API docs pages name nothing on another host (issue 29: ReDoc loaded its fonts from Google's servers; its
script and Swagger UI's come from drf-spectacular-sidecar's static files). Every URL in a ``src``, ``href`` or
CSS ``url(...)`` of the page is this deployment's own."""

import re

import pytest


@pytest.mark.parametrize("path", ["/api/docs/", "/api/redoc/"])
def test_api_docs_pages_name_no_other_host(client, db, path):
    page = client.get(path)
    assert page.status_code == 200
    body = page.content.decode()
    urls = re.findall(r'(?:src|href)\s*=\s*["\']([^"\']+)["\']', body) + re.findall(r"url\(([^)]+)\)", body)
    assert urls, body  # the page names its assets (the check below has something to check)
    foreign = [url for url in urls if re.match(r"^(?:[a-z]+:)?//", url.strip("'\" "))]
    assert not foreign, f"{path} loads from other hosts: {foreign}"
    assert "fonts.googleapis" not in body and "fonts.gstatic" not in body
