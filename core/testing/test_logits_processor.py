"""Conformance of a logits processor (`--core-conformance=logits_processor:NAME`).

The class subclasses LogitsProcessor (checked when it is looked up) and is built as
`cls(config, device, is_pin_memory=False)`; `is_argmax_invariant()` is a fixed bool; a
request without extra_args passes `validate_params`. A batch lives as in a worker (core's
own InputBatch: requests added, finished, condensed into the freed rows), each step's
changes handed to `update_state`, then `apply` to random logits: the rows of requests that
do not ask for the processor come out as they went in, and the result keeps the logits'
shape and dtype. With the arguments of a request that asks
(`--core-conformance-logits-args NAME=JSON`; those checks are skipped without them): they
pass `validate_params`; such a request's row comes out the same wherever the batch moved
it; and an argmax-invariant processor leaves its argmax where it was.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from core.config import EngineConfig
from core.sample.logits_processor import LogitsProcessor
from core.sampling_params import SamplingParams
from core.testing.plugin import logits_args_of, targets_of
from core.testing.targets import Target
from core.worker.input_batch import CachedRequestState, InputBatch

VOCAB = 64
# (requests added, requests finished) before each step; a finished request's row is
# filled by the batch's last one, as the worker condenses.
LIFE = [(["a", "b", "c", "d"], []), ([], ["a"]), (["e"], ["c"]), ([], ["b", "e"])]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    targets = targets_of(metafunc.config, "logits_processor")
    metafunc.parametrize("target", [pytest.param(t, id=t.id) for t in targets])


@pytest.fixture
def processor_cls(target: Target) -> type[LogitsProcessor]:
    return target.value


@pytest.fixture
def args(target: Target, request: pytest.FixtureRequest) -> dict:
    given = logits_args_of(request.config, target.spec.name)
    if given is None:
        pytest.skip(f"no --core-conformance-logits-args {target.spec.name}=JSON")
    if not isinstance(given, dict):
        pytest.fail(f"--core-conformance-logits-args {target.spec.name}: not a JSON object")
    return given


def build(cls: type[LogitsProcessor], device: torch.device) -> LogitsProcessor:
    return cls(EngineConfig(), device, False)


def steps(
    processor: LogitsProcessor, asking: dict[str, SamplingParams], device: torch.device
) -> Iterator[tuple[InputBatch, torch.Tensor, torch.Tensor]]:
    """(batch, logits, processed) of each step of LIFE, on the CPU; the requests in `asking`
    with their params, the others with none."""
    batch = InputBatch(max_num_reqs=8, max_model_len=16, block_sizes=[16])
    generator = torch.Generator().manual_seed(0)
    for added, finished in LIFE:
        for name in finished:
            batch.remove(name)
        for name in added:
            params = asking.get(name, SamplingParams())
            batch.add(CachedRequestState(name, [1, 2, 3], params, None, ([],), 0))
        batch.condense()
        processor.update_state(batch.changes.build(batch.num_reqs))
        logits = torch.randn(batch.num_reqs, VOCAB, generator=generator)  # [B, V]
        yield batch, logits, processor.apply(logits.to(device, copy=True)).cpu()


@pytest.fixture
def device(core_conformance_device: torch.device) -> torch.device:
    return core_conformance_device


def test_builds_and_says_whether_it_moves_the_argmax(processor_cls, device):
    processor = build(processor_cls, device)
    first = processor.is_argmax_invariant()
    assert isinstance(first, bool) and processor.is_argmax_invariant() == first


def test_takes_a_request_without_arguments(processor_cls):
    processor_cls.validate_params(SamplingParams())


def test_leaves_the_requests_that_do_not_ask_alone(processor_cls, device):
    processor = build(processor_cls, device)
    for batch, logits, processed in steps(processor, {}, device):
        assert processed.shape == logits.shape and processed.dtype == logits.dtype
        assert torch.equal(processed, logits), f"rows {batch.req_ids} changed"


def test_takes_the_arguments_of_a_request_that_asks(processor_cls, args):
    processor_cls.validate_params(SamplingParams(extra_args=args))


def test_a_requests_effect_follows_it_and_spares_the_others(processor_cls, args, device):
    asking = {name: SamplingParams(extra_args=args) for name in ("b", "d")}
    processor = build(processor_cls, device)
    alone = build(processor_cls, device)
    for batch, logits, processed in steps(processor, asking, device):
        for row, name in enumerate(batch.req_ids):
            if name not in asking:
                assert torch.equal(processed[row], logits[row]), f"{name} (row {row}) changed"
                continue
            # The same request alone, at row 0, with the same logits.
            only = InputBatch(max_num_reqs=1, max_model_len=16, block_sizes=[16])
            only.add(CachedRequestState(name, [1, 2, 3], asking[name], None, ([],), 0))
            alone.update_state(only.changes.build(1))
            expected = alone.apply(logits[row : row + 1].to(device, copy=True)).cpu()
            alone.update_state(_removal(only, name))
            assert torch.equal(processed[row], expected[0]), f"{name} at row {row} differs"
            if processor.is_argmax_invariant():
                assert processed[row].argmax() == logits[row].argmax(), "the argmax moved"


def _removal(batch: InputBatch, name: str):
    batch.remove(name)
    return batch.changes.build(0)
