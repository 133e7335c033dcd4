import pytest

from gpus.catalogue import MODELS, TIER_CODES, UnknownModel, model_get


def test_catalogue_codes_are_unique():
    assert len(set(TIER_CODES)) == len(MODELS)


def test_catalogue_model_get_accepts_aliases_and_case():
    assert model_get("v100m16").code == "V100-16GB"
    assert model_get("h100-80gb").memory_mib > 80_000


def test_catalogue_model_get_names_known_codes_on_error():
    with pytest.raises(UnknownModel, match="H100-80GB"):
        model_get("B300")
