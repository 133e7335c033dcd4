"""The seeded price books are consistent: per model, a shape with no less memory, compute and media engines
never costs less, and a GPU-hour of shares never costs more than the exclusive GPU-hour (issue 29)."""

from __future__ import annotations

import io
from decimal import Decimal

import pytest
from django.core.management import call_command

from billing.core.pricing import RateTable
from billing.models import PriceBook
from billing.selectors import book_rate_table
from gpus.catalogue import MODELS
from gpus.mig import profiles_for

pytestmark = pytest.mark.django_db


def _shapes(model) -> list[tuple[str, str, int, int, bool]]:
    """(kind, profile, memory MiB, compute slices, media engines) of every shape a model is sold in."""
    whole = [("whole", "", model.memory_mib, 7, True)]
    return whole + [("mig", p.name, p.memory_mib, p.compute_slices, p.shape.media_extensions or p.compute_slices == 7)
                    for p in profiles_for(model.code)]


def monotonicity_problems(table: RateTable) -> list[str]:
    """Every pair of shapes of one model where the one with no more memory, compute or media costs more."""
    problems = []
    for model in MODELS:
        priced = []
        for kind, profile, memory, compute, media in _shapes(model):
            found = table.base(model.code, kind, profile)
            if found is not None:
                priced.append((profile or "whole GPU", memory, compute, media, found[0]))
        for small in priced:
            for large in priced:
                if small is large or not (small[1] <= large[1] and small[2] <= large[2] and small[3] <= large[3]):
                    continue
                if small[4] > large[4]:
                    problems.append(f"{model.code}: {small[0]} at {small[4]} costs more than {large[0]} at {large[4]}")
        share, whole = table.base(model.code, "share"), table.base(model.code, "whole")
        if share is not None and whole is not None and share[0] > whole[0]:
            problems.append(f"{model.code}: a shared GPU-hour at {share[0]} costs more than the whole at {whole[0]}")
    return problems


def test_price_book_seed_is_monotone_in_memory_and_compute():
    call_command("seed_prices", stdout=io.StringIO())
    books = list(PriceBook.objects.filter(tenant__isnull=True).prefetch_related("rates").order_by("currency"))
    assert [book.currency for book in books] == ["EUR", "USD"]
    for book in books:
        assert monotonicity_problems(book_rate_table(book)) == [], book.name


def test_price_book_monotonicity_check_finds_a_dearer_smaller_slice():
    """The check itself: the book seeded before issue 29 (1g.10gb at 0.70 next to a whole H100 at 4.20, whose
    1g.20gb is 4.20 / 7 = 0.60; L4 shares at 0.96 next to the L4 at 0.80) is refused, naming both."""
    table = RateTable(rates={("H100-80GB", "whole", ""): Decimal("4.20"),
                             ("H100-80GB", "mig", "1g.10gb"): Decimal("0.70"),
                             ("L4", "whole", ""): Decimal("0.80"), ("L4", "share", ""): Decimal("0.96")},
                      over_quota_multiplier=Decimal(1), interactive_multiplier=Decimal(1))
    problems = monotonicity_problems(table)
    assert "H100-80GB: 1g.10gb at 0.70 costs more than 1g.20gb at 0.600000" in problems
    assert "L4: a shared GPU-hour at 0.96 costs more than the whole at 0.80" in problems
