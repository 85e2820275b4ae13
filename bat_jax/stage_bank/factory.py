"""The Stage Bank Data Factory: fictional tasks → checked teacher trajectories → SFT slices, stage-boundary
states and E2E surrogates → Accept() → leakage preflight → one new bank version (paper Appendix A.1).

Source grid: every (focus, track, outcome) of `FactoryConfig.foci × tracks × outcomes` is one *source*: a fresh
fictional training task ξ (seed derived from the config seed and the cell). Per source:

  1. the teacher plays ξ end to end in a sandbox (trajectory τ, Eq. 8); every stage check must pass
     (Check_s = 1 ⇔ stage reward r = 1) and T ≤ H; each teacher response becomes one SFT row (Eq. 9, focus =
     the turn's stage);
  2. stage focus s: the prefix τ_{<b_s} is replayed in a fresh sandbox (Eq. 11; every replayed call must exit
     as recorded) and the reached workspace is the RL row's state p; the teacher then plays stage s alone from
     p (Boot(p) and Check_s on the stage rollout); its responses are SFT rows too (context: brief + the stage's
     skill only);
  3. focus E2E: ξ̃ = R_λ(ξ) (`e2e_surrogate.reduce_task`), the teacher plays ξ̃ (τ̃, Eq. 13), Accept() of
     Eq. 15 (+ the λ_validate budget) decides; the RL row starts at ξ̃'s initial state with the union contract
     (Eq. 14); τ̃'s responses are SFT rows with focus 'E2E';
  4. Leak(z) = 0 for every row and state of the source, scanned against the held-out manifest.

A source yields rows only when every step passes; otherwise it is rejected with one counted reason. With the
scripted teacher and all three outcomes a source gives ≈ 12.3 full-trajectory responses, plus ≈ 2.5 stage
responses (stage foci) or ≈ 12.3 surrogate responses (E2E): the default 126-source grid gives ≈ 2,070 SFT rows.

Resumable: each finished source is cached as JSON under `<bank_dir>/work/sources/<key>.json` (key = digest of
the source, the task seed, every setting that changes its rows, the held-out manifest and `code_fingerprint`);
an accepted source's state is stored in the bank's states/ directory at once (content-addressed, unreferenced
until admitted). Infrastructure rejections (teacher endpoint, sandbox failure) are not cached and are retried
on the next run. All accepted rows are admitted with one `StageBank.admit` (atomic: a killed build leaves no
partial version), after a final leakage preflight over exactly those rows and their states.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bat_jax.atomic_io import atomic_write
from bat_jax.clients.chat_endpoint import ChatEndpointConfig
from bat_jax.benchmark.stages import E2E, FOCI, STAGES, Stage
from bat_jax.rollout.action_loop import run_action_episode
from bat_jax.sandbox.backends import SandboxFactory, backend_factory
from bat_jax.sandbox.types import Sandbox, SandboxState, fault_of
from bat_jax.stage_bank import e2e_surrogate as e2e
from bat_jax.stage_bank import slicing
from bat_jax.stage_bank.bank import StageBank
from bat_jax.stage_bank.leakage import HeldOutManifest, LeakageReport, LeakageScanner, preflight
from bat_jax.stage_bank.row import OUTCOMES, Provenance, RLRow, SFTRow, StateRef, content_digest
from bat_jax.stage_bank.row_parse import rl_row_from_dict, sft_row_from_dict
from bat_jax.tasks import heldout
from bat_jax.tasks.brief import VARIED_TEMPLATE_BASE
from bat_jax.tasks.episode import RecordedEpisode, collect_evidence
from bat_jax.tasks.registry import TRACKS, get_track
from bat_jax.tasks.rubric_items import build_rubric
from bat_jax.tasks.portable_expert import VERSION as PORTABLE_VERSION, PortableExpert
from bat_jax.tasks.teacher import ChatTeacher, ScriptedExpert
from bat_jax.verify.rubric import Evidence, verify_episode

FACTORY_VERSION = "bat_stage_bank_factory/v1"
#: Rejection reasons that depend on infrastructure, never cached (retried by the next build).
_TRANSIENT = ("teacher_", "sandbox_failure", "boot_failed")
LAYOUTS = ("fixed", "varied")


@dataclasses.dataclass(frozen=True)
class FactoryConfig:
    """Settings of one factory build (gin binds these at the launch edge).

    Attributes:
      bank_dir: Stage Bank root (created if absent); the work cache lives in `<bank_dir>/work`.
      seed: base seed; task seeds are derived from (seed, focus, track, outcome).
      tracks: track names (registry order by default: 7 tracks).
      foci: row foci, subset of ('E2E', 'S1'..'S5').
      outcomes: teacher-trajectory outcome buckets, subset of ('success', 'recovery', 'failure').
      layouts: 'fixed' (every task in `tasks.layout.TRAIN_LAYOUT`, 'tr' ids) or 'varied' (paths and id prefix drawn
        from the task seed, `tasks.layout.varied_naming`): a policy must read them from the brief.
      cases_per_task: cases per generated task; 0 keeps each track's default (4 or 6).
      e2e_cases, e2e_input_fraction, e2e_validation_passes: the E2E reduction λ (Eq. 12).
      horizon: rollout limit H in assistant turns (REFERENCE.md: 24); also the teacher's turn cap.
      backend: sandbox backend, 'local' (non-isolated, tests/dev) or 'docker'.
      teacher: 'scripted' (the scripted expert: the brief's paths written into its code), 'portable' (the
        scripted expert whose action texts are the same for every task: its code reads the paths from task.md
        when it runs, `tasks.portable_expert`; the tiny default's teacher) or 'openai' (an LLM over an
        OpenAI-compatible endpoint, `tasks.teacher.ChatTeacher`).
      teacher_endpoint: the chat endpoint of the 'openai' teacher (`clients.chat_endpoint.ChatEndpointConfig`, gin:
        `teacher/chat_endpoint.ChatEndpointConfig`); its key is read from the environment variable it names,
        never stored.
      heldout_manifest: held-out manifest JSON for Leak(z) and the preflight; '' = the default held-out suite
        (`bat_jax.tasks.heldout.heldout_suite()`) generated in memory.
      workers: sources processed in parallel (threads; the work is sandbox subprocesses).
      note: free text kept in the bank version's manifest.
    """

    bank_dir: str = "stage_bank"
    seed: int = 0
    tracks: tuple[str, ...] = tuple(TRACKS)
    foci: tuple[str, ...] = FOCI
    outcomes: tuple[str, ...] = OUTCOMES
    layouts: str = "fixed"
    cases_per_task: int = 0
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
    def reduction(self) -> e2e.Reduction:
        return e2e.Reduction(self.e2e_cases, self.e2e_input_fraction, self.e2e_validation_passes)

    def validate(self) -> None:
        """Raises ValueError naming the bad field."""
        for name, allowed in (("tracks", tuple(TRACKS)), ("foci", FOCI), ("outcomes", OUTCOMES)):
            values = getattr(self, name)
            bad = [v for v in values if v not in allowed]
            if not values or bad or len(set(values)) != len(values):
                raise ValueError(f"FactoryConfig.{name} must be distinct values from {allowed}, got {values!r}")
        if self.layouts not in LAYOUTS:
            raise ValueError(f"FactoryConfig.layouts must be one of {LAYOUTS}, got {self.layouts!r}")
        if self.backend not in ("local", "docker"):
            raise ValueError(f"FactoryConfig.backend must be 'local' or 'docker', got {self.backend!r}")
        if self.teacher not in ("scripted", "portable", "openai"):
            raise ValueError(f"FactoryConfig.teacher must be 'scripted', 'portable' or 'openai', got {self.teacher!r}")
        if self.teacher == "openai" and self.teacher_endpoint is None:
            raise ValueError("FactoryConfig.teacher='openai' needs teacher_endpoint (a ChatEndpointConfig)")
        if self.cases_per_task < 0 or self.cases_per_task == 1:
            raise ValueError(f"FactoryConfig.cases_per_task must be 0 (track default) or >= 2, "
                             f"got {self.cases_per_task}")
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


def sources(config: FactoryConfig) -> list[Source]:
    """The source grid in order foci × tracks × outcomes; seeds are < HELDOUT_SEED_BASE (training range); template
    0 or 1, plus `VARIED_TEMPLATE_BASE` when `config.layouts == 'varied'`."""
    out = []
    offset = VARIED_TEMPLATE_BASE if config.layouts == "varied" else 0
    for focus in config.foci:
        for track in config.tracks:
            for outcome in config.outcomes:
                h = content_digest([config.seed, focus, track, outcome])
                out.append(Source(len(out), focus, track, outcome, int(h[:12], 16) % heldout.HELDOUT_SEED_BASE,
                                  int(h[12], 16) % 2 + offset))
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

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class _Rejected(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass
class _Context:
    config: FactoryConfig
    bank: StageBank
    make_sandbox: SandboxFactory
    scanner: LeakageScanner

    def policy(self):
        if self.config.teacher == "scripted":
            return ScriptedExpert()
        if self.config.teacher == "portable":
            return PortableExpert()
        return ChatTeacher(self.config.teacher_endpoint)


def _play(ctx: _Context, state: SandboxState, brief: str, task_id: str, focus: str
          ) -> tuple[RecordedEpisode, Evidence]:
    """Runs the teacher in a fresh sandbox. Raises _Rejected (boot, teacher, sandbox failures, too long)."""
    try:
        box = ctx.make_sandbox(state)
    except Exception as exc:  # noqa: BLE001 — a sandbox that does not start is Boot(p) = 0
        raise _Rejected("boot_failed") from exc
    try:
        ep = run_action_episode(ctx.policy(), box, brief, task_id, focus, ctx.config.horizon + 1)
        if _died(box, ep):
            raise _Rejected("sandbox_failure")
        evidence = collect_evidence(box)
    except _Rejected:
        raise
    except Exception as exc:  # noqa: BLE001 — the sandbox died mid-trajectory
        raise _Rejected("sandbox_failure") from exc
    finally:
        box.close()
    if ep.rejected:
        m = re.match(r"teacher (\w+)", ep.rejected)
        raise _Rejected(f"teacher_{m.group(1) if m else 'error'}")
    if len(ep.turns) > ctx.config.horizon:
        raise _Rejected("too_long")
    return ep, evidence


def _died(box: Sandbox, ep: RecordedEpisode) -> bool:
    """True when the sandbox failed during the teacher's episode, whoever's failure it was (`fault_of`: it died,
    hung, stopped answering or was called after it was closed), or a call raised (the episode loop ends such an
    episode with 'sandbox_error'): the teacher's trajectory is then no evidence of the task."""
    return ep.end_reason == "sandbox_error" or bool(fault_of(box)[0])


def _task(config: FactoryConfig, src: Source):
    """The source's track (a copy with `cases_per_task` cases when set) and its training task ξ."""
    track = get_track(src.track)
    if config.cases_per_task:
        track = type(track)()
        track.n_cases = config.cases_per_task
    return track, heldout.training_task(track, src.task_seed, src.outcome, src.template)


def _process(ctx: _Context, src: Source) -> dict:
    """All rows of one source as stored records, or {'reason': ...}. Raises nothing but programming errors."""
    cfg = ctx.config
    track, inst = _task(cfg, src)
    rubric = build_rubric(track, inst)
    base = Provenance(inst.task_id, inst.state().digest(), src.track, src.outcome, (
        slicing.transformation("task_synthesis", seed=inst.seed, variant=src.outcome, template=src.template,
                               factory=FACTORY_VERSION),))
    try:
        ep, evidence = _play(ctx, inst.state(), inst.brief, inst.task_id, E2E)
        failed = slicing.failed_checks(verify_episode(rubric, evidence), STAGES)
        if failed:
            raise _Rejected(f"check_failed:{failed[0]}")
        traj = content_digest(ep.to_dict())
        step = slicing.transformation("teacher_trajectory", trajectory=traj, teacher=cfg.teacher)
        prov = dataclasses.replace(base, transformations=base.transformations + (step,))
        sft = slicing.sft_slices(ep, inst.brief, prov, traj)
        if src.focus == E2E:
            reduced, params = e2e.reduce_task(track, inst, cfg.reduction, src.template)
            start = reduced.state()
            ep2, ev2 = _play(ctx, start, reduced.brief, reduced.task_id, E2E)
            failed = slicing.failed_checks(verify_episode(build_rubric(track, reduced), ev2), STAGES)
            reduce_step = slicing.transformation("e2e_reduce", **params)
            play_inst, stages = reduced, STAGES
        else:
            stage = Stage.parse(src.focus)
            try:  # Eq. 11
                start = slicing.boundary_state(ctx.make_sandbox, inst.state(), ep, stage)
            except slicing.ReplayMismatch as exc:
                raise _Rejected("replay_mismatch") from exc
            except Exception as exc:  # noqa: BLE001 — the replay sandbox failed to start or died
                raise _Rejected("sandbox_failure") from exc
            reduce_step = slicing.transformation("prefix_replay", trajectory=traj, stage=stage.value,
                                                 turns=next((t.index for t in ep.turns if t.stage.index >= stage.index),
                                                            len(ep.turns)))
            ep2, ev2 = _play(ctx, start, inst.brief, inst.task_id, stage.value)
            failed = slicing.failed_checks(verify_episode(rubric, ev2, (stage,)), (stage,))
            play_inst, stages = inst, (stage,)
        traj2 = content_digest(ep2.to_dict())
        prov2 = dataclasses.replace(prov, transformations=prov.transformations + (reduce_step,))
        sft += slicing.sft_slices(ep2, play_inst.brief, prov2, traj2)
        c, g = slicing.stage_contract(build_rubric(track, play_inst), stages)
        check = slicing.transformation("teacher_check", trajectory=traj2, turns=len(ep2.turns))
        ref = StateRef(start.digest(), f"states/{start.digest()}.tar")  # stored only once accepted
        row = RLRow(ref, src.focus, slicing.row_prompt(play_inst, src.focus), c, g, slicing.row_skill(src.focus),
                    dataclasses.replace(prov2, transformations=prov2.transformations + (check,)), "rubric")
        leak = LeakageReport()
        for i, r in enumerate([row] + sft):
            ctx.scanner.scan_value(r.to_dict(), file=inst.task_id, row=i, field="", report=leak)
        ctx.scanner.scan_state(start, file=inst.task_id, row=0, field="state", report=leak)
        reason = e2e.accept(booted=True, turns=len(ep2.turns), horizon=cfg.horizon, failed_stages=failed,
                            passes=e2e.validation_passes(ev2, play_inst) if src.focus == E2E else 0,
                            lam=cfg.reduction, leak_hits=len(leak.hits))
        if reason:
            raise _Rejected(reason)
        ctx.bank.put_state(start)
    except _Rejected as rej:
        return {"reason": rej.reason}
    return {"reason": "", "rl": [row.to_record()], "sft": [r.to_record() for r in sft]}


def code_fingerprint() -> str:
    """SHA-256 over the source files that shape rows (tasks, verifier, sandbox, stage bank): a cached source
    is reused only while this code is unchanged."""
    pkg = Path(__file__).resolve().parents[1]
    files = sorted(p for d in ("tasks", "verify", "sandbox", "stage_bank") for p in (pkg / d).glob("*.py"))
    return content_digest([[p.relative_to(pkg).as_posix(), content_digest(p.read_text("utf-8"))] for p in files])


def _cache_key(cfg: FactoryConfig, src: Source, salt: str) -> str:
    fields = {k: v for k, v in dataclasses.asdict(cfg).items()
              if k not in ("bank_dir", "tracks", "foci", "outcomes", "workers", "note", "heldout_manifest")}
    if fields["teacher_endpoint"] is not None:  # where the key is read from does not change the rows
        fields["teacher_endpoint"] = {k: v for k, v in fields["teacher_endpoint"].items() if k != "api_key_env"}
    return content_digest({"factory": FACTORY_VERSION, "source": dataclasses.asdict(src), "config": fields,
                           "salt": salt})


def recipe(config: FactoryConfig) -> str:
    """The part of a version's note that says which teacher and layouts wrote its rows, e.g.
    'teacher=portable/v2 layouts=varied' (`check_recipe` compares it; the portable expert's action texts carry
    their version, `portable_expert.VERSION`, since rows of two versions must not be trained on together)."""
    teacher = f"{config.teacher}/{PORTABLE_VERSION}" if config.teacher == "portable" else config.teacher
    return f"teacher={teacher} layouts={config.layouts}"


def check_recipe(bank: StageBank, config: FactoryConfig) -> None:
    """Refuses a bank whose first version was written by another teacher or layout family than `config` asks
    for (rows of two recipes would otherwise be trained on together). Versions admitted with a custom
    `FactoryConfig.note` are not checked.

    Raises:
      ValueError: naming the bank directory, what built it and what the run asks for.
    """
    versions = bank.versions()
    if not versions:
        return
    note = bank.note(versions[0])
    if not note.startswith(FACTORY_VERSION):
        return
    if f" {recipe(config)} " not in f" {note} ":
        found = (" ".join(w for w in note.split() if w.startswith(("teacher=", "layouts=")))
                 or "teacher=scripted layouts=fixed (an older bank)")
        raise ValueError(f"Stage Bank {config.bank_dir} was built with {found}; this run asks for {recipe(config)}: "
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


def load_manifest(config: FactoryConfig) -> HeldOutManifest:
    """The held-out manifest used for Leak(z): `config.heldout_manifest`, else the default held-out suite's."""
    if config.heldout_manifest:
        return HeldOutManifest.load(config.heldout_manifest)
    return HeldOutManifest.from_task_manifest(heldout.manifest(heldout.heldout_suite()))


def build_bank(config: FactoryConfig, progress: bool = True, *, make_sandbox: SandboxFactory | None = None,
               on_source: Callable[[Source, str], None] | None = None) -> BuildReport:
    """Builds (or resumes) the bank described by `config` and admits one new version.

    Args:
      config: the factory settings.
      progress: show a tqdm progress bar over sources.
      make_sandbox: sandbox factory override (tests inject failing sandboxes); default from `config.backend`.
      on_source: called in the main thread after each source finishes with (source, reason or '').

    Returns:
      The BuildReport (also written to `<bank_dir>/work/build_report.json`).

    Raises:
      ValueError: a bad config field.
      bat_jax.sandbox.backends.BackendUnavailable: the Docker backend cannot be used.
      bat_jax.stage_bank.leakage.LeakageError: the final preflight found held-out markers (nothing is
        admitted).
    """
    from tqdm import tqdm

    t0 = time.time()
    config.validate()
    bank = StageBank(config.bank_dir)
    manifest = load_manifest(config)
    salt = content_digest([dataclasses.asdict(manifest), code_fingerprint()])  # manifest + code → cache key
    ctx = _Context(config, bank, make_sandbox or backend_factory(config.backend), LeakageScanner(manifest))
    work = Path(config.bank_dir) / "work" / "sources"
    grid = sources(config)
    results: dict[int, dict] = {}
    report = BuildReport(str(config.bank_dir), sources_total=len(grid))
    todo = []
    for src in grid:
        cached = _load_cached(work / f"{_cache_key(config, src, salt)}.json", bank)
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
                atomic_write(work / f"{_cache_key(config, src, salt)}.json",
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
        note = config.note or f"{FACTORY_VERSION} seed={config.seed} {recipe(config)} digest={report.digest}"
        report.version = bank.admit(new_rl, new_sft, note=note)
        report.admitted_rl, report.admitted_sft = len(new_rl), len(new_sft)
    report.elapsed_s = round(time.time() - t0, 3)
    atomic_write(Path(config.bank_dir) / "work" / "build_report.json",
                 json.dumps(report.to_dict(), sort_keys=True).encode())
    return report

