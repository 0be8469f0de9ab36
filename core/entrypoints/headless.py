"""`core serve --headless`: this node's data-parallel engine cores, without an API server.

They connect over TCP to the primary node (the one running `core serve` with the API
server and `--data-parallel-size N`): engine core r to `--data-parallel-address` at ports
`--data-parallel-rpc-port + 2r` and the next. The command runs until its engine cores
end (the primary stops them when it shuts down) or until SIGTERM / SIGINT, which stops
them; they also die with it.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from typing import Any

from core.config import UsageContext
from core.engine import core_proc
from core.engine.core_client import with_data_parallel_rank
from core.engine.processor import EngineSetup
from core.engine_args import EngineArgs

logger = logging.getLogger(__name__)


def run_headless(engine_args: EngineArgs) -> int:
    """Start this node's engine cores and wait for them; their exit code (0: all ended)."""
    setup = EngineSetup.from_engine_args(engine_args, UsageContext.SERVING)
    parallel = setup.config.parallel
    ranks = parallel.local_data_parallel_ranks
    if ranks.start == 0:
        raise ValueError(
            "--headless: rank 0 runs with the API server; give this node "
            "--data-parallel-start-rank 1 or more"
        )
    processes = [_start(setup, rank) for rank in ranks]
    logger.info(
        "engine cores %d-%d connecting to %s from port %d",
        ranks.start, ranks.stop - 1, parallel.data_parallel_address,
        parallel.data_parallel_rpc_port + 2 * ranks.start,
    )  # fmt: skip

    def stop(signum: int, frame: Any) -> None:
        for process in processes:
            process.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return max(process.wait() for process in processes)


def _start(setup: EngineSetup, rank: int) -> subprocess.Popen:
    parallel = setup.config.parallel
    port = parallel.data_parallel_rpc_port + 2 * rank
    address = parallel.data_parallel_address
    command = [
        sys.executable, "-m", core_proc.__name__, str(setup.checkpoint.path),
        f"tcp://{address}:{port}", f"tcp://{address}:{port + 1}",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdin=subprocess.PIPE)
    process.stdin.write(with_data_parallel_rank(setup.config, rank).encode())
    process.stdin.close()
    return process
