"""moto's server, answering one request at a time.

moto applies a DynamoDB transaction item by item and rolls back a failed one by restoring
a copy of the tables taken before it started. On moto_server's threaded server, concurrent
TransactWriteItems are therefore not isolated from each other (a rollback can undo another
transaction's writes, and a half-applied transaction is visible), while real DynamoDB's are
serializable. Serving requests one at a time restores the isolation Airlock's tests rely on
(the concurrency storms of the execute path). Same options as moto_server: -H HOST -p PORT.
"""

import argparse
import os
import signal
import sys

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
