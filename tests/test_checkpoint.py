"""Orbax checkpoints: retention rules, resume with optimizer state and cursor, cross-mesh restore, fallback."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from bat_jax.checkpoint import CheckpointConfig, Checkpointer
from bat_jax.learn import optim, train_state
from bat_jax.models import mesh as mesh_lib
from bat_jax.models.mesh import MeshConfig

TX = optim.make_optimizer(optim.OptimizerConfig(schedule="constant", warmup_ratio=0.0), 10)


def make_state(mesh, seed=0):
    rng = np.random.default_rng(seed)
    params = {"w": rng.normal(size=(16, 4)).astype(np.float32), "b": rng.normal(size=(4,)).astype(np.float32)}
    shardings = {"w": NamedSharding(mesh, P("fsdp", None)), "b": NamedSharding(mesh, P())}
    state_shardings = train_state.train_state_shardings(params, shardings, TX, mesh)
    state = train_state.create_train_state(params, TX, state_shardings)
    # take one optimizer step so that the Adam moments and count are non-trivial
    grads = {"w": jnp.ones((16, 4)), "b": jnp.ones((4,))}
    updates, opt_state = TX.update(grads, state.opt_state, state.params)
    state = train_state.TrainState(step=state.step + 1, params=jax.tree.map(jnp.add, state.params, updates), opt_state=opt_state)
    return state, state_shardings


def assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_latest_three_and_best_are_kept_and_restorable(tmp_path):
    mesh = mesh_lib.build_mesh(MeshConfig(fsdp=1), jax.devices()[:1])
    state, shardings = make_state(mesh)
    target = train_state.abstract_train_state(state, shardings)
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path / "ck"), keep_latest=3))
    overall = {100: 0.50, 200: 0.40, 300: 0.30, 400: 0.20, 500: 0.10}  # worsening
    for step, score in overall.items():
        s = state.replace(step=jnp.int32(step))
        ckpt.save(step, s, metrics={"overall": score}, extra={"data_cursor": step * 8})
    assert ckpt.all_steps() == [100, 300, 400, 500]
    assert ckpt.best_step() == 100
    for step in (100, 300, 400, 500):
        r = ckpt.restore(target, step=step)
        assert int(r.state.step) == step and r.extra == {"data_cursor": step * 8}
        assert_trees_equal(r.state.params, state.params)
        assert_trees_equal(r.state.opt_state, state.opt_state)  # optimizer state resumes too
    latest = ckpt.restore(target)
    assert latest.step == 500 and latest.extra["data_cursor"] == 4000
    ckpt.close()
    # a resumed run (new manager on the same directory) still knows the best step from disk
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path / "ck"), keep_latest=3))
    ckpt.save(600, state, metrics={"overall": 0.05})
    assert ckpt.all_steps() == [100, 400, 500, 600] and ckpt.best_step() == 100
    # no temporary directories left behind (saves are atomic renames)
    assert sorted(os.listdir(tmp_path / "ck")) == ["100", "400", "500", "600"]
    ckpt.close()


def test_best_survives_many_later_saves_and_min_mode(tmp_path):
    mesh = mesh_lib.build_mesh(MeshConfig(fsdp=1), jax.devices()[:1])
    state, _ = make_state(mesh)
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path / "ck"), keep_latest=2, best_mode="min"))
    for step, loss in [(1, 0.9), (2, 0.1), (3, 0.5), (4, 0.6), (5, 0.7), (6, None)]:
        ckpt.save(step, state, metrics=None if loss is None else {"overall": loss})
    assert ckpt.all_steps() == [2, 5, 6]
    with pytest.raises(ValueError, match="best_metric"):
        ckpt.save(7, state, metrics={"task": 0.3})
    ckpt.close()


def test_pinned_steps_survive_equal_scores_and_a_better_candidate(tmp_path):
    # The experiment's case: every round scores the same Overall (Orbax's BestN keeps the later of equals),
    # and a candidate the controller rejected may outrank the one it retains. Pinned steps are kept anyway.
    mesh = mesh_lib.build_mesh(MeshConfig(fsdp=1), jax.devices()[:1])
    state, _ = make_state(mesh)
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path / "ck"), keep_latest=3))
    for step in range(6):
        ckpt.pin({0, 1})
        ckpt.save(step, state, metrics={"overall": 0.9 if step == 2 else 0.0})
    assert ckpt.all_steps() == [0, 1, 2, 3, 4, 5]  # pinned 0 and 1, best 2, latest 3..5
    ckpt.pin({0})
    ckpt.save(6, state, metrics={"overall": 0.0})
    assert ckpt.all_steps() == [0, 2, 4, 5, 6]  # 1 unpinned: dropped at the next save
    ckpt.close()
    unpinned = Checkpointer(CheckpointConfig(directory=str(tmp_path / "plain"), keep_latest=3))
    for step in range(5):
        unpinned.save(step, state, metrics={"overall": 0.0})
    assert 0 not in unpinned.all_steps()  # what pinning prevents
    unpinned.close()


def test_saved_on_8_devices_restores_on_1(tmp_path):
    mesh8 = mesh_lib.build_mesh(MeshConfig(fsdp=8))
    state8, _ = make_state(mesh8)
    assert state8.params["w"].sharding.spec == P("fsdp", None)
    assert len(state8.params["w"].sharding.device_set) == 8
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path / "ck")))
    ckpt.save(10, state8, metrics={"overall": 0.3}, extra={"data_cursor": 80})
    mesh1 = mesh_lib.build_mesh(MeshConfig(fsdp=1), jax.devices()[:1])
    like, shardings1 = make_state(mesh1, seed=1)
    r = ckpt.restore(train_state.abstract_train_state(like, shardings1))
    assert r.step == 10 and r.extra == {"data_cursor": 80}
    assert r.state.params["w"].sharding.device_set == {jax.devices()[0]}
    assert_trees_equal(r.state.params, state8.params)
    assert_trees_equal(r.state.opt_state, state8.opt_state)
    ckpt.close()


def test_restore_params_lands_on_the_shardings_of_the_parameters_given(tmp_path):
    """Parameters saved on 8 devices come back onto `like`'s one device, equal to what was saved."""
    state8, _ = make_state(mesh_lib.build_mesh(MeshConfig(fsdp=8)))
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path / "ck")))
    ckpt.save(3, {"params": state8.params}, metrics={"overall": 0.1})
    ckpt.wait()
    like, _ = make_state(mesh_lib.build_mesh(MeshConfig(fsdp=1), jax.devices()[:1]), seed=1)
    back = ckpt.restore_params(like.params, step=3)
    assert back["w"].sharding.device_set == {jax.devices()[0]}
    assert_trees_equal(back, state8.params)
    ckpt.close()


def test_corrupted_newest_step_falls_back_with_warning(tmp_path):
    mesh = mesh_lib.build_mesh(MeshConfig(fsdp=1), jax.devices()[:1])
    state, shardings = make_state(mesh)
    target = train_state.abstract_train_state(state, shardings)
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path / "ck")))
    ckpt.save(1, state.replace(step=jnp.int32(1)), extra={"data_cursor": 8})
    ckpt.save(2, state.replace(step=jnp.int32(2)), extra={"data_cursor": 16})
    corrupted = 0
    for root, _, files in os.walk(tmp_path / "ck" / "2" / "state"):
        for f in files:
            with open(os.path.join(root, f), "wb") as fh:
                fh.write(b"\x00garbage")
            corrupted += 1
    assert corrupted > 0
    with pytest.warns(RuntimeWarning, match="step 2 .* unreadable"):
        r = ckpt.restore(target)
    assert r.step == 1 and int(r.state.step) == 1 and r.extra == {"data_cursor": 8}
    with pytest.raises(Exception):
        ckpt.restore(target, step=2)  # an explicit step does not silently fall back
    ckpt.close()


def test_empty_directory_is_a_clear_error(tmp_path):
    mesh = mesh_lib.build_mesh(MeshConfig(fsdp=1), jax.devices()[:1])
    state, shardings = make_state(mesh)
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path / "empty")))
    with pytest.raises(FileNotFoundError, match="no checkpoint under"):
        ckpt.restore(train_state.abstract_train_state(state, shardings))
    ckpt.close()
