"""The evaluate-only launch job (bat_jax/bicurl/evaluate_only.py) against the evaluation a BiCuRL run does for its
final rows (`evaluation.evaluate` over `evaluation.EngineCells`, one E2E episode per cell), on the tiny default
policy with the local backend and one track; and its gin file (gin/evaluate_small.gin) binds the SmolLM2 policy."""

import dataclasses
import inspect
import json

import gin

from bat_jax import launch, report
from bat_jax.bicurl import evaluate_only
from bat_jax.bicurl import evaluation as ev
from bat_jax.bicurl.engines import EngineConfig, build_engine
from bat_jax.bicurl.evaluation import EngineCells
from bat_jax.bicurl.experiment import Components
from bat_jax.policy import PolicyConfig, build_policy, make_agent_loop
from bat_jax.prompts import PromptFormat
from bat_jax.rollout.agent_loop import AgentLoopConfig
from bat_jax.sandbox.backends import backend_factory
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark

IMAGING = ImagingBenchmark()
COMPONENTS = Components(
    benchmark=IMAGING,
    policy=PolicyConfig(architecture="qwen3", tiny={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2},
                        prompt_style="compact"),
    agent=AgentLoopConfig(max_assistant_turns=2, max_tokens_per_turn=12, max_response_tokens=24,
                          max_context_tokens=1024, max_workers=2, progress=False),
    evaluation=ev.EvalConfig(repeats=2, tracks=("classification",), max_turns=2),
    engine=EngineConfig(max_batch=2))


def test_job_writes_the_summary_of_the_runs_final_evaluation(tmp_path):
    out = evaluate_only.run(tmp_path, COMPONENTS, backend="local", purpose="final", system="tiny (untrained)")
    # the reference: what experiment.run's `evaluate(untrained, "final")` does, on a fresh copy of the policy
    policy = build_policy(COMPONENTS.policy)
    loop = make_agent_loop(policy, build_engine(policy, COMPONENTS.engine, COMPONENTS.agent.max_context_tokens, tmp_path), backend_factory("local"),
                           dataclasses.replace(COMPONENTS.agent, max_assistant_turns=2,
                                               sampling=dataclasses.replace(COMPONENTS.sampling, group_size=1)))
    want = ev.evaluate(EngineCells(loop, IMAGING, prompt=PromptFormat.of(IMAGING, "compact")),
                       dataclasses.replace(COMPONENTS.evaluation, purpose="final"), IMAGING)
    assert want.n_cells == 2
    written = json.loads((tmp_path / "evaluation.json").read_text())
    assert written == json.loads(json.dumps(out))
    assert written["summary"] == json.loads(json.dumps(report.summary_dict(want)))
    assert (written["system"], written["purpose"], written["backend"]) == ("tiny (untrained)", "final", "local")
    assert written["eval_s"] > 0
    assert (tmp_path / "evaluation.md").read_text().splitlines()[2].startswith("tiny (untrained)")


def test_evaluate_small_gin_binds_the_smollm2_policy_and_the_final_slice():
    launch.parse_gin(["evaluate_small.gin"], [])
    job = gin.query_parameter("launch.run.job").scoped_configurable_fn  # gin's wrapper of the function
    assert (job.__module__, job.__name__) == ("bat_jax.bicurl.evaluate_only", "run")
    assert "purpose" not in gin.get_bindings("evaluate_only.run")  # the job's default, 'final'
    assert inspect.signature(evaluate_only.run).parameters["purpose"].default == "final"
    assert gin.query_parameter("experiment.Components.benchmark").configurable.wrapped is ImagingBenchmark
    assert gin.query_parameter("policy.PolicyConfig.chat_family") == "chatml"
    assert gin.query_parameter("policy.PolicyConfig.prompt_style") == "compact"
    assert gin.query_parameter("policy.PolicyConfig.checkpoint_dir") == "runs/smollm2-135m-instruct"
