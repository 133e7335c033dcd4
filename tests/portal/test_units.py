import pytest

from portal.templatetags.gpu_units import gpus


@pytest.mark.parametrize(("milli", "text"), [(4000, "4"), (2500, "2.5"), (429, "0.43"), (0, "0"), (None, "\u2013")])
def test_units_gpus_filter(milli, text):
    assert gpus(milli) == text
