"""RayExecutor: a Ray actor per rank, placed by a placement group (executor backend `ray`).

The engine core is the Ray driver: it attaches to the Ray it finds (initialised in this
process, else the cluster at RAY_ADDRESS, else a local instance it starts), reserves one
bundle per rank (a GPU on CUDA platforms, a CPU elsewhere) packed on as few nodes as
possible, and pins each rank's actor to its bundle. Every call runs on every actor, since
ranks meet in collectives, in the order it was made (an actor runs one call at a time, in
submission order); only the ranks whose answer is wanted send one back. A dead actor
(killed, out of memory, its node lost) fails the pending and every later call with
WorkerDiedError, and the other actors are killed: they would wait forever in a collective.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from core.config import EngineConfig
from core.executor.interface import Executor
from core.executor.multiproc import WorkerDiedError
from core.executor.worker_proc import Reply, start_rank_worker
from core.model_loader import Checkpoint, resolve_model
from core.platforms.interface import Platform
from core.worker.contract import ModelRunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 600.0
_PLACEMENT_TIMEOUT_S = 60.0
# How long a failed call waits to learn whether an actor died: a rank whose peer was
# killed fails in its collective before Ray reports the death.
_DEATH_GRACE_S = 3.0


class RankActor:
    """One rank in its Ray actor process: the Worker that start_rank_worker builds.

    Every method answers a worker_proc.Reply, as mp's workers do: a call that raised
    carries its traceback back, so Ray errors mean only that the actor is gone."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.worker: Any = None

    def free_address(self) -> Reply:
        """This node's IP and a port free on it, where rank 0 hosts the rendezvous."""
        return self._reply(_free_address)

    def start(self, config_json: str, model: str, init: str) -> Reply:
        """Join the process groups and load this rank's share of the model; the pid."""
        return self._reply(partial(self._start, config_json, model, init))

    def _start(self, config_json: str, model: str, init: str) -> int:
        # One CPU per bundle, so one thread; each actor sees only its bundle's device,
        # as device 0.
        self.worker = start_rank_worker(
            config_json, model, self.rank, init, num_threads=1, local_rank=0
        )
        return os.getpid()

    def execute(self, method: str, args: tuple, kwargs: dict[str, Any], reply: bool) -> Reply:
        answer = self._reply(lambda: getattr(self.worker, method)(*args, **kwargs))
        return answer if reply or answer.error is not None else Reply(self.rank)

    def _reply(self, call: Callable[[], Any]) -> Reply:
        try:
            return Reply(self.rank, value=call())
        except Exception:
            return Reply(self.rank, error=traceback.format_exc())


def _free_address() -> tuple[str, int]:
    with socket.socket() as s:
        # Free on every address: the rendezvous store listens on all of them.
        s.bind(("", 0))
        return ray.util.get_node_ip_address(), s.getsockname()[1]


class RayExecutor(Executor):
    def __init__(
        self, config: EngineConfig, platform: Platform, checkpoint: Checkpoint | None = None
    ) -> None:
        super().__init__(config)
        self.world_size = config.parallel.world_size
        checkpoint = checkpoint or resolve_model(config.model.model)
        self._dead: str | None = None
        self._stopping = False
        self._initialised_ray = _connect(self.world_size)
        self.workers: list[Any] = []
        self.worker_pids: list[int] = []
        self._placement: PlacementGroup | None = None
        try:
            self._placement = _place(self.world_size, platform)
            self.workers = _create_actors(self._placement, self.world_size, platform)
            # Rank 0 hosts the rendezvous: on a cluster it need not be on this node.
            [(ip, port)] = self._gather([self.workers[0].free_address.remote()], _STARTUP_TIMEOUT_S)
            setup = (config.model_dump_json(), str(checkpoint.path))
            starts = [actor.start.remote(*setup, f"tcp://{ip}:{port}") for actor in self.workers]
            self.worker_pids = self._gather(starts, _STARTUP_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise

    def collective_rpc(
        self,
        method: str,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        reply_ranks: tuple[int, ...] | None = None,
    ) -> list[Any]:
        """WorkerDiedError when an actor is gone; RuntimeError carrying a worker's
        traceback when the call raised there."""
        return self._start(method, args, kwargs, reply_ranks)()

    def execute_model_async(
        self, scheduler_output: SchedulerOutput
    ) -> Callable[[], ModelRunnerOutput]:
        """Start the step on every actor; an actor runs its calls in the order they came,
        so steps started before the first is waited for queue up behind it."""
        wait = self._start("execute_model", (scheduler_output,), None, self.step_reply_ranks())
        return lambda: self.step_output(wait())

    def _start(
        self,
        method: str,
        args: tuple,
        kwargs: dict[str, Any] | None,
        reply_ranks: tuple[int, ...] | None,
    ) -> Callable[[], list[Any]]:
        """Call `method` on every actor; a function that waits for the replying ranks'
        answers, in rank order."""
        self._check_alive()
        ranks = range(self.world_size) if reply_ranks is None else reply_ranks
        calls = [
            actor.execute.remote(method, args, kwargs or {}, rank in ranks)
            for rank, actor in enumerate(self.workers)
        ]

        def wait() -> list[Any]:
            answers = self._gather(calls, timeout_s=None)
            return [answers[rank] for rank in sorted(ranks)]

        return wait

    def _gather(self, calls: list[ray.ObjectRef], timeout_s: float | None) -> list[Any]:
        """Every rank's answer to `calls` (one per rank, in rank order), as soon as all
        are in; raises as soon as an actor is dead, or `_DEATH_GRACE_S` after a call
        failed without one dying."""
        pending = {call: rank for rank, call in enumerate(calls)}
        answers: dict[int, Any] = {}
        failures: dict[int, str] = {}  # rank: the traceback of the call there
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            wait_s = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
            if not ready:
                if failures:
                    break
                raise TimeoutError(f"Ray workers not ready after {timeout_s:.0f} s")
            rank = pending.pop(ready[0])
            try:
                reply: Reply = ray.get(ready[0])
            except RayActorError as error:
                raise self._declare_dead(rank, error) from error
            if reply.error is None:
                answers[rank] = reply.value
            else:
                failures[rank] = reply.error
                grace_end = time.monotonic() + _DEATH_GRACE_S
                deadline = grace_end if deadline is None else min(deadline, grace_end)
        if failures:
            rank, error = min(failures.items())
            raise RuntimeError(f"worker rank {rank} failed:\n{error}")
        return [answers[rank] for rank in range(len(calls))]

    def _declare_dead(self, rank: int, error: RayActorError) -> WorkerDiedError:
        """Record the death and kill the other ranks (they would wait in a collective);
        the error to raise."""
        where = f"Ray actor, pid {self.worker_pids[rank]}" if self.worker_pids else "Ray actor"
        self._dead = f"worker rank {rank} ({where}) died"
        logger.error("%s; stopping the other workers\n%s", self._dead, error)
        self._kill_actors()
        return WorkerDiedError(self._dead)

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise WorkerDiedError(self._dead)

    def shutdown(self) -> None:
        """Kill the actors, free their placement group; shut Ray down in this process if
        the executor initialised it there (a Ray found initialised is left as it was)."""
        if self._stopping:
            return
        self._stopping = True
        self._kill_actors()
        if self._placement is not None:
            remove_placement_group(self._placement)
        if self._initialised_ray:
            ray.shutdown()

    def _kill_actors(self) -> None:
        for actor in self.workers:
            ray.kill(actor)


def _connect(world_size: int) -> bool:
    """Attach this process to Ray; whether this call did (shutdown then undoes it: stops
    the instance it started, or only disconnects from a cluster)."""
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        # A private instance (not a `ray start` one found on this host: RAY_ADDRESS=auto
        # attaches to that), sized for the ranks rather than the whole host.
        ray.init(address="local", num_cpus=world_size, include_dashboard=False, log_to_driver=False)
    return True


def _bundle(platform: Platform) -> dict[str, float]:
    return {"GPU": 1.0} if platform.device_type == "cuda" else {"CPU": 1.0}


def _place(world_size: int, platform: Platform) -> PlacementGroup:
    """A bundle per rank, reserved; TimeoutError naming what the cluster has otherwise."""
    bundle = _bundle(platform)
    group = placement_group([bundle] * world_size, strategy="PACK")
    if not group.wait(timeout_seconds=_PLACEMENT_TIMEOUT_S):
        remove_placement_group(group)
        raise TimeoutError(
            f"Ray could not place {world_size} bundles of {bundle} in "
            f"{_PLACEMENT_TIMEOUT_S:.0f} s; the cluster has {ray.cluster_resources()}"
        )
    return group


def _create_actors(group: PlacementGroup, world_size: int, platform: Platform) -> list[Any]:
    """A RankActor per rank, each holding exactly its bundle's resources."""
    bundle = _bundle(platform)
    actor_cls = ray.remote(RankActor)
    return [
        actor_cls.options(
            num_cpus=bundle.get("CPU", 0.0),
            num_gpus=bundle.get("GPU", 0.0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, rank),
        ).remote(rank)
        for rank in range(world_size)
    ]
