"""The BiCuRL experiment, top to bottom (paper Section 2.2, Algorithm of Figure 1b).

Details: docs/design.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import time

from bat_jax import report
from bat_jax.atomic_io import atomic_write
from bat_jax.benchmark.scoring import Summary, display
from bat_jax.benchmark.stages import StageSet
from bat_jax.bicurl import evaluation as ev
from bat_jax.bicurl import hosts as run_hosts
from bat_jax.bicurl import round_journal
from bat_jax.bicurl.bank_feed import BankFeed, RayFactory, check_bank_version
from bat_jax.bicurl.cold_start import (ROUND0_FILE, SFT_TARGETS, load_round0, round0_items, round0_matches,
                                      rehearse, save_round0, sft_cold_start)
from bat_jax.bicurl.engines import EngineConfig, build_engine
from bat_jax.bicurl.export import export_retained
from bat_jax.bicurl.async_block import run_grpo_block
from bat_jax.bicurl.grpo_round import GRPOBlockConfig
from bat_jax.bicurl.ray_workers import RayRolloutConfig, WorkerSpec
from bat_jax.bicurl.round_rows import RoundRows, fit_probe, kl_prompts
from bat_jax.bicurl.run_loops import RunLoops, ensure_sandbox_image, open_run_loops
from bat_jax.checkpoint import (BaseRecord, CheckpointConfig, Checkpointer, base_digest, checkpoint_name,
                                checkpoint_step)
from bat_jax.curriculum import controller as ctl
from bat_jax.errors import ConfigValueError
from bat_jax.curriculum import router
from bat_jax.learn import distributed, kl, sft
from bat_jax.learn.learner import Learner, MemoryConfig, checkpoint_sharding
from bat_jax.ledger import Ledger, RoundRecord
from bat_jax.models.mesh import MeshConfig
from bat_jax.policy import Policy, PolicyConfig, build_policy
from bat_jax.prompts import PromptFormat
from bat_jax.rollout.agent_loop import AgentLoopConfig
from bat_jax.rollout.engine import RolloutEngine
from bat_jax.rollout.sampling import SamplingConfig
from bat_jax.stage_bank import pools
from bat_jax.stage_bank.bank import BankView, StageBank
from bat_jax.stage_bank.factory import FactoryConfig, build_bank, check_recipe
from bat_jax.stage_bank.factory_loop import FactoryLoopConfig, FactoryProcess
from bat_jax.stage_bank.leakage import HeldOutManifest, preflight
from bat_jax.staged_benchmark.contract import BenchmarkError, StagedBenchmark
from bat_jax.verify.judge import JudgeConfig, RubricJudge

MODES = ("bicurl", "sft_only", "grpo_e2e")


def build_stage_bank(run_dir: pathlib.Path, config: FactoryConfig, benchmark: StagedBenchmark) -> dict:
    """The Data Factory as a launch job (`gin/stage_bank_tiny.gin`).

    It builds one new version of `benchmark`'s bank, its report in run_dir."""
    built = build_bank(config, benchmark)
    out = dataclasses.asdict(built) if dataclasses.is_dataclass(built) else {"report": str(built)}
    atomic_write(pathlib.Path(run_dir) / "build_report.json", json.dumps(out, indent=2, default=str).encode())
    print(f"[bat_jax] Stage Bank build: {built}")
    return out


@dataclasses.dataclass(frozen=True)
class BiCuRLConfig:
    """Outer-loop settings (paper defaults, App. A.4 and A.7). Component settings are their own dataclasses.

    Attributes:
      mode: 'bicurl' (paper), 'sft_only' or 'grpo_e2e' (baselines).
      rounds: outer-loop rounds R (paper: 10).
      grpo_steps_per_round: GRPO optimizer steps per round block (paper: 50); one step = one pool batch.
      sft_max_rows: SFT rows used by the cold start (0 = all).
      sft_targets: 'row' (paper Eq. 9: loss on each row's one target action) or 'trajectory' (per teacher
        trajectory its longest row that fits, with loss on every action: the same targets and contexts in one
        sequence instead of one per row; `sft_data.trajectory_examples`).
      backend: sandbox backend, 'docker' (real runs) or 'local' (non-isolated; tests only).
      sandbox_pool: Docker only: GRPO rollouts and evaluations take their sandboxes from one warm pool, each
        reset to a fresh state between episodes (`sandbox/pool.py`); False = a new container per episode.
      seed: run seed (paper: 42).
      bank_version: the Stage Bank version each round reads: 'latest' (the newest admitted at the round's start:
        versions a Data Factory admits while the run trains reach the next round) or a version number (pinned).
        Each round's version is recorded before its first rollout (`bicurl/bank_feed.py`) and in the ledger.
    """

    mode: str = "bicurl"
    rounds: int = 10
    grpo_steps_per_round: int = 50
    sft_max_rows: int = 0
    sft_targets: str = "row"
    backend: str = "docker"
    sandbox_pool: bool = True
    seed: int = 42
    bank_version: str | int = "latest"

    def __post_init__(self):
        check_bank_version(self.bank_version)
        if self.mode not in MODES:
            raise ValueError(f"BiCuRLConfig.mode must be one of {MODES}, got {self.mode!r}")
        if self.sft_targets not in SFT_TARGETS:
            raise ValueError(f"BiCuRLConfig.sft_targets must be one of {SFT_TARGETS}, got {self.sft_targets!r}")
        if self.rounds < 0 or self.grpo_steps_per_round < 1:
            raise ValueError(f"BiCuRLConfig needs rounds >= 0 and grpo_steps_per_round >= 1, got "
                             f"{self.rounds}, {self.grpo_steps_per_round}")


@dataclasses.dataclass(frozen=True)
class Components:
    """The component configs one run uses, each bound by gin on its own dataclass.

    The experiment hands each mechanism its own config, never this whole. `benchmark` (required) is the staged
    benchmark the run teaches with (`staged_benchmark.contract.StagedBenchmark`; gin names it, e.g.
    `@imaging.ImagingBenchmark()`): its stages, tasks, rubric, teachers and held-out suite. `engine` picks the rollout
    engine and its memory bounds (`engines.EngineConfig`: the JAX sampler, on one device or the mesh, or vLLM, one
    replica per GPU). `block` is what a round's GRPO block reads (`grpo_round.GRPOBlockConfig`: the objective, its
    optimizer, micro-batches, reward scoring, dynamic sampling, staleness). `judge` (optional) names the LLM judge
    endpoint and the rubric items it decides, for rollout rewards and evaluation cells alike; unset = all
    programmatic. `ray` (optional, `gin/rollout/ray_local2.gin`) runs the GRPO rollouts on Ray workers, each with its
    own policy copy, JAX sampler and sandboxes (`bicurl/ray_workers.py`); unset = in this process. Evaluation stays
    in-process.
    `factory_loop` (optional) runs the Data Factory beside training in its own process (a Ray actor when `ray` is
    set: `bank_feed.RayFactory`), admitting new versions of
    `bank` steered by the run's aggregate scores (`stage_bank/factory_loop.py`); it stops with the run, and rounds
    read whatever version is admitted when they start (`BiCuRLConfig.bank_version`). Unset = the bank is built once.
    `rehearsal` (optional, an `sft.SFTConfig` in scope `rehearsal/`) runs its `total_steps` SFT steps on every stage's
    SFT rows after each round's GRPO block (`cold_start.rehearse`); unset = none (the paper).

    `sampling` (`rollout/sampling.SamplingConfig`) is the run's one K and sampling transform: construction puts
    one object into `sampling`, `agent.sampling` and `block.grpo.sampling`, so the rollouts and GRPO's logprobs cannot
    disagree: the one of them that differs from the default (a sampling set on the loop's or GRPO's config is used).

    Raises:
      ConfigValueError: two of the three set to different values (naming them).
      ValueError: `ray` with engine kind 'vllm' (Ray workers run the JAX sampler).
    """

    benchmark: StagedBenchmark | None = None
    policy: PolicyConfig = PolicyConfig()
    bank: FactoryConfig | None = None
    sft: sft.SFTConfig = sft.SFTConfig()
    block: GRPOBlockConfig = GRPOBlockConfig()
    pools: pools.PoolConfig = pools.PoolConfig()
    router: router.RouterConfig = router.RouterConfig()
    controller: ctl.ControllerConfig = ctl.ControllerConfig()
    agent: AgentLoopConfig = AgentLoopConfig()
    evaluation: ev.EvalConfig = ev.EvalConfig()
    mesh: MeshConfig = MeshConfig(data=1, fsdp=1, tensor=1)
    memory: MemoryConfig = MemoryConfig()  # learner remat / attention block / logit chunk
    policy_shift: kl.PolicyShiftConfig = kl.PolicyShiftConfig()
    engine: EngineConfig = EngineConfig()
    judge: JudgeConfig | None = None
    ray: RayRolloutConfig | None = None
    factory_loop: FactoryLoopConfig | None = None
    sampling: SamplingConfig = SamplingConfig()
    rehearsal: sft.SFTConfig | None = None

    def __post_init__(self):
        bound = {name: value for name, value in (("sampling.SamplingConfig", self.sampling),
                                                 ("agent_loop.AgentLoopConfig.sampling", self.agent.sampling),
                                                 ("grpo.GRPOConfig.sampling", self.block.grpo.sampling))
                 if value != SamplingConfig()}
        if len(set(bound.values())) > 1:
            raise ConfigValueError("the run has one K and sampling temperature, bound on sampling.SamplingConfig; "
                                   "these disagree: " + "; ".join(f"{k} = {v}" for k, v in bound.items()))
        one = next(iter(bound.values()), self.sampling)  # a binding is used wherever it was made, never dropped
        object.__setattr__(self, "sampling", one)
        object.__setattr__(self, "agent", dataclasses.replace(self.agent, sampling=one))
        object.__setattr__(self, "block", dataclasses.replace(
            self.block, grpo=dataclasses.replace(self.block.grpo, sampling=one)))
        if self.ray is not None and self.engine.kind != "jax":
            raise ValueError("Components.ray runs the JAX sampler on its workers; it needs engine kind 'jax'")


def run(run_dir: pathlib.Path, config: BiCuRLConfig = BiCuRLConfig(), components: Components = Components(),
        hosts: run_hosts.OneHost | None = None) -> dict:
    """Runs (or resumes) one experiment in `run_dir`; returns the final summary (also written as JSON).

    The sandboxes (warm pool), rollout engine and Ray workers it starts are released when it returns or raises.

    Raises:
      errors.ConfigError: what a binding or path must change (one line from launch): `components.benchmark` or
        `components.bank` unset, a benchmark definition or bank row that does not fit
        (`staged_benchmark.contract.BenchmarkError`), a missing or incomplete checkpoint directory, an unknown track
        or stage, an unreachable Docker engine (`sandbox.backends.BackendUnavailable`).
      stage_bank.leakage.LeakageError: a held-out marker in the bank or in a round's rows.
    """
    run_dir = pathlib.Path(run_dir)
    with contextlib.ExitStack() as resources:
        exp = _open(run_dir, config, components, resources, hosts or run_hosts.current())
        untrained = exp.learner.host_copy(exp.learner.params)
        round0 = _cold_start(exp)
        sft_params = exp.learner.host_copy(exp.learner.params)
        controller, records = _resume(exp, round0)
        best_params = exp.learner.host_copy(exp.restore(controller.state.best_checkpoint))
        if records:
            exp.learner.params = exp.restore(records[-1].retained_checkpoint)
        rounds = 0 if config.mode == "sft_only" else config.rounds
        kl_probe = kl_prompts(exp.view.rl_rows, exp.policy, exp.prompt, exp.components.policy_shift)
        for r in range(len(records) + 1, rounds + 1):
            t_round = time.perf_counter()
            last_scores = records[-1].controller_scores["stage_scores"] if records else round0.stage_scores
            decision = router.route(last_scores, exp.stages, round_index=r, held=controller.state.held,
                                    reference_scores=controller.state.reference_scores, config=components.router)
            view = exp.feed.round_start(r, exp.view)  # resolved now, never waiting on a factory
            round_view = exp.round_rows.view(view, decision.target, r)
            # what the block rolls out is journaled: a killed round resumes on it (one process: its writer)
            journal = round_journal.for_round(run_dir, r, enabled=exp.hosts.count == 1)
            stats = run_grpo_block(exp.learner, exp.loops.rollouts, exp.bank, round_view, exp.block, exp.benchmark,
                                   seed=config.seed * 1000 + r, judge=exp.judge, journal=journal, hosts=exp.hosts)
            if journal.line():
                print(journal.line(), flush=True)
            if components.rehearsal is not None:
                _rehearse(exp, view, components.rehearsal, seed=config.seed * 1000 + r, round_index=r)
            summary, agent_failed = exp.evaluate(exp.learner.params, "controller")
            shift = kl.policy_shift_kl(exp.learner.apply_fn, exp.learner.full(exp.learner.params),
                                       exp.learner.full(exp.learner.on_mesh(best_params)), *kl_probe,
                                       config=exp.components.policy_shift)
            verdict = exp.hosts.agree(_judge_candidate(exp, controller, r, summary, shift), f"round {r} decision")
            if verdict.new_best:
                best_params = exp.learner.host_copy(exp.learner.params)
            if verdict.retained_checkpoint != checkpoint_name(r):
                exp.learner.params = exp.restore(verdict.retained_checkpoint)
            record = RoundRecord(
                round=r, selected_stage=decision.target, routing_report=decision.report(),
                pool_counts=round_view.pool_counts(), bank_version=view.version, state_ids=round_view.state_ids(),
                reward_version=stats.reward_version, controller_scores=ctl.Evaluation.from_summary(summary).to_dict(),
                kl=shift, decision=verdict.decision, decision_reasons=verdict.reasons,
                retained_checkpoint=verdict.retained_checkpoint, controller_state=controller.state.to_dict(),
                eval_cells=summary.n_cells, eval_unscored=summary.n_unscored, eval_agent_failed=agent_failed,
                grpo=stats, eval_items=summary.items.to_dict() or None, bank_rows_new=exp.feed.new_rows(r, view),
                factory=exp.feed.factory_line())
            exp.ledger.append(record)
            journal.clear()
            records.append(record)
            if exp.hosts.is_primary:
                exp.feed.publish_steering(records, view)
            _log_round(exp.writer, record, summary, time.perf_counter() - t_round)

        final = _final_evaluation(exp, config, {"untrained": untrained, "SFT": sft_params}, best_params, rounds)
        exp.close_engine()  # vLLM: free its memory and worker before the export and the reports
        # SFT without rounds; with several processes all join the gathers and process 0 writes
        export_retained(exp.learner.sync_model(best_params), run_dir, exp.policy.tokenizer)
        exp.loops.close()  # Ray rollout workers, the sandbox pool
        return exp.hosts.on_primary(lambda: report.write_run_report(
            run_dir, final, records, round0, exp.stages, exp.writer, note=exp.benchmark.note,
            round0_items=round0_items(run_dir)), "run report")


@dataclasses.dataclass
class _Experiment:
    """What one run holds open.

    Policy and learner, the bank version it reads, rollout engine and loops, judge, checkpoints, ledger and TensorBoard
    writer; `evaluate` runs the held-out suite on a set of parameters."""

    run_dir: pathlib.Path
    config: BiCuRLConfig
    components: Components
    benchmark: StagedBenchmark
    prompt: PromptFormat
    policy: Policy
    learner: Learner
    bank: StageBank
    feed: BankFeed
    view: BankView
    round_rows: RoundRows
    engine: RolloutEngine
    loops: RunLoops
    judge: RubricJudge | None
    checkpoints: Checkpointer
    ledger: Ledger
    writer: report.ScalarWriter
    block: GRPOBlockConfig
    hosts: run_hosts.OneHost  # or multihost.ManyHosts: every exchange between the run's processes

    @property
    def stages(self) -> StageSet:
        return self.benchmark.stages

    def evaluate(self, params, purpose: str) -> tuple[Summary, int]:
        """(aggregates, scored cells that were agent-caused sandbox failures) of one held-out evaluation."""
        self.engine.update_weights(self.learner.sync_model(params))  # every process (a collective with several)
        config = dataclasses.replace(self.components.evaluation, purpose=purpose)
        # on process 0 alone; its aggregates go to every process
        return self.hosts.on_primary(lambda: self.loops.evaluate(config, self.benchmark, self.judge, self.prompt),
                                     f"{purpose} evaluation")

    def restore(self, name: str):
        """The parameters of checkpoint `name` (`checkpoint.checkpoint_name`), on the learner's mesh."""
        return self.checkpoints.restore_params(self.learner.params, checkpoint_step(name))

    def close_engine(self) -> None:
        if hasattr(self.engine, "close"):
            self.engine.close()


def _open(run_dir: pathlib.Path, config: BiCuRLConfig, components: Components,
          resources: contextlib.ExitStack, hosts: run_hosts.OneHost) -> _Experiment:
    """Opens a run: the benchmark, policy, learner, Stage Bank version, engine, loops and records.

    It checks the benchmark, builds the policy and learner (a missing checkpoint directory fails before other work),
    then the Stage Bank version (built once, resumable) behind the leakage preflight, the engine, loops and the run's
    records."""
    benchmark = components.benchmark
    if benchmark is None:
        raise ConfigValueError("experiment.Components.benchmark (the staged benchmark to teach with, e.g. "
                               "@imaging.ImagingBenchmark()) is required")
    if components.bank is None:
        raise ConfigValueError("experiment.Components.bank (a FactoryConfig naming the Stage Bank directory) is "
                               "required")
    benchmark.validate()
    if components.judge is not None:
        benchmark.check_judged_items(components.judge.items)  # against this benchmark's rubric items
    if "docker" in (config.backend, components.bank.backend):
        ensure_sandbox_image(benchmark)  # a benchmark's own image, built once (every host: its own Docker)
    controller_config = _with_late_stages(components.controller, benchmark)
    components = dataclasses.replace(components, controller=controller_config)
    policy = build_policy(components.policy, checkpoint_sharding(components.mesh))  # straight onto the mesh
    learner = Learner(policy.model, components.mesh, components.memory)

    manifest_path = hosts.on_primary(lambda: ev.write_heldout_manifest(
        run_dir / "heldout_manifest.json", components.evaluation, benchmark), "held-out manifest")
    manifest = HeldOutManifest.load(manifest_path)
    bank = StageBank(components.bank.bank_dir)

    def check_or_build() -> None:  # process 0 alone; the others wait, then read the bank
        check_recipe(bank, components.bank, benchmark)  # another benchmark's or recipe's bank is refused, never mixed
        if not bank.versions():
            built = build_bank(dataclasses.replace(components.bank, heldout_manifest=str(manifest_path)), benchmark)
            versions = ", ".join(f"{k} {v}" for k, v in built.sandbox.items())  # what the digest depends on too
            print(f"[bat_jax] Stage Bank v{built.version} built in {built.elapsed_s:.0f} s: {built.sources_accepted} "
                  f"of {built.sources_total} sources accepted, {built.rl_rows} RL rows, {built.sft_rows} SFT rows, "
                  f"digest {built.digest[:8]}… (sandbox {versions or 'versions unknown'})"
                  + (f"; rejected {built.rejected}" if built.rejected else ""))

    hosts.on_primary(check_or_build, "Stage Bank check and build")
    feed = BankFeed(bank, run_dir, config.bank_version, benchmark, hosts=hosts)
    view = feed.view(feed.version_for(0))  # SFT and the KL probe set read this version, also after a resume
    feed.check_foci(view, 0)
    preflight(manifest, files=[components.bank.bank_dir]).raise_if_leaky()
    print(f"[bat_jax] Stage Bank v{view.version}: {len(view.rl_rows)} RL rows, {len(view.sft_rows)} SFT rows; "
          f"leakage preflight clean")
    round_rows = RoundRows(config.mode, config.grpo_steps_per_round, components.pools,
                           components.block.dynamic_sampling,
                           manifest, bank.load_state)
    round_rows.check_fits(view, benchmark.stages.ids)  # bank-dependent sizes, before the engine and SFT
    components = dataclasses.replace(components, policy_shift=fit_probe(components.policy_shift, len(view.rl_rows)))

    agent = components.agent
    engine = hosts.local_engine(  # with several processes: its own model copy, fed gathered weights
        lambda engine_policy, directory: build_engine(
            engine_policy, components.engine, agent.max_context_tokens, directory,
            batch_episodes=components.pools.batch_size * components.sampling.group_size),
        policy, run_dir, sampler_mesh=components.engine.sampler_mesh is not None)
    if hasattr(engine, "close"):
        resources.callback(engine.close)  # vLLM
    worker = WorkerSpec(components.policy, agent, config.backend, components.engine) if components.ray else None
    rows_in_flight = components.pools.batch_size * (1 + components.block.max_staleness)  # s later batches too
    loops = hosts.all_ok(  # every host opens its own sandboxes; one that cannot stops every process, named
        lambda: open_run_loops(policy, engine, agent, components.evaluation, benchmark, rows_in_flight,
                               config.backend, warm_pool=config.sandbox_pool, ray=components.ray, worker=worker),
        "opening the sandboxes", release=lambda opened: opened.close())
    resources.callback(loops.close)
    judge = RubricJudge(components.judge) if components.judge is not None else None
    if judge is not None:
        judge.check_endpoint()  # a rejected request (wrong model / key) stops here; unreachable only warns
    # after the first build: the factory admits the versions after it (one factory: process 0's)
    if components.factory_loop is not None and hosts.is_primary:
        kind = RayFactory if components.ray is not None else FactoryProcess  # Ray is up: the rollout workers
        feed.factory = kind(dataclasses.replace(components.bank, heldout_manifest=str(manifest_path)), benchmark,
                            components.factory_loop).start()
        resources.callback(feed.close)
    prompt = PromptFormat.of(benchmark, policy.prompt_style)
    block = components.block.for_run(agent, prompt)
    # checkpoints/ is created only now: a run the leakage preflight or the loops stop leaves none behind
    checkpoints = Checkpointer(CheckpointConfig(directory=str((run_dir / "checkpoints").resolve())))
    base = (BaseRecord(components.policy.base_source(), base_digest(learner.frozen, distributed.host_gather))
            if learner.frozen else None)  # a LoRA run's frozen base; every process hashes (a collective)
    hosts.on_primary(lambda: checkpoints.check_base(base), "LoRA base check")  # another base: refused
    return _Experiment(run_dir, config, components, benchmark, prompt, policy, learner, bank, feed, view, round_rows,
                       engine, loops, judge, checkpoints,
                       hosts.primary_only(lambda: Ledger(run_dir / "ledger.jsonl")),  # writers: process 0
                       hosts.primary_only(lambda: report.ScalarWriter(run_dir / "tensorboard", benchmark.stages)),
                       block, hosts)


def _with_late_stages(config: ctl.ControllerConfig, benchmark: StagedBenchmark) -> ctl.ControllerConfig:
    """`config` with the gate's late stages filled in from the benchmark when unset (None).

    Raises:
      BenchmarkError: a bound late stage the benchmark does not have.
    """
    margins = config.margins
    if margins.late_stages is None:
        return dataclasses.replace(config, margins=dataclasses.replace(margins, late_stages=benchmark.late_stages))
    unknown = [s for s in margins.late_stages if s not in benchmark.stages]
    if unknown:
        raise BenchmarkError(f"controller.NonInferiorityMargins.late_stages {unknown} are not stages of benchmark "
                             f"{benchmark.name!r} {list(benchmark.stages.ids)}")
    return config


def _cold_start(exp: _Experiment) -> ctl.Evaluation:
    """SFT cold start once (checkpoint step 0) and its controller evaluation (round 0); restored on resume."""
    jobs = ev.suite_jobs(dataclasses.replace(exp.components.evaluation, purpose="controller"), exp.benchmark)
    restored = 0 in exp.checkpoints.all_steps()
    if restored:
        exp.learner.params = exp.restore(checkpoint_name(0))
        if exp.hosts.on_primary(lambda: round0_matches(exp.run_dir, jobs), "round 0 evaluation"):
            return exp.hosts.on_primary(lambda: load_round0(exp.run_dir), "round 0 evaluation")
        # e.g. an SFT cold start copied from a run with other controller repeats or seed (`launch.sweep
        # --init_from`): every round would be compared with a baseline over other cells
        print(f"[bat_jax] the round 0 evaluation in {ROUND0_FILE} played other cells than this run's controller "
              f"evaluation ({len(jobs)} cells): evaluating the SFT policy again", flush=True)
    else:
        t0 = time.perf_counter()
        sft_cold_start(exp.learner, exp.policy, exp.prompt,
                       list(exp.view.sft_rows)[: exp.config.sft_max_rows or None], exp.components.sft,
                       exp.config.sft_targets, exp.config.seed, exp.components.agent.max_observation_chars)
        print(f"[bat_jax] SFT cold start done in {time.perf_counter() - t0:.0f} s", flush=True)
    t1 = time.perf_counter()
    summary, _ = exp.evaluate(exp.learner.params, "controller")
    print(f"[bat_jax] controller evaluation of the SFT policy: Overall {display(summary.overall)} "
          f"({time.perf_counter() - t1:.0f} s)", flush=True)
    round0 = exp.hosts.on_primary(lambda: save_round0(exp.run_dir, summary, jobs), "round 0 evaluation")
    if not restored:
        exp.checkpoints.save(0, {"params": exp.learner.params}, extra={"round": 0},
                             metrics=None if summary.overall is None else {"overall": summary.overall})
    return round0


def _rehearse(exp: _Experiment, view: BankView, config: sft.SFTConfig, seed: int, round_index: int) -> None:
    """The round's rehearsal on the SFT rows of the version it read (`cold_start.rehearse`), one log line."""
    t0 = time.perf_counter()
    n, nll = rehearse(exp.learner, exp.policy, exp.prompt, list(view.sft_rows)[: exp.config.sft_max_rows or None],
                      config, exp.config.sft_targets, seed, exp.components.agent.max_observation_chars)
    print(f"[bat_jax] round {round_index} rehearsal: {config.total_steps} SFT steps on {n} sequences of every stage, "
          f"last batch NLL {nll:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)


def _resume(exp: _Experiment, round0: ctl.Evaluation) -> tuple[ctl.Controller, list[RoundRecord]]:
    """The controller and the ledger's rounds of a resumed run (a new run: round 0 observed).

    A checkpoint saved by a round killed before its ledger line is deleted: that round is redone."""
    records = exp.hosts.on_primary(exp.ledger.read, "ledger")
    for step in exp.checkpoints.all_steps():
        if step > (records[-1].round if records else 0):
            print(f"[bat_jax] dropping checkpoint {step}: its round is not in the ledger (killed run)", flush=True)
            exp.checkpoints.delete(step)
    config = exp.components.controller
    if records:
        state = ctl.ControllerState.from_dict(records[-1].controller_state, last_decision=records[-1].decision)
        return ctl.Controller(config, state), records
    controller = ctl.Controller(config)
    controller.observe(0, checkpoint_name(0), round0)
    return controller, records


def _judge_candidate(exp: _Experiment, controller: ctl.Controller, round_index: int, summary: Summary,
                     shift: float) -> ctl.ControllerDecision:
    """Saves the round's candidate (pinning what the controller may still restore) and has the controller decide."""
    state = controller.state
    exp.checkpoints.pin({0} | {checkpoint_step(name) for name in (state.best_checkpoint, state.retained_checkpoint)
                               if name})
    exp.checkpoints.save(round_index, {"params": exp.learner.params},
                         metrics=None if summary.overall is None else {"overall": summary.overall},
                         extra={"round": round_index, "summary": report.summary_dict(summary)})
    return controller.observe(round_index, checkpoint_name(round_index), ctl.Evaluation.from_summary(summary),
                              kl=shift)


def _log_round(writer: report.ScalarWriter, record: RoundRecord, summary: Summary, seconds: float) -> None:
    """One log line and the TensorBoard scalars of a finished round."""
    writer.summary("controller_eval", summary, record.round)
    for key, value in record.grpo.scalars().items():
        writer.scalar(f"grpo/{key}", value, record.round)
    stats = record.grpo
    fmt = lambda x: "—" if x is None else f"{x:.3f}"  # noqa: E731
    print(f"[bat_jax] round {record.round}: target {record.selected_stage}, Overall {display(summary.overall)}, "
          f"KL {record.kl:.4f}, {record.decision} → {record.retained_checkpoint}; reward on its pool "
          f"{fmt(stats.pool_reward_before)} → {fmt(stats.pool_reward_after)}, groups with reward variance "
          f"{stats.groups_with_variance}/{stats.groups_scored}, trained {stats.groups_trained} of "
          f"{stats.groups_drawn} drawn "
          f"({seconds:.0f} s)", flush=True)


def _final_evaluation(exp: _Experiment, config: BiCuRLConfig, systems: dict, best_params, rounds: int
                      ) -> dict[str, Summary]:
    """The final evaluation on disjoint held-out runs: untrained, SFT and (after rounds) the retained best."""
    t0 = time.perf_counter()
    if rounds:
        systems[("BiCuRL (retained)" if config.mode == "bicurl" else "GRPO (E2E task reward)")] = best_params
    final = {name: exp.evaluate(params, "final")[0] for name, params in systems.items()}
    print(f"[bat_jax] final evaluation of {len(final)} systems: "
          + ", ".join(f"{name} {display(summary.overall)}" for name, summary in final.items())
          + f" Overall ({time.perf_counter() - t0:.0f} s)", flush=True)
    return final
