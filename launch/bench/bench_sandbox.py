"""Sandbox benchmark: tool-call latency, snapshot restore, 8-way throughput.

Latency against plain `docker exec` and against the sandbox before privilege separation.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import io
import os
import pathlib
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

import docker
import docker.errors
import docker.types

from bat_jax.sandbox import images
from bat_jax.sandbox.docker import (LABEL, WORKSPACE, DockerSandbox, DockerSandboxConfig, SandboxError,
                                    _Channel, connect, new_owner, remove_labelled, state_to_tar)
from bat_jax.sandbox.pool import SandboxPool
from bat_jax.sandbox.types import SandboxState

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository (git reads the baseline from it)
BASELINE_REV = "546187d"  # the last commit before the sandbox's privilege separation
BASELINE_REPO = "bat-sandbox-baseline"
PRINT1 = ("python", "print(1)")
ECHO1 = ("bash", "echo 1")
NUMPY = ("python", "import numpy as np; print(np.ones(3).sum())")
#: A call that writes a 1 MB workspace file: what the receipts' per-written-file digests cost.
WRITE1MB = ("python", "import numpy as np; np.save('w.npy', np.ones(131072))")


def _median_ms(fn, n: int, pause_s: float = 0.0) -> float:
    times = []
    for _ in range(n):
        time.sleep(pause_s)
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _paired_median_ms(fn_a, fn_b, n: int, pause_s: float = 0.0) -> tuple[float, float]:
    """Medians of `fn_a` and `fn_b` timed alternately (a, b, b, a, ...), so both see the same machine load."""
    times_a, times_b = [], []
    for i in range(n):
        order = ((fn_a, times_a), (fn_b, times_b)) if i % 2 == 0 else ((fn_b, times_b), (fn_a, times_a))
        for fn, times in order:
            time.sleep(pause_s)
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times_a), statistics.median(times_b)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def baseline_image(client: docker.DockerClient, rev: str) -> str:
    """`bat-sandbox-baseline:<rev>`: the task image of git revision `rev` (its `sandboxes/task/`, plus any file
    its Dockerfile copies from `bat_jax/sandbox/` at that revision) on the current base image; built once."""
    full = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    tag = f"{BASELINE_REPO}:{full[:12]}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="bat-baseline-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", full, "sandboxes/task"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        context = pathlib.Path(tmp) / "sandboxes" / "task"
        for line in (context / "Dockerfile").read_text().splitlines():
            words = line.split()
            if words[:1] == ["COPY"]:
                for name in words[1:-1]:
                    if not (context / name).exists():  # e.g. a package module copied next to the executor
                        (context / name).write_bytes(subprocess.run(
                            ["git", "-C", str(ROOT), "show", f"{full}:bat_jax/sandbox/{name}"], check=True,
                            capture_output=True).stdout)
        print(f"building {tag} from {rev} ({full[:12]}) on {images.base_tag()}", flush=True)
        client.images.build(path=str(context), tag=tag, buildargs={"BASE": images.base_tag()}, rm=True,
                            network_mode="none", labels={images.IMAGE_LABEL: "baseline"})
    return tag


class BaselineSandbox:
    """A container of the pre-hardening image, run with that revision's settings (executor and agent code as
    uid 65534, no capabilities; otherwise the limits of `DockerSandboxConfig`), spoken to with its protocol:
    one JSON request line, one reply line, no request ids."""

    def __init__(self, client: docker.DockerClient, image: str, owner: str,
                 config: DockerSandboxConfig = DockerSandboxConfig()):
        self._client, self.config, self.container_id, self._channel = client, config, "", None
        api = client.api
        host_config = api.create_host_config(
            network_mode="none", cap_drop=["ALL"], read_only=True, security_opt=["no-new-privileges"],
            mem_limit=config.mem_limit, memswap_limit=config.memswap_limit, pids_limit=config.pids_limit,
            nano_cpus=int(config.cpus * 1e9), init=True, auto_remove=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={config.tmp_size},mode=1777"},
            mounts=[docker.types.Mount(WORKSPACE, None, type="volume", driver_config=docker.types.DriverConfig(
                "local", {"type": "tmpfs", "device": "tmpfs",
                          "o": f"size={config.workspace_size},uid=65534,gid=65534,mode=0755,nosuid,nodev"}))],
            log_config=docker.types.LogConfig(type="none"))
        try:
            self.container_id = api.create_container(
                image, user="65534:65534", stdin_open=True, detach=False, tty=False, working_dir=WORKSPACE,
                labels={LABEL: "1", f"{LABEL}.owner": owner}, host_config=host_config, network_disabled=True)["Id"]
            self._channel = _Channel(api.attach_socket(self.container_id, params={
                "stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}))
            api.start(self.container_id)
            self._channel.send({"op": "ping"})
            if not self._channel.recv(config.start_timeout_s).get("ok"):
                raise SandboxError(f"the baseline executor of {image} did not answer its ping")
        except BaseException:
            self.close()
            raise

    def execute_code(self, language: str, code: str) -> dict:
        self._channel.send({"op": "exec", "language": language, "code": code, "timeout_s": self.config.timeout_s,
                            "max_chars": self.config.max_output_chars, "env": {}})
        return self._channel.recv(self.config.timeout_s + self.config.grace_s)

    def reset(self, state: SandboxState) -> None:
        """That revision's reset: wipe + inline tar through the executor up to 2 MB, else wipe + put_archive."""
        data = state_to_tar(state)
        inline = len(data) <= self.config.inline_restore_max_bytes
        req = {"op": "load", "tar_b64": base64.b64encode(data).decode("ascii")} if inline else {"op": "wipe"}
        self._channel.send(req)
        if not self._channel.recv(self.config.start_timeout_s).get("ok"):
            raise SandboxError("baseline reset failed")
        if not inline:
            self._client.api.put_archive(self.container_id, WORKSPACE, data)

    def export_files(self) -> dict[str, bytes]:
        """That revision's export: one `get_archive` of the whole workspace, regular files kept."""
        stream, _ = self._client.api.get_archive(self.container_id, WORKSPACE + "/.")
        files = {}
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r") as tar:
            for member in tar.getmembers():
                parts = member.name.split("/", 1)
                if member.isfile() and len(parts) == 2 and parts[1]:
                    files[parts[1]] = tar.extractfile(member).read()
        return files

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        if self.container_id:
            try:
                self._client.api.remove_container(self.container_id, force=True, v=True)
            except docker.errors.DockerException:
                pass

    def __enter__(self) -> BaselineSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def before_after(client: docker.DockerClient, image: str, rev: str, calls: int, think_s: float,
                 plain: dict[str, float]) -> bool:
    """Warm latency of the pre-hardening sandbox ("before") and the current one ("after"), alternating calls,
    next to plain `docker exec`; prints the table and the verdict (after <= 2 x before). Returns whether it passed."""
    owner = new_owner()
    base_tag = baseline_image(client, rev)
    rows = []
    try:
        with BaselineSandbox(client, base_tag, owner) as before, DockerSandbox(client, image=image) as after:
            for _ in range(5):  # warm both, and check that both answer
                got = (before.execute_code(*PRINT1).get("stdout"), after.execute_code(*PRINT1).stdout)
                if got != ("1\n", "1\n"):
                    raise SandboxError(f"print(1) gave {got} (before, after)")
            for name, call, pause in (("python print(1)", PRINT1, think_s), ("bash echo 1", ECHO1, think_s),
                                      ("python + numpy", NUMPY, think_s),
                                      ("python writes a 1 MB file", WRITE1MB, think_s),
                                      ("python print(1), back-to-back", PRINT1, 0.0)):
                b, a = _paired_median_ms(lambda c=call: before.execute_code(*c),
                                         lambda c=call: after.execute_code(*c), calls, pause)
                rows.append((name, b, a, plain.get(name)))
            # Not part of the gate (it is about tool calls), but paid once per pooled episode.
            small = SandboxState(files={"notes.md": b"stage boundary\n", "mask.npy": os.urandom(200_000)})
            b, a = _paired_median_ms(lambda: before.reset(small), lambda: after.reset(small), max(5, calls // 3))
            rows.append(("reset to a 0.2 MB, 2-file state *", b, a, None))
            big = SandboxState(files={f"vol/scan_{i:02d}.nii": os.urandom(500_000) for i in range(16)})
            before.reset(big)
            after.reset(big)
            if not len(before.export_files()) == len(after.export_state().files) == 16:
                raise SandboxError("export_state did not return the 16 files restored")
            b, a = _paired_median_ms(before.export_files, after.export_state, max(5, calls // 6))
            rows.append(("export_state 8 MB, 16 files *", b, a, None))
    finally:
        remove_labelled(client, owner)
    print(f"\nwarm execute_code medians, before = {rev} ({base_tag}), after = this tree; calls alternate, "
          f"{calls} each, think time {think_s * 1e3:.0f} ms (back-to-back row: none)")
    print(f"{'call':<36}{'before':>10}{'after':>10}{'docker exec':>13}{'after/before':>14}")
    ok = True
    for name, b, a, p in rows:
        ok &= a <= 2 * b or name.endswith("*")
        plain_text = f"{p:10.1f} ms" if p is not None else f"{'—':>13}"
        print(f"{name:<36}{b:7.2f} ms{a:7.2f} ms{plain_text}{a / b:13.2f}x")
    worst = max((r for r in rows if not r[0].endswith("*")), key=lambda r: r[2] / r[1])
    print(f"goal, execute_code after <= 2 x before on every row: {'PASS' if ok else 'FAIL'} "
          f"(worst: {worst[0]}, {worst[2] / worst[1]:.2f}x; * = shown, not gated)")
    return ok


def executor_ab(client: docker.DockerClient, image: str, rev: str, calls: int, think_s: float) -> bool:
    """Warm latency of this tree's sandbox with the executor of git revision `rev` (its task image,
    `baseline_image`) against this tree's executor, both driven by this tree's host code and settings, calls
    alternating; prints the table and whether every warm tool call stays within 10 % (the 1 MB write row, which
    pays for the receipts' write digests, is shown, not gated). Returns whether it passed."""
    tag = baseline_image(client, rev)
    rows = []
    with DockerSandbox(client, image=tag) as old, DockerSandbox(client, image=image) as new:
        for _ in range(5):
            old.execute_code(*PRINT1)
            new.execute_code(*PRINT1)
        for name, call in (("python print(1)", PRINT1), ("bash echo 1", ECHO1), ("python + numpy", NUMPY),
                           ("python writes a 1 MB file *", WRITE1MB)):
            rows.append((name, *_paired_median_ms(lambda c=call: old.execute_code(*c),
                                                  lambda c=call: new.execute_code(*c), calls, think_s)))
    print(f"\nexecutor A/B: executor of {rev} ({tag}) vs this tree's, same host code; {calls} alternating calls "
          f"each, think time {think_s * 1e3:.0f} ms")
    ok = True
    for name, a, b in rows:
        ok &= b <= 1.10 * a or name.endswith("*")
        print(f"{name:<36}{a:7.2f} ms{b:7.2f} ms{100 * (b / a - 1):+9.1f} %")
    print(f"warm tool calls within 10 % of {rev}'s executor: {'PASS' if ok else 'FAIL'} (* = shown, not gated)")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="calls per latency measurement")
    parser.add_argument("--concurrency", type=int, default=8, help="sandboxes in the throughput test")
    parser.add_argument("--think_s", type=float, default=0.1,
                        help="pause before each timed call, seconds (the policy's decode time in a rollout)")
    parser.add_argument("--snapshot_mb", type=float, default=8.0, help="size of the restored workspace, MB")
    parser.add_argument("--baseline_rev", default=BASELINE_REV,
                        help="git revision whose sandboxes/task/ is the 'before' sandbox ('none' skips it)")
    parser.add_argument("--executor_rev", default=None,
                        help="only the executor A/B: git revision whose executor this tree's is compared with")
    args = parser.parse_args()
    client = connect()
    image = images.ensure_images(client)
    print(f"image {image}, {os.cpu_count()} CPU cores")
    if args.executor_rev:
        return 0 if executor_ab(client, image, args.executor_rev, args.calls, args.think_s) else 1

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
        plain_bash = _median_ms(lambda: subprocess.run(["docker", "exec", cid, "bash", "-c", "echo 1"],
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
    if args.baseline_rev.lower() != "none":
        plain = {"python print(1)": plain_cli, "bash echo 1": plain_bash, "python + numpy": plain_np}
        before_after(client, image, args.baseline_rev, args.calls, args.think_s, plain)

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
