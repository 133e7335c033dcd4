"""gpus/ is one catalogue: a model added to ``gpus.catalogue.MODELS`` must come with its memory, its MIG rows
(exactly when it is MIG-capable), its performance row and its NVML device name, or these tests fail naming
the model and the table it lacks."""

import pytest

from gpus import mig, performance
from gpus.catalogue import MODELS, TIER_CODES, GpuModel, UnknownModel, model_get


def test_catalogue_codes_are_unique():
    assert len(set(TIER_CODES)) == len(MODELS)


def test_catalogue_model_get_accepts_aliases_and_case():
    assert model_get("v100m16").code == "V100-16GB"
    assert model_get("h100-80gb").memory_mib > 80_000


def test_catalogue_model_get_names_known_codes_on_error():
    with pytest.raises(UnknownModel, match="H100-80GB"):
        model_get("B300")


MIG_TABLES = ("memory_mib", "name_gb")  # gpus.mig: usable memory and profile names by slot count


def missing_rows(model: GpuModel, *, specs=None, mig_rows=None) -> list[str]:
    """What the catalogue lacks for ``model``: one line per table, naming it (the tables are arguments so the
    check itself can be shown to fail)."""
    specs = performance.SPECS if specs is None else specs
    rows = (mig.mig_rows if mig_rows is None else mig_rows)(model.code)
    out = []
    if model.memory_mib <= 0:
        out.append(f"{model.code}: no memory (GpuModel.memory_mib in gpus.catalogue.MODELS)")
    for table in MIG_TABLES:
        if model.mig_capable and table not in rows:
            out.append(f"{model.code}: MIG-capable but no MIG {table} row in gpus.mig")
        if not model.mig_capable and table in rows:
            out.append(f"{model.code}: a MIG {table} row in gpus.mig but mig_capable is False")
    if "memory_mib" in rows and rows["memory_mib"][-1] > model.memory_mib:
        out.append(f"{model.code}: its whole-GPU MIG memory in gpus.mig exceeds the GPU's memory")
    if model.trace_only:
        if model.code in specs:
            out.append(f"{model.code}: trace_only but has a performance row in gpus.performance.SPECS")
        return out
    if model.code not in specs:
        out.append(f"{model.code}: no performance row in gpus.performance.SPECS")
    if not model.vendor_name.strip():
        out.append(f"{model.code}: no NVML device name (GpuModel.vendor_name)")
    return out


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.code)
def test_catalogue_every_model_has_its_memory_mig_performance_and_nvml_rows(model):
    assert missing_rows(model) == []


def test_catalogue_no_row_names_a_model_the_catalogue_lacks():
    for table, codes in (("gpus.performance.SPECS", performance.SPECS), ("gpus.mig", mig.mig_models())):
        strays = sorted(set(codes) - set(TIER_CODES))
        assert not strays, f"{table} has rows for models not in gpus.catalogue.MODELS: {', '.join(strays)}"


def test_catalogue_nvml_names_are_unique():
    """The agent maps a device to its model by this name first (``agent.nvml_backend.model_for_device_name``):
    two models with one name would make the second unreachable."""
    names = [m.vendor_name.lower() for m in MODELS if not m.trace_only]
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)


def test_catalogue_check_names_the_model_and_the_missing_table():
    b200 = GpuModel("B200-180GB", "NVIDIA B200", 183_359, True, True)
    assert missing_rows(b200) == [
        "B200-180GB: MIG-capable but no MIG memory_mib row in gpus.mig",
        "B200-180GB: MIG-capable but no MIG name_gb row in gpus.mig",
        "B200-180GB: no performance row in gpus.performance.SPECS",
    ]
    nameless = GpuModel("X1", " ", 1024, False, False)
    assert missing_rows(nameless, specs={"X1": None}) == ["X1: no NVML device name (GpuModel.vendor_name)"]
    h100 = model_get("H100-80GB")
    half = {"memory_mib": mig.mig_rows("H100-80GB")["memory_mib"]}
    assert missing_rows(h100, mig_rows=lambda code: half) == [
        "H100-80GB: MIG-capable but no MIG name_gb row in gpus.mig"]
    assert missing_rows(model_get("L4"), mig_rows=lambda code: half) == [
        "L4: a MIG memory_mib row in gpus.mig but mig_capable is False",
        "L4: its whole-GPU MIG memory in gpus.mig exceeds the GPU's memory"]
