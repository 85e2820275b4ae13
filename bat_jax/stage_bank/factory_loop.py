"""The Data Factory as a long-running job beside training.

It reads the latest steering record, builds the next version's sources, admits a version atomically and repeats
(paper: "the asynchronous Stage Bank data pipeline").

Details: docs/design.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import os
import pickle
import pathlib
import signal
import threading
import time
from collections.abc import Callable

from bat_jax.atomic_io import atomic_write
from bat_jax.errors import ConfigValueError
from bat_jax.stage_bank import steering
from bat_jax.stage_bank.bank import BankLocked, StageBank
from bat_jax.stage_bank.factory import BuildReport, FactoryConfig, build_bank
from bat_jax.staged_benchmark.contract import StagedBenchmark

#: build(config, benchmark, progress=..., grid=..., hold_lock=...) -> BuildReport: `factory.build_bank` or a stand-in.
Build = Callable[..., BuildReport]


@dataclasses.dataclass(frozen=True)
class FactoryLoopConfig:
    """Settings of the long-running factory.

    Attributes:
      rule: how the steering record shapes each version (`steering.SteeringRule`: sources per version, weak share).
      max_versions: stop after admitting this many versions (0: until stopped).
      idle_s: seconds to wait after an iteration that admitted nothing, and between tries for a writer lock held by
        a live process.
      pause_s: seconds to wait after every admitted version (0: build the next at once); bounds how fast a fast
        teacher grows the bank over a long run.
      stop_timeout_s: seconds `FactoryProcess.stop` waits after SIGTERM (the version in progress is abandoned:
        nothing partial is ever admitted) before SIGKILL.
    """

    rule: steering.SteeringRule = steering.SteeringRule()
    max_versions: int = 0
    idle_s: float = 10.0
    pause_s: float = 0.0
    stop_timeout_s: float = 30.0

    def __post_init__(self):
        if self.max_versions < 0 or self.idle_s < 0 or self.pause_s < 0 or self.stop_timeout_s <= 0:
            raise ValueError(f"FactoryLoopConfig needs max_versions >= 0, idle_s >= 0, pause_s >= 0 and "
                             f"stop_timeout_s > 0, got {self.max_versions}, {self.idle_s}, {self.pause_s}, "
                             f"{self.stop_timeout_s}")


def serve(config: FactoryConfig, benchmark: StagedBenchmark, loop: FactoryLoopConfig = FactoryLoopConfig(), *,
          stop: threading.Event | None = None, build: Build = build_bank,
          parent_pid: int | None = None) -> list[BuildReport]:
    """Admits steered bank versions until told to stop; returns the build reports.

    It stops when `stop` is set, `loop.max_versions` are admitted or the parent process `parent_pid` is gone.

    Raises:
      ValueError / BenchmarkError / LeakageError / BackendUnavailable: as `factory.build_bank` (the loop stops).
    """
    stop = stop or threading.Event()
    benchmark.validate()
    config.validate(benchmark)
    bank = StageBank(config.bank_dir)
    reports: list[BuildReport] = []
    with contextlib.ExitStack() as held:
        if not _take_lock(bank, held, stop, loop.idle_s):
            return reports
        generation = bank.latest()
        while not stop.is_set() and (not loop.max_versions or sum(1 for r in reports if r.version) < loop.max_versions):
            if parent_pid is not None and os.getppid() != parent_pid:
                print("[bat_jax] Data Factory: the run that started it is gone; stopping", flush=True)
                break
            record = steering.read(config.bank_dir, benchmark.stages)
            grid = steering.steered_sources(config, benchmark, record, generation, loop.rule)
            t0 = time.perf_counter()
            report = build(config, benchmark, progress=False, grid=grid, hold_lock=False)
            reports.append(report)
            focus = ", ".join(f"{k} {v}" for k, v in sorted(report.rl_by_focus.items()))
            steer = (f"steered to {record['target_stage']} by round {record.get('round', '?')}"
                     if record and "target_stage" in record else "no steering record: uniform")
            print(f"[bat_jax] Data Factory: generation {generation}: "
                  + (f"v{report.version} admitted ({report.admitted_rl} RL, {report.admitted_sft} SFT rows; {focus})"
                     if report.version else f"nothing new ({report.sources_accepted}/{report.sources_total} "
                                            f"sources accepted)")
                  + f"; {steer}; {time.perf_counter() - t0:.0f} s", flush=True)
            _write_status(config.bank_dir, generation, report, record)
            generation += 1
            stop.wait(loop.pause_s if report.version else loop.idle_s)
    return reports


def _take_lock(bank: StageBank, held: contextlib.ExitStack, stop: threading.Event, idle_s: float) -> bool:
    """Enters the bank's writer lock into `held`; False when `stop` was set first.

    It waits (one log line) while a live process holds the lock."""
    waited = False
    while not stop.is_set():
        try:
            held.enter_context(bank.writer(f"data factory (pid {os.getpid()})"))
            return True
        except BankLocked as e:
            if not waited:
                print(f"[bat_jax] Data Factory waiting for the writer lock: {e}", flush=True)
                waited = True
            stop.wait(idle_s or 1.0)
    return False


def _write_status(bank_dir: str, generation: int, report: BuildReport, record: dict | None) -> None:
    """`<bank_dir>/work/factory_status.json`: the factory's last iteration, for whoever watches a long job."""
    status = {"pid": os.getpid(), "generation": generation, "version": report.version, "time_unix": time.time(),
              "admitted_rl": report.admitted_rl, "admitted_sft": report.admitted_sft,
              "rl_by_focus": report.rl_by_focus, "steered_by_round": (record or {}).get("round"),
              "target_stage": (record or {}).get("target_stage")}
    atomic_write(pathlib.Path(bank_dir) / "work" / "factory_status.json", json.dumps(status, sort_keys=True).encode())


def serve_job(run_dir: pathlib.Path, config: FactoryConfig, benchmark: StagedBenchmark,
              loop: FactoryLoopConfig = FactoryLoopConfig()) -> dict:
    """The long-running factory as a launch job (`gin/stage_bank_async_tiny.gin`).

    It runs `serve` until Ctrl-C / SIGTERM or `loop.max_versions`; the versions admitted are written to
    run_dir/factory_report.json."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        reports = serve(config, benchmark, loop, stop=stop)
    except KeyboardInterrupt:
        reports = []
    finally:
        signal.signal(signal.SIGTERM, previous)
    out = {"versions": [r.version for r in reports if r.version], "builds": [r.to_dict() for r in reports]}
    atomic_write(pathlib.Path(run_dir) / "factory_report.json", json.dumps(out, indent=2, default=str).encode())
    return out


def _child(config: FactoryConfig, benchmark: StagedBenchmark, loop: FactoryLoopConfig, build: Build,
           parent_pid: int) -> None:
    """The factory process's body: `serve` until SIGTERM (the version in progress is abandoned, the lock released)."""
    def _terminate(*_):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C on the run: the run stops the factory itself
    serve(config, benchmark, loop, build=build, parent_pid=parent_pid)


class FactoryProcess:
    """The long-running factory in its own (spawned) process, started and stopped by a run.

    `exit_line()` says once, after the process ended on its own, how it ended (a crash: the exit code); the run
    then goes on training on the last admitted version.
    """

    def __init__(self, config: FactoryConfig, benchmark: StagedBenchmark, loop: FactoryLoopConfig,
                 build: Build = build_bank):
        self.loop = loop
        ctx = multiprocessing.get_context("spawn")  # no JAX state, threads or locks of the run are inherited
        self._process = ctx.Process(target=_child, args=(config, benchmark, loop, build, os.getpid()),
                                    name="bat_jax-data-factory", daemon=True)
        self._stopping = False
        self._reported = False

    def start(self) -> "FactoryProcess":
        """Starts the process. Raises ConfigValueError when the benchmark or config cannot be sent to it."""
        try:
            self._process.start()
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise ConfigValueError(f"experiment.Components.factory_loop: the Data Factory process needs the benchmark "
                                   f"and factory config as picklable objects ({type(e).__name__}: {e})") from None
        print(f"[bat_jax] Data Factory started beside training (pid {self._process.pid})", flush=True)
        return self

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def alive(self) -> bool:
        return self._process.is_alive()

    def exit_line(self) -> str:
        """'' while the factory runs (or after `stop`); once it has ended on its own, one line saying so.

        The line is returned a single time."""
        if self._stopping or self._reported or self._process.is_alive():
            return ""
        self._reported = True
        code = self._process.exitcode
        how = "finished its versions" if code == 0 else f"crashed (exit code {code})"
        return (f"Data Factory (pid {self._process.pid}) {how}; training continues on the last admitted Stage "
                f"Bank version")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after `loop.stop_timeout_s`; idempotent."""
        self._stopping = True
        if self._process.pid is None or not self._process.is_alive():
            return
        self._process.terminate()
        self._process.join(self.loop.stop_timeout_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
