"""A worker process of the multiprocess executor: one tensor-parallel rank.

Started by MultiprocExecutor as `python -m core.executor.worker_proc` (a fresh
interpreter, not fork: the engine core has torch threads; not multiprocessing's spawn:
it would re-run the user's __main__), with a pickled WorkerSetup on stdin. It joins the
process groups, loads its share of the model, reports READY, then runs every call the
executor broadcasts through the shared-memory queue, replying over ZMQ when asked (rank 0
always; every rank for calls whose answer differs per rank). It dies with its parent.
"""

from __future__ import annotations

import pickle
import sys
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq

from core.process_lifetime import die_with_parent

if TYPE_CHECKING:
    from core.config import EngineConfig
    from core.platforms.interface import Platform

# Executor -> worker call that ends the loop.
SHUTDOWN = "__shutdown__"


@dataclass(frozen=True)
class WorkerSetup:
    config_json: str
    model: str
    rank: int
    distributed_init_method: str
    rpc_handle: Any  # core.distributed.shm_broadcast handle of the call queue
    reply_address: str  # the executor's ZMQ PULL socket
    num_threads: int
    local_rank: int  # the device this rank computes on


@dataclass(frozen=True)
class Reply:
    rank: int
    value: Any = None
    error: str | None = None  # the formatted traceback when the call raised


def run_worker(setup: WorkerSetup) -> None:
    die_with_parent()
    ctx = zmq.Context()
    reply = ctx.socket(zmq.PUSH)
    reply.connect(setup.reply_address)
    try:
        worker, calls = _start(setup)
    except Exception:
        reply.send(pickle.dumps(Reply(setup.rank, error=traceback.format_exc())))
        raise
    reply.send(pickle.dumps(Reply(setup.rank, value="READY")))
    try:
        _serve(worker, calls, reply, setup.rank)
    finally:
        calls.close()
        ctx.destroy(linger=1000)


def _start(setup: WorkerSetup):
    from core.distributed.shm_broadcast import MessageQueue

    worker = start_rank_worker(
        setup.config_json,
        setup.model,
        setup.rank,
        setup.distributed_init_method,
        setup.num_threads,
        setup.local_rank,
    )
    return worker, MessageQueue.create_reader(setup.rpc_handle, setup.rank)


def start_rank_worker(
    config_json: str,
    model: str,
    rank: int,
    distributed_init_method: str,
    num_threads: int,
    local_rank: int | None = None,
) -> Any:
    """The Worker of this engine core's rank `rank`, in this process: plugins loaded,
    process groups joined (`join_world`), its share of `model` loaded. What every
    executor's worker process runs first (mp's here, Ray's in its actors)."""
    import torch

    from core.config import EngineConfig
    from core.model_loader import resolve_model
    from core.platforms.selection import select_platform
    from core.plugins.registry import get_registry
    from core.worker.worker import Worker

    local_rank = rank if local_rank is None else local_rank
    torch.set_num_threads(num_threads)
    registry = get_registry()
    registry.run_general_plugins()
    config = EngineConfig.model_validate_json(config_json).freeze()
    platform = select_platform(registry, config.device.device).platform
    join_world(config, platform, rank, distributed_init_method, local_rank)
    worker = Worker(config, platform, rank=rank, local_rank=local_rank)
    worker.init_device()
    worker.load_model(resolve_model(model))
    return worker


def join_world(
    config: EngineConfig,
    platform: Platform,
    rank: int,
    distributed_init_method: str,
    local_rank: int,
) -> None:
    """Join torch.distributed and build the parallel groups as this engine core's rank
    `rank` (pp * TP + tp): its ranks are the world, met at `distributed_init_method`.
    When experts span data-parallel engines (ParallelConfig.experts_span_engines) every
    engine's ranks form one world instead, engine d's at d * TP * PP on, met on the
    data-parallel address and master port: the expert layers' collectives span them."""
    from core.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )

    parallel = config.parallel
    world_size, dp_size = parallel.world_size, 1
    if parallel.experts_span_engines:
        dp_size = parallel.data_parallel_size
        rank += parallel.data_parallel_rank * world_size
        world_size *= dp_size
        address = f"{parallel.data_parallel_address}:{parallel.data_parallel_master_port}"
        distributed_init_method = f"tcp://{address}"
    init_distributed_environment(
        world_size,
        rank,
        distributed_init_method,
        local_rank=local_rank,
        backend=platform.dist_backend,
    )
    initialize_model_parallel(
        tensor_parallel_size=parallel.tensor_parallel_size,
        pipeline_parallel_size=parallel.pipeline_parallel_size,
        data_parallel_size=dp_size,
        backend=platform.dist_backend,
        communicator_cls=platform.device_communicator_cls,
        expert_parallel=parallel.enable_expert_parallel,
    )


def _serve(worker: Any, calls: Any, reply: zmq.Socket, rank: int) -> None:
    while True:
        method, args, kwargs, reply_ranks = calls.dequeue()
        if method == SHUTDOWN:
            worker.shutdown()
            return
        try:
            answer = Reply(rank, value=getattr(worker, method)(*args, **kwargs))
        except Exception:
            answer = Reply(rank, error=traceback.format_exc())
        # Errors always: a rank that fails leaves the others waiting on it.
        if reply_ranks is None or rank in reply_ranks or answer.error is not None:
            reply.send(pickle.dumps(answer))


if __name__ == "__main__":
    # python -m core.executor.worker_proc < pickled WorkerSetup. Run the module's own copy
    # (not __main__'s), so the Replies it pickles name a class the executor can load.
    from core.executor import worker_proc

    worker_proc.run_worker(pickle.loads(sys.stdin.buffer.read()))
