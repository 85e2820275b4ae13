import json
import pathlib

import pytest

from launch import sweep

REPO = pathlib.Path(__file__).resolve().parents[1]


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
    path.write_text(json.dumps([{"name": "a", "group": ""}]))
    with pytest.raises(ValueError, match=r"entry 0 \(a\) field 'group'"):
        sweep.load_sweep(path)
    path.write_text(json.dumps([{"name": "a", "seed": 1}, {"name": "b", "seed": "2"}]))
    with pytest.raises(ValueError, match=r"entry 1 \(b\) field 'seed' must be an integer"):
        sweep.load_sweep(path)


def test_sweep_runs_entries_in_separate_dirs(tmp_path):
    path = tmp_path / "s.json"
    dry = "launch.run.job = @launch.show_config"
    path.write_text(json.dumps([{"name": "r2", "bindings": [dry, "experiment.BiCuRLConfig.rounds = 2"]},
                                {"name": "broken", "bindings": [dry, "experiment.BiCuRLConfig.nope = 2"]}]))
    rc = sweep.main(["--gin_file=bicurl_tiny.gin", f"--sweep={path}", f"--runs_root={tmp_path / 'runs'}"])
    assert rc == 1  # the broken entry fails, the sweep goes on
    assert "rounds = 2" in (tmp_path / "runs" / "r2" / "config.gin").read_text()


def test_only_selects_entries_and_names_unknown_ones(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"name": "a"}, {"name": "b"}, {"name": "c"}]))
    assert sweep.main([f"--sweep={path}", "--only=c,a", "--dry_run", f"--runs_root={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "[sweep] a:" in out and "[sweep] c:" in out and "[sweep] b:" not in out
    assert sweep.main([f"--sweep={path}", "--only=a,zz", "--dry_run"]) == 2
    assert "unknown entries ['zz']" in capsys.readouterr().err


def test_init_from_copies_the_sft_cold_start_once(tmp_path):
    source = tmp_path / "main"
    (source / "checkpoints" / "0" / "state").mkdir(parents=True)
    (source / "checkpoints" / "0" / "state" / "blob").write_bytes(b"sft weights")
    (source / "checkpoints" / "1").mkdir()  # a GRPO round: not copied
    (source / "round0_eval.json").write_text('{"overall": 0.05}')
    run_dir = tmp_path / "runs" / "ablation"
    sweep.seed_from_sft(source, run_dir)
    assert (run_dir / "checkpoints" / "0" / "state" / "blob").read_bytes() == b"sft weights"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["0"]
    assert (run_dir / "round0_eval.json").read_text() == '{"overall": 0.05}'
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints", "round0_eval.json"]  # no temp left
    (source / "round0_eval.json").write_text('{"overall": 0.9}')
    sweep.seed_from_sft(source, run_dir)  # a resumed sweep keeps what the entry already has
    assert (run_dir / "round0_eval.json").read_text() == '{"overall": 0.05}'
    with pytest.raises(FileNotFoundError, match=r"nothing/checkpoints/0 does not exist"):
        sweep.seed_from_sft(tmp_path / "nothing", run_dir)


def test_report_only_writes_one_table_over_finished_entries(tmp_path, capsys):
    from bat_jax import report
    from bat_jax.benchmark.scoring import Cell, aggregate
    from bat_jax.benchmarks.imaging.stages import STAGES

    def summary(values):
        return report.summary_dict(aggregate([Cell(f"t{i}", 0, {s: v for s in STAGES.ids}, task=v)
                                              for i, v in enumerate(values)], STAGES))

    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"name": "seed1"}, {"name": "seed2"}, {"name": "unfinished"}]))
    for name, gain in (("seed1", 0.1), ("seed2", 0.2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"final": {
            "untrained": summary([0, 0]), "SFT": summary([0.1, 0.2]), "BiCuRL (retained)": summary([0.1 + gain, 0.2])}}))
    assert sweep.main([f"--sweep={path}", f"--runs_root={tmp_path}", "--report_only"]) == 0
    text = (tmp_path / "sweep_report.md").read_text()
    assert "seed2: BiCuRL (retained)" in text and "unfinished" not in text
    assert "trained − SFT: 7.5 ± 15.2 over 4 (run, track) pairs" in text
    assert sweep.main([f"--sweep={path}", f"--runs_root={tmp_path / 'none'}", "--report_only"]) == 1


@pytest.mark.parametrize("sweep_file", sorted(p.name for p in (REPO / "launch" / "sweeps").glob("*.json")))
def test_bundled_sweep_bindings_configure_the_tiny_default(sweep_file):
    """Every entry's bindings parse on bicurl_tiny.gin and give valid run and pool configs (their checks run), and
    every round the entry could route draws its batches from the tiny bank's pools."""
    import gin

    from bat_jax import launch
    from bat_jax.bicurl.experiment import BiCuRLConfig
    from bat_jax.stage_bank.pools import PoolConfig
    from doubles import assert_rounds_fit_the_tiny_bank

    for entry in sweep.load_sweep(REPO / "launch" / "sweeps" / sweep_file):
        launch.parse_gin(["bicurl_tiny.gin"] + entry.get("gin_files", []), entry.get("bindings", []))
        run = BiCuRLConfig(**gin.get_bindings("bat_jax.bicurl.experiment.BiCuRLConfig"))
        pools = PoolConfig(**gin.get_bindings("bat_jax.stage_bank.pools.PoolConfig"))
        for binding in entry.get("bindings", []):
            key, value = (x.strip() for x in binding.split("=", 1))
            owner = {"experiment.BiCuRLConfig": run, "pools.PoolConfig": pools}.get(key.rsplit(".", 1)[0])
            if owner is not None:
                assert getattr(owner, key.rsplit(".", 1)[1]) == eval(value), (sweep_file, entry["name"], binding)
        assert_rounds_fit_the_tiny_bank(f"{sweep_file} entry {entry['name']}")
