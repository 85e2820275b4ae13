"""WORKSPACE.md's map of the code is complete, and the tests mirror the package.

Every module `bat_jax/<package>/<name>.py` has a test file named after it: `tests/test_<name>.py` (when no other
module is called `<name>`) or `tests/test_<package>_<name>.py`. A module may have more test files, one per aspect:
`tests/test_<its test file's stem>_<aspect>.py`. Test files about no single module (red-team, end-to-end, property
suites, the launch scripts) are listed in `SUITES` and in WORKSPACE.md. Shared test doubles live in the
`tests/doubles` package: no test file imports another.
"""

import ast
import collections
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

#: Test files about no single module of `bat_jax`, and what each checks.
SUITES = {
    "test_layers.py": "imports point down the layers of the package",
    "test_workspace_map.py": "this map: modules, test files, no test importing another",
    "test_docstrings.py": "the package's docstrings: a one-line summary first, few long sentences",
    "test_docs.py": "README as a landing page, docs/ links, anchors and named paths",
    "test_conftest_devices.py": "the test session's setup: 8 fake CPU devices, one shared compilation cache",
    "test_gin_configs.py": "every gin run file parses and binds what it says",
    "test_byo_benchmark.py": "a benchmark brought from outside the package, end to end",
    "test_imaging_framework.py": "the imaging suite's task framework: episodes, stage boundaries, baselines, teachers",
    "test_imaging_import_order.py": "the imaging suite's task modules import one way",
    "test_varied_tasks.py": "seed-drawn training layouts, through factory, reward and expert",
    "test_text_integrity.py": "red team: text never becomes a control token",
    "test_credit_integrity.py": "red team: credit tied to the episode's own work",
    "test_reward_integrity.py": "red team: rewards from evidence the agent cannot forge",
    "test_reward_integrity_inputs.py": "red team: rewards under hostile inputs",
    "test_artefact_properties.py": "property suite: hostile artefacts against scoring and readers",
    "test_judge_redteam.py": "red team: the LLM judge decides from its own words only",
    "test_sandbox_redteam.py": "red team: the sandbox against a hostile agent",
    "test_redteam_round4.py": "red team, fourth round: judge, S5 credit, context limits",
    "test_memory_parity.py": "memory-saving model paths give the plain path's numbers",
    "test_vllm_llama.py": "vLLM against the JAX Llama",
    "test_vllm_qwen3_5.py": "vLLM against the JAX Qwen3.5",
    "test_verl_parity.py": "the GRPO objective against verl's own functions",
    "test_box_stack.py": "the other dependency stacks build and run the core tests",
    "test_install_resolves.py": "the pinned install resolves",
    "test_bench_learner_step.py": "launch/bench/bench_learner_step.py",
    "test_bench_memory_walk.py": "launch/bench/memory_walk.py",
    "test_bench_rollout_loops.py": "launch/bench/rollout_loops.py",
    "test_bench_workloads.py": "launch/bench/workloads.py",
    "test_compile_probe.py": "launch/bench/compile_probe.py",
    "test_gpu_smoke_tiny.py": "launch/bench/gpu_smoke.py",
    "test_sweep.py": "launch/sweep.py",
    "test_teacher_nll.py": "launch/teacher_nll.py",
    "test_evaluate_rounds.py": "launch/evaluate_rounds.py",
}


def _modules() -> list[pathlib.Path]:
    return sorted(p for p in (REPO / "bat_jax").rglob("*.py")
                  if p.name != "__init__.py" or p.parent.name == "launch")


def _test_names(module: pathlib.Path, clashing: set[str]) -> list[str]:
    """The names a test file of `module` may have: `test_<name>.py` (a name no other module has) or
    `test_<package>_<name>.py`; the launch package's `__init__` / `__main__` are `test_launch.py`."""
    if module.parent.name == "launch":
        return ["test_launch.py"]
    name = module.stem
    names = [] if name in clashing else [f"test_{name}.py"]
    if module.parent.name != "bat_jax":
        names.append(f"test_{module.parent.name}_{name}.py")
    return [n for n in names if n not in SUITES]


def _module_tests() -> dict[str, list[str]]:
    """Each module → the test files named after it that exist."""
    counts = collections.Counter(p.stem for p in _modules())
    clashing = {stem for stem, n in counts.items() if n > 1}
    return {str(m.relative_to(REPO)): [n for n in _test_names(m, clashing) if (TESTS / n).exists()]
            for m in _modules()}


def test_every_module_is_in_the_map_and_every_mapped_module_exists():
    text = (REPO / "WORKSPACE.md").read_text()
    modules = {str(p.relative_to(REPO)) for p in _modules()}
    mapped = set(re.findall(r"`(bat_jax/[\w/]+\.py)`", text))
    assert sorted(modules - mapped) == [], "modules missing from WORKSPACE.md"
    assert sorted(mapped - modules) == [], "WORKSPACE.md names modules that do not exist"


def test_every_module_has_a_test_file_named_after_it():
    tests = _module_tests()
    missing = sorted(m for m, files in tests.items() if not files)
    assert missing == [], f"modules without tests/test_<name>.py: {missing}"


def test_every_test_file_is_a_modules_or_a_listed_suite():
    own = {n for files in _module_tests().values() for n in files}
    files = sorted(p.name for p in TESTS.glob("test_*.py"))
    aspects = {n for n in files if any(n.startswith(o.removesuffix(".py") + "_") for o in own)}
    stray = sorted(set(files) - own - aspects - set(SUITES))
    assert stray == [], f"test files named after no module and not in SUITES: {stray}"
    assert sorted(set(SUITES) - set(files)) == [], "SUITES lists test files that do not exist"
    workspace = (REPO / "WORKSPACE.md").read_text()
    unlisted = sorted(n for n in SUITES if n not in workspace)
    assert unlisted == [], f"suites WORKSPACE.md does not name: {unlisted}"


def test_no_test_file_imports_another():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        source = path.read_text()
        names = []
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.append(node.module)
        names += re.findall(r"(?:from|import) (test_\w+)", source)  # code run in a subprocess
        offenders += [f"{path.relative_to(REPO)} imports {n}" for n in names
                      if n.split(".")[0].startswith("test_") or n.startswith("tests.")]
    assert offenders == [], offenders
