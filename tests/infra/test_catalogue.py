"""GPU catalogue: published figures, overrides of any numeric field, one-sentence errors."""

import pytest

from infra.catalogue import CATALOGUE, gpu, parse_overrides


def test_catalogue_holds_the_four_gpus_and_two_published_variants_with_dense_bf16_peaks():
    assert set(CATALOGUE) == {"a100", "h100", "h200", "b200", "a100-40gb", "h100-96gb-500w"}
    assert [CATALOGUE[g].peak_tflops for g in ("a100", "h100", "h200", "b200")] == [312, 989, 989, 2250]
    assert CATALOGUE["h200"].memory_gb == 141 and CATALOGUE["h100"].memory_gb == 80


def test_any_numeric_field_can_be_overridden_and_names_are_case_insensitive():
    custom = gpu("H100", price_per_hour=2.4, memory_gb=96, gpus_per_node=4)
    assert (custom.price_per_hour, custom.memory_gb, custom.gpus_per_node) == (2.4, 96.0, 4)
    assert isinstance(custom.gpus_per_node, int)
    assert gpu("h100-sxm") == CATALOGUE["h100"]


def test_unknown_gpu_names_the_choices():
    with pytest.raises(ValueError, match="unknown GPU 'v100'; choose one of a100, h100, h200, b200"):
        gpu("v100")


def test_unknown_or_bad_field_is_an_error():
    with pytest.raises(ValueError, match="unknown GPU field 'colour'"):
        gpu("h100", colour=1)
    with pytest.raises(ValueError, match="must be positive"):
        gpu("h100", memory_gb=0)
    with pytest.raises(ValueError, match="efficiency at most 1"):
        gpu("h100", compute_efficiency=1.5)


def test_overrides_parse_from_field_equals_value():
    assert parse_overrides(["memory_gb=96", " price_per_hour = 2.5"]) == {"memory_gb": 96.0, "price_per_hour": 2.5}
    with pytest.raises(ValueError, match="field=value"):
        parse_overrides(["memory_gb"])
    with pytest.raises(ValueError, match="needs a number"):
        parse_overrides(["memory_gb=lots"])


def test_every_catalogue_gpu_has_the_peak_that_mfu_divides_by():
    """One table of peaks (tasks/train/peaks.py): the plan's MFU and the trainer's mean the same thing."""
    from tasks.train.metrics import gpu_peak_flops

    assert {name: gpu_peak_flops(g.label) for name, g in CATALOGUE.items()} == \
        {name: g.peak_flops for name, g in CATALOGUE.items()}
