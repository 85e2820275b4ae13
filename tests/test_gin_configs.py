"""Every gin file under gin/ parses and (for run files) configures a job (MaxText-style config validation)."""

import pathlib
import re

import gin
import pytest

from bat_jax import launch
from doubles import assert_rounds_fit_the_tiny_bank

GIN_DIR = launch.DEFAULT_GIN_DIR
ALL = sorted(str(p.relative_to(GIN_DIR)) for p in GIN_DIR.rglob("*.gin"))
#: Files that bind the job or the run's name (`launch.run.job` / `.run_name`, alone or in a `launch.run:` block):
#: the top-level run files.
RUN_FILES = [name for name in ALL
             if re.search(r"^(launch\.run\.|  )(job|run_name)\s*=", (GIN_DIR / name).read_text(), re.M)]


def resolved(binding: str):
    """The value `binding` (e.g. 'pools.PoolConfig.target') has in the parsed configuration: its bound value (a
    macro followed), else the parameter's default in the code."""
    try:
        value = gin.query_parameter(binding)
    except ValueError:  # not bound: the dataclass's (or function's) default
        selector, param = binding.rsplit(".", 1)
        return default_of(selector, param)
    return gin.query_parameter(str(value)) if str(value).startswith("%") else value


def test_gin_tree_has_the_design_card_files():
    for name in ("bicurl_9b.gin", "bicurl_4b.gin", "bicurl_tiny.gin"):
        assert name in RUN_FILES


@pytest.mark.parametrize("name", ALL)
def test_gin_file_parses(name):
    launch.parse_gin([name], [])


@pytest.mark.parametrize("name", RUN_FILES)
def test_run_file_binds_a_job_and_the_papers_numbers(name):
    launch.parse_gin([name], [])
    assert callable(gin.query_parameter("launch.run.job").scoped_configurable_fn)
    assert isinstance(gin.query_parameter("launch.run.run_name"), str)


PAPER_NUMBERS = {
    "pools.PoolConfig.target": 0.5,
    "pools.PoolConfig.mix": 0.25,
    "pools.PoolConfig.e2e": 0.25,
    "controller.ControllerConfig.kl_threshold": 0.1,
    "controller.ControllerConfig.patience": 3,
    "sampling.SamplingConfig.group_size": 4,
    "sampling.SamplingConfig.temperature": 0.7,
    "grpo.GRPOConfig.kl_coef": 1e-3,
}
#: The paper's actor learning rate; the tiny default trains a random-init model for a few GRPO steps only and
#: uses a larger one (stated in bicurl_tiny.gin).
GRPO_LR = {"bicurl_9b.gin": 1e-6, "bicurl_4b.gin": 1e-6, "bicurl_tiny.gin": 1e-4, "bicurl_small.gin": 1e-5,
           "bicurl_9b_lora.gin": 1e-5}


@pytest.mark.parametrize("name", ["bicurl_9b.gin", "bicurl_4b.gin", "bicurl_tiny.gin", "bicurl_small.gin",
                                  "bicurl_9b_lora.gin"])
def test_bicurl_files_carry_the_design_card_numbers(name):
    launch.parse_gin([name], [])
    for binding, expected in PAPER_NUMBERS.items():
        assert resolved(binding) == expected, binding
    assert gin.query_parameter("grpo/optim.OptimizerConfig.learning_rate") == GRPO_LR[name]


@pytest.mark.parametrize("name, style, layouts", [("bicurl_9b.gin", None, None), ("bicurl_4b.gin", None, None),
                                                  ("bicurl_tiny.gin", "compact", "varied"),
                                                  ("bicurl_small.gin", "compact", "varied")])
def test_only_the_tiny_default_prompts_compactly_on_seed_drawn_layouts(name, style, layouts):
    """Small policies get compact prompts, varied training layouts and the portable teacher; paper
    scale keeps the full prompts (PolicyConfig's default 'full') and the factory's default teacher."""
    from bat_jax.policy import PolicyConfig
    from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark

    launch.parse_gin([name], [])
    bound = gin.get_bindings("policy.PolicyConfig")
    assert bound.get("prompt_style") == style
    assert gin.query_parameter("experiment.Components.benchmark").configurable.wrapped is ImagingBenchmark
    assert gin.get_bindings("imaging.ImagingBenchmark").get("layouts") == layouts
    assert "layouts" not in gin.get_bindings("factory.FactoryConfig")
    assert resolved("factory.FactoryConfig.teacher") == ("portable" if style else "scripted")
    assert PolicyConfig().prompt_style == "full"
    if name == "bicurl_tiny.gin":  # the Data Factory job alone builds the same bank
        launch.parse_gin(["stage_bank_tiny.gin"], [])
        assert gin.query_parameter("experiment.build_stage_bank.benchmark").configurable.wrapped is ImagingBenchmark
        assert gin.get_bindings("imaging.ImagingBenchmark")["layouts"] == "varied"
        assert gin.get_bindings("factory.FactoryConfig")["teacher"] == "portable"


@pytest.mark.parametrize("name, engine", [("bicurl_9b.gin", "vllm"), ("bicurl_4b.gin", "vllm"),
                                          ("bicurl_tiny.gin", "jax"), ("bicurl_small.gin", "jax"),
                                          ("bicurl_9b_lora.gin", "jax")])
def test_paper_scale_files_roll_out_on_vllm_and_the_tiny_default_on_the_jax_sampler(name, engine):
    launch.parse_gin([name], [])
    try:
        value = gin.query_parameter("engines.EngineConfig.kind")
    except ValueError:  # not bound: the dataclass default
        value = "jax"
    assert value == engine
    if engine == "vllm":
        assert gin.query_parameter("engines.EngineConfig.vllm_options")["dtype"] == "bfloat16"
        # turns served in flight: one call per ready turn, at least a GRPO batch's episodes (rows x K) at once
        episodes = resolved("pools.PoolConfig.batch_size") * resolved("sampling.SamplingConfig.group_size")
        assert gin.query_parameter("agent_loop.AgentLoopConfig.max_generate_batch") == 1
        assert gin.query_parameter("agent_loop.AgentLoopConfig.max_concurrent_generate") >= episodes


def test_the_readme_judge_bindings_parse_on_the_run_files():
    from bat_jax.verify.judge import JudgeConfig

    launch.parse_gin(["bicurl_tiny.gin"], ["experiment.Components.judge = @judge.JudgeConfig()",
                                           "judge/chat_endpoint.ChatEndpointConfig.base_url = 'http://localhost:8000/v1'",
                                           "judge/chat_endpoint.ChatEndpointConfig.model = 'my-judge'"])
    components = gin.get_bindings("bat_jax.bicurl.experiment.Components")
    judge = components["judge"]
    assert isinstance(judge, JudgeConfig)
    endpoint = judge.endpoint
    assert (endpoint.base_url, endpoint.model, judge.items) == ("http://localhost:8000/v1", "my-judge", ("plan.written",))
    assert (endpoint.timeout_s, endpoint.max_retries, endpoint.max_tokens) == (120.0, 2, 4096)
    assert judge.context_tokens == 16384


def test_bicurl_small_trains_the_pretrained_smollm2_in_its_own_chatml_template():
    from bat_jax.policy import PolicyConfig

    launch.parse_gin(["bicurl_small.gin"], [])
    assert gin.query_parameter("launch.run.run_name") == "bicurl_small"
    bound = gin.get_bindings("policy.PolicyConfig")
    config = PolicyConfig(**bound)
    assert (config.chat_family, config.checkpoint_dir, dict(config.tiny)) == ("chatml", "runs/smollm2-135m-instruct", {})
    assert gin.query_parameter("sft/optim.OptimizerConfig.learning_rate") == 1e-4


def test_the_tiny_lora_file_is_the_tiny_default_with_an_adapter():
    """`bicurl_tiny_lora.gin`: the tiny default's bindings, the policy gains a rank-8, alpha-16 adapter and the learning
    rates are 10x the tiny default's."""
    from bat_jax.models.lora import DEFAULT_TARGETS, LoRAConfig
    from bat_jax.policy import PolicyConfig

    launch.parse_gin(["bicurl_tiny.gin"], [])
    tiny = {k: v for k, v in _config_snapshot().items()}
    launch.parse_gin(["bicurl_tiny_lora.gin"], [])
    assert gin.query_parameter("launch.run.run_name") == "bicurl_tiny_lora"
    config = gin.get_configurable(PolicyConfig)()  # as the run builds it, the reference called
    adapter = config.lora
    assert isinstance(adapter, LoRAConfig)
    assert (adapter.rank, adapter.alpha, adapter.scale, adapter.target_modules) == (8, 16.0, 2.0, DEFAULT_TARGETS)
    assert config.prompt_style == "compact" and dict(config.tiny) == dict(tiny[("", "bat_jax.policy.PolicyConfig")]
                                                                           .get("tiny", {}))
    # LoRA's learning rates: 10x the tiny default's ("LoRA Without Regret")
    assert gin.query_parameter("sft/optim.OptimizerConfig.learning_rate") == 3e-2
    assert gin.query_parameter("grpo/optim.OptimizerConfig.learning_rate") == 1e-3
    changed = {key for key, params in _config_snapshot().items() if tiny.get(key) != params}
    assert changed == {("", "bat_jax.launch.run"), ("", "bat_jax.policy.PolicyConfig"),
                       ("", "bat_jax.models.lora.LoRAConfig"), ("sft", "bat_jax.learn.optim.OptimizerConfig"),
                       ("grpo", "bat_jax.learn.optim.OptimizerConfig")}
    for scope, tiny_lr in (("sft", 3e-3), ("grpo", 1e-4)):
        assert tiny[(scope, "bat_jax.learn.optim.OptimizerConfig")]["learning_rate"] == tiny_lr
    gin.clear_config(clear_constants=True)


def test_the_9b_lora_file_is_bicurl_9b_with_an_adapter_on_one_device():
    """`bicurl_9b_lora.gin`: bicurl_9b.gin's bindings but the adapter (rank 32, alpha 32, bf16 base), one device (one
    row per micro-batch, as at fsdp = 8), the JAX sampler with JAX's 0.9 share, and 10x the learning rates."""
    from bat_jax.models.lora import LoRAConfig
    from bat_jax.policy import PolicyConfig

    launch.parse_gin(["bicurl_9b.gin"], [])
    full = _config_snapshot()
    launch.parse_gin(["bicurl_9b_lora.gin"], [])
    adapter = gin.get_configurable(PolicyConfig)().lora
    assert isinstance(adapter, LoRAConfig) and (adapter.rank, adapter.alpha, adapter.base_dtype) == (32, 32.0,
                                                                                                     "bfloat16")
    assert (resolved("mesh.MeshConfig.data"), resolved("mesh.MeshConfig.fsdp"), resolved("mesh.MeshConfig.tensor")) \
        == (1, 1, 1)
    assert (gin.query_parameter("sft.SFTConfig.num_micro_batches"), resolved("sft.SFTConfig.global_batch_size")) == (
        64, 64)
    assert gin.query_parameter("grpo_round.GRPOBlockConfig.micro_batches") == 32
    assert gin.query_parameter("launch.run.xla_memory_fraction") == 0.9
    for scope, full_lr in (("sft", 2e-5), ("grpo", 1e-6)):
        assert full.get((scope, "bat_jax.learn.optim.OptimizerConfig"), {}).get(  # unbound: OptimizerConfig's 2e-5
            "learning_rate", 2e-5) == full_lr
        assert gin.query_parameter(f"{scope}/optim.OptimizerConfig.learning_rate") == pytest.approx(10 * full_lr)
    assert gin.query_parameter("policy.PolicyConfig.checkpoint_dir") == "/models/Qwen3.5-9B-Instruct"
    changed = {key for key, params in _config_snapshot().items() if full.get(key) != params}
    assert changed == {("", "bat_jax.launch.run"), ("", "bat_jax.policy.PolicyConfig"),
                       ("", "bat_jax.models.lora.LoRAConfig"), ("", "bat_jax.models.mesh.MeshConfig"),
                       ("", "bat_jax.learn.sft.SFTConfig"), ("", "bat_jax.bicurl.grpo_round.GRPOBlockConfig"),
                       ("", "bat_jax.bicurl.engines.EngineConfig"), ("sft", "bat_jax.learn.optim.OptimizerConfig"),
                       ("grpo", "bat_jax.learn.optim.OptimizerConfig")}
    gin.clear_config(clear_constants=True)


@pytest.mark.parametrize("name", ["bicurl_tiny.gin", "baseline_grpo_e2e_tiny.gin"])
def test_tiny_run_files_can_draw_every_round_from_the_tiny_bank(name):
    launch.parse_gin([name], [])
    assert_rounds_fit_the_tiny_bank(name)


def test_released_preset_over_the_tiny_default_binds_the_released_objective():
    """`presets/released_bat.gin` after a run file: the released run's objective (REFERENCE.md, released code's
    launch on verl defaults); everything else stays the run file's."""
    from bat_jax.curriculum.controller import RULE_GATE, ControllerConfig, NonInferiorityMargins
    from bat_jax.curriculum.router import RouterConfig
    from bat_jax.learn.grpo import GRPOConfig
    from bat_jax.learn.optim import OptimizerConfig

    assert "presets/released_bat.gin" in ALL and "presets/released_bat.gin" not in RUN_FILES
    launch.parse_gin(["bicurl_tiny.gin", "presets/released_bat.gin"], [])
    grpo = GRPOConfig(**{k: gin.query_parameter(v[1:]) if isinstance(v, str) and v.startswith("%") else v
                         for k, v in gin.get_bindings("grpo.GRPOConfig").items()})
    assert (grpo.kl_coef, grpo.kl_estimator, grpo.kl_value_clamp, grpo.log_ratio_clamp) == (0.006, "k3", 10.0, 20.0)
    assert (grpo.eps_low, grpo.eps_high, grpo.dual_clip) == (0.2, 0.2, 3.0)
    assert (grpo.loss_agg, grpo.adv_std_normalize, grpo.entropy_coef, grpo.epochs) == (
        "seq-mean-token-mean", False, 0.0, 1)
    assert resolved("sampling.SamplingConfig.group_size") == 4  # the run file's K and T, as released
    assert resolved("sampling.SamplingConfig.temperature") == 0.7
    opt = OptimizerConfig(**gin.get_bindings("grpo/optim.OptimizerConfig"))
    assert (opt.learning_rate, opt.schedule, opt.warmup_ratio, opt.weight_decay, opt.grad_clip_norm) == (
        2.5e-7, "constant", 0.0, 0.01, 1.0)
    ctl = ControllerConfig(**gin.get_bindings("controller.ControllerConfig"))
    assert (ctl.acceptance, ctl.kl_threshold, ctl.margins) == (RULE_GATE, None, NonInferiorityMargins())
    assert RouterConfig(**gin.get_bindings("router.RouterConfig")).corrective is True
    assert gin.query_parameter("launch.run.run_name") == "bicurl_tiny"  # the run file still names the job
    assert gin.query_parameter("dynamic_sampling.DynamicSamplingConfig.enabled") is False  # on in the tiny default
    launch.parse_gin(["bicurl_9b.gin", "presets/released_bat.gin"], [])  # paper scale, as the released run
    assert gin.get_bindings("grpo.GRPOConfig")["dual_clip"] == 3.0
    assert gin.query_parameter("grpo/optim.OptimizerConfig.learning_rate") == 2.5e-7
    # dynamic sampling: off at paper scale, one binding turns it on (the base file binds the component)
    launch.parse_gin(["bicurl_9b.gin"], ["dynamic_sampling.DynamicSamplingConfig.enabled = True"])
    from bat_jax.bicurl.experiment import Components

    assert gin.get_configurable(Components)().block.dynamic_sampling.enabled is True
    launch.parse_gin(["bicurl_9b.gin"], [])
    assert gin.get_configurable(Components)().block.dynamic_sampling.enabled is False
    # the run file alone keeps the paper's objective
    launch.parse_gin(["bicurl_tiny.gin"], [])
    assert resolved("grpo.GRPOConfig.kl_coef") == 1e-3
    assert "dual_clip" not in gin.get_bindings("grpo.GRPOConfig")
    assert resolved("controller.ControllerConfig.acceptance") == "fallback"


def test_the_tiny_default_turns_the_factory_on_with_one_binding():
    from bat_jax.bicurl import experiment
    from bat_jax.stage_bank.factory_loop import FactoryLoopConfig

    launch.parse_gin(["bicurl_tiny.gin"], [])
    assert gin.get_configurable(experiment.Components)().factory_loop is None  # off by default
    launch.parse_gin(["bicurl_tiny.gin"], ["experiment.Components.factory_loop = @factory_loop.FactoryLoopConfig()"])
    components = gin.get_configurable(experiment.Components)()
    assert components.factory_loop == FactoryLoopConfig(idle_s=30.0, pause_s=60.0)
    assert gin.get_configurable(experiment.BiCuRLConfig)().bank_version == "latest"
    launch.parse_gin(["stage_bank_async_tiny.gin"], [])
    assert resolved("steering.SteeringRule.weak_share") == 0.5


def test_the_rehearsal_preset_has_its_own_optimizer_and_leaves_the_cold_start_alone():
    """presets/rehearsal.gin over the tabular tiny file: 3 SFT steps a round at a constant 1e-4, the cold start's batch
    and length; the cold start keeps its 120 steps at 3e-3 (cosine). Without the preset: no rehearsal."""
    from bat_jax.bicurl import experiment
    from bat_jax.learn.optim import OptimizerConfig

    try:
        launch.parse_gin(["tabular_tiny.gin"], [])
        assert gin.get_configurable(experiment.Components)().rehearsal is None
        launch.parse_gin(["tabular_tiny.gin", "presets/rehearsal.gin"], [])
        components = gin.get_configurable(experiment.Components)()
        assert components.rehearsal.optimizer == OptimizerConfig(learning_rate=1e-4, schedule="constant",
                                                                 warmup_ratio=0.0)
        assert (components.rehearsal.total_steps, components.rehearsal.global_batch_size,
                components.rehearsal.max_seq_len) == (3, components.sft.global_batch_size, components.sft.max_seq_len)
        assert (components.sft.total_steps, components.sft.optimizer.learning_rate,
                components.sft.optimizer.schedule) == (120, 3e-3, "cosine")
    finally:
        gin.clear_config(clear_constants=True)


def test_one_sampling_binding_reaches_the_loop_and_grpo_and_the_old_bindings_are_gone():
    """`sampling.SamplingConfig` is the one place K and the temperature are bound: a binding reaches the agent loop and
    GRPO alike (the same object); the loop's and GRPO's own former fields no longer exist, so a binding of one of
    them fails naming it; gin is cleared afterwards."""
    from bat_jax.bicurl import experiment
    from bat_jax.rollout.sampling import SamplingConfig

    try:
        launch.parse_gin(["bicurl_tiny.gin"], ["sampling.SamplingConfig.temperature = 0.9",
                                               "sampling.SamplingConfig.group_size = 2"])
        comps = gin.get_configurable(experiment.Components)()
        assert comps.agent.sampling is comps.block.grpo.sampling is comps.sampling
        assert comps.sampling == SamplingConfig(group_size=2, temperature=0.9)
        for old in ("agent_loop.AgentLoopConfig.temperature", "agent_loop.AgentLoopConfig.episodes_per_state",
                    "grpo.GRPOConfig.temperature", "grpo.GRPOConfig.group_size"):
            with pytest.raises(launch.LaunchError, match=rf"{old.rpartition('.')[0]}' doesn't have a parameter"):
                launch.parse_gin(["bicurl_tiny.gin"], [f"{old} = 2"])
    finally:
        gin.clear_config(clear_constants=True)


#: The files the default check reads: the run files and their bases, at the top of gin/. The overlays in its
#: folders (mesh/, rollout/, presets/) are given after or inside a run file and state their whole setting, defaults
#: included, because the run file may bind those fields otherwise (e.g. `rollout/mesh_sampler.gin`'s engine kind
#: 'jax' over paper scale's 'vllm').
TOP_LEVEL = [name for name in ALL if "/" not in name]


def _config_snapshot() -> dict:
    """gin's parsed bindings, (scope, selector) -> {parameter: value}, copied."""
    return {key: dict(params) for key, params in gin.config._CONFIG.items()}


def own_bindings(name: str, gin_dir: pathlib.Path = GIN_DIR) -> list[tuple[str, str, object, bool]]:
    """(selector, parameter, value, overrides) of each binding gin file `name` makes itself: a value its includes
    do not already give that parameter (bindings of gin macros and configurable references included); `overrides`:
    an include binds the parameter to another value."""
    text = (gin_dir / name).read_text()
    includes = re.findall(r"^include '([^']+)'", text, re.M)
    if includes:
        launch.parse_gin(includes, [], [str(gin_dir)])
    else:
        gin.clear_config(clear_constants=True)
    before = _config_snapshot()
    launch.parse_gin([name], [], [str(gin_dir)])
    after = _config_snapshot()
    out = []
    for (scope, selector), params in after.items():
        old = before.get((scope, selector), {})
        for param, value in params.items():
            if param not in old or not _same(old[param], value):
                out.append(((f"{scope}/" if scope else "") + selector, param, value, param in old))
    return out


def _same(a, b) -> bool:
    """Equal values of the same kind (True is not 1, 1 is not 1.0 when one of them is a bool)."""
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    try:
        return bool(a == b)
    except Exception:  # e.g. arrays
        return False


def default_of(selector: str, param: str):
    """The default of `param` of the configurable gin knows as `selector` (a dataclass field's default or a
    function's keyword default); `inspect.Parameter.empty` when it has none."""
    import dataclasses
    import inspect

    fn = gin.config._REGISTRY.get_match(selector.split("/")[-1]).wrapped
    if dataclasses.is_dataclass(fn):
        field = {f.name: f for f in dataclasses.fields(fn)}.get(param)
        if field is None:
            return inspect.Parameter.empty
        if field.default is not dataclasses.MISSING:
            return field.default
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        return inspect.Parameter.empty
    parameter = inspect.signature(fn).parameters.get(param)
    return inspect.Parameter.empty if parameter is None else parameter.default


def restated_defaults(name: str, gin_dir: pathlib.Path = GIN_DIR) -> list[str]:
    """The bindings of `name` (its own, not its includes') whose value is the bound parameter's default."""
    import inspect

    found = []
    for selector, param, value, overrides in own_bindings(name, gin_dir):
        if overrides or isinstance(value, gin.config.ConfigurableReference):
            continue  # a reference wires a component so its own bindings apply; a macro is one shared value
        default = default_of(selector, param)
        if default is not inspect.Parameter.empty and _same(value, default):
            found.append(f"{selector}.{param} = {value!r}")
    return sorted(found)


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_no_binding_restates_a_default(name):
    """A run file binds what differs from the code's defaults; a value equal to the default is said only to
    override an included file's other value (e.g. `tabular_tiny.gin`'s teacher 'scripted' over the tiny default's
    'portable')."""
    assert restated_defaults(name) == [], f"{name} restates defaults"
    gin.clear_config(clear_constants=True)


def test_the_default_check_sees_a_restated_default_and_an_override_back_to_it(tmp_path):
    """Hand-built files: `rounds = 10` (BiCuRLConfig's default) alone is a restatement; `rounds = 10` after an
    include binding 3 is an override; `rounds = 3` is neither; a reference (`@pools.PoolConfig()`) never is."""
    from bat_jax.bicurl.experiment import BiCuRLConfig
    from bat_jax.learn.grpo import GRPOConfig

    assert BiCuRLConfig().rounds == 10 and GRPOConfig().clip_eps == 0.2
    head = ("from __gin__ import dynamic_registration\nimport bat_jax.bicurl.experiment as experiment\n"
            "import bat_jax.learn.grpo as grpo\nimport bat_jax.stage_bank.pools as pools\n")
    (tmp_path / "three.gin").write_text(head + "experiment.BiCuRLConfig.rounds = 3\n")
    (tmp_path / "restated.gin").write_text(head + "experiment.BiCuRLConfig.rounds = 10\ngrpo.GRPOConfig.clip_eps = 0.2\n"
                                           "experiment.Components.pools = @pools.PoolConfig()\n")
    (tmp_path / "back.gin").write_text(head + "include 'three.gin'\nexperiment.BiCuRLConfig.rounds = 10\n")
    try:
        assert restated_defaults("restated.gin", tmp_path) == ["bat_jax.bicurl.experiment.BiCuRLConfig.rounds = 10",
                                                               "bat_jax.learn.grpo.GRPOConfig.clip_eps = 0.2"]
        assert restated_defaults("back.gin", tmp_path) == []
        assert restated_defaults("three.gin", tmp_path) == []
    finally:
        gin.clear_config(clear_constants=True)
