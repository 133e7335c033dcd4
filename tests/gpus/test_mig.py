import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.nvml_backend import GI_PROFILE_SHAPES, model_for_device_name
from gpus.mig import (
    COMPUTE_SLICES,
    SHAPE_BY_KEY,
    MigPlacement,
    UnknownProfile,
    free_starts,
    layout_problem,
    maximal_layouts,
    mig_rows,
    profile_get,
    profiles_for,
)

MIG_MODELS = ["A100-40GB", "A100-80GB", "H100-80GB", "H100-NVL-94GB", "H200-141GB"]


def P(model, name, start):
    return MigPlacement(start, profile_get(model, name))


@pytest.mark.parametrize(
    ("model", "names"),
    [
        ("A100-40GB", ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
        ("A100-80GB", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        ("H100-80GB", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        ("H100-NVL-94GB", ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"]),
        ("H200-141GB", ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
    ],
)
def test_mig_profile_names_per_model(model, names):
    assert [p.name for p in profiles_for(model)] == names


def test_mig_memory_is_real_size_below_name():
    assert profile_get("H100-80GB", "1g.10gb").memory_mib == 9984  # 9.75 GiB
    for model in MIG_MODELS:
        sizes = [p.memory_mib for p in profiles_for(model)]
        assert all(size > 0 for size in sizes)
        assert profile_get(model, profiles_for(model)[-1].name).memory_mib < 1.03 * profiles_for(model)[-1].memory_mib


def test_mig_unknown_profile_names_offered():
    with pytest.raises(UnknownProfile, match=r"offered: 1g\.10gb"):
        profile_get("H100-80GB", "3g.20gb")
    with pytest.raises(UnknownProfile, match="no MIG"):
        profile_get("L4", "1g.5gb")


@pytest.mark.parametrize(
    ("layout", "problem"),
    [
        ([("3g.40gb", 2)], "cannot start at slot 2"),
        ([("4g.40gb", 4)], "cannot start at slot 4"),
        ([("1g.10gb", 7)], "cannot start at slot 7"),
        ([("2g.20gb", 6)], "cannot start at slot 6"),
        ([("3g.40gb", 0), ("3g.40gb", 4), ("1g.10gb", 3)], "overlaps"),
        ([("4g.40gb", 0), ("1g.10gb", 2)], "overlaps"),
        ([("1g.10gb+me", 0), ("1g.10gb+me", 1)], "+me"),
        ([("7g.80gb", 0), ("1g.10gb", 1)], "overlaps"),
    ],
)
def test_mig_invalid_layouts_give_reason(layout, problem):
    placements = [P("H100-80GB", name, start) for name, start in layout]
    assert problem in (layout_problem(placements) or "")


def test_mig_valid_layouts():
    for layout in [
        [("4g.40gb", 0), ("3g.40gb", 4)],
        [("3g.40gb", 0), ("3g.40gb", 4)],
        [("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.10gb", 6)],
        [("1g.10gb", s) for s in range(7)],
        [("1g.20gb", 0), ("1g.20gb", 2), ("1g.20gb", 4), ("1g.20gb", 6)],
    ]:
        assert layout_problem([P("H100-80GB", n, s) for n, s in layout]) is None


def test_mig_compute_budget_refuses_seven_plus_one():
    # 1g.20gb x4 fill all 8 memory slots with 4 compute slices; fine. 4g+3g uses 7 compute.
    layout = [P("H100-80GB", "4g.40gb", 0), P("H100-80GB", "2g.20gb", 4)]
    assert layout_problem(layout) is None
    assert free_starts(layout, profile_get("H100-80GB", "1g.10gb")) == (6,)


@pytest.mark.parametrize("model", ["A100-80GB", "H100-80GB", "H200-141GB"])
def test_mig_fourteen_maximal_layouts_on_80gb_class(model):
    layouts = maximal_layouts(model)
    assert len(layouts) == 14
    gb = {"A100-80GB": (10, 20, 40, 80), "H100-80GB": (10, 20, 40, 80), "H200-141GB": (18, 35, 71, 141)}[model]
    assert (f"3g.{gb[2]}gb", f"4g.{gb[2]}gb") in layouts  # 4g + 3g is valid
    assert (f"1g.{gb[0]}gb", f"3g.{gb[2]}gb", f"3g.{gb[2]}gb") not in layouts  # 3g+3g+1g is not


placement_strategy = st.lists(
    st.tuples(st.sampled_from([p.name for p in profiles_for("H100-80GB")]), st.integers(0, 7)), max_size=9
)


@given(placement_strategy)
@settings(max_examples=400, deadline=None)
def test_mig_property_layouts_built_by_free_starts_are_valid(requests):
    """Adding instances only where ``free_starts`` allows always yields a valid layout."""
    layout: list[MigPlacement] = []
    for name, wish in requests:
        profile = profile_get("H100-80GB", name)
        starts = free_starts(layout, profile)
        if starts:
            layout.append(MigPlacement(starts[wish % len(starts)], profile))
        assert layout_problem(layout) is None
    assert sum(p.profile.compute_slices for p in layout) <= COMPUTE_SLICES
    masks = [p.slot_mask for p in layout]
    assert sum(bin(m).count("1") for m in masks) == bin(sum(masks)).count("1")  # no shared slot


@given(placement_strategy)
@settings(max_examples=400, deadline=None)
def test_mig_property_layout_problem_agrees_with_definition(requests):
    layout = [MigPlacement(start, profile_get("H100-80GB", name)) for name, start in requests]
    slots = [s for p in layout for s in range(p.start, p.end)]
    expected_valid = (
        all(p.start in p.profile.starts for p in layout)
        and len(slots) == len(set(slots))
        and sum(p.profile.compute_slices for p in layout) <= 7
        and sum(p.profile.shape.media_extensions for p in layout) <= 1
        and all(sum(q.profile.shape.key == p.profile.shape.key for q in layout) <= p.profile.shape.max_per_gpu
                for p in layout)
    )
    assert (layout_problem(layout) is None) == expected_valid


# The MIG profile probes recorded on lent machines (bench/mig_profiles.py: NVML's answer for each GPU-instance
# profile constant, read-only). The rows of gpus/mig.py for a recorded model must be what NVML said.
MIG_PROBES = sorted((Path(__file__).parents[1] / "agent" / "data").glob("*_mig_profiles_*.json"))


@pytest.mark.parametrize("path", MIG_PROBES, ids=lambda path: path.name)
def test_mig_table_matches_the_recorded_nvml_profiles(path):
    recording = json.loads(path.read_text())
    for gpu in recording["gpus"]:
        model = model_for_device_name(gpu["name"])
        assert model is not None, gpu["name"]
        ours = {p.shape.key: p for p in profiles_for(model.code)}
        answered = {row["constant"]: row for row in gpu["profiles"] if "error" not in row}
        # every shape we offer is one NVML offers, and the other way round for the shapes we name
        assert {GI_PROFILE_SHAPES[c] for c in answered if c in GI_PROFILE_SHAPES} == set(ours)
        for constant, row in answered.items():
            if constant not in GI_PROFILE_SHAPES:
                continue
            shape = SHAPE_BY_KEY[GI_PROFILE_SHAPES[constant]]
            profile = ours[shape.key]
            assert (row["sliceCount"], row["instanceCount"]) == (shape.compute_slices, shape.max_per_gpu), constant
            assert profile.memory_mib == row["memorySizeMB"], (model.code, profile.name, constant)
        # memory by memory-slot count, as the table is kept
        by_slots = {}
        for constant, row in answered.items():
            if constant in GI_PROFILE_SHAPES:
                by_slots.setdefault(SHAPE_BY_KEY[GI_PROFILE_SHAPES[constant]].memory_slots, set()).add(
                    row["memorySizeMB"])
        assert all(len(sizes) == 1 for sizes in by_slots.values()), by_slots
        assert mig_rows(model.code)["memory_mib"] == tuple(by_slots[slots].pop() for slots in (1, 2, 4, 8))


def test_mig_h200_memory_is_the_measured_answer():
    assert [(p.name, p.memory_mib) for p in profiles_for("H200-141GB")] == [
        ("1g.18gb", 16_384), ("1g.18gb+me", 16_384), ("1g.35gb", 33_280), ("2g.35gb", 33_280),
        ("3g.71gb", 71_424), ("4g.71gb", 71_424), ("7g.141gb", 143_360),
    ]
