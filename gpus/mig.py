"""MIG (Multi-Instance GPU) profiles and their placement rules.

A100, H100 and H200 share one geometry: 8 memory slots (0-7) and 7 compute slices. A GPU instance of a
profile occupies the memory slots ``[start, start + memory_slots)`` and ``compute_slices`` of compute.
Rules (NVIDIA MIG user guide, "Supported MIG Profiles"):

- a profile may start only at its valid start slots (a ``3g`` at 0 or 4, a ``4g`` or ``7g`` at 0);
- instances never share a memory slot;
- the compute slices of all instances add up to at most 7;
- at most one ``+me`` (media extensions) instance per GPU, and never more instances of a profile than
  its per-GPU maximum.

A layout is a tuple of ``MigPlacement(profile, start)``. ``layout_problem`` returns why a layout is invalid
(or None); nothing else in the project decides MIG validity. Memory is the usable size the driver reports
(``nvidia-smi mig -lgip``), a little below the name: bill and check by ``memory_mib``, not the name.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

MEMORY_SLOTS = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True, slots=True, order=True)
class MigShape:
    """The geometry of a profile family, shared by all MIG-capable models."""

    key: str  # "1g", "1g+me", "1g.2s" (one compute slice, two memory slots), "2g", "3g", "4g", "7g"
    compute_slices: int
    memory_slots: int
    starts: tuple[int, ...]
    max_per_gpu: int
    media_extensions: bool = False


SHAPES: tuple[MigShape, ...] = (
    MigShape("1g", 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
    MigShape("1g+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, media_extensions=True),
    MigShape("1g.2s", 1, 2, (0, 2, 4, 6), 4),
    MigShape("2g", 2, 2, (0, 2, 4), 3),
    MigShape("3g", 3, 4, (0, 4), 2),
    MigShape("4g", 4, 4, (0,), 1),
    MigShape("7g", 7, 8, (0,), 1),
)
SHAPE_BY_KEY = {shape.key: shape for shape in SHAPES}


@dataclass(frozen=True, slots=True, order=True)
class MigProfile:
    """A profile as a model names it (``3g.40gb`` on an H100-80GB) with its usable memory."""

    name: str
    model: str
    shape: MigShape
    memory_mib: int
    # copied from the shape for speed (the scheduler reads them in its inner loops)
    compute_slices: int = 0
    memory_slots: int = 0
    starts: tuple[int, ...] = ()
    # the GPU units the profile counts against quotas: compute slices of 7, in milli-GPU, rounded down so
    # that any valid layout sums to at most 1000 (7 x 1g = 994); the full 7g is exactly 1000
    gpu_milli: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "compute_slices", self.shape.compute_slices)
        object.__setattr__(self, "memory_slots", self.shape.memory_slots)
        object.__setattr__(self, "starts", self.shape.starts)
        slices = self.shape.compute_slices
        object.__setattr__(self, "gpu_milli", 1000 if slices == COMPUTE_SLICES else slices * 1000 // COMPUTE_SLICES)


# Usable memory (MiB) by memory-slot count per model: 1 slot, 2 slots, 4 slots, 8 slots (the agent's nvml
# backend reads the real sizes from the device; these rows are what the broker plans and bills with).
# - A100-40GB, A100-80GB, H100-80GB: as `nvidia-smi mig -lgip` reports them (no profile probe of these
#   models is recorded in the repository yet).
# - H100-NVL-94GB: scaled from the H100-80GB ratios (never read on real hardware).
# - H200-141GB: measured, NVML's memorySizeMB for each GPU-instance profile on a real NVIDIA H200 (driver
#   580.159.04, MIG disabled, read-only probe bench/mig_profiles.py, 2026-11-27:
#   tests/agent/data/h200_mig_profiles_2026-11-27.json): 1_SLICE 16,384; 1_SLICE_REV2 and 2_SLICE 33,280;
#   3_SLICE and 4_SLICE 71,424; 7_SLICE 143,360. The H100-ratio scaling it replaces had 17,920 / 35,968 /
#   72,192 for the first three (too large by 1,536, 2,688 and 768 MiB).
_MEMORY_BY_SLOTS: dict[str, tuple[int, int, int, int]] = {
    "A100-40GB": (4_864, 9_856, 20_096, 40_320),
    "A100-80GB": (9_728, 19_968, 40_192, 80_896),
    "H100-80GB": (9_984, 20_096, 40_320, 81_152),
    "H100-NVL-94GB": (11_776, 23_680, 47_488, 95_488),
    "H200-141GB": (16_384, 33_280, 71_424, 143_360),
}
# The name each model gives a shape: (1-slot GB, 2-slot GB, 4-slot GB, 8-slot GB) in the profile name.
_NAME_GB: dict[str, tuple[int, int, int, int]] = {
    "A100-40GB": (5, 10, 20, 40),
    "A100-80GB": (10, 20, 40, 80),
    "H100-80GB": (10, 20, 40, 80),
    "H100-NVL-94GB": (12, 24, 47, 94),
    "H200-141GB": (18, 35, 71, 141),
}
_SLOT_INDEX = {1: 0, 2: 1, 4: 2, 8: 3}


def _profile_name(model: str, shape: MigShape) -> str:
    gb = _NAME_GB[model][_SLOT_INDEX[shape.memory_slots]]
    compute = shape.key.split("+")[0].split(".")[0]
    return f"{compute}.{gb}gb" + ("+me" if shape.media_extensions else "")


def mig_models() -> tuple[str, ...]:
    """The models the MIG tables have a row for (usable memory or profile names by slot count)."""
    return tuple(sorted(set(_MEMORY_BY_SLOTS) | set(_NAME_GB)))


def mig_rows(model: str) -> dict[str, tuple[int, int, int, int]]:
    """The MIG table rows of ``model`` by table name (``memory_mib``, ``name_gb``), those it has."""
    rows = {"memory_mib": _MEMORY_BY_SLOTS.get(model), "name_gb": _NAME_GB.get(model)}
    return {name: row for name, row in rows.items() if row is not None}


@cache
def profiles_for(model: str) -> tuple[MigProfile, ...]:
    """The MIG profiles of a model (empty when the model has no MIG)."""
    if model not in _MEMORY_BY_SLOTS:
        return ()
    memory = _MEMORY_BY_SLOTS[model]
    return tuple(
        MigProfile(_profile_name(model, shape), model, shape, memory[_SLOT_INDEX[shape.memory_slots]])
        for shape in SHAPES
    )


class UnknownProfile(KeyError):
    pass


@lru_cache(maxsize=1024)  # the scheduler looks a profile up per MIG unit it applies; the catalogue is fixed
def profile_get(model: str, name: str) -> MigProfile:
    """The profile ``name`` (``3g.40gb``; a ``MIG `` prefix and case are ignored) of ``model``."""
    wanted = name.strip().removeprefix("MIG ").lower()
    for profile in profiles_for(model):
        if profile.name == wanted:
            return profile
    offered = ", ".join(p.name for p in profiles_for(model)) or "none (the model has no MIG)"
    raise UnknownProfile(f"profile {name!r} is not offered on {model}; offered: {offered}")


@dataclass(frozen=True, slots=True, order=True)
class MigPlacement:
    """One GPU instance: a profile at a start memory slot."""

    start: int
    profile: MigProfile

    @property
    def end(self) -> int:
        return self.start + self.profile.memory_slots

    @property
    def slot_mask(self) -> int:
        return ((1 << self.profile.memory_slots) - 1) << self.start


def layout_problem(layout: tuple[MigPlacement, ...] | list[MigPlacement]) -> str | None:
    """Why ``layout`` cannot exist on one GPU, or None when it is valid."""
    used_mask = 0
    compute = 0
    media = 0
    counts: dict[str, int] = {}
    models = {placement.profile.model for placement in layout}
    if len(models) > 1:
        return f"profiles of different models in one layout: {sorted(models)}"
    for placement in sorted(layout):
        profile = placement.profile
        if placement.start not in profile.starts:
            valid = ", ".join(map(str, profile.starts))
            return f"{profile.name} cannot start at slot {placement.start} (valid: {valid})"
        if placement.slot_mask & used_mask:
            return f"{profile.name} at slot {placement.start} overlaps another instance"
        used_mask |= placement.slot_mask
        compute += profile.compute_slices
        counts[profile.shape.key] = counts.get(profile.shape.key, 0) + 1
        if counts[profile.shape.key] > profile.shape.max_per_gpu:
            return f"at most {profile.shape.max_per_gpu} x {profile.name} per GPU"
        media += profile.shape.media_extensions
    if compute > COMPUTE_SLICES:
        return f"the instances need {compute} compute slices; a GPU has {COMPUTE_SLICES}"
    if media > 1:
        return "at most one +me (media extensions) instance per GPU"
    return None


def free_starts(layout: tuple[MigPlacement, ...] | list[MigPlacement], profile: MigProfile) -> tuple[int, ...]:
    """The start slots where ``profile`` could be added to ``layout`` keeping it valid."""
    return tuple(
        start for start in profile.starts if layout_problem((*layout, MigPlacement(start, profile))) is None
    )


def maximal_layouts(model: str, shape_keys: tuple[str, ...] = ("1g", "2g", "3g", "4g", "7g")) -> set[tuple[str, ...]]:
    """Every layout of the given shapes to which no further instance of those shapes can be added, as
    sorted tuples of profile names by start (``("3g.40gb", "4g.40gb")``)."""
    profiles = [p for p in profiles_for(model) if p.shape.key in shape_keys]
    found: set[tuple[tuple[int, str], ...]] = set()
    seen: set[tuple[MigPlacement, ...]] = set()

    def extend(layout: tuple[MigPlacement, ...]) -> None:
        if layout in seen:
            return
        seen.add(layout)
        grew = False
        for profile in profiles:
            for start in free_starts(layout, profile):
                grew = True
                extend(tuple(sorted((*layout, MigPlacement(start, profile)))))
        if not grew:
            found.add(tuple((p.start, p.profile.name) for p in layout))

    extend(())
    # Two layouts are the same combination when they hold the same multiset of profiles.
    return {tuple(sorted(name for _, name in layout)) for layout in found}
