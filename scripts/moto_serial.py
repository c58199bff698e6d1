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

`--zygote SOCKET` instead of `-p PORT`: a warmed process that forks a fresh server for each
request on a Unix socket (see `zygote`). The test command runs one; tests/src/moto.rs uses it
when AIRLOCK_MOTO_ZYGOTE names its socket.
"""

import argparse
import gc
import os
import random
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


def serve(app: DomainDispatcherApplication, host: str, port: int) -> None:
    os.environ["MOTO_PORT"] = str(port)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_simple(
        host,
        port,
        app,
        threaded=False,
        use_reloader=False,
        request_handler=MotoRequestHandler,
    )


def warm(app: DomainDispatcherApplication) -> None:
    """One call to each service the tests use, then a reset: the imports, the per-service
    apps and moto's lazily built tables are ready, and no state is left."""
    from werkzeug.test import Client

    client = Client(app)

    def auth(service: str) -> str:
        return (
            "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/"
            f"{service}/aws4_request, SignedHeaders=host, Signature=0"
        )

    def call(service: str, target: str, body: str, content_type: str) -> None:
        r = client.post(
            "/",
            data=body,
            headers={
                "Authorization": auth(service),
                "X-Amz-Target": target,
                "Content-Type": content_type,
            },
        )
        if r.status_code >= 500:
            raise RuntimeError(f"warm-up {target}: {r.status_code} {r.get_data(as_text=True)}")

    json10, json11 = "application/x-amz-json-1.0", "application/x-amz-json-1.1"
    call("dynamodb", "DynamoDB_20120810.ListTables", "{}", json10)
    call("sqs", "AmazonSQS.ListQueues", "{}", json10)
    call("kms", "TrentService.ListKeys", "{}", json11)
    call(
        "kms",
        "TrentService.CreateKey",
        '{"KeySpec": "ECC_NIST_P256", "KeyUsage": "SIGN_VERIFY"}',
        json11,
    )
    r = client.post(
        "/",
        data="Action=GetCallerIdentity&Version=2011-06-15",
        headers={
            "Authorization": auth("sts"),
            "Content-Type": "application/x-www-form-urlencoded",
        },
    )
    if r.status_code >= 500:
        raise RuntimeError(f"warm-up sts: {r.status_code}")
    if client.post("/moto-api/reset").status_code != 200:
        raise RuntimeError("warm-up: /moto-api/reset failed")


def zygote(app: DomainDispatcherApplication, path: str) -> None:
    """Serves fresh moto servers by forking this warmed process (the test command starts one;
    tests/src/moto.rs asks it through AIRLOCK_MOTO_ZYGOTE). Starting a moto server costs about
    1.5 s of CPU in imports and first calls; a fork of a warmed process costs milliseconds,
    and every server still starts with empty state in its own process.

    One request per connection, one line each way:
      `start PORT LOG_PATH CWD` -> `pid PID`   (a new server on 127.0.0.1:PORT)
      `status PID`              -> `running` | `exited CODE` | `unknown`
      `kill PID`                -> `killed`  (SIGKILL, reaped before the answer)
    """
    import socket

    warm(app)
    gc.collect()
    # The warmed objects never die: out of the collector's sight, in here and in every fork.
    gc.freeze()
    children: dict[int, int | None] = {}

    def reap() -> None:
        for pid, code in list(children.items()):
            if code is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    children[pid] = os.waitstatus_to_exitcode(status)

    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"moto zygote ready on {path}", flush=True)
    try:
        while True:
            conn, _ = listener.accept()
            with conn:
                words = conn.makefile("r").readline().split()
                reap()
                if len(words) == 4 and words[0] == "start":
                    port, log, cwd = int(words[1]), words[2], words[3]
                    pid = os.fork()
                    if pid == 0:
                        listener.close()
                        conn.close()
                        signal.signal(signal.SIGTERM, signal.SIG_DFL)
                        # Its own random sequence (moto draws names and handles from it).
                        random.seed()
                        try:
                            os.chdir(cwd)
                            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                            null = os.open(os.devnull, os.O_RDONLY)
                            sys.stdout.flush()
                            sys.stderr.flush()
                            os.dup2(null, 0)
                            os.dup2(fd, 1)
                            os.dup2(fd, 2)
                            log_full_collections()
                            serve(app, "127.0.0.1", port)
                        except SystemExit as e:
                            os._exit(e.code if isinstance(e.code, int) else 0)
                        except BaseException as e:  # noqa: BLE001 - the child must not return
                            print(f"moto child: {e!r}", file=sys.stderr, flush=True)
                            os._exit(1)
                        os._exit(0)
                    children[pid] = None
                    conn.sendall(f"pid {pid}\n".encode())
                elif len(words) == 2 and words[0] == "status":
                    pid = int(words[1])
                    if pid not in children:
                        answer = "unknown"
                    elif children[pid] is None:
                        answer = "running"
                    else:
                        answer = f"exited {children[pid]}"
                    conn.sendall(f"{answer}\n".encode())
                elif len(words) == 2 and words[0] == "kill":
                    pid = int(words[1])
                    if children.get(pid, "unknown") is None:
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                    children.pop(pid, None)
                    conn.sendall(b"killed\n")
                else:
                    conn.sendall(b"error unknown request\n")
    finally:
        for pid, code in children.items():
            if code is None:
                os.kill(pid, signal.SIGKILL)
        if os.path.exists(path):
            os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int)
    parser.add_argument("--zygote", metavar="SOCKET", help="fork servers on request instead")
    args = parser.parse_args()
    app = DomainDispatcherApplication(create_backend_app)
    if args.zygote:
        zygote(app, args.zygote)
        return
    if args.port is None:
        parser.error("-p PORT is required")
    log_full_collections()
    serve(app, args.host, args.port)


if __name__ == "__main__":
    main()
