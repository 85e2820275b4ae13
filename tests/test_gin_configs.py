"""Every gin file under gin/ parses and (for run files) configures a job (MaxText-style config validation)."""

import pathlib

import gin
import pytest

from bat_jax import launch

GIN_DIR = launch.DEFAULT_GIN_DIR
ALL = sorted(str(p.relative_to(GIN_DIR)) for p in GIN_DIR.rglob("*.gin"))
RUN_FILES = [name for name in ALL if "launch.run" in (GIN_DIR / name).read_text()]


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
    "experiment.BiCuRLConfig.pool_proportions": {"S-target": 0.5, "S-mix": 0.25, "E2E": 0.25},
    "experiment.BiCuRLConfig.kl_tau": 0.1,
    "experiment.BiCuRLConfig.patience": 3,
    "experiment.BiCuRLConfig.num_rollouts": 4,
    "experiment.BiCuRLConfig.temperature": 0.7,
    "experiment.BiCuRLConfig.kl_beta": 1e-3,
    "experiment.BiCuRLConfig.actor_lr": 1e-6,
}


@pytest.mark.parametrize("name", ["bicurl_9b.gin", "bicurl_4b.gin", "bicurl_tiny.gin"])
def test_bicurl_files_carry_the_design_card_numbers(name):
    launch.parse_gin([name], [])
    for binding, expected in PAPER_NUMBERS.items():
        assert gin.query_parameter(binding) == expected, binding
