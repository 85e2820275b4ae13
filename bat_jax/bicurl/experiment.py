"""The BiCuRL experiment, top to bottom (paper Section 2.2, Algorithm of Figure 1b):

  Stage Bank (build or reuse a version) → leakage preflight → SFT cold start (once) → evaluation →
  rounds of: route to the weakest stage → round view (S-target / S-mix / E2E) → preflight of the view →
  GRPO block (K rollouts per state in sandboxes, rubric rewards) → weight sync → evaluation →
  KL(candidate ‖ best) → accept or fall back → checkpoint → ledger → report
  → final evaluation on disjoint runs (untrained, SFT, retained best) → results table + staircase plot
  → HF export of the retained policy to run_dir/export/ (weights, config, tokenizer, chat template).
Sandboxes: by default one warm Docker pool serves every GRPO rollout and evaluation episode, each container
reset to a fresh state in between (`bicurl/run_loops.py`); it and the Ray workers are released when `run`
returns or raises (also on Ctrl-C).

Gin binds `run` and the config dataclasses (gin/bicurl_*.gin); this module itself is plain Python. A killed run
resumes from its ledger and checkpoints: finished rounds are read back, the retained checkpoint restored, and a
checkpoint saved by a round that never reached the ledger is deleted (that round is redone).
Baselines: `mode='sft_only'` (stops after the cold start) and `mode='grpo_e2e'` (GRPO on E2E rows with the
terminal task reward, no routing or fallback — the paper's GRPO row).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import time
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from bat_jax import report
from bat_jax.atomic_io import atomic_write
from bat_jax.benchmark.scoring import Summary, display
from bat_jax.benchmark.stages import STAGES
from bat_jax.bicurl import evaluation as ev
from bat_jax.bicurl.engines import EngineConfig, build_engine, jax_memory_fraction
from bat_jax.bicurl.export import export_retained
from bat_jax.bicurl.grpo_round import GRPOBlockConfig, grpo_block
from bat_jax.bicurl.ray_workers import RayRolloutConfig, WorkerSpec
from bat_jax.bicurl.reward import RewardConfig
from bat_jax.bicurl.run_loops import open_run_loops
from bat_jax.bicurl.sft_data import render_sft_row, sft_batch, trajectory_examples
from bat_jax.checkpoint import CheckpointConfig, Checkpointer
from bat_jax.curriculum import controller as ctl
from bat_jax.curriculum import router
from bat_jax.learn import grpo, kl, rollout_correction, sft
from bat_jax.learn.dynamic_sampling import DynamicSamplingConfig
from bat_jax.learn.learner import Learner, MemoryConfig, pad_batch
from bat_jax.learn.optim import GRPO_OPTIMIZER, OptimizerConfig
from bat_jax.ledger import Ledger, RoundRecord
from bat_jax.models.mesh import MeshConfig
from bat_jax.models.episode import EpisodeBuilder
from bat_jax.policy import Policy, PolicyConfig, build_policy
from bat_jax.prompts import first_messages
from bat_jax.rollout.agent_loop import AgentLoopConfig
from bat_jax.stage_bank import pools
from bat_jax.stage_bank.bank import StageBank
from bat_jax.stage_bank.factory import FactoryConfig, build_bank, check_recipe
from bat_jax.stage_bank.leakage import HeldOutManifest, preflight
from bat_jax.stage_bank.row import RLRow, SFTRow
from bat_jax.verify.judge import JudgeConfig, RubricJudge

MODES = ("bicurl", "sft_only", "grpo_e2e")


def build_stage_bank(run_dir: pathlib.Path, config: FactoryConfig) -> dict:
    """The Data Factory as a launch job (`gin/stage_bank_tiny.gin`): one new bank version, report in run_dir."""
    built = build_bank(config)
    out = dataclasses.asdict(built) if dataclasses.is_dataclass(built) else {"report": str(built)}
    atomic_write(pathlib.Path(run_dir) / "build_report.json", json.dumps(out, indent=2, default=str).encode())
    print(f"[bat_jax] Stage Bank build: {built}")
    return out


@dataclasses.dataclass(frozen=True)
class BiCuRLConfig:
    """Outer-loop settings (paper defaults; REFERENCE.md). Component settings are their own dataclasses.

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
    """

    mode: str = "bicurl"
    rounds: int = 10
    grpo_steps_per_round: int = 50
    sft_max_rows: int = 0
    sft_targets: str = "row"
    backend: str = "docker"
    sandbox_pool: bool = True
    seed: int = 42

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"BiCuRLConfig.mode must be one of {MODES}, got {self.mode!r}")
        if self.sft_targets not in ("row", "trajectory"):
            raise ValueError(f"BiCuRLConfig.sft_targets must be 'row' or 'trajectory', got {self.sft_targets!r}")
        if self.rounds < 0 or self.grpo_steps_per_round < 1:
            raise ValueError(f"BiCuRLConfig needs rounds >= 0 and grpo_steps_per_round >= 1, got "
                             f"{self.rounds}, {self.grpo_steps_per_round}")


@dataclasses.dataclass(frozen=True)
class Components:
    """The component configs one run uses, each bound by gin on its own dataclass; the experiment hands each
    mechanism its own config, never this whole. `engine` picks the rollout engine and its memory bounds
    (`engines.EngineConfig`: the JAX sampler, on one device or the mesh, or vLLM, one replica per GPU). `grpo_micro_batches`: gradient accumulation inside one
    GRPO step (the loss is exact under the split). `judge` (optional) names the LLM judge endpoint and the rubric
    items it decides, for rollout rewards and evaluation cells alike; unset = all programmatic. `ray` (optional,
    `gin/rollout/ray_local2.gin`) runs the GRPO rollouts on Ray workers, each with its own policy copy, JAX
    sampler and sandboxes (`bicurl/ray_workers.py`); unset = in this process. Evaluation stays in-process.
    `reward` bounds the threads scoring a GRPO batch and the rebuilt tasks a round keeps (`bicurl/reward.py`).
    `dynamic_sampling` drops GRPO groups without reward variance and replaces them from the same pool
    (`learn/dynamic_sampling.py`); rollout correction is `grpo.tis_cap` / `grpo.seq_ratio_range`.

    Raises:
      ValueError: `ray` with engine kind 'vllm' (Ray workers run the JAX sampler); `grpo.group_size` other than
        `agent.episodes_per_state` (both K).
    """

    policy: PolicyConfig = PolicyConfig()
    bank: FactoryConfig | None = None
    sft: sft.SFTConfig = sft.SFTConfig()
    grpo: grpo.GRPOConfig = grpo.GRPOConfig(temperature=0.7)
    grpo_optimizer: OptimizerConfig = GRPO_OPTIMIZER
    pools: pools.PoolConfig = pools.PoolConfig()
    router: router.RouterConfig = router.RouterConfig()
    controller: ctl.ControllerConfig = ctl.ControllerConfig()
    agent: AgentLoopConfig = AgentLoopConfig()
    evaluation: ev.EvalConfig = ev.EvalConfig()
    mesh: MeshConfig = MeshConfig(data=1, fsdp=1, tensor=1)
    memory: MemoryConfig = MemoryConfig()  # learner remat / attention block / logit chunk
    policy_shift: kl.PolicyShiftConfig = kl.PolicyShiftConfig()
    engine: EngineConfig = EngineConfig()
    grpo_micro_batches: int = 4
    judge: JudgeConfig | None = None
    ray: RayRolloutConfig | None = None
    reward: RewardConfig = RewardConfig()
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()

    def __post_init__(self):
        if self.grpo.group_size != self.agent.episodes_per_state:  # K: the loop rolls it, GRPO groups by it
            raise ValueError(f"Components: grpo.group_size ({self.grpo.group_size}) must equal "
                             f"agent.episodes_per_state ({self.agent.episodes_per_state}), the K rollouts per state")
        if self.ray is not None and self.engine.kind != "jax":
            raise ValueError("Components.ray runs the JAX sampler on its workers; it needs engine kind 'jax'")


def _evaluation(s: Summary) -> ctl.Evaluation:
    return ctl.Evaluation(overall=s.overall or 0.0, task=s.task, stage_scores={k.value: v for k, v in s.stages.items()},
                          track_scores={t: row["overall"] for t, row in s.tracks.items()})


def run(run_dir: pathlib.Path, config: BiCuRLConfig = BiCuRLConfig(), components: Components = Components()) -> dict:
    """Runs (or resumes) one experiment in `run_dir`; returns the final summary (also written as JSON). The
    sandboxes (warm pool), rollout engine and Ray workers it starts are released when it returns or raises."""
    with contextlib.ExitStack() as resources:
        return _run(pathlib.Path(run_dir), config, components, resources)


def _run(run_dir: pathlib.Path, config: BiCuRLConfig, c: Components, resources: contextlib.ExitStack) -> dict:
    """The body of `run`; whatever must be released at the end goes on `resources`."""
    if c.bank is None:
        raise ValueError("Components.bank (a FactoryConfig naming the Stage Bank directory) is required")

    if c.engine.kind == "vllm":  # JAX and vLLM share the accelerator in this process: JAX leaves vLLM its share
        share = float(dict(c.engine.vllm_options).get("gpu_memory_utilization", 0.5))
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{jax_memory_fraction(share):.2f}")

    # ---- policy and learner first: a missing checkpoint directory or device fails before any other work ---
    policy = build_policy(c.policy)
    learner = Learner(policy.model, c.mesh, c.memory)

    # ---- Stage Bank: build a version once (resumable), then guard the held-out firewall -----------------
    manifest_path = ev.write_heldout_manifest(run_dir / "heldout_manifest.json", c.evaluation)
    manifest = HeldOutManifest.load(manifest_path)
    bank = StageBank(c.bank.bank_dir)
    check_recipe(bank, c.bank)  # a bank another teacher / layout family wrote is refused, never mixed in
    if not bank.versions():
        built = build_bank(dataclasses.replace(c.bank, heldout_manifest=str(manifest_path)))
        print(f"[bat_jax] Stage Bank built: {built}")
    view = bank.read()
    preflight(manifest, files=[c.bank.bank_dir]).raise_if_leaky()
    print(f"[bat_jax] Stage Bank v{view.version}: {len(view.rl_rows)} RL rows, {len(view.sft_rows)} SFT rows; "
          f"leakage preflight clean")

    # ---- rollout engine, sandboxes (warm pool), GRPO and evaluation loops (`bicurl/run_loops.py`) --------
    engine = build_engine(policy, c.engine, c.agent.max_context_tokens, run_dir,
                          batch_episodes=c.pools.batch_size * c.agent.episodes_per_state)
    if hasattr(engine, "close"):
        resources.callback(engine.close)  # vLLM
    worker = WorkerSpec(c.policy, c.agent, config.backend, c.engine) if c.ray is not None else None
    loops = open_run_loops(policy, engine, c.agent, c.evaluation, c.pools.batch_size, config.backend,
                           warm_pool=config.sandbox_pool, ray=c.ray, worker=worker)
    resources.callback(loops.close)
    loop, eval_loop = loops.rollouts, loops.evaluation
    checkpoints = Checkpointer(CheckpointConfig(directory=str((run_dir / "checkpoints").resolve())))
    ledger = Ledger(run_dir / "ledger.jsonl")
    writer = report.ScalarWriter(run_dir / "tensorboard")

    judge = RubricJudge(c.judge) if c.judge is not None else None
    if judge is not None:
        judge.check_endpoint()  # a rejected request (wrong model / key) stops here; unreachable only warns

    eval_agent_failed = [0]  # scored cells of the latest evaluation that were agent-caused sandbox failures

    def evaluate(params, purpose: str) -> Summary:
        engine.update_weights(learner.sync_model(params))
        cells = ev.EngineCells(eval_loop, judge, prompt_style=policy.prompt_style)
        summary = ev.evaluate(cells, dataclasses.replace(c.evaluation, purpose=purpose))
        eval_agent_failed[0] = cells.agent_failed
        return summary

    # the untrained / SFT / best copies wait on the host (fp32, exact) and go onto the mesh only when used: at 9B
    # each is 4.5 GB per device that the SFT and GRPO steps need (launch/bench/compile_probe.py)
    untrained = learner.host_copy(learner.params)

    # ---- SFT cold start (once; checkpoint step 0) -----------------------------------------------------
    abstract = {"params": jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                                       learner.params)}
    if 0 in checkpoints.all_steps():
        learner.params = checkpoints.restore(abstract, step=0).state["params"]
    else:
        t0 = time.perf_counter()
        _sft_cold_start(learner, policy, view.sft_rows, c.sft, config, c.agent.max_observation_chars)
        t1 = time.perf_counter()
        sft_eval = evaluate(learner.params, "controller")
        print(f"[bat_jax] SFT cold start done in {t1 - t0:.0f} s; controller evaluation Overall "
              f"{display(sft_eval.overall)} ({time.perf_counter() - t1:.0f} s)", flush=True)
        _round0(run_dir, sft_eval)
        checkpoints.save(0, {"params": learner.params}, metrics={"overall": sft_eval.overall or 0.0},
                         extra={"round": 0})
    sft_params = learner.host_copy(learner.params)
    round0 = _round0(run_dir)

    # ---- rounds ----------------------------------------------------------------------------------------
    records = ledger.read()
    for step in checkpoints.all_steps():  # saved by a round killed before its ledger line: that round is redone
        if step > (records[-1].round if records else 0):
            print(f"[bat_jax] dropping checkpoint {step}: its round is not in the ledger (killed run)", flush=True)
            checkpoints.delete(step)
    controller = ctl.Controller(c.controller, ctl.ControllerState.from_dict(records[-1].controller_state)
                                if records else None)
    stage_scores = dict(records[-1].controller_scores["stage_scores"]) if records else dict(round0.stage_scores)
    if not records:
        controller.observe(0, "ckpt-0", round0)
    best_step = _step(controller.state.best_checkpoint) if controller.state.best_checkpoint else 0
    best_params = learner.host_copy(checkpoints.restore(abstract, step=best_step).state["params"])
    if records:
        learner.params = checkpoints.restore(abstract, step=_step(records[-1].retained_checkpoint)).state["params"]
    rounds = 0 if config.mode == "sft_only" else config.rounds
    kl_prompts = _kl_prompts(view.rl_rows, policy, c.policy_shift)
    block = GRPOBlockConfig(grpo=c.grpo, optimizer=c.grpo_optimizer, micro_batches=c.grpo_micro_batches,
                            episodes_per_state=c.agent.episodes_per_state, max_context_tokens=c.agent.max_context_tokens,
                            prompt_style=c.policy.prompt_style, reward=c.reward, dynamic_sampling=c.dynamic_sampling,
                            max_response_tokens=c.agent.max_response_tokens)
    spares = c.dynamic_sampling.max_extra_rows * config.grpo_steps_per_round if c.dynamic_sampling.enabled else 0
    for r in range(len(records) + 1, rounds + 1):
        t_round = time.perf_counter()
        held = bool(records) and records[-1].decision != "accept"
        decision = _route(stage_scores, round_index=r, held=held, config=c.router)
        rows, pool_cfg = mode_pools(view.rl_rows, config.mode, c.pools)
        round_view = pools.build_round_view(rows, decision.target, round_index=r,
                                            n_batches=config.grpo_steps_per_round, config=pool_cfg,
                                            spares_per_pool=spares)
        spare_items = [item for items in round_view.spares.values() for item in items]
        preflight(manifest, rows=[item.row for item in round_view.items + spare_items], load_state=bank.load_state,
                  source=f"round {r} view").raise_if_leaky()
        metrics = grpo_block(learner, loop, bank, round_view, block, seed=config.seed * 1000 + r, judge=judge)
        summary = evaluate(learner.params, "controller")
        stage_scores = {k.value: v for k, v in summary.stages.items()}
        shift = kl.policy_shift_kl(learner.apply_fn, learner.params, learner.on_mesh(best_params), *kl_prompts,
                                   config=c.policy_shift)
        checkpoints.pin(_needed_steps(controller.state))
        checkpoints.save(r, {"params": learner.params},
                         metrics=None if summary.overall is None else {"overall": summary.overall},
                         extra={"round": r, "summary": report.summary_dict(summary)})
        scores = _evaluation(summary).to_dict()
        if summary.overall is None:  # every controller cell unscored (sandboxes or judge down): no evidence
            scores["overall"] = None  # either way — the candidate is neither accepted nor counted as a drop
            decided = "unscored"
            keep = controller.state.retained_checkpoint or controller.state.best_checkpoint or "ckpt-0"
        else:
            verdict = controller.observe(r, f"ckpt-{r}", _evaluation(summary), kl=shift)
            decided, keep = verdict.decision, verdict.retained_checkpoint
            if verdict.decision == "accept" and verdict.best_checkpoint == f"ckpt-{r}":
                best_params = learner.host_copy(learner.params)
        if keep != f"ckpt-{r}":
            learner.params = checkpoints.restore(abstract, step=_step(keep)).state["params"]
        record = RoundRecord(round=r, selected_stage=decision.target.value, routing_report=decision.report(),
                             pool_counts=round_view.pool_counts(), bank_version=view.version,
                             state_ids=round_view.state_ids(), reward_version=metrics["reward_version"],
                             controller_scores=scores, kl=shift, decision=decided,
                             retained_checkpoint=keep,
                             controller_state=controller.state.to_dict(), rollouts=int(metrics["rollouts"]),
                             unscored_rollouts=int(metrics["unscored"]), eval_cells=summary.n_cells,
                             eval_unscored=summary.n_unscored, agent_failed_rollouts=int(metrics["agent_failed"]),
                             eval_agent_failed=eval_agent_failed[0],
                             pool_reward_before=_finite(metrics["pool_reward_before"]),
                             pool_reward_after=_finite(metrics["pool_reward_after"]),
                             groups_with_variance=int(metrics["groups_with_variance"]),
                             groups_scored=int(metrics["groups_scored"]),
                             update_logp_shift_pos=_finite(metrics["update_logp_shift_pos"]),
                             update_logp_shift_neg=_finite(metrics["update_logp_shift_neg"]),
                             update_token_kl=_finite(metrics["update_token_kl"]),
                             groups_drawn=int(metrics["groups_drawn"]), groups_dropped=int(metrics["groups_dropped"]),
                             groups_trained=int(metrics["groups_trained"]),
                             trained_pool_counts=dict(metrics["trained_pools"]),
                             rollout_mismatch={k: metrics[f"rc_{k}"] for k in rollout_correction.METRICS
                                               if f"rc_{k}" in metrics} or None)
        ledger.append(record)
        records.append(record)
        writer.summary("controller_eval", summary, r)
        for key, value in metrics.items():
            if isinstance(value, float):
                writer.scalar(f"grpo/{key}", value, r)
        print(f"[bat_jax] round {r}: target {decision.target.value}, Overall {display(summary.overall)}, "
              f"KL {shift:.4f}, {decided} → {keep}; reward on its pool {metrics['pool_reward_before']:.3f} → "
              f"{metrics['pool_reward_after']:.3f}, groups with reward variance {record.groups_with_variance}/"
              f"{record.groups_scored}, trained {record.groups_trained} of {record.groups_drawn} drawn "
              f"({time.perf_counter() - t_round:.0f} s)", flush=True)

    # ---- final evaluation on disjoint runs ------------------------------------------------------------
    t_final = time.perf_counter()
    final = {"untrained": evaluate(untrained, "final"), "SFT": evaluate(sft_params, "final")}
    if rounds:
        retained = "BiCuRL (retained)" if config.mode == "bicurl" else "GRPO (E2E task reward)"
        final[retained] = evaluate(best_params, "final")
    print(f"[bat_jax] final evaluation of {len(final)} systems: "
          + ", ".join(f"{name} {display(summary.overall)}" for name, summary in final.items())
          + f" Overall ({time.perf_counter() - t_final:.0f} s)", flush=True)
    if hasattr(engine, "close"):
        engine.close()  # vLLM: free its memory and worker before the reports
    export_retained(learner.sync_model(best_params), run_dir, policy.tokenizer)  # SFT when no round ran
    loops.close()  # Ray rollout workers, the sandbox pool
    return report.write_run_report(run_dir, final, records, round0, writer)


def _finite(value: float) -> float | None:
    """`value`, or None when it is NaN (nothing scored): the ledger holds no NaN."""
    return None if value != value else float(value)


def _needed_steps(state: ctl.ControllerState) -> set[int]:
    """Checkpoint steps a run may still restore: the SFT cold start (0), the controller's best and retained."""
    return {0} | {_step(name) for name in (state.best_checkpoint, state.retained_checkpoint) if name}


def _step(checkpoint: str) -> int:
    """Orbax step of a controller checkpoint name 'ckpt-<round>'."""
    return int(checkpoint.removeprefix("ckpt-"))


def mode_pools(rl_rows: Sequence[RLRow], mode: str, pool_config: pools.PoolConfig
               ) -> tuple[list[RLRow], pools.PoolConfig]:
    """The RL rows and pool config a round of `mode` draws from: all rows and `pool_config` for BiCuRL; for the
    GRPO-E2E baseline only the E2E rows, rewarded by their task metric, in the E2E pool alone."""
    if mode != "grpo_e2e":
        return list(rl_rows), pool_config
    rows = [dataclasses.replace(row, reward_source="task_metric") for row in rl_rows if row.focus == "E2E"]
    return rows, dataclasses.replace(pool_config, omit=("target", "mix"))


def _sft_cold_start(learner: Learner, policy: Policy, rows: Sequence[SFTRow], config: sft.SFTConfig,
                    run: BiCuRLConfig, max_observation_chars: int) -> None:
    """SFT on the bank's SFT rows: loss on the single target action (+ end of turn), paper Appendix A.4.
    Observations in the context are cut to `max_observation_chars`, as rollouts cut them. Each batch is padded
    to the length bucket of its rows (`sft_data.sft_batch`), not to `max_seq_len`."""
    rows = list(rows)[: run.sft_max_rows or None]
    if run.sft_targets == "trajectory":
        examples = trajectory_examples(rows, policy, config.max_seq_len, max_observation_chars)
    else:
        examples = [e for e in (render_sft_row(row, policy, config.max_seq_len, max_observation_chars)
                                for row in rows) if e is not None]
    if not examples:
        raise ValueError(f"no SFT row fits SFTConfig.max_seq_len={config.max_seq_len}")
    targets = sum(int(np.sum(np.diff(e["loss_mask"], prepend=0) == 1)) for e in examples)
    print(f"[bat_jax] SFT cold start: {len(examples)} sequences holding {targets} of the {len(rows)} rows' target "
          f"actions within {config.max_seq_len} tokens; {config.total_steps} steps × {config.global_batch_size}",
          flush=True)
    step_fn, state = learner.sft_block(config, config.total_steps)
    rng = np.random.default_rng(run.seed)
    bar = tqdm(range(config.total_steps), desc="SFT", unit="step")
    for i in bar:
        state, metrics = step_fn(state, sft_batch(examples, config.global_batch_size, rng, config.max_seq_len))
        if i % 10 == 9:
            bar.set_postfix(nll=f"{float(metrics['nll']):.3f}")  # token-mean NLL of this batch's target actions
    learner.adopt(state)


def _route(stage_scores: Mapping[str, float | None], *, round_index: int, held: bool,
           config: router.RouterConfig) -> router.RoutingDecision:
    """The router's choice; when every stage is unscored (e.g. the LLM judge was unreachable for a whole
    evaluation) the earliest stage, recorded as rule 'no_scored_stage', so the run goes on."""
    if any(v is not None for v in stage_scores.values()):
        return router.route(stage_scores, round_index=round_index, held=held, config=config)
    return router.RoutingDecision(round_index=round_index, target=STAGES[0], rule="no_scored_stage",
                                  scores_in={s.value: None for s in STAGES}, reference_scores=None, regressions={},
                                  held=held)


def _kl_prompts(rows: Sequence[RLRow], policy: Policy, config: kl.PolicyShiftConfig
                ) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded prompt ids of up to `num_prompts` Stage Bank RL rows (the held-out KL probe set)."""
    prompts = []
    for row in list(rows)[: config.num_prompts]:
        messages, tools = first_messages(row.prompt, row.skill, policy.prompt_style)
        # through the EpisodeBuilder: text in briefs and skills never becomes a control id
        prompts.append(list(EpisodeBuilder(policy.tokenizer, policy.family).start(messages, tools)))
    batch = pad_batch([{"input_ids": np.asarray(p, np.int32), "attention_mask": np.ones(len(p), np.int32)}
                       for p in prompts], multiple=1)
    return batch["input_ids"], batch["attention_mask"]


def _round0(run_dir: pathlib.Path, summary: Summary | None = None) -> ctl.Evaluation:
    """The SFT policy's controller evaluation (round 0): written once, read back on resume."""
    path = run_dir / "round0_eval.json"
    if summary is not None:
        atomic_write(path, json.dumps(_evaluation(summary).to_dict()).encode())
    return ctl.Evaluation.from_dict(json.loads(path.read_text()))
