"""Per-episode sandbox cost: a fresh container per episode vs the warm pool the experiment uses by default.

Both through `bat_jax.sandbox.backends.open_backend` exactly as `bicurl/run_loops.py` builds them.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import time

from bat_jax.benchmarks.imaging import heldout
from bat_jax.sandbox.backends import open_backend
from bat_jax.benchmarks.imaging.registry import get_track


def _episode(backend, state) -> tuple[float, float]:
    """(get, give back) seconds of one episode's sandbox."""
    t0 = time.perf_counter()
    sb = backend.make(state)
    t1 = time.perf_counter()
    assert sb.execute_code("python", "print(1)").stdout == "1\n"
    t2 = time.perf_counter()
    (backend.release or type(sb).close)(sb)
    return t1 - t0, time.perf_counter() - t2


def _batch(backend, state, n: int) -> float:
    """Wall seconds to open `n` sandboxes at once (n threads), run one call in each and release them all."""
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        boxes = list(ex.map(lambda _: backend.make(state), range(n)))
        list(ex.map(lambda sb: sb.execute_code("python", "print(1)"), boxes))
        list(ex.map(backend.release or (lambda sb: sb.close()), boxes))
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=8, help="episodes per backend (and the batch size)")
    parser.add_argument("--track", default="segmentation", help="track whose task state episodes start from")
    args = parser.parse_args()
    n = args.episodes
    state = heldout.training_task(get_track(args.track), 1, "success", 0).state()
    size = sum(len(v) for v in state.files.values())
    print(f"episode start state: {args.track} task, {len(state.files)} files, {size / 1e6:.2f} MB; {n} episodes")
    with open_backend("docker", concurrency=n) as fresh, open_backend("docker", concurrency=n, warm=n) as warm:
        _episode(fresh, state), _episode(warm, state)  # warm-up: image cache, first connections
        times = {"fresh": [], "warm": []}
        for _ in range(n):
            for name, backend in (("fresh", fresh), ("warm", warm)):
                times[name].append(_episode(backend, state))
        batch = {name: _batch(backend, state, n) for name, backend in (("fresh", fresh), ("warm", warm))}
    med = {name: (statistics.median(g for g, _ in t) * 1e3, statistics.median(r for _, r in t) * 1e3,
                  statistics.median(g + r for g, r in t) * 1e3) for name, t in times.items()}
    print(f"{'per episode (median ms)':28s} {'get':>9s} {'give back':>10s} {'sum':>9s}")
    for name, (g, r, s) in med.items():
        print(f"{name:28s} {g:9.1f} {r:10.1f} {s:9.1f}")
    print(f"ratio fresh / warm (sum): {med['fresh'][2] / med['warm'][2]:.1f}x; get only: "
          f"{med['fresh'][0] / med['warm'][0]:.1f}x")
    print(f"batch of {n} opened at once, one call each, released (wall s): fresh {batch['fresh']:.2f}, "
          f"warm {batch['warm']:.2f}, ratio {batch['fresh'] / batch['warm']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
