"""The Stage Bank Data Factory: fictional tasks in, one new bank version out (paper Appendix A.1).

Fictional tasks → checked teacher trajectories → SFT slices, stage-boundary states and E2E surrogates → Accept() →
leakage preflight → one new bank version.

Details: docs/design.md.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import inspect
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from bat_jax.atomic_io import atomic_write
from bat_jax.benchmark.stages import E2E
from bat_jax.clients.chat_endpoint import ChatEndpointConfig
from bat_jax.errors import ConfigValueError
from bat_jax.rollout.action_loop import STAGE_TAG_REJECTION, run_action_episode
from bat_jax.sandbox.backends import SandboxFactory, backend_factory, environment_versions
from bat_jax.sandbox.types import Sandbox, SandboxState, fault_of
from bat_jax.stage_bank import e2e_surrogate as e2e
from bat_jax.stage_bank import slicing
from bat_jax.stage_bank.bank import StageBank
from bat_jax.stage_bank.leakage import HeldOutManifest, LeakageReport, LeakageScanner, preflight
from bat_jax.stage_bank.row import Provenance, RLRow, SFTRow, StateRef, content_digest
from bat_jax.stage_bank.row_parse import rl_row_from_dict, sft_row_from_dict
from bat_jax.staged_benchmark.contract import BenchmarkError, Reduction, StagedBenchmark
from bat_jax.staged_benchmark.episode import RecordedEpisode, collect_evidence
from bat_jax.verify.rubric import Evidence, verify_episode

FACTORY_VERSION = "bat_stage_bank_factory/v1"
#: Rejection reasons that depend on infrastructure, never cached (retried by the next build).
_TRANSIENT = ("teacher_", "sandbox_failure", "boot_failed")


@dataclasses.dataclass(frozen=True)
class FactoryConfig:
    """Settings of one factory build (gin binds these at the launch edge).

    Attributes:
      bank_dir: Stage Bank root (created if absent); the work cache lives in `<bank_dir>/work`.
      seed: base seed; task seeds are derived from (seed, focus, track, outcome).
      tracks: task families of the benchmark (None: all of them, in its order).
      foci: row foci, 'E2E' and stage ids of the benchmark (None: 'E2E' and every stage).
      outcomes: teacher-trajectory outcome buckets, variants of the benchmark (None: all of them).
      e2e_cases, e2e_input_fraction, e2e_validation_passes: the E2E reduction λ (Eq. 12).
      horizon: rollout limit H in assistant turns (24, the released code's); also the teacher's turn cap.
      backend: sandbox backend, 'local' (non-isolated, tests/dev) or 'docker'.
      teacher: one of the benchmark's teachers (`StagedBenchmark.teachers`; the imaging suite's: 'scripted', the
        scripted expert; 'portable', the scripted expert whose action texts are the same for every task, the tiny
        default's; 'openai', an LLM over an OpenAI-compatible endpoint).
      teacher_endpoint: the chat endpoint of an LLM teacher (`clients.chat_endpoint.ChatEndpointConfig`, gin:
        `teacher/chat_endpoint.ChatEndpointConfig`); its key is read from the environment variable it names,
        never stored.
      heldout_manifest: held-out manifest JSON for Leak(z) and the preflight; '' = the benchmark's default held-out
        suite generated in memory.
      workers: sources processed in parallel (threads; the work is sandbox subprocesses).
      note: free text kept in the bank version's manifest.
    """

    bank_dir: str = "stage_bank"
    seed: int = 0
    tracks: tuple[str, ...] | None = None
    foci: tuple[str, ...] | None = None
    outcomes: tuple[str, ...] | None = None
    e2e_cases: int = 2
    e2e_input_fraction: float = 1.0
    e2e_validation_passes: int = 1
    horizon: int = 24
    backend: str = "local"
    teacher: str = "scripted"
    teacher_endpoint: ChatEndpointConfig | None = None
    heldout_manifest: str = ""
    workers: int = 2
    note: str = ""

    @property
    def reduction(self) -> Reduction:
        return Reduction(self.e2e_cases, self.e2e_input_fraction, self.e2e_validation_passes)

    def grid(self, benchmark: StagedBenchmark) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """(foci, tracks, outcomes) of the source grid: the bound ones, or all of the benchmark's."""
        return (self.foci or benchmark.stages.foci, self.tracks or tuple(benchmark.tracks),
                self.outcomes or tuple(benchmark.variants))

    def validate(self, benchmark: StagedBenchmark) -> None:
        """Raises ValueError naming the bad field (and the benchmark, for grid values it does not have)."""
        foci, tracks, outcomes = self.grid(benchmark)
        for name, values, allowed in (("tracks", tracks, tuple(benchmark.tracks)),
                                      ("foci", foci, benchmark.stages.foci),
                                      ("outcomes", outcomes, tuple(benchmark.variants))):
            bad = [v for v in values if v not in allowed]
            if not values or bad or len(set(values)) != len(values):
                raise ConfigValueError(f"factory.FactoryConfig.{name} must be distinct values of benchmark "
                                       f"{benchmark.name!r} {allowed}, got {values!r}")
        if self.backend not in ("local", "docker"):
            raise ValueError(f"FactoryConfig.backend must be 'local' or 'docker', got {self.backend!r}")
        if self.teacher not in benchmark.teachers:
            raise ConfigValueError(f"factory.FactoryConfig.teacher must be one of benchmark {benchmark.name!r}'s "
                                   f"teachers {benchmark.teachers}, got {self.teacher!r}")
        try:  # a teacher the benchmark cannot build with these settings (e.g. an LLM teacher without an endpoint)
            benchmark.teacher(self.teacher, self.teacher_endpoint)
        except ValueError as e:
            raise ConfigValueError(f"factory.FactoryConfig.teacher {self.teacher!r} (teacher_endpoint "
                                   f"{'unset' if self.teacher_endpoint is None else 'set'}): {e}") from None
        if self.horizon < 1 or self.workers < 1:
            raise ValueError(f"FactoryConfig.horizon and workers must be >= 1, got {self.horizon}, {self.workers}")
        self.reduction.validate()


@dataclasses.dataclass(frozen=True)
class Source:
    """One grid cell: focus, track, outcome, the derived task seed and brief template (0 / 1, or 10 / 11)."""

    index: int
    focus: str
    track: str
    outcome: str
    task_seed: int
    template: int


def sources(config: FactoryConfig, benchmark: StagedBenchmark) -> list[Source]:
    """The source grid in order foci × tracks × outcomes.

    Seeds are < `benchmark.training_seeds` (the training range), templates from `benchmark.source_template`."""
    out = []
    foci, tracks, outcomes = config.grid(benchmark)
    for focus in foci:
        for track in tracks:
            for outcome in outcomes:
                h = content_digest([config.seed, focus, track, outcome])
                out.append(Source(len(out), focus, track, outcome, int(h[:12], 16) % benchmark.training_seeds,
                                  benchmark.source_template(h)))
    return out


@dataclasses.dataclass
class BuildReport:
    """What a build did (also written as JSON to `<bank_dir>/work/build_report.json`).

    Attributes:
      version: the bank version written, or None when nothing new was admitted.
      digest: SHA-256 over the sorted digests of all accepted RL and SFT rows (same seed ⇒ same digest).
      sources_total / sources_accepted: grid cells and those that produced rows.
      rejected: rejection reason → number of sources.
      rl_rows / sft_rows: accepted rows (including ones already admitted by an earlier build).
      rl_by_focus / sft_by_focus: accepted rows per focus.
      admitted_rl / admitted_sft: rows written in this build's new version.
      cached_sources: sources read from the work cache instead of being recomputed.
      leakage_hits, leakage_rows_scanned: the final preflight (hits are always 0 in a written version).
      elapsed_s: wall-clock seconds.
      sandbox: Python and numpy versions of its sandboxes (`backends.environment_versions`; {}: factory injected).
    """

    bank_dir: str
    version: int | None = None
    digest: str = ""
    sources_total: int = 0
    sources_accepted: int = 0
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)
    rl_rows: int = 0
    sft_rows: int = 0
    rl_by_focus: dict[str, int] = dataclasses.field(default_factory=dict)
    sft_by_focus: dict[str, int] = dataclasses.field(default_factory=dict)
    admitted_rl: int = 0
    admitted_sft: int = 0
    cached_sources: int = 0
    leakage_hits: int = 0
    leakage_rows_scanned: int = 0
    elapsed_s: float = 0.0
    sandbox: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class _Rejected(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass
class _Context:
    config: FactoryConfig
    benchmark: StagedBenchmark
    bank: StageBank
    make_sandbox: SandboxFactory
    scanner: LeakageScanner

    def policy(self):
        return self.benchmark.teacher(self.config.teacher, self.config.teacher_endpoint)


def _play(ctx: _Context, state: SandboxState, brief: str, task_id: str, focus: str
          ) -> tuple[RecordedEpisode, Evidence]:
    """Runs the teacher in a fresh sandbox.

    Raises _Rejected (boot, teacher, sandbox failures, too long) and BenchmarkError when the teacher tags an action with
    a stage the benchmark does not have."""
    try:
        box = ctx.make_sandbox(state)
    except Exception as exc:  # noqa: BLE001 — a sandbox that does not start is Boot(p) = 0
        raise _Rejected("boot_failed") from exc
    benchmark = ctx.benchmark
    try:
        ep = run_action_episode(ctx.policy(), box, brief, task_id, benchmark.stages, benchmark.row_skill(focus),
                                focus, ctx.config.horizon + 1)
        if _died(box, ep):
            raise _Rejected("sandbox_failure")
        evidence = collect_evidence(box, start=state)  # the start state: checks credit its unchanged files
    except _Rejected:
        raise
    except Exception as exc:  # noqa: BLE001 — the sandbox died mid-trajectory
        raise _Rejected("sandbox_failure") from exc
    finally:
        box.close()
    if ep.rejected.startswith(STAGE_TAG_REJECTION):
        raise BenchmarkError(f"benchmark {benchmark.name!r}, teacher {ctx.config.teacher!r} on task {task_id}: "
                             f"{ep.rejected}")
    if ep.rejected:
        m = re.match(r"teacher (\w+)", ep.rejected)
        raise _Rejected(f"teacher_{m.group(1) if m else 'error'}")
    if len(ep.turns) > ctx.config.horizon:
        raise _Rejected("too_long")
    return ep, evidence


def _died(box: Sandbox, ep: RecordedEpisode) -> bool:
    """True when the sandbox failed or a call raised during the teacher's episode.

    A sandbox failure counts whoever's it was (`fault_of`: it died, hung, stopped answering or was called after it was
    closed), and so does a raised call (the episode loop ends such an episode with 'sandbox_error'): the teacher's
    trajectory is then no evidence of the task."""
    return ep.end_reason == "sandbox_error" or bool(fault_of(box)[0])


def _process(ctx: _Context, src: Source) -> dict:
    """All rows of one source as stored records, or {'reason': ...}. Raises nothing but programming errors."""
    cfg, benchmark = ctx.config, ctx.benchmark
    stages = benchmark.stages
    inst = benchmark.training_task(src.track, src.task_seed, src.outcome, src.template)
    rubric = benchmark.rubric(inst)
    base = Provenance(inst.task_id, inst.state().digest(), src.track, src.outcome, (
        slicing.transformation("task_synthesis", seed=src.task_seed, variant=src.outcome, template=src.template,
                               factory=FACTORY_VERSION),))
    try:
        ep, evidence = _play(ctx, inst.state(), inst.brief, inst.task_id, E2E)
        failed = slicing.failed_checks(verify_episode(rubric, evidence), stages.ids)
        if failed:
            raise _Rejected(f"check_failed:{failed[0]}")
        traj = content_digest(ep.to_dict())
        step = slicing.transformation("teacher_trajectory", trajectory=traj, teacher=cfg.teacher)
        prov = dataclasses.replace(base, transformations=base.transformations + (step,))
        sft = slicing.sft_slices(ep, inst.brief, benchmark.row_skill(E2E), stages, prov, traj)
        if src.focus == E2E:
            if benchmark.has_e2e_surrogate:
                reduced, params = benchmark.reduce_task(inst, cfg.reduction, src.template)
                reduce_step = slicing.transformation("e2e_reduce", **params)
            else:  # the whole task is its own end-to-end row
                reduced, reduce_step = inst, slicing.transformation(slicing.E2E_WHOLE_TASK)
            start = reduced.state()
            ep2, ev2 = _play(ctx, start, reduced.brief, reduced.task_id, E2E)
            failed = slicing.failed_checks(verify_episode(benchmark.rubric(reduced), ev2), stages.ids)
            play_inst, focus_stages = reduced, stages.ids
        else:
            stage = stages.parse(src.focus)
            try:  # Eq. 11
                start = slicing.boundary_state(ctx.make_sandbox, inst.state(), ep, stage, stages)
            except slicing.ReplayMismatch as exc:
                raise _Rejected("replay_mismatch") from exc
            except Exception as exc:  # noqa: BLE001 — the replay sandbox failed to start or died
                raise _Rejected("sandbox_failure") from exc
            reduce_step = slicing.transformation(
                "prefix_replay", trajectory=traj, stage=stage,
                turns=next((t.index for t in ep.turns if stages.index(t.stage) >= stages.index(stage)),
                           len(ep.turns)))
            ep2, ev2 = _play(ctx, start, inst.brief, inst.task_id, stage)
            failed = slicing.failed_checks(verify_episode(rubric, ev2, (stage,)), (stage,))
            play_inst, focus_stages = inst, (stage,)
        traj2 = content_digest(ep2.to_dict())
        prov2 = dataclasses.replace(prov, transformations=prov.transformations + (reduce_step,))
        sft += slicing.sft_slices(ep2, play_inst.brief, benchmark.row_skill(src.focus), stages, prov2, traj2)
        c, g = slicing.stage_contract(benchmark.rubric(play_inst), focus_stages)
        check = slicing.transformation("teacher_check", trajectory=traj2, turns=len(ep2.turns))
        ref = StateRef(start.digest(), f"states/{start.digest()}.tar")  # stored only once accepted
        row = RLRow(ref, src.focus, benchmark.row_prompt(play_inst, src.focus), c, g, benchmark.row_skill(src.focus),
                    dataclasses.replace(prov2, transformations=prov2.transformations + (check,)), "rubric")
        leak = LeakageReport()
        for i, r in enumerate([row] + sft):
            ctx.scanner.scan_value(r.to_dict(), file=inst.task_id, row=i, field="", report=leak)
        ctx.scanner.scan_state(start, file=inst.task_id, row=0, field="state", report=leak)
        reason = e2e.accept(booted=True, turns=len(ep2.turns), horizon=cfg.horizon, failed_stages=failed,
                            passes=benchmark.validation_passes(ev2, play_inst) if src.focus == E2E else 0,
                            lam=cfg.reduction, leak_hits=len(leak.hits))
        if reason:
            raise _Rejected(reason)
        ctx.bank.put_state(start)
    except _Rejected as rej:
        return {"reason": rej.reason}
    return {"reason": "", "rl": [row.to_record()], "sft": [r.to_record() for r in sft]}


def code_fingerprint(benchmark: StagedBenchmark) -> str:
    """SHA-256 over the source files that shape rows.

    They are the benchmark's package, the plug-in interface, verifier, sandbox and stage bank. A cached source is reused
    only while this code is unchanged."""
    pkg = Path(__file__).resolve().parents[1]
    dirs = [pkg / d for d in ("staged_benchmark", "verify", "sandbox", "stage_bank")]
    dirs.append(Path(inspect.getfile(type(benchmark))).resolve().parent)
    files = sorted({p for d in dirs for p in d.glob("*.py")})
    return content_digest([[p.name if not p.is_relative_to(pkg) else p.relative_to(pkg).as_posix(),
                            content_digest(p.read_text("utf-8"))] for p in files])


def _cache_key(cfg: FactoryConfig, benchmark: StagedBenchmark, src: Source, salt: str) -> str:
    fields = {k: v for k, v in dataclasses.asdict(cfg).items()
              if k not in ("bank_dir", "tracks", "foci", "outcomes", "workers", "note", "heldout_manifest")}
    if fields["teacher_endpoint"] is not None:  # where the key is read from does not change the rows
        fields["teacher_endpoint"] = {k: v for k, v in fields["teacher_endpoint"].items() if k != "api_key_env"}
    return content_digest({"factory": FACTORY_VERSION, "source": dataclasses.asdict(src), "config": fields,
                           "benchmark": [benchmark.name, repr(benchmark)], "salt": salt})


def recipe(config: FactoryConfig, benchmark: StagedBenchmark) -> str:
    """The part of a version's note that says which benchmark and teacher wrote its rows.

    E.g. 'benchmark=imaging teacher=portable/v2 layouts=varied' (`check_recipe` compares it; the rest is the benchmark's
    `recipe`)."""
    return f"benchmark={benchmark.name} {benchmark.recipe(config.teacher)}"


def check_recipe(bank: StageBank, config: FactoryConfig, benchmark: StagedBenchmark) -> None:
    """Refuses a bank whose first version was written for another benchmark, teacher or layout family.

    Rows of two recipes would otherwise be trained on together. Versions admitted with a custom `FactoryConfig.note`
    are not checked; a factory note that names no benchmark is refused (no benchmark is assumed).

    Raises:
      ValueError: naming the bank directory, what built it and what the run asks for.
    """
    versions = bank.versions()
    note = bank.note(versions[0]) if versions else ""
    if not note.startswith(FACTORY_VERSION):
        return
    wanted = recipe(config, benchmark)
    if not all(f" {word} " in f" {note} " for word in wanted.split()):
        found = (" ".join(w for w in note.split()[1:] if "=" in w and not w.startswith(("seed=", "digest=")))
                 if "benchmark=" in note else "no benchmark named (an older factory)")
        raise ValueError(f"Stage Bank {config.bank_dir} was built with {found}; this run asks for {wanted}: "
                         f"set FactoryConfig.bank_dir to a new directory or remove {config.bank_dir}")


def _load_cached(path: Path, bank: StageBank) -> dict | None:
    try:
        result = json.loads(path.read_text("utf-8"))
        rl = [rl_row_from_dict(d, file=str(path), row=i) for i, d in enumerate(result.get("rl", ()))]
        sft = [sft_row_from_dict(d, file=str(path), row=i) for i, d in enumerate(result.get("sft", ()))]
    except (OSError, ValueError):
        return None  # unreadable or invalid cache entry: recompute the source
    if any(not bank.state_path(r.state).is_file() for r in rl):
        return None
    return {"reason": result["reason"], "rl": rl, "sft": sft}


def load_manifest(config: FactoryConfig, benchmark: StagedBenchmark) -> HeldOutManifest:
    """The held-out manifest used for Leak(z).

    `config.heldout_manifest`, else the benchmark's default held-out suite's (two tasks per track and held-out variant,
    suite seed 0)."""
    if config.heldout_manifest:
        return HeldOutManifest.load(config.heldout_manifest)
    suite = benchmark.heldout_suite(2, benchmark.eval_variants(), 0)
    return HeldOutManifest.from_task_manifest(benchmark.manifest(suite))


def build_bank(config: FactoryConfig, benchmark: StagedBenchmark, progress: bool = True, *,
               make_sandbox: SandboxFactory | None = None, on_source: Callable[[Source, str], None] | None = None,
               grid: Sequence[Source] | None = None, hold_lock: bool = True) -> BuildReport:
    """Builds (or resumes) the bank described by `config` for `benchmark` and admits one new version.

    The build holds the bank's writer lock (`StageBank.writer`) from start to admission, so a second writer on the
    same bank is refused at once, naming the holder.

    Args:
      config: the factory settings.
      benchmark: the staged benchmark whose tasks, teacher and contracts make the rows.
      progress: show a tqdm progress bar over sources.
      make_sandbox: sandbox factory override (tests inject failing sandboxes); default from `config.backend`.
      on_source: called in the main thread after each source finishes with (source, reason or '').
      grid: the sources to build (default: `sources(config, benchmark)`, the whole grid); the long-running
        factory passes each version's steered sources (`stage_bank/steering.py`).
      hold_lock: take the writer lock for the build; False when the caller already holds it (the factory loop).

    Returns:
      The BuildReport (also written to `<bank_dir>/work/build_report.json`).

    Raises:
      ValueError: a bad config field.
      BenchmarkError: the benchmark's definition is unusable, or its teacher tags a stage it does not have.
      bat_jax.sandbox.backends.BackendUnavailable: the Docker backend cannot be used.
      bat_jax.stage_bank.leakage.LeakageError: the final preflight found held-out markers (nothing is
        admitted).
      bat_jax.stage_bank.bank.BankLocked: another writer holds the bank.
    """
    benchmark.validate()
    config.validate(benchmark)
    bank = StageBank(config.bank_dir)
    lock = bank.writer(f"stage bank build seed={config.seed}") if hold_lock else contextlib.nullcontext()
    with lock:
        return _build(config, benchmark, bank, progress, make_sandbox, on_source, grid)


def _build(config: FactoryConfig, benchmark: StagedBenchmark, bank: StageBank, progress: bool,
           make_sandbox: SandboxFactory | None, on_source: Callable[[Source, str], None] | None,
           grid: Sequence[Source] | None) -> BuildReport:
    """`build_bank`'s work, under the writer lock."""
    from tqdm import tqdm

    t0 = time.time()
    manifest = load_manifest(config, benchmark)
    salt = content_digest([dataclasses.asdict(manifest), code_fingerprint(benchmark)])  # manifest + code → cache key
    ctx = _Context(config, benchmark, bank,
                   make_sandbox or backend_factory(config.backend, image=benchmark.sandbox_image()),
                   LeakageScanner(manifest))
    work = Path(config.bank_dir) / "work" / "sources"
    grid = list(sources(config, benchmark) if grid is None else grid)
    results: dict[int, dict] = {}
    report = BuildReport(str(config.bank_dir), sources_total=len(grid),
                         sandbox={} if make_sandbox else environment_versions(ctx.make_sandbox))
    todo = []
    for src in grid:
        cached = _load_cached(work / f"{_cache_key(config, benchmark, src, salt)}.json", bank)
        if cached is None:
            todo.append(src)
        else:
            results[src.index] = cached
            report.cached_sources += 1
    bar = tqdm(total=len(grid), initial=len(results), desc="stage bank sources", disable=not progress)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=config.workers)
    try:
        futures = {pool.submit(_process, ctx, src): src for src in todo}
        for fut in concurrent.futures.as_completed(futures):
            src, result = futures[fut], fut.result()
            if not result["reason"].startswith(_TRANSIENT):
                atomic_write(work / f"{_cache_key(config, benchmark, src, salt)}.json",
                             json.dumps(result, sort_keys=True).encode())
            results[src.index] = {"reason": result["reason"],
                                  "rl": [rl_row_from_dict(d) for d in result.get("rl", ())],
                                  "sft": [sft_row_from_dict(d) for d in result.get("sft", ())]}
            bar.update(1)
            if on_source is not None:
                on_source(src, result["reason"])
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
    rl: list[RLRow] = []
    sft: list[SFTRow] = []
    rejected: Counter = Counter()
    for i in sorted(results):
        if results[i]["reason"]:
            rejected[results[i]["reason"]] += 1
            continue
        report.sources_accepted += 1
        rl += results[i]["rl"]
        sft += results[i]["sft"]
    sft = list({r.digest: r for r in sft}.values())  # identical slices (same context and target) kept once
    report.rejected = dict(sorted(rejected.items()))
    report.rl_rows, report.sft_rows = len(rl), len(sft)
    report.rl_by_focus = dict(sorted(Counter(r.focus for r in rl).items()))
    report.sft_by_focus = dict(sorted(Counter(r.focus for r in sft).items()))
    report.digest = content_digest({"rl": sorted(r.digest for r in rl), "sft": sorted(r.digest for r in sft)})
    current = bank.read()
    have_rl, have_sft = {r.state_id for r in current.rl_rows}, {r.digest for r in current.sft_rows}
    new_rl = [r for r in rl if r.state_id not in have_rl]
    new_sft = [r for r in sft if r.digest not in have_sft]
    leak = preflight(manifest, rows=new_rl + new_sft, load_state=bank.load_state, source="factory")
    report.leakage_hits, report.leakage_rows_scanned = len(leak.hits), leak.rows_scanned
    if leak.hits:
        leak.raise_if_leaky()  # refuse: nothing is admitted
    if new_rl or new_sft:
        note = (config.note
                or f"{FACTORY_VERSION} seed={config.seed} {recipe(config, benchmark)} digest={report.digest}")
        report.version = bank.admit(new_rl, new_sft, note=note)
        report.admitted_rl, report.admitted_sft = len(new_rl), len(new_sft)
    report.elapsed_s = round(time.time() - t0, 3)
    atomic_write(Path(config.bank_dir) / "work" / "build_report.json",
                 json.dumps(report.to_dict(), sort_keys=True).encode())
    return report

