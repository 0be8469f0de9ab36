"""The engine-core process: an EngineCore behind two ZMQ sockets.

The frontend PUSHes requests and aborts; this process PULLs them, steps the engine while
it has work and PUSHes EngineCoreOutputs back. With no work it blocks on its input socket
and never spins: on a 2-core machine a spinning loop would take a core from the model.
It dies with its parent (PDEATHSIG), so a killed server leaves no orphan.

Engines whose workers share experts (ParallelConfig.experts_span_engines) step in
lock-step: each step's forward exchanges tokens among all of them, so all run it, a
placeholder forward on those with no tokens. They step in waves. A wave starts when an
idle engine gets work: it tells the frontend (`EngineCoreOutputs.start_wave`, the wave's
number), which wakes the others into that wave (START_WAVE), and ends on the first step
in which no engine had tokens (every engine learns that from the same step's summed
count, `EngineCore.tokens_across_dp`): all then number the next wave alike and block on
their inputs. A wake for a wave an engine has already passed is stale and ignored.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any

import msgspec
import zmq

from core.config import EngineConfig
from core.engine.core import EngineCore
from core.engine.protocol import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    SchedulerStats,
)
from core.process_lifetime import die_with_parent, skip_exit_collection

logger = logging.getLogger(__name__)

# Frontend -> engine core message kinds (first frame of a multipart message).
ADD, ABORT, UTILITY = b"ADD", b"ABORT", b"UTILITY"
# Engine core -> frontend.
READY, OUTPUTS, FAILED = b"READY", b"OUTPUTS", b"FAILED"
# An engine core says it is alive this often, busy or idle (core.engine.core_client reads the
# age of the last word heard: /health, and a frontend on another node has no other way to
# know); STOP (frontend -> engine core) ends one the frontend did not start.
HEARTBEAT, STOP = b"HEARTBEAT", b"STOP"
HEARTBEAT_S = 1.0
# Frontend -> lock-step engine core: join the wave numbered in the payload.
START_WAVE = b"START_WAVE"
# Frontend -> engine core: run [call id, name, args] (EngineCore.call); the engine core
# answers REPLY [call id, answer, None], or [call id, None, why] when it refuses the call.
CALL, REPLY = b"CALL", b"REPLY"


def run_engine_core(config_json: str, model: str, input_addr: str, output_addr: str) -> None:
    """Process entry point: build the engine core, then serve until SIGTERM."""
    die_with_parent()
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the frontend decides when to stop
    logging.basicConfig(level=logging.INFO, format="%(levelname)s engine-core: %(message)s")
    ctx = zmq.Context()
    output = ctx.socket(zmq.PUSH)
    output.connect(output_addr)
    encoder = msgspec.msgpack.Encoder()
    try:
        core = _build_core(config_json, model)
        core.executor.on_failure = _FailureSignal()
        info = {"pid": os.getpid(), "num_blocks": core.num_gpu_blocks}
        output.send_multipart([READY, encoder.encode(info)])
        inputs = ctx.socket(zmq.PULL)
        inputs.connect(input_addr)
        with _Heartbeat(ctx, output_addr):
            _EngineCoreLoop(core, inputs, output, encoder).run()
    except SystemExit:
        pass
    except Exception as exc:  # report, then die: the frontend turns unhealthy
        logger.exception("engine core failed")
        output.send_multipart([FAILED, encoder.encode(f"{type(exc).__name__}: {exc}")])
    finally:
        ctx.destroy(linger=1000)


def _build_core(config_json: str, model: str) -> EngineCore:
    from core.model_loader import resolve_model
    from core.platforms.selection import select_platform
    from core.plugins.hooks import get_hook_manager
    from core.plugins.registry import get_registry

    registry = get_registry()
    registry.run_general_plugins()  # every process loads plugins, by construction
    config = EngineConfig.model_validate_json(config_json).freeze()
    platform = select_platform(registry, config.device.device).platform
    return EngineCore(config, platform, resolve_model(model), get_hook_manager(registry))


class _Heartbeat:
    """HEARTBEAT every HEARTBEAT_S from a thread and a socket of its own, whatever the loop
    does: a step that runs for long still beats (kernels and torch release the GIL, Python
    yields it every few ms), a frozen process (SIGSTOP, a deadlock) does not."""

    def __init__(self, ctx: zmq.Context, output_addr: str) -> None:
        self._ctx, self._addr = ctx, output_addr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="core-heartbeat", daemon=True)

    def __enter__(self) -> None:
        self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        # ZMQ sockets belong to one thread: this one is made, used and closed here.
        socket = self._ctx.socket(zmq.PUSH)
        socket.connect(self._addr)
        try:
            while not self._stop.wait(HEARTBEAT_S):
                with contextlib.suppress(zmq.Again):  # a frontend not reading: skip a beat
                    socket.send_multipart([HEARTBEAT, b""], flags=zmq.NOBLOCK)
        finally:
            socket.close(linger=0)


class Wave:
    """A lock-step engine's wave of steps: its number, and whether it is running."""

    def __init__(self) -> None:
        self.number = 0
        self.running = False

    def start(self) -> int:
        """Run the current wave (this engine has work); its number, for the frontend."""
        self.running = True
        return self.number

    def join(self, number: int) -> None:
        """Another engine started wave `number`: run it, unless it is already past."""
        if number == self.number:
            self.running = True

    def end(self) -> None:
        """No engine had tokens: the next work starts the next wave."""
        self.number += 1
        self.running = False


class _EngineCoreLoop:
    def __init__(self, core: EngineCore, inputs: zmq.Socket, output: zmq.Socket, encoder):
        self.core = core
        self.wave = Wave() if core.lockstep else None
        self.inputs = inputs
        self.output = output
        self.encoder = encoder
        self.request_decoder = msgspec.msgpack.Decoder(EngineCoreRequest)
        self.ids_decoder = msgspec.msgpack.Decoder(list[str])
        self._last_stats: SchedulerStats | None = None

    def run(self) -> None:
        """Until SIGTERM (SystemExit): take every waiting message, then step once."""
        try:
            while True:
                if not self._busy():
                    # Idle: block (never spin), waking now and then (signals are handled).
                    if not self.inputs.poll(HEARTBEAT_S * 1000):
                        continue
                    self._handle(self.inputs.recv_multipart())
                while self.inputs.poll(0):
                    self._handle(self.inputs.recv_multipart())
                if self._busy():
                    self._step()
                elif self.core.scheduler.make_stats() != self._last_stats:
                    self._send(EngineCoreOutputs())  # e.g. an abort emptied the engine
        finally:
            self.core.shutdown()

    def _busy(self) -> bool:
        """Whether to step now: while there are requests, or in lock-step while the wave
        runs (an engine that gets requests while idle starts the next one); never while
        asleep: requests wait in the scheduler, the loop blocks on its input socket."""
        if self.core.is_sleeping():
            return False
        if self.wave is None:
            return self.core.has_unfinished_requests()
        if not self.wave.running and self.core.has_unfinished_requests():
            self._send(EngineCoreOutputs(start_wave=self.wave.start()))
        return self.wave.running

    def _step(self) -> None:
        had_requests = self.core.has_unfinished_requests()
        outputs = self.core.step()
        if self.wave is not None and self.core.tokens_across_dp == 0:
            self.wave.end()
        if had_requests:  # a placeholder step of an engine without any has nothing to say
            self._send(outputs)

    def _send(self, outputs: EngineCoreOutputs) -> None:
        outputs.scheduler_stats = self._last_stats = self.core.scheduler.make_stats()
        outputs.engine_index = self.core.config.parallel.data_parallel_rank
        self.output.send_multipart([OUTPUTS, self.encoder.encode(outputs)])

    def _handle(self, frames: list[bytes]) -> None:
        kind, payload = frames[0], frames[1] if len(frames) > 1 else b""
        if kind == ADD:
            self._add(self.request_decoder.decode(payload))
        elif kind == ABORT:
            self.core.abort_requests(self.ids_decoder.decode(payload))
        elif kind == UTILITY:
            self._utility(msgspec.msgpack.decode(payload))
        elif kind == CALL:
            self._call(*msgspec.msgpack.decode(payload))
        elif kind == START_WAVE and self.wave is not None:
            self.wave.join(msgspec.msgpack.decode(payload))
        elif kind == STOP:
            raise SystemExit(0)

    def _add(self, request: EngineCoreRequest) -> None:
        try:
            self.core.add_request(request)
        except ValueError as exc:  # the frontend validates; this is a last line of defence
            logger.warning("request %s refused: %s", request.request_id, exc)
            failed = EngineCoreOutput(
                request_id=request.request_id, new_token_ids=[], finish_reason=FinishReason.ERROR
            )
            self._send(EngineCoreOutputs(outputs=[failed]))

    def _call(self, call_id: int, name: str, args: list) -> None:
        try:
            reply = [call_id, self.core.call(name, *args), None]
        except ValueError as exc:  # refused: the caller's error; the engine serves on
            reply = [call_id, None, str(exc)]
        self.output.send_multipart([REPLY, self.encoder.encode(reply)])

    def _utility(self, name: str) -> None:
        try:
            self.core.call_utility(name)
        except ValueError as exc:  # the client checks the name; this is a last line of defence
            logger.warning("utility refused: %s", exc)


class ExecutorFailed(RuntimeError):
    """The executor cannot run steps any more (a worker died)."""


class _FailureSignal:
    """The executor's `on_failure`: turns a failure its monitor thread reports into
    ExecutorFailed raised in the main thread, even while that waits for input, so the
    frontend learns at once (FAILED) and fails its requests. Built in the main thread,
    the only one that may install the signal handler."""

    def __init__(self) -> None:
        self.reason = "executor failed"
        signal.signal(signal.SIGUSR1, self._raise)

    def __call__(self, reason: str) -> None:
        self.reason = reason
        os.kill(os.getpid(), signal.SIGUSR1)

    def _raise(self, signum: int, frame: Any) -> None:
        raise ExecutorFailed(self.reason)


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    # python -m core.engine.core_proc MODEL INPUT_ADDR OUTPUT_ADDR < config.json
    run_engine_core(sys.stdin.read(), *sys.argv[1:4])
    skip_exit_collection()
