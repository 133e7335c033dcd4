"""Every portal page looked at as a new user would: on a 1366 px laptop screen and on a phone (390 px, touch),
in Debian's Chromium (issue 29: "each page looked at at 1366 px and on a phone").

What "looked at" checks, page by page: it answers (no 4xx/5xx), no script error, and nothing is wider than the
screen: the page never scrolls sideways (wide tables scroll inside their own box, as the stylesheet's
``.table-wrap`` does). The pages are every GET page of the portal's URL configuration, found from the
configuration itself, so a page added later is looked at too; the pages that need an object get one from the
seeded tenant (a finished lease, a finalized invoice) or are named in ``NEEDS`` below."""

from __future__ import annotations

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from billing import services as billing
from billing.models import Invoice
from broker.models import Lease
from tests import real_parts
from tests.billing.test_invoicing import AFTER, JANUARY, two_leases
from tests.billing.test_invoicing import world as world
from tests.factories import make_user
from tests.portal.test_browser import _close_server_connections, browser, open_page  # noqa: F401 - fixtures

pytestmark = [real_parts.CHROMIUM, pytest.mark.slow]

SCREENS = {
    "laptop": {"viewport": {"width": 1366, "height": 768}},
    "phone": {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True,
              "device_scale_factor": 2},
}

# pages that are not a page to look at: redirects, downloads, POST-only actions, htmx fragments
NOT_PAGES = {"ops", "tenant-switch", "lease-preview", "lease-log", "lease-release", "lease-renew", "invoice-document",
             "workload-profile", "workload-regime", "pipeline-plan", "budget-delete", "token-revoke"}


def portal_pages() -> dict[str, tuple]:
    """name -> (pattern's converters) for every named portal route; POST-only views and fragments excluded."""
    resolver = get_resolver()
    portal = next(p for p in resolver.url_patterns if isinstance(p, URLResolver) and p.namespace == "portal")
    pages = {}
    for pattern in portal.url_patterns:
        if not isinstance(pattern, URLPattern) or not pattern.name or pattern.name in NOT_PAGES:
            continue
        view = getattr(pattern.callback, "view_class", None)
        methods = getattr(pattern.callback, "view_initkwargs", {}).get("http_method_names") or \
            getattr(view, "http_method_names", ["get"])
        if "get" not in methods or view is None or not hasattr(view, "get"):
            continue
        if any(word in pattern.name for word in ("accept", "reject", "apply", "release", "delete", "cordon",
                                                  "run", "status", "quota-set", "decide")):
            continue
        # a path() names its arguments' converters; a re_path() has regex groups instead (invoice-focus's pk, fmt)
        arguments = tuple(pattern.pattern.converters) or tuple(pattern.pattern.regex.groupindex)
        pages[pattern.name] = arguments
    return pages


@pytest.fixture
def seeded(world):
    two_leases(world)
    billing.invoice_run(period=JANUARY, now=AFTER)
    make_user("root", is_staff=True)
    return world


# the element that makes the page too wide: hide each child in turn and go down into the one whose hiding cures it
CULPRIT = """(width) => {
  const over = () => document.documentElement.scrollWidth > width + 1;
  const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
    + (e.classList.length ? '.' + e.classList[0] : '');
  let node = document.body, path = [];
  descend: for (let depth = 0; depth < 40; depth++) {
    for (const child of node.children) {
      const before = child.style.display;
      child.style.display = 'none';
      const cured = !over();
      child.style.display = before;
      if (cured) { path.push(name(child)); node = child; continue descend; }
    }
    break;
  }
  return path.join(' > ') || 'no single element';
}"""


def _look(page, url: str, width: int) -> list[str]:
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"script error: {error}"))
    response = page.goto(url)
    page.wait_for_load_state("networkidle")
    if response is None or response.status >= 400:
        errors.append(f"answered {response.status if response else 'nothing'}")
    scroll = page.evaluate("document.documentElement.scrollWidth")
    # against the screen's own width: a phone browser zooms out to fit a page that is too wide, so the page's
    # idea of its window (innerWidth) grows with the overflow and cannot be the measure
    if scroll > width + 1:
        errors.append(f"scrolls sideways: {scroll} px wide on a {width} px screen (because of: "
                      f"{page.evaluate(CULPRIT, width)})")
    return errors


@pytest.mark.usefixtures("_close_server_connections")
def test_every_portal_page_fits_a_laptop_and_a_phone(live_server, browser, seeded):  # noqa: F811
    lease = Lease.objects.filter(project__tenant=seeded.acme).order_by("pk").first()
    invoice = Invoice.objects.get(tenant=seeded.acme)
    # the object each page with an argument is looked at with
    arguments = {"lease": [lease.pk], "invoice": [invoice.pk], "ops-tenant": [seeded.acme.slug]}
    pages = portal_pages()
    unknown = sorted(name for name, converters in pages.items() if converters and name not in arguments)
    tenant_urls, staff_urls = [], []
    for name, converters in sorted(pages.items()):
        if converters and name not in arguments:
            continue  # pages of objects the seeded tenant has none of (pipelines, workloads, price books)
        url = reverse(f"portal:{name}", args=arguments.get(name, []))
        (staff_urls if url.startswith("/ops/") else tenant_urls).append(url)
    assert len(tenant_urls) >= 10 and len(staff_urls) >= 5, (tenant_urls, staff_urls)

    problems = []
    for screen, options in SCREENS.items():
        for username, urls in (("alice", ["/accounts/login/", *tenant_urls]), ("root", staff_urls)):
            page = open_page(browser, live_server.url, username, **options)  # staff pass the second factor
            page.set_default_timeout(20_000)
            for url in urls:
                problems += [f"{screen} {username} {url}: {error}" for error in _look(page, live_server.url + url,
                                                                                 options["viewport"]["width"])]
            page.context.close()
    assert not problems, "\n".join(problems)
    print(f"\nlooked at {len(tenant_urls) + len(staff_urls) + 1} pages on {len(SCREENS)} screens; "
          f"pages of objects the seeded tenant lacks: {', '.join(unknown)}")
