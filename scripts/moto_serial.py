"""moto's server, answering one request at a time.

moto applies a DynamoDB transaction item by item and rolls back a failed one by restoring
a copy of the tables taken before it started. On moto_server's threaded server, concurrent
TransactWriteItems are therefore not isolated from each other (a rollback can undo another
transaction's writes, and a half-applied transaction is visible), while real DynamoDB's are
serializable. Serving requests one at a time restores the isolation Airlock's tests rely on
(the concurrency storms of the execute path). Same options as moto_server: -H HOST -p PORT.

Each full garbage collection (Python's generation 2) is logged with how long it held the
server: `moto-gc: generation 2 collection took 412.3 ms`. moto's tables are many small
Python objects, so these pauses grow with the tables; `lambda-bench --execute-aws` counts
them to tell the emulator's pauses from the client's (BENCHMARKS.md).
"""

import argparse
import gc
import os
import signal
import sys
import time


def log_full_collections() -> None:
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            took = (time.perf_counter() - started[0]) * 1000
            print(f"moto-gc: generation 2 collection took {took:.1f} ms", file=sys.stderr, flush=True)

    gc.callbacks.append(callback)

from werkzeug.serving import run_simple

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args()
    os.environ.setdefault("MOTO_PORT", str(args.port))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    log_full_collections()
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        args.host,
        args.port,
        app,
        threaded=False,
        use_reloader=False,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
