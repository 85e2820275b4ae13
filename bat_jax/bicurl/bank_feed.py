"""The Stage Bank versions a run's rounds read, and what the run tells the Data Factory.

Paper Sections 1, 2 and 6: "the policy-update loop reads only versioned, executable states".

Details: docs/design.md.
"""

from __future__ import annotations

import json
import pathlib
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from bat_jax.atomic_io import atomic_write
from bat_jax.bicurl.hosts import OneHost
from bat_jax.errors import ConfigValueError
from bat_jax.ledger import RoundRecord
from bat_jax.stage_bank import steering
from bat_jax.stage_bank.bank import BankView, StageBank
from bat_jax.stage_bank.factory import FactoryConfig, build_bank
from bat_jax.stage_bank.factory_loop import Build, FactoryLoopConfig, FactoryProcess, serve
from bat_jax.staged_benchmark.contract import StagedBenchmark

VERSIONS_FILE = "bank_versions.json"


def check_bank_version(value: Any) -> str | int:
    """`BiCuRLConfig.bank_version` checked: 'latest' or a version number >= 1.

    Raises:
      ConfigValueError: naming the binding and the value.
    """
    if value == "latest" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ConfigValueError(f"experiment.BiCuRLConfig.bank_version must be 'latest' or a version number >= 1, "
                           f"got {value!r}")


class BankFeed:
    """The versions of one run's rounds (module docstring); `view(version)` reads and keeps the newest view."""

    def __init__(self, bank: StageBank, run_dir: pathlib.Path, setting: str | int, benchmark: StagedBenchmark,
                 factory: "FactoryProcess | RayFactory | None" = None, hosts: OneHost | None = None):
        self.bank = bank
        self.hosts = hosts or OneHost()
        self.path = pathlib.Path(run_dir) / VERSIONS_FILE
        self.setting = check_bank_version(setting)
        self.benchmark = benchmark
        self.stages = benchmark.stages
        self._steering_warned = False
        self.factory = factory
        self._view: BankView | None = None
        self.last_round_start_s = 0.0
        self.factory_lines: list[str] = []

    def _recorded(self) -> dict[str, int]:
        try:
            return {str(k): int(v) for k, v in json.loads(self.path.read_text("utf-8")).items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, AttributeError) as e:
            raise ConfigValueError(f"{self.path}: unreadable record of the run's bank versions ({e}); it is written "
                                   "by the run itself: restore it or start a new run directory") from None

    def version_for(self, round_index: int) -> int:
        """The version round `round_index` reads (0: the one SFT and the KL probe read).

        It is the one recorded for it, else resolved now ('latest' or the pinned one) and recorded before any rollout.

        Raises:
          ConfigValueError: the pinned version is not published in this bank, or the bank is empty.
        """
        # process 0 resolves and records it; with several processes every one gets its answer
        return self.hosts.on_primary(lambda: self._resolve(round_index), f"bank version of round {round_index}")

    def _resolve(self, round_index: int) -> int:
        recorded = self._recorded()
        if str(round_index) in recorded:
            return recorded[str(round_index)]
        published = self.bank.versions()
        if self.setting == "latest":
            if not published:
                raise ConfigValueError(f"Stage Bank {self.bank.root} has no admitted version")
            version = published[-1]
        elif self.setting in published:
            version = self.setting
        else:
            raise ConfigValueError(f"experiment.BiCuRLConfig.bank_version = {self.setting}: Stage Bank "
                                   f"{self.bank.root} has versions {published}")
        recorded[str(round_index)] = version
        atomic_write(self.path, json.dumps(recorded, sort_keys=True).encode())
        return version

    def view(self, version: int) -> BankView:
        """Bank version `version` (segments after the newest view read so far are the only ones read)."""
        if self._view is not None and self._view.version == version:
            return self._view
        base = self._view if self._view is not None and self._view.version < version else None
        view = self.bank.read(version, base=base)
        if self._view is None or view.version >= self._view.version:
            self._view = view
        return view

    def check_foci(self, view: BankView, start: int) -> None:
        """RL rows of `view` from index `start` on must have foci of the run's benchmark.

        Raises:
          BenchmarkError: naming the bank, version, row, state id and field.
        """
        for i, row in enumerate(view.rl_rows[start:], start):
            self.benchmark.check_focus(row.focus, f"Stage Bank {self.bank.root} v{view.version} RL row {i} "
                                                  f"({row.state_id}) field 'focus'")

    def round_start(self, round_index: int, base: BankView) -> BankView:
        """The bank view round `round_index` reads.

        A version other than `base` (the cold start's) gets its new rows' foci checked and one log line (version, new
        rows, how long resolving and reading took)."""
        t0 = time.perf_counter()
        view = self.view(self.version_for(round_index))
        self.last_round_start_s = time.perf_counter() - t0
        if view.version != base.version:
            self.check_foci(view, len(base.rl_rows) if view.version > base.version else 0)
            print(f"[bat_jax] round {round_index} reads Stage Bank v{view.version} ({len(view.rl_rows)} RL rows, "
                  f"{self.new_rows(round_index, view)} new since round {round_index - 1}; resolved in "
                  f"{1000 * self.last_round_start_s:.0f} ms)", flush=True)
        return view

    def new_rows(self, round_index: int, view: BankView) -> int:
        """RL rows in `view` that the version of the round before (round 0: the cold start's) did not have."""
        return len(view.rl_rows) - self.bank.rl_count(self.version_for(round_index - 1))

    def factory_line(self) -> str:
        """'' or, once, the line saying the factory process ended on its own (printed and kept for report.md)."""
        if self.factory is None:
            return ""
        line = self.factory.exit_line()
        if line:
            print(f"[bat_jax] {line}", flush=True)
            self.factory_lines.append(line)
        return line

    def publish_steering(self, records: Sequence[RoundRecord], view: BankView) -> dict[str, Any] | None:
        """Writes the steering record after the last of `records` and returns it (None when it cannot).

        The record holds aggregates only; `view` holds every state id the records name, versions being append-only. None
        means the bank directory cannot be written (said once: a factory on this bank then builds unsteered)."""
        try:
            return self._publish(records, view)
        except (OSError, KeyError) as e:  # unwritable directory; a recorded state id the view lacks
            if not self._steering_warned:
                print(f"[bat_jax] steering record not written ({e}); a Data Factory on this bank builds unsteered",
                      flush=True)
                self._steering_warned = True
            return None

    def _publish(self, records: Sequence[RoundRecord], view: BankView) -> dict[str, Any]:
        last = records[-1]
        by_pool: Counter = Counter()
        by_focus: Counter = Counter()
        for rec in records:
            by_pool.update(rec.pool_counts)
            by_focus.update(view.row(sid).focus for sid in rec.state_ids)
        scores: Mapping[str, Any] = last.controller_scores
        return steering.publish(self.bank.root, {
            "round": last.round, "bank_version": last.bank_version, "target_stage": last.selected_stage,
            "overall": scores.get("overall"), "stage_scores": dict(scores.get("stage_scores") or {}),
            "rows_by_pool": dict(by_pool), "rows_by_focus": dict(by_focus)}, self.stages)

    def close(self) -> None:
        """Stops the factory process (if any)."""
        if self.factory is not None:
            self.factory.stop()


class _FactoryActor:
    """The body of the Ray actor: `serve` on one thread, `stop` from another (the actor runs two at once)."""

    def __init__(self, config: FactoryConfig, benchmark: StagedBenchmark, loop: FactoryLoopConfig, build: Build):
        import threading

        self._args = (config, benchmark, loop, build)
        self._stop = threading.Event()

    def serve(self) -> list[int]:
        config, benchmark, loop, build = self._args
        return [r.version for r in serve(config, benchmark, loop, stop=self._stop, build=build) if r.version]

    def stop(self) -> None:
        self._stop.set()

    def pid(self) -> int:
        import os

        return os.getpid()


class RayFactory:
    """The long-running factory as a Ray actor, with the same methods as `FactoryProcess`.

    It reserves 0 CPUs: its work is sandbox subprocesses. The methods are `start` / `alive` / `exit_line` / `stop`. Ray
    must be initialised (the run's rollout workers did it)."""

    def __init__(self, config: FactoryConfig, benchmark: StagedBenchmark, loop: FactoryLoopConfig,
                 build: Build = build_bank):
        self.loop = loop
        self._args = (config, benchmark, loop, build)
        self._actor = self._serving = self.pid = None
        self._stopping = self._reported = False

    def start(self) -> "RayFactory":
        import ray

        self._actor = ray.remote(num_cpus=0, max_concurrency=2)(_FactoryActor).remote(*self._args)
        self._serving = self._actor.serve.remote()
        self.pid = ray.get(self._actor.pid.remote())
        print(f"[bat_jax] Data Factory started beside training (Ray actor, pid {self.pid})", flush=True)
        return self

    def alive(self) -> bool:
        import ray

        return self._serving is not None and not ray.wait([self._serving], timeout=0)[0]

    def exit_line(self) -> str:
        """'' while the actor serves (or after `stop`); once it has ended on its own, one line saying how."""
        import ray

        if self._stopping or self._reported or self.alive():
            return ""
        self._reported = True
        try:
            ray.get(self._serving)
            how = "finished its versions"
        except Exception as e:  # noqa: BLE001 — whatever ended the actor is reported, never raised into the run
            cause = getattr(e, "cause", None) or e  # a RayTaskError carries the actor's own exception
            how = f"crashed ({type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[-1]})"
        return (f"Data Factory (Ray actor, pid {self.pid}) {how}; training continues on the last admitted Stage "
                f"Bank version")

    def stop(self) -> None:
        """Asks the actor to stop after its version in progress, waits `loop.stop_timeout_s`, then kills it."""
        import ray

        self._stopping = True
        if self._actor is None:
            return
        if self.alive():
            self._actor.stop.remote()
            ray.wait([self._serving], timeout=self.loop.stop_timeout_s)
        ray.kill(self._actor)
        self._actor = None
