"""Where the knee is: Locust runs at increasing user counts until p99 latency or failures break.

Runs ``load_tests/locustfile.py`` headless (Locust from its own venv: it runs on gevent and must
never share a process with ray or toolspec) against a running ``make serve`` on loopback, once
per user count, each for ``--seconds``, and reads Locust's CSV summary: requests, failures,
p50 / p99 latency, requests/s. The capacity is the most users whose run had p99 < ``--p99`` s
and no failures; it stops at the first count past the knee. Writes ``capacity.json``.

    .venv/bin/python load_tests/capacity.py --users 2,4,8,12,16,24 --seconds 120
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_locust(locust: Path, host: str, users: int, seconds: int, out: Path,
               sessions: Path | None) -> dict[str, Any]:
    prefix = out / f"users-{users}"
    env = dict(os.environ)
    if sessions is not None:
        env["TOOLSPEC_SESSIONS"] = str(sessions)
    subprocess.run([str(locust), "-f", str(ROOT / "load_tests" / "locustfile.py"),
                    "--host", host, "--headless", "-u", str(users),
                    "-r", str(max(1, users // 4)), "-t", f"{seconds}s", "--stop-timeout", "120",
                    "--csv", str(prefix), "--only-summary"], env=env, check=False,
                   capture_output=True, timeout=seconds + 300)
    with open(f"{prefix}_stats.csv") as handle:
        total = next(row for row in csv.DictReader(handle) if row["Name"] == "Aggregated")
    return {"users": users, "requests": int(total["Request Count"]),
            "failures": int(total["Failure Count"]),
            "p50_s": float(total["50%"]) / 1000, "p99_s": float(total["99%"]) / 1000,
            "requests_per_s": float(total["Requests/s"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="http://127.0.0.1:8000")
    parser.add_argument("--users", default="2,4,8,12,16,24")
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--p99", type=float, default=10.0, help="latency bound, seconds")
    parser.add_argument("--sessions", type=Path, default=None,
                        help="a sessions file (default: the locustfile's)")
    parser.add_argument("--locust", type=Path, default=ROOT / ".venv-locust" / "bin" / "locust")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "capacity")
    args = parser.parse_args()
    if urllib.parse.urlparse(args.host).hostname not in ("127.0.0.1", "localhost", "::1"):
        parser.error("load is sent to loopback addresses only")
    if not args.locust.exists():
        parser.error(f"{args.locust} is missing: `make load-test` creates .venv-locust")
    args.out.mkdir(parents=True, exist_ok=True)
    runs, capacity = [], 0
    for users in (int(part) for part in args.users.split(",")):
        run = run_locust(args.locust, args.host, users, args.seconds, args.out, args.sessions)
        runs.append(run)
        print(json.dumps(run), flush=True)
        held = run["failures"] == 0 and run["requests"] > 0 and run["p99_s"] < args.p99
        if not held:
            break
        capacity = users
    (args.out / "capacity.json").write_text(json.dumps(
        {"host": args.host, "seconds": args.seconds, "p99_bound_s": args.p99,
         "capacity_users": capacity, "runs": runs}, indent=2))
    print(f"capacity: {capacity} users held p99 < {args.p99:g} s with no failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
