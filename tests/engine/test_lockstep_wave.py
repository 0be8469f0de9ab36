"""core_proc.Wave: lock-step engines agree on wave numbers without a coordinator's
count; a wake for a wave an engine has already finished does not restart it."""

from __future__ import annotations

from core.engine.core_proc import Wave


def test_work_starts_the_current_wave_and_the_end_numbers_the_next():
    wave = Wave()
    assert (wave.start(), wave.running) == (0, True)
    wave.end()
    assert (wave.number, wave.running) == (1, False)
    assert wave.start() == 1


def test_a_wake_joins_the_current_wave_only():
    wave = Wave()
    wave.join(0)
    assert wave.running  # another engine started wave 0
    wave.end()
    wave.join(0)  # a second engine's wake for wave 0 arriving late
    assert not wave.running
    wave.join(1)
    assert wave.running
