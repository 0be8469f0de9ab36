"""`--core-conformance` values: KIND:NAME parsing and loading the named component."""

from __future__ import annotations

import pytest

from core.sample.sampler import DefaultSampler
from core.spec_decode.rejection_sampler import StandardRejectionSampler
from core.testing.targets import TargetSpec, parse_targets, resolve


def test_items_split_at_the_first_colon_repeated_or_comma_separated():
    specs = parse_targets(["attention:torch_ref, sampler:default", "attention:pkg.mod:Backend"])
    assert specs == [
        TargetSpec("attention", "torch_ref"),
        TargetSpec("sampler", "default"),
        TargetSpec("attention", "pkg.mod:Backend"),
    ]
    assert [s.is_reference for s in specs] == [False, False, True]
    assert [s.id for s in specs] == ["torch_ref", "default", "Backend"]


def test_a_repeated_item_is_kept_once():
    assert parse_targets(["sampler:default", "sampler:default"]) == [
        TargetSpec("sampler", "default")
    ]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("scheduler:fcfs", "unknown kind 'scheduler'; kinds: platform, attention, sampler"),
        ("attention", "expected KIND:NAME"),
        ("attention:", "expected KIND:NAME"),
    ],
)
def test_malformed_item_is_refused_naming_it(item, message):
    with pytest.raises(ValueError, match=f"--core-conformance '{item}'") as info:
        parse_targets([item])
    assert message in str(info.value)


def test_entry_name_resolves_to_the_installed_value():
    assert resolve(TargetSpec("sampler", "default")).value is DefaultSampler


def test_missing_entry_name_is_refused_listing_what_is_installed():
    with pytest.raises(ValueError, match="attention backend 'nope' is not installed") as info:
        resolve(TargetSpec("attention", "nope"))
    assert "torch_ref" in str(info.value)


def test_reference_to_a_component_of_another_kind_is_refused():
    with pytest.raises(ValueError, match="DefaultSampler is not a subclass of AttentionBackend"):
        resolve(TargetSpec("attention", "core.sample.sampler:DefaultSampler"))


def test_reference_that_does_not_import_is_refused():
    with pytest.raises(ValueError, match="'no_such_module:Thing' cannot be imported"):
        resolve(TargetSpec("sampler", "no_such_module:Thing"))


def test_a_kind_without_an_entry_point_group_is_named_only_by_reference():
    with pytest.raises(ValueError, match="'rejection_sampler:standard': rejection_sampler comp"):
        parse_targets(["rejection_sampler:standard"])
    reference = "core.spec_decode.rejection_sampler:StandardRejectionSampler"
    (spec,) = parse_targets([f"rejection_sampler:{reference}"])
    assert resolve(spec).value is StandardRejectionSampler


def test_kernels_name_a_general_entry_point_or_a_callable_by_reference():
    pytest.importorskip("core_cpu_kernels.ops", reason="core-cpu-kernels is not installed")
    from core_cpu_kernels.ops import register

    assert resolve(TargetSpec("kernels", "kernel_ops")).value is register
    with pytest.raises(
        ValueError, match="'core.ops:CORE_OPS': a value of type OpRegistry is not callable"
    ):
        resolve(TargetSpec("kernels", "core.ops:CORE_OPS"))
