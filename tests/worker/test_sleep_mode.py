"""core.worker.sleep_mode on a hand-sized model and a KV cache made as the CPU platform
makes one: every storage is emptied and refilled in place, so the tensors (and views of
them taken before) are the same objects after, holding the same bytes (level 1) or the
checkpoint's (level 2, a reload)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from core.platforms.cpu import CpuPlatform
from core.worker.sleep_mode import WorkerSleep, check_level, check_sleep, wake_tags

KV_BYTES = 4096


def tied_model(seed: int = 0) -> nn.Module:
    """Two 64x64 linears sharing one weight, and a buffer: 4 storages."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    model[1].weight = model[0].weight
    model.register_buffer("table", torch.arange(10.0))
    return model


class Worker:
    """A model, a KV cache and the WorkerSleep over them; `reloads` counts level 2's."""

    def __init__(self, reload_seed: int = 0) -> None:
        self.model = tied_model()
        self.kv = CpuPlatform().zeroed_bytes(KV_BYTES, torch.device("cpu"))
        self.reloads = 0
        self.reload_seed = reload_seed
        self.sleep = WorkerSleep(self.model, lambda: [self.kv], self.reload, torch.device("cpu"))

    def reload(self) -> nn.Module:
        self.reloads += 1
        return tied_model(self.reload_seed)

    def state(self) -> dict[str, torch.Tensor]:
        return {name: t.clone() for name, t in self.model.state_dict().items()}

    def storage_sizes(self) -> list[int]:
        return [t.untyped_storage().nbytes() for t in self.model.state_dict().values()]


def assert_same(state: dict[str, torch.Tensor], model: nn.Module) -> None:
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_level_1_frees_every_storage_and_restores_the_same_tensors_to_the_bit():
    worker = Worker()
    before, weight = worker.state(), worker.model[0].weight
    row = weight[3]  # a view taken before sleep
    worker.kv.fill_(7)
    # 64x64 float32 weight (tied: once) + two biases + the 10-float buffer + the KV cache.
    assert worker.sleep.sleep(1) == 64 * 64 * 4 + 2 * 64 * 4 + 10 * 4 + KV_BYTES
    assert worker.storage_sizes() == [0, 0, 0, 0, 0]
    worker.sleep.wake_up()
    assert worker.model[0].weight is weight and worker.model[1].weight is weight
    assert_same(before, worker.model)
    assert torch.equal(row, before["0.weight"][3])
    assert worker.kv.eq(0).all()  # the cache's content is forgotten
    assert worker.reloads == 0


def test_level_2_reloads_the_weights_from_the_checkpoint():
    worker = Worker(reload_seed=1)  # the checkpoint now holds other weights
    version = worker.model[0].weight._version
    worker.sleep.sleep(2)
    worker.sleep.wake_up()
    assert worker.reloads == 1
    assert_same(tied_model(1).state_dict(), worker.model)
    # Written in place: a kernel package's copy of the old weight is stale now.
    assert worker.model[0].weight._version > version


def test_level_2_after_level_1_forgets_the_offloaded_copy():
    worker = Worker(reload_seed=1)
    worker.sleep.sleep(1)
    worker.sleep.sleep(2)
    worker.sleep.wake_up()
    assert worker.reloads == 1
    assert_same(tied_model(1).state_dict(), worker.model)


def test_tags_wake_one_part_at_a_time_and_waking_an_awake_part_does_nothing():
    worker = Worker()
    before = worker.state()
    worker.sleep.sleep(1)
    worker.sleep.wake_up(["kv_cache"])
    assert worker.storage_sizes() == [0, 0, 0, 0, 0]
    worker.sleep.wake_up(["weights"])
    worker.sleep.wake_up(["weights", "kv_cache"])
    assert_same(before, worker.model)


def test_a_checkpoint_that_no_longer_fits_the_model_is_an_error():
    worker = Worker()
    worker.reload = lambda: nn.Sequential(nn.Linear(8, 8))
    worker.sleep.reload = worker.reload
    worker.sleep.sleep(2)
    with pytest.raises(RuntimeError, match="no longer matches"):
        worker.sleep.wake_up()


def config(enable: bool = True, lora: bool = False, eplb: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        model=SimpleNamespace(enable_sleep_mode=enable),
        lora=object() if lora else None,
        parallel=SimpleNamespace(enable_eplb=eplb),
    )


@pytest.mark.parametrize(
    ("check", "named"),
    [
        (lambda: check_sleep(config(enable=False), 1), "enable_sleep_mode"),
        (lambda: check_sleep(config(), 3), "level"),
        (lambda: check_level(True), "level"),
        (lambda: check_sleep(config(lora=True), 2), "level 2 .* --enable-lora"),
        (lambda: check_sleep(config(eplb=True), 2), "level 2 .* --enable-eplb"),
        (lambda: wake_tags(["weights", "scheduling"]), "tags"),
        (lambda: wake_tags("weights"), "tags"),
    ],
)
def test_what_cannot_sleep_or_wake_is_a_value_error_naming_it(check, named):
    with pytest.raises(ValueError, match=f"^{named}"):
        check()


def test_level_1_with_lora_or_eplb_is_allowed():
    check_sleep(config(lora=True, eplb=True), 1)
