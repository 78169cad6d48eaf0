"""How long the coordinator's Control API calls take while TLS handshakes flood a SuperLink's Fleet port.

    .venv/bin/python benchmarks/handshake_flood.py [--rounds 3] [--calls 30] [--flooders 3] [--label after]

Starts a real SuperLink (``fedseg.flower.superlink.start_superlink``: TLS, the default limits, the Fleet listener
on one loopback port, the control address on another) and times the coordinator's own status poll on the control
address (``ListRuns`` through ``fedseg.flower.deploy.control_client``, the key in its header, on one kept-alive TLS
connection, as ``wait_run`` polls) ``--calls`` times, 50 ms apart, in each phase: idle, then flooded. A flood is
``--flooders`` processes, each replaying one recorded TLS 1.3 ClientHello on a new connection to the Fleet port as
fast as the SuperLink answers it, and closing the connection once the server's first flight (its ServerHello,
certificate and signature: the SuperLink's whole cost of a handshake) has come; the handshakes per second answered
are counted. The phases alternate ``--rounds`` times. Appends every call's seconds, each phase's median, quartiles,
min and max (ms), and the flood's rate to ``benchmarks/results/handshake_flood.json`` (or ``--out``) under
``--label``. The SuperLink runs the fedseg this script imports: to measure another commit,
``git worktree add /tmp/old COMMIT`` and run this script with ``PYTHONPATH=/tmp/old/src``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
CALL_EVERY_S = 0.05  # seconds between two timed control calls
FLOOD_WARMUP_S = 1.0  # seconds the flood runs before the first call is timed


def client_hello(ca: Path) -> bytes:
    """The bytes of one TLS 1.3 ClientHello to 127.0.0.1 (``ca``: the SuperLink's CA), as a client's first flight."""
    context = ssl.create_default_context(cafile=str(ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    hello = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    try:
        hello.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def flood(port: int, hello: bytes, stop, counted) -> None:
    """Replay ``hello`` on new connections to ``port`` until ``stop`` is set; add each one the server answered with
    its first flight to ``counted``."""
    done = 0
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.sendall(hello)
                if conn.recv(65536):
                    done += 1
        except OSError:
            time.sleep(0.01)  # refused or closed over the limits: a moment, then again
    with counted.get_lock():
        counted.value += done


def timed_calls(client, calls: int) -> list[float]:
    """Seconds of each of ``calls`` ListRuns calls, ``CALL_EVERY_S`` apart."""
    from flwr.proto.control_pb2 import ListRunsRequest

    seconds = []
    for _ in range(calls):
        began = time.perf_counter()
        client.ListRuns(ListRunsRequest())
        seconds.append(time.perf_counter() - began)
        time.sleep(CALL_EVERY_S)
    return seconds


def summary(seconds: list[float]) -> dict:
    """Median, quartiles, min and max of ``seconds`` (at least two), in milliseconds."""
    q1, median, q3 = statistics.quantiles(seconds, n=4)
    return {
        "calls": len(seconds),
        "median_ms": round(median * 1000, 1),
        "q1_ms": round(q1 * 1000, 1),
        "q3_ms": round(q3 * 1000, 1),
        "min_ms": round(min(seconds) * 1000, 1),
        "max_ms": round(max(seconds) * 1000, 1),
    }


def measure(rounds: int, calls: int, flooders: int) -> dict:
    from fedseg.flower.certs import make_certs
    from fedseg.flower.deploy import Processes, flower_env, free_ports
    from fedseg.flower.superlink import LinkSettings, start_superlink

    idle: list[float] = []
    flooded: list[float] = []
    handshakes, flood_s = 0, 0.0
    with tempfile.TemporaryDirectory() as tmp, Processes() as procs:
        folder = Path(tmp)
        certs = make_certs(folder / "certs")
        fleet, control = free_ports(2)
        link = LinkSettings("127.0.0.1", fleet, certs, control=f"127.0.0.1:{control}")
        running = start_superlink(procs, link, folder, flower_env(folder))
        hello = client_hello(certs.ca)
        client = running.control_client()
        try:
            timed_calls(client, 5)  # the first calls warm the SuperLink up
            for _ in range(rounds):
                idle += timed_calls(client, calls)
                stop, counted = mp.Event(), mp.Value("q", 0)
                workers = [mp.Process(target=flood, args=(fleet, hello, stop, counted)) for _ in range(flooders)]
                for worker in workers:
                    worker.start()
                began = time.monotonic()
                try:
                    time.sleep(FLOOD_WARMUP_S)
                    flooded += timed_calls(client, calls)
                finally:
                    stop.set()
                    for worker in workers:
                        worker.join(timeout=30)
                    flood_s += time.monotonic() - began
                handshakes += counted.value
        finally:
            client.close()
    return {
        "idle": summary(idle),
        "flooded": summary(flooded),
        "flood_handshakes_per_s": round(handshakes / flood_s, 1),
        "idle_s": [round(s, 4) for s in idle],
        "flooded_s": [round(s, 4) for s in flooded],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=30, help="timed calls a phase (at least 2)")
    parser.add_argument("--flooders", type=int, default=3)
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "handshake_flood.json")
    args = parser.parse_args()
    import fedseg

    report = json.loads(args.out.read_text()) if args.out.is_file() else {}
    result = measure(args.rounds, args.calls, args.flooders)
    where = os.environ.get("PYTHONPATH")
    result["command"] = (f"PYTHONPATH={where} " if where else "") + (
        f".venv/bin/python benchmarks/handshake_flood.py --rounds {args.rounds} --calls {args.calls} "
        f"--flooders {args.flooders} --label {args.label!r}"
    )
    result["fedseg"] = str(Path(fedseg.__file__).parent)
    result["cpus"] = os.cpu_count()
    report.setdefault(args.label, []).append(result)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for phase in ("idle", "flooded"):
        r = result[phase]
        print(
            f"{args.label}: {phase}: median {r['median_ms']} ms (quartiles {r['q1_ms']}-{r['q3_ms']}, "
            f"min {r['min_ms']}, max {r['max_ms']}) over {r['calls']} calls",
            file=sys.stderr,
        )
    print(f"{args.label}: flood: {result['flood_handshakes_per_s']} handshakes/s answered", file=sys.stderr)


if __name__ == "__main__":
    main()
