"""The performance model (gpus.performance): roofline behaviour, MIG and share fractions, calibration."""

import pytest

from gpus.architectures import ARCHITECTURES, architecture_get
from gpus.performance import (
    COMPUTE_EFFICIENCY,
    Workload,
    calibration,
    estimate,
    fitted_efficiency,
    mig,
    share,
    slice_from_key,
    slices_for,
    whole,
    workload_problems,
)


def test_published_parameter_counts_come_out_of_the_configurations():
    """The layer shapes reproduce the models' published sizes (within 3 %)."""
    published = {"bert-base": 110e6, "bert-large": 335e6, "gpt2": 124e6, "gpt2-xl": 1.56e9, "llama-2-7b": 6.74e9,
                 "llama-2-13b": 13.0e9, "mistral-7b": 7.24e9, "llama-3-8b": 8.03e9, "gpt-j-6b": 6.05e9,
                 "vit-b-16": 86e6}
    for name, params in published.items():
        assert abs(architecture_get(name).params / params - 1) < 0.03, name


def test_calibration_constant_is_the_fit_and_its_error_is_what_the_docs_say():
    assert fitted_efficiency() == COMPUTE_EFFICIENCY
    report = calibration()
    assert report["mape"] == pytest.approx(0.113, abs=0.001)
    assert report["loo_mape"] == pytest.approx(0.163, abs=0.001)
    assert {p["gpu"] for p in report["points"]} == {"H100-80GB", "A100-80GB", "L4"}
    assert report["gptj_ratio"]["error"] == pytest.approx(-0.111, abs=0.001)


def test_decode_is_memory_bound_and_scales_with_bandwidth():
    decode = Workload("llama-2-7b", "generation", "bf16", 8, 1024)
    h100, h200 = estimate(decode, whole("H100-80GB")), estimate(decode, whole("H200-141GB"))
    assert h100.bound == h200.bound == "memory"
    # the busy time scales with bandwidth; launch gaps and host work do not
    assert 1.25 < h200.throughput / h100.throughput <= 4800 / 3350


def test_large_batch_training_is_compute_bound_and_mig_slices_scale_with_their_compute():
    train = Workload("bert-base", "training", "bf16", 64, 128)
    full, third = estimate(train, whole("A100-80GB")), estimate(train, mig("A100-80GB", "3g.40gb"))
    assert full.bound == "compute" and full.fits and third.fits
    assert third.throughput / full.throughput == pytest.approx(3 / 7, rel=0.05)


def test_memory_decides_what_fits():
    big = Workload("llama-2-13b", "inference", "bf16", 1, 512)
    assert not estimate(big, whole("L4")).fits and estimate(big, whole("L4")).throughput == 0
    assert estimate(big, whole("A100-80GB")).fits
    assert not estimate(big, share("A100-80GB", 250)).fits  # a quarter share holds a quarter of the memory


def test_fp8_on_a_gpu_without_fp8_runs_as_bf16():
    fp8, bf16 = Workload("gpt2-xl", "inference", "fp8", 16, 512), Workload("gpt2-xl", "inference", "bf16", 16, 512)
    a100 = whole("A100-80GB")
    assert estimate(fp8, a100).throughput == pytest.approx(estimate(bf16, a100).throughput)
    assert estimate(fp8, whole("H100-80GB")).throughput > estimate(bf16, whole("H100-80GB")).throughput


def test_slices_and_keys_round_trip():
    for where in slices_for("H100-80GB") + slices_for("L4"):
        assert slice_from_key(where.key) == where
    with pytest.raises(KeyError):
        slice_from_key("H100-80GB/mig/9g.99gb")


@pytest.mark.parametrize(("fields", "field"), [
    ({"architecture": "gpt-9"}, "architecture"),
    ({"task": "dreaming"}, "task"),
    ({"precision": "int4"}, "precision"),
    ({"task": "training", "precision": "int8"}, "precision"),
    ({"task": "generation", "architecture": "resnet-50"}, "task"),
    ({"batch_size": 0}, "batch_size"),
    ({"seq_len": 10**7}, "seq_len"),
])
def test_bad_workload_definitions_name_the_field(fields, field):
    values = {"architecture": "bert-base", "task": "inference", "precision": "bf16", "batch_size": 8,
              "seq_len": 128, "image_size": 224, **fields}
    spec = object.__new__(Workload)
    for key, value in values.items():
        object.__setattr__(spec, key, value)
    assert workload_problems(spec)[0][0] == field
    with pytest.raises(ValueError, match=field):
        Workload(**values)


def test_every_architecture_runs_somewhere():
    for name in ARCHITECTURES:
        assert estimate(Workload(name, "inference", "bf16", 1, 128), whole("H100-80GB")).throughput > 0, name
