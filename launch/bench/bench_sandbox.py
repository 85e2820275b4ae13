"""Sandbox benchmark (issue 4): tool-call latency vs plain `docker exec`, snapshot restore, 8-way throughput.

Run (engine up, images built): python launch/bench/bench_sandbox.py [--calls 50] [--concurrency 8]
Goals: warm `execute_code('python', 'print(1)')` median <= 20 ms and >= 5x faster than a plain
`docker exec python3 -c 'print(1)'` measured in the same run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bat_jax.sandbox import images  # noqa: E402
from bat_jax.sandbox.docker import DockerSandbox, connect  # noqa: E402
from bat_jax.sandbox.pool import SandboxPool  # noqa: E402
from bat_jax.sandbox.types import SandboxState  # noqa: E402


def _median_ms(fn, n: int, pause_s: float = 0.0) -> float:
    times = []
    for _ in range(n):
        time.sleep(pause_s)
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="calls per latency measurement")
    parser.add_argument("--concurrency", type=int, default=8, help="sandboxes in the throughput test")
    parser.add_argument("--think_s", type=float, default=0.1,
                        help="pause before each timed call, seconds (the policy's decode time in a rollout)")
    parser.add_argument("--snapshot_mb", type=float, default=8.0, help="size of the restored workspace, MB")
    args = parser.parse_args()
    client = connect()
    image = images.ensure_images(client)
    print(f"image {image}, {os.cpu_count()} CPU cores")

    with DockerSandbox(client, image=image) as sb:
        for _ in range(5):
            sb.execute_code("python", "print(1)")
        ours_b2b = _median_ms(lambda: sb.execute_code("python", "print(1)"), args.calls)
        # In a rollout the policy decodes between two tool calls; the executor uses that gap to fork the next
        # call's process ahead of time. --think_s models that gap (the baseline gets the same pauses).
        ours = _median_ms(lambda: sb.execute_code("python", "print(1)"), args.calls, args.think_s)
        ours_bash = _median_ms(lambda: sb.execute_code("bash", "echo 1"), args.calls, args.think_s)
        ours_np = _median_ms(lambda: sb.execute_code("python", "import numpy as np; print(np.ones(3).sum())"),
                             args.calls, args.think_s)
        cid = sb.container_id
        plain_n = max(5, args.calls // 5)
        # Baseline: the same container, one fresh process per call through the docker CLI and through docker-py.
        plain_cli = _median_ms(lambda: subprocess.run(["docker", "exec", cid, "python3", "-c", "print(1)"],
                                                      check=True, capture_output=True), plain_n, args.think_s)
        plain_api = _median_ms(lambda: client.api.exec_start(client.api.exec_create(
            cid, ["python3", "-c", "print(1)"])["Id"]), plain_n, args.think_s)
        plain_np = _median_ms(lambda: subprocess.run(
            ["docker", "exec", cid, "python3", "-c", "import numpy as np; print(np.ones(3).sum())"],
            check=True, capture_output=True), plain_n, args.think_s)
    print(f"load average {os.getloadavg()[0]:.1f}; think time between calls {args.think_s * 1e3:.0f} ms")
    print(f"execute_code('python', 'print(1)') warm median     {ours:8.2f} ms "
          f"(back-to-back, no think time: {ours_b2b:.2f} ms)")
    print(f"execute_code('bash', 'echo 1') warm median         {ours_bash:8.2f} ms")
    print(f"execute_code python + numpy median                {ours_np:8.2f} ms")
    print(f"plain `docker exec python3 -c 'print(1)'` (CLI)    {plain_cli:8.2f} ms  -> {plain_cli / ours:5.1f}x slower")
    print(f"plain exec_create/exec_start (docker-py)          {plain_api:8.2f} ms  -> {plain_api / ours:5.1f}x slower")
    print(f"plain `docker exec` python3 + numpy (CLI)         {plain_np:8.2f} ms  -> {plain_np / ours_np:5.1f}x slower")
    print(f"goal <= 20 ms and >= 5x vs plain docker exec: "
          f"{'MET' if ours <= 20 and plain_cli / ours >= 5 else 'NOT MET'}")

    rng = os.urandom
    n_files = 16
    per_file = int(args.snapshot_mb * 1e6 / n_files)
    state = SandboxState(files={f"vol/scan_{i:02d}.nii": rng(per_file) for i in range(n_files)} |
                         {"notes.md": b"stage boundary\n"})
    with DockerSandbox(client, image=image) as sb:
        small = SandboxState(files={"notes.md": b"stage boundary\n", "mask.npy": rng(200_000)})
        restore_small = _median_ms(lambda: sb.reset(small), 10)
        restore = _median_ms(lambda: sb.reset(state), 10)
        export = _median_ms(sb.export_state, 5)
        assert sb.export_state().digest() == state.digest()
    cold = _median_ms(lambda: DockerSandbox(client, image=image, state=state).close(), 3)
    print(f"snapshot restore into a warm sandbox: 0.2 MB, 2 files {restore_small:.2f} ms; "
          f"{args.snapshot_mb:.0f} MB, {n_files + 1} files {restore:.2f} ms (export {export:.2f} ms); "
          f"fresh container + {args.snapshot_mb:.0f} MB restore + remove {cold:.0f} ms")

    with SandboxPool(size=args.concurrency, client=client) as pool:
        def worker(k: int) -> int:
            with pool.sandbox() as s:
                for _ in range(k):
                    s.execute_code("python", "print(1)")
            return k

        per = max(10, args.calls // 2)
        t = time.perf_counter()
        worker(per)
        single = per / (time.perf_counter() - t)
        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as ex:
            total = sum(ex.map(worker, [per] * args.concurrency))
        multi = total / (time.perf_counter() - t)
    print(f"throughput print(1): 1 sandbox {single:7.1f} calls/s; {args.concurrency} concurrent sandboxes "
          f"{multi:7.1f} calls/s ({multi / single:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
