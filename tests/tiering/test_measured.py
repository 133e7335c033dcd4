"""The performance model against measured GPUs (gpus.measured): regimes, memory, the fit, measured beats modelled."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpus.measured import (
    CROSS_VALIDATED_ERROR,
    Measurement,
    cross_validate,
    errors,
    expected_error,
    fill,
    fit,
    load,
    measured_bound,
    predicted_peak_mib,
    row_of,
)
from gpus.performance import FITTED, Constants, Workload, estimate, mig, regime_infer, share, whole, workload_problems

H100 = whole("H100-80GB")


def test_measured_rows_load_from_the_repository_with_their_gpu():
    rows = load()
    assert len(rows) == 40 and {r.slice_key for r in rows} == {"H100-80GB"}
    assert {r.architecture for r in rows} == {"resnet-50", "bert-base", "gpt2", "tinyllama-1.1b", "llama-2-7b"}
    assert sum(r.mode == "eager" for r in rows) == 24 and sum(r.mode == "graph" for r in rows) == 13


def test_the_constants_in_the_model_are_the_fit_of_the_measured_rows():
    assert fit(load()) == FITTED


def test_a_constant_no_row_constrains_keeps_its_prior():
    """Fitted without the CNN, the CNN's efficiency and activation figures are the priors: nothing was learnt."""
    constants = fit([r for r in load() if r.architecture != "resnet-50"])
    prior = Constants()
    assert constants.eager_conv_efficiency == prior.eager_conv_efficiency
    assert constants.conv_fp32_workspace_maps == prior.conv_fp32_workspace_maps
    assert constants.host_seconds_per_op != prior.host_seconds_per_op


def test_peak_memory_is_within_15_percent_on_every_measured_row():
    rows = [r for r in load() if r.peak_mib]
    assert len(rows) == 24
    for row in rows:
        assert predicted_peak_mib(row) == pytest.approx(row.peak_mib, rel=0.15), (row.architecture, row.batch)


def test_peak_memory_cross_validated_by_architecture_is_within_15_percent_on_every_16_bit_row():
    """Each architecture's memory predicted by constants fitted without it (fit on four, score the fifth). A CNN's
    16-bit activations are counted from its layer shapes (``ConvNet.live_maps``), nothing fitted, so resnet-50 held
    out is a prediction; the one FP32 CNN row's cuDNN workspace has no other row to be fitted on (docs/tiering.md)."""
    report = cross_validate(load())
    cases = [c for c in report["cases"] if c["measured_peak_mib"]]
    assert len(cases) == 24
    for case in cases:
        ratio = case["measured_peak_mib"] / case["predicted_peak_mib"]
        if case["arch"] == "resnet-50" and case["precision"] == "fp32":
            continue
        assert ratio == pytest.approx(1, abs=0.15), case


def test_cnn_activations_come_from_the_layer_shapes_not_a_fit():
    """Fitted on the transformers alone (their workspace figure), resnet-50's 16-bit peak memory at batch 32 and 256
    is within 10 %: the live tensors at layer1's downsample (3.25 maps of 802,816 elements) and the input image, per
    sample; the batch-256 row alone holds 1,529 MiB where the old cap at 4 samples said 202."""
    rows = load()
    without = fit([r for r in rows if r.architecture != "resnet-50"])
    by = {(r.batch, r.precision): r for r in rows if r.architecture == "resnet-50" and r.peak_mib}
    for batch in (32, 256):
        row = by[batch, "fp16"]
        assert predicted_peak_mib(row, without) == pytest.approx(row.peak_mib, rel=0.10)


def test_no_predicted_bound_contradicts_the_measured_one_cross_validated():
    report = cross_validate(load())
    assert report["contradictions"] == 0, [c for c in report["cases"] if c["contradicts"]]


def test_a_graph_replay_slower_than_the_eager_step_says_nothing_of_its_bound():
    """bert-base at batch 32: replayed as a graph 5.4 ms, eagerly 4.4 ms (the capture took other kernels); the
    batches decide: 8x the batch took 3.3x the time, the host's step."""
    rows = load()
    by = {(r.architecture, r.task, r.precision, r.batch, r.mode): r for r in rows}
    row = by["bert-base", "inference", "bf16", 32, "eager"]
    assert by["bert-base", "inference", "bf16", 32, "graph"].step_s > 1.2 * row.step_s
    assert measured_bound(row, rows) == "host"
    without_batches = [r for r in rows if not (r.architecture == "bert-base" and r.batch != 32)]
    assert measured_bound(row, without_batches) is None


def test_memory_scales_with_the_batch_the_vocabulary_and_the_cache():
    """Activations per sample for CNNs (no cap at 4 samples), every token's logits in a decoder's forward pass,
    the KV cache in decode."""
    resnet = [estimate(Workload("resnet-50", "inference", "fp16", b, regime="eager"), H100).memory_mib
              for b in (4, 256)]
    assert resnet[1] - resnet[0] > 1000
    qwen = estimate(Workload("qwen2-0.5b", "inference", "bf16", 32, 512, regime="eager"), H100).memory_mib
    assert qwen > 32 * 512 * 151936 * 2 / 2**20  # the logits alone: 4,748 MiB (measured 5,759 MiB in all)
    short, long = (estimate(Workload("llama-2-7b", "generation", "bf16", 16, s), H100).memory_mib for s in (512, 4096))
    assert long - short == pytest.approx(16 * 3584 * 32 * 2 * 4096 * 2 / 2**20, rel=0.25)


def test_eager_decode_is_host_bound_and_does_not_speed_up_on_a_bigger_gpu():
    eager = Workload("llama-2-7b", "generation", "bf16", 1, 512, regime="eager")
    engine = replace(eager, regime="engine")
    h100, h200 = estimate(eager, H100), estimate(eager, whole("H200-141GB"))
    assert h100.bound == "host" and h100.engine_active < 0.34  # measured: the GPU busy 7-34 % of an eager step
    assert h200.throughput / h100.throughput == pytest.approx(1.0, abs=0.01)
    fast, faster = estimate(engine, H100), estimate(engine, whole("H200-141GB"))
    assert fast.bound == "memory" and faster.throughput / fast.throughput > 1.25
    assert fast.throughput > 2.5 * h100.throughput  # the graph step: about 3x for a 7B model, as measured


def test_the_default_regime_is_the_engine_existing_callers_meant():
    assert Workload("bert-base").regime == "engine"
    assert estimate(Workload("bert-base"), H100).regime == "engine"
    spec = object.__new__(Workload)
    for key, value in {"architecture": "bert-base", "task": "inference", "precision": "bf16", "batch_size": 8,
                       "seq_len": 128, "image_size": 224, "regime": "jit"}.items():
        object.__setattr__(spec, key, value)
    assert workload_problems(spec)[0][0] == "regime"


def test_the_regime_is_inferred_from_measured_engine_activity():
    decode = Workload("llama-2-7b", "generation", "bf16", 1, 512)
    assert regime_infer(decode, H100, 0.2) == "eager"
    assert regime_infer(decode, H100, 0.85) == "engine"


def test_mig_slices_and_shares_scale_the_gpu_part_not_the_host():
    eager = Workload("bert-base", "inference", "bf16", 256, 128, regime="eager")
    whole_gpu, third = estimate(eager, H100), estimate(eager, mig("H100-80GB", "3g.40gb"))
    assert third.throughput / whole_gpu.throughput == pytest.approx(3 / 7, rel=0.15)
    small = Workload("bert-base", "inference", "bf16", 1, 128, regime="eager")
    assert estimate(small, H100).bound == "host"
    assert estimate(small, share("H100-80GB", 500)).throughput < estimate(small, H100).throughput


def test_the_measured_bound_comes_from_the_measurements_alone():
    rows = load()
    by = {(r.architecture, r.task, r.batch, r.mode): r for r in rows}
    assert measured_bound(by["llama-2-7b", "generation", 1, "eager"], rows) == "host"  # 2.96x its graph step
    assert measured_bound(by["tinyllama-1.1b", "inference", 32, "eager"], rows) == "gpu"  # grew with the batch
    assert measured_bound(by["gpt2", "generation", 1, "graph"], rows) == "gpu"


def test_errors_report_each_subset_and_the_contradictions():
    report = errors(load())
    eager = report["subsets"]["eager, all"]
    assert eager["throughput"]["cases"] == 24 and eager["throughput"]["median_abs_error"] < 0.25
    assert report["subsets"]["graph decode"]["throughput"]["median_abs_error"] < 0.12
    assert report["contradictions"] == sum(1 for c in report["cases"] if c["contradicts"])


def test_measured_beats_modelled_and_fills_the_rest_from_the_nearest_measurement():
    workload = Workload("llama-2-7b", "generation", "bf16", 16, 512, regime="eager")
    measured = {"H100-80GB": (630.3, 17682 + 512, 0.3)}
    there = fill(workload, H100, measured)
    assert there.measured and there.throughput == 630.3 and there.memory_mib == 17682 + 512
    # a host-bound workload gets no faster on an H200: the model's ratio in its own regime is about 1
    h200 = fill(workload, whole("H200-141GB"), measured)
    assert h200.source == "scaled from H100-80GB" and h200.throughput == pytest.approx(630.3, rel=0.02)
    # the measured memory (18 GB) fits an A100-40GB, not a T4 (15 GB)
    assert fill(workload, whole("A100-40GB"), measured).fits
    assert not fill(workload, whole("T4"), measured).fits and fill(workload, whole("T4"), measured).throughput == 0
    # no measurement: the model alone
    assert fill(workload, H100, {}).source == "model"


def test_expected_error_per_regime_is_the_cross_validated_one():
    assert expected_error("engine", "generation") == CROSS_VALIDATED_ERROR["graph decode"]
    assert expected_error("eager", "inference") == CROSS_VALIDATED_ERROR["eager inference"]
    assert expected_error("eager", "generation") == CROSS_VALIDATED_ERROR["eager decode"]


@pytest.mark.parametrize(("values", "field"), [
    ({"batch": "many"}, "batch"), ({"mode": "compiled"}, "mode"), ({"arch": "gpt-9"}, "architecture"),
    ({"step_s": ""}, "step_s"),
])
def test_a_bad_row_names_its_column(values, field):
    good = {"arch": "gpt2", "task": "inference", "precision": "bf16", "batch": "8", "seq": "512", "image": "224",
            "mode": "eager", "step_s": "0.01", "throughput": "800", "peak_mib": "", "spread": "0.1"}
    with pytest.raises(ValueError, match=field):
        row_of({**good, **values}, "H100-80GB")
    assert isinstance(row_of(good, "H100-80GB"), Measurement)


def test_device_perf_dry_run_writes_rows_the_loader_reads(tmp_path):
    from bench import device_perf
    from gpus.measured import load_results

    path = tmp_path / "device_perf.json"
    assert device_perf.main(["--dry-run", "--quick", "--groups", "2", "--json", str(path)]) == 0
    figures = json.loads(path.read_text())["figures"]
    assert len(figures["rows"]) == len(device_perf.cases(quick=True)) == 13
    assert {r["mode"] for r in figures["rows"]} == {"eager", "graph", "own-eager"}
    rows = load_results(path, dry_run=True)
    assert all(r.step_s > 0 and r.throughput == pytest.approx(r.batch / r.step_s, rel=1e-3) for r in rows)
    assert load_results(path) == []  # a dry run measured no GPU: never fitted on


H200_RUN = Path(__file__).parent / "data" / "device_perf_h200_2026-11-27.json"


def test_the_h200_check_file_is_the_recorded_run_and_never_fitted_on():
    """gpus/data/h200-141gb-2026-11-27.csv is the lent H200's ``bench/device_perf.py --held-out`` results file
    (kept in tests/tiering/data/) written by ``results_csv``, a check file of its own GPU model."""
    from gpus.measured import CHECK_FILES, DATA, FILES, load_check, results_csv

    assert (DATA / "h200-141gb-2026-11-27.csv").read_text() == results_csv(H200_RUN)
    assert CHECK_FILES["h200-141gb-2026-11-27.csv"] == "H200-141GB" and "h200-141gb-2026-11-27.csv" not in FILES
    rows = [r for r in load_check() if r.slice_key == "H200-141GB"]
    assert len(rows) == 147 and len({r.architecture for r in rows}) == 29
    assert [sum(r.mode == mode for r in rows) for mode in ("eager", "graph", "own-eager")] == [84, 49, 14]
    assert all(r.slice_key == "H100-80GB" for r in load())  # the fit never sees it


def test_results_csv_refuses_a_dry_run_and_mixed_slices(tmp_path):
    from gpus.measured import results_csv

    run = json.loads(H200_RUN.read_text())
    for change, field in (({"dry_run": True}, "dry_run"), ({"slice": "H100-80GB"}, "slice"), ({"mode": "x"}, "mode")):
        bad = json.loads(json.dumps(run))
        bad["figures"]["rows"][3].update(change)
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=field):
            results_csv(path)


def test_another_gpu_model_is_scored_apart_from_the_held_out_architectures():
    """The H200's rows do not enter ``held_out`` (the H100 check machine's 24 unseen architectures); ``other_gpus``
    scores them on their own: the figures docs/tiering.md §2.4 quotes."""
    from gpus.measured import held_out, other_gpus

    unseen = held_out()
    assert unseen["rows"] == 105 and len(unseen["architectures"]) == 24
    others = other_gpus()
    assert list(others) == ["H200-141GB"]
    h200 = others["H200-141GB"]
    assert (h200["rows"], len(h200["architectures"]), h200["reference"]) == (147, 29, ["H100-80GB"])
    ratio, by_mode = h200["predicted_over_measured"], h200["predicted_over_measured_by_mode"]
    quoted = {"eager, all": 1.089, "graph decode": 1.005, "graph inference": 2.181, "eager decode": 1.087}
    assert {name: ratio[name]["median"] for name in quoted} == pytest.approx(quoted, abs=0.001)
    assert {mode: v["median"] for mode, v in by_mode.items()} == pytest.approx(
        {"eager": 1.089, "graph": 1.132, "own-eager": 0.668}, abs=0.001)
    assert h200["subsets"]["eager, all"]["throughput"]["median_abs_error"] == pytest.approx(0.187, abs=0.001)
    assert h200["subsets"]["graph decode"]["throughput"]["median_abs_error"] == pytest.approx(0.164, abs=0.001)
    scaling = {mode: v["median"] for mode, v in h200["scaling_by_mode"].items()}
    assert scaling == pytest.approx({"eager": 0.982, "graph": 0.967, "own-eager": 1.4}, abs=0.001)


def test_device_perf_reads_mig_devices_it_finds_and_names_their_slices():
    from bench.device_perf import parse_mig_listing

    listing = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5f0c)\n"
               "  MIG 3g.40gb     Device  0: (UUID: MIG-aa11)\n"
               "  MIG 1g.10gb     Device  1: (UUID: MIG-bb22)\n"
               "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-77)\n")
    assert parse_mig_listing(listing) == [("MIG-aa11", "H100-80GB/mig/3g.40gb"), ("MIG-bb22", "H100-80GB/mig/1g.10gb")]
    assert parse_mig_listing("GPU 0: NVIDIA L4 (UUID: GPU-1)\n") == []


def test_the_measured_mode_judges_against_measurements_and_counts_the_decisions_they_change():
    from dataclasses import fields

    from bench import tiering as bench_tiering

    rows = load()
    folds = {r.architecture: {f.name: getattr(FITTED, f.name) for f in fields(Constants)} for r in rows}
    held, truth_of = bench_tiering.measured_truths(rows, folds)
    assert len(held) == 37  # every measured case but the own decoder's
    decode = Workload("llama-2-7b", "generation", "bf16", 16, 512, regime="eager")
    assert truth_of(decode, H100).throughput == pytest.approx(630.346)  # the measurement itself
    assert truth_of(decode, whole("H200-141GB")).throughput == pytest.approx(630.346, rel=0.02)  # host-bound
    eager = [w for w in held if w.regime == "eager" and w.task == "generation"]
    changed = bench_tiering.decisions_changed(eager, truth_of, bench_tiering.candidates())
    assert changed["decisions"] == 4 * len(eager) == 32
    # the model alone thought eager decode ran as an engine: it picks slices too small for the measured speed
    assert changed["changed"] > 0 and changed["model_choice_misses"] > 0
    assert all(not e["model_choice_meets_measured"] or e["model_chose"] != e["measured_chooses"]
               for e in changed["examples"])


def test_the_documented_measured_command_prints_and_records_the_cross_validated_errors(tmp_path):
    """``bench/tiering.py --truth measured`` as docs/tiering.md §4.1 types it (without the forest's two runs)."""
    import subprocess
    import sys

    from bench.record import ROOT

    path = tmp_path / "tiering_measured.json"
    done = subprocess.run([sys.executable, "bench/tiering.py", "--truth", "measured", "--no-forest", "--json",
                           str(path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cross-validated by architecture" in done.stdout and "the model before regimes" in done.stdout
    figures = json.loads(path.read_text())["figures"]
    cv = figures["cross_validated"]["subsets"]
    assert cv["eager, all"]["throughput"]["cases"] == 24 and cv["graph decode"]["throughput"]["cases"] == 8
    # the H200's check rows, a GPU model never fitted on, reported as their own subset (docs/tiering.md §2.4)
    assert "another GPU model, never fitted on: H200-141GB (147 rows" in done.stdout
    h200 = figures["other_gpus"]["H200-141GB"]
    assert h200["rows"] == 147 and h200["memory_rows"]["rows"] == 84 and "cases" not in h200
    assert figures["held_out"]["rows"] == 105
    # the figures gpus.measured.expected_error quotes are these
    assert cv["graph decode"]["throughput"]["median_abs_error"] == pytest.approx(CROSS_VALIDATED_ERROR["graph decode"],
                                                                                 abs=0.001)
    assert cv["eager decode"]["throughput"]["median_abs_error"] == pytest.approx(CROSS_VALIDATED_ERROR["eager decode"],
                                                                                 abs=0.001)
    assert cv["eager inference"]["throughput"]["median_abs_error"] == pytest.approx(
        CROSS_VALIDATED_ERROR["eager inference"], abs=0.001)


def test_the_docs_render_another_gpu_models_table_once_the_results_have_it():
    """``python -m bench docs``: the tiering_held_out block gains the H200's table when tiering_error.json is
    re-recorded with ``other_gpus``; a file recorded before it renders as it did."""
    from bench import docs
    from bench.tiering import memory_rows
    from gpus.measured import other_gpus

    others = other_gpus()
    for other in others.values():
        other["memory_rows"] = memory_rows(other["cases"])
        other["contradicting_cases"] = [c for c in other.pop("cases") if c["contradicts"]]
    text = docs._other_gpus(others)
    assert "| subset (H200-141GB, never fitted on: 147 rows, 29 architectures) |" in text
    assert "| graph decode | 32 | 16 % (0.66 – 1.51) | 1.00 | – |" in text
    assert "Peak memory within 15 % on 81 of 84 rows" in text
    assert docs._other_gpus({}) == ""
