"""The micro BiCuRL configuration the experiment tests share; one source, the gin text below.

A tiny Qwen3.5 (2 layers, hidden size 32), a Stage Bank over two tracks (success outcomes, local sandbox
backend), 2 SFT steps of 2 rows (sequences up to 4096 tokens), GRPO groups of 2 on batches of 4 rows, 2
episodes per state of at most 2 assistant turns / 64 response tokens, a held-out evaluation of 1 repeat on one
track, KL over 4 prompts.

* `gin_text(bank_dir)`: the run file the recovery tests launch with `python -m bat_jax.launch` (2 rounds of 1
  GRPO step, seed 42);
* `components(bank_dir)`: the `experiment.Components` that run file binds, parsed from the same text, for the
  in-process runs (which pass their own `BiCuRLConfig`);
* `seeded(bank_dir)`: `bank_dir` holding the micro bank's work cache, so that its build reads 12 sources back
  instead of playing them in sandboxes again (~18 s of 2 cores per build).
"""

import dataclasses
import fcntl
import os
import shutil
from pathlib import Path

#: The session's micro-bank cache folder (set by tests/conftest.py for the session and the processes it starts).
CACHE_ENV = "BAT_MICRO_BANK_CACHE"

MODEL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
         "linear_num_key_heads": 1, "linear_num_value_heads": 2, "max_position_embeddings": 8192}
TRACKS = ("segmentation", "vqa")
EVAL_TRACKS = ("segmentation",)

_GIN = """\
from __gin__ import dynamic_registration
import bat_jax.launch as launch
import bat_jax.bicurl.experiment as experiment
import bat_jax.bicurl.grpo_round as grpo_round
import bat_jax.policy as policy
import bat_jax.stage_bank.factory as factory
import bat_jax.stage_bank.pools as pools
import bat_jax.learn.grpo as grpo
import bat_jax.learn.sft as sft
import bat_jax.learn.optim as optim
import bat_jax.learn.kl as kl
import bat_jax.rollout.agent_loop as agent_loop
import bat_jax.rollout.sampling as sampling
import bat_jax.bicurl.evaluation as evaluation
import bat_jax.benchmarks.imaging.benchmark as imaging

launch.run:
  job = @experiment.run
  run_name = 'micro'
experiment.run:
  config = @experiment.BiCuRLConfig()
  components = @experiment.Components()
experiment.BiCuRLConfig:
  rounds = 2
  grpo_steps_per_round = 1
  backend = 'local'
  seed = 42
experiment.Components:
  benchmark = @imaging.ImagingBenchmark()
  policy = @policy.PolicyConfig()
  bank = @factory.FactoryConfig()
  sft = @sft.SFTConfig()
  block = @grpo_round.GRPOBlockConfig()
  pools = @pools.PoolConfig()
  agent = @agent_loop.AgentLoopConfig()
  sampling = @sampling.SamplingConfig()
  evaluation = @evaluation.EvalConfig()
  policy_shift = @kl.PolicyShiftConfig()
grpo_round.GRPOBlockConfig.grpo = @grpo.GRPOConfig()
policy.PolicyConfig.tiny = {model}
factory.FactoryConfig:
  bank_dir = '{bank_dir}'
  tracks = {tracks}
  outcomes = ('success',)
  backend = 'local'
sft.SFTConfig:
  optimizer = @sft/optim.OptimizerConfig()
  global_batch_size = 2
  total_steps = 2
  max_seq_len = 4096
sft/optim.OptimizerConfig.learning_rate = 1e-3
sampling.SamplingConfig.group_size = 2
pools.PoolConfig.batch_size = 4
agent_loop.AgentLoopConfig:
  max_assistant_turns = 2
  max_tool_calls = 2
  max_response_tokens = 64
  max_tokens_per_turn = 32
  max_context_tokens = 8192
  progress = False
evaluation.EvalConfig:
  repeats = 1
  tracks = {eval_tracks}
  max_turns = 2
kl.PolicyShiftConfig:
  num_prompts = 4
  batch_size = 2
"""


def gin_text(bank_dir) -> str:
    """The micro run file, with the Stage Bank at `bank_dir`."""
    return _GIN.format(model=MODEL, bank_dir=bank_dir, tracks=TRACKS, eval_tracks=EVAL_TRACKS)


def components(bank_dir):
    """The `experiment.Components` of `gin_text(bank_dir)` (gin is cleared before and after)."""
    import gin

    from bat_jax.bicurl import experiment

    gin.clear_config()
    try:
        gin.parse_config(gin_text(bank_dir))
        return gin.get_configurable(experiment.Components)()
    finally:
        gin.clear_config()


def seeded(bank_dir) -> Path:
    """`bank_dir` (which must not exist yet), created holding the micro Stage Bank's cached sources and states.

    The cache is built once per test session in `$BAT_MICRO_BANK_CACHE` (one process builds it, under a file lock) with
    the held-out manifest an experiment run writes. The factory reuses a cached source only under its own key (config,
    benchmark, code, held-out manifest), so a test with other settings builds what differs as before. Without the
    variable (outside pytest) `bank_dir` is returned untouched.
    """
    bank_dir = Path(bank_dir)
    if not os.environ.get(CACHE_ENV):
        return bank_dir
    cache = Path(os.environ[CACHE_ENV])
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (cache / "bank" / "work" / "build_report.json").is_file():
            _build(cache)
    for part in ("work/sources", "states"):
        shutil.copytree(cache / "bank" / part, bank_dir / part)
    return bank_dir


def _build(cache: Path) -> None:
    from bat_jax.bicurl import evaluation
    from bat_jax.stage_bank.factory import build_bank

    comps = components(cache / "bank")
    manifest = evaluation.write_heldout_manifest(cache / "heldout_manifest.json", comps.evaluation, comps.benchmark)
    build_bank(dataclasses.replace(comps.bank, heldout_manifest=str(manifest)), comps.benchmark, progress=False)
