import importlib.util
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sweep", REPO / "launch" / "sweep.py")
sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)


def test_bundled_sweep_files_are_valid():
    for path in (REPO / "launch" / "sweeps").glob("*.json"):
        assert sweep.load_sweep(path)


def test_commands_put_each_entry_in_its_own_run_dir(tmp_path):
    entries = [{"name": "a", "bindings": ["x.y = 1"]}, {"name": "b", "bindings": [], "gin_files": ["extra.gin"]}]
    cmds = sweep.commands(["base.gin"], entries, str(tmp_path), python="py")
    assert cmds[0] == ("a", ["py", "-m", "bat_jax.launch", "--gin_file=base.gin", "--gin_bindings=x.y = 1",
                             f"--run_dir={tmp_path / 'a'}"])
    assert cmds[1][1][3:5] == ["--gin_file=base.gin", "--gin_file=extra.gin"]


def test_bad_sweep_file_names_entry_and_field(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"name": "ok"}, {"name": "bad name!"}]))
    with pytest.raises(ValueError, match=r"entry 1 field 'name'"):
        sweep.load_sweep(path)
    path.write_text(json.dumps([{"name": "a", "bindings": "x = 1"}]))
    with pytest.raises(ValueError, match=r"entry 0 \(a\) field 'bindings'"):
        sweep.load_sweep(path)


def test_sweep_runs_entries_in_separate_dirs(tmp_path):
    path = tmp_path / "s.json"
    dry = "launch.run.job = @launch.show_config"
    path.write_text(json.dumps([{"name": "r2", "bindings": [dry, "experiment.BiCuRLConfig.rounds = 2"]},
                                {"name": "broken", "bindings": [dry, "experiment.BiCuRLConfig.nope = 2"]}]))
    rc = sweep.main(["--gin_file=bicurl_tiny.gin", f"--sweep={path}", f"--runs_root={tmp_path / 'runs'}"])
    assert rc == 1  # the broken entry fails, the sweep goes on
    assert "rounds = 2" in (tmp_path / "runs" / "r2" / "config.gin").read_text()
