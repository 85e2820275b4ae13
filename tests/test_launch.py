"""The launch edge: gin resolution from any directory, the run directory, clear errors."""

import os
import pathlib
import subprocess
import sys

import pytest

from bat_jax import launch
from bat_jax.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_unknown_gin_file_lists_available_ones():
    with pytest.raises(launch.LaunchError, match=r"'nope\.gin' not found(.|\n)*bicurl_tiny\.gin"):
        launch.parse_gin(["nope.gin"], [])


def test_malformed_binding_is_named():
    bad = "experiment.BiCuRLConfig.rounds = = 3"
    with pytest.raises(launch.LaunchError, match=r"bad gin binding 'experiment\.BiCuRLConfig\.rounds = = 3'"):
        launch.parse_gin(["bicurl_tiny.gin"], [bad])
    with pytest.raises(launch.LaunchError, match="roundz"):
        launch.parse_gin(["bicurl_tiny.gin"], ["experiment.BiCuRLConfig.roundz = 3"])


def test_a_base_file_run_alone_names_the_run_files_that_include_it():
    with pytest.raises(launch.LaunchError, match=r"bind no launch\.run\.job / launch\.run\.run_name: "
                                                 r"bicurl_base\.gin is a base file that run files include; run one "
                                                 r"of them \(bicurl_paper_base\.gin, bicurl_tiny\.gin, plugin_base\.gin\)"):
        launch.launch(["bicurl_base.gin"])
    with pytest.raises(launch.LaunchError, match=r"bind no launch\.run\.run_name: .*\(bicurl_4b\.gin, bicurl_9b\.gin\)"):
        launch.launch(["bicurl_paper_base.gin"], ["launch.run.job = @launch.show_config"])
    with pytest.raises(launch.LaunchError, match=r"bind no launch\.run\.job: a top-level gin file imports "
                                                 r"bat_jax\.launch as launch and binds launch\.run\.job"):
        launch.launch(["mesh/cpu.gin"], ["launch.run.run_name = 'x'"])


def test_no_gin_file_is_an_error():
    with pytest.raises(launch.LaunchError, match="no --gin_file"):
        launch.parse_gin([], [])


def test_search_path_order_prefers_extra_paths(tmp_path):
    (tmp_path / "bicurl_tiny.gin").write_text("# shadow\n")
    paths = launch.search_paths([str(tmp_path)])
    assert launch.resolve_gin_file("bicurl_tiny.gin", paths) == (tmp_path / "bicurl_tiny.gin").resolve()
    assert paths[-1] == launch.DEFAULT_GIN_DIR.resolve()


DRY_RUN = "launch.run.job = @launch.show_config"


def test_cli_from_another_directory_writes_resolved_config(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "BAT_JAX_GIN_PATH"}
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "bat_jax.launch", "--gin_file=bicurl_tiny.gin", f"--gin_bindings={DRY_RUN}",
         "--gin_bindings=experiment.BiCuRLConfig.rounds = 2", f"--run_dir={run_dir}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    config = (run_dir / "config.gin").read_text()
    assert "experiment.BiCuRLConfig.rounds = 2" in config
    assert "launch.run.job = @launch.show_config" in config
    assert "grpo/optim.OptimizerConfig.schedule = 'constant'" in config  # from bicurl_base.gin, an include
    assert "experiment.BiCuRLConfig.rounds = 2" in proc.stdout
    assert (run_dir / "operative_config.gin").is_file()
    # library INFO lines (absl format 'I1130 ...') are off unless --verbosity asks for them
    assert not [line for line in proc.stderr.splitlines() if line.startswith("I")], proc.stderr[-2000:]


def test_cli_verbosity_brings_library_info_back(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bat_jax.launch", "--verbosity=0", "--gin_file=bicurl_tiny.gin",
         f"--gin_bindings={DRY_RUN}", f"--run_dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any(line.startswith("I") and "run directory" in line for line in proc.stderr.splitlines())


def test_cli_bad_binding_exits_nonzero_with_the_binding(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bat_jax.launch", "--gin_file=bicurl_tiny.gin", "--gin_bindings=nope.x = 1",
         f"--run_dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "bad gin binding 'nope.x = 1'" in proc.stderr


def test_guarded_with_one_process_prints_a_config_error_as_one_line_and_re_raises_others(capsys):
    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()

    def bad_config():
        raise ConfigError("bank row 3: field 'stage'\n  In call to configurable 'run'")

    with pytest.raises(SystemExit) as exit_info:
        launch.guarded(bad_config, several=False)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "[bat_jax] error: bank row 3: field 'stage'\n"
    with pytest.raises(KeyError, match="lost"):
        launch.guarded(lambda: {}["lost"], several=False)
    assert launch.guarded(lambda: None, several=False) is None


def test_a_run_dir_that_refuses_directory_renames_stops_the_launch_in_one_line(tmp_path, monkeypatch, capsys):
    """A default gcsfuse mount refuses to rename a directory (ENOTSUP): the launch stops before the job runs, naming
    the run directory and the fix, and leaves no probe behind."""
    import errno

    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()

    def refuse(src, dst):
        raise OSError(errno.ENOTSUP, "Operation not supported", str(src))

    ran = []
    monkeypatch.setattr(launch.os, "rename", refuse)
    with pytest.raises(SystemExit) as exit_info:
        launch.guarded(lambda: launch.run(job=lambda run_dir: ran.append(run_dir), run_name="r",
                                          run_dir=str(tmp_path / "run")), several=False)
    assert exit_info.value.code == 2 and ran == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"[bat_jax] error: run directory {(tmp_path / 'run').resolve()}: "
                                                    "its filesystem refuses to rename a directory ([Errno 95]")
    assert "--rename-dir-limit" in err and list((tmp_path / "run").iterdir()) == []
    monkeypatch.undo()
    launch.check_renames(tmp_path / "run")  # a local disk renames
    assert list((tmp_path / "run").iterdir()) == []
