"""Routing rows over rollout replicas (bat_jax/rollout/replica_router.py): episodes stay on their replica, new ones
go to the replica with the fewest live tokens."""

import threading

import pytest

from bat_jax.rollout.replica_router import ReplicaRouter


def test_new_episodes_go_to_the_fewest_live_tokens():
    router = ReplicaRouter(3)
    # live tokens = prompt + budget: 10+90, then 5+15 on the next empty replica, then 1+9 on the last
    assert router.route([1] * 10, 90) == 0
    assert router.route([2] * 5, 15) == 1
    assert router.route([3] * 1, 9) == 2
    assert router.live_tokens() == [100, 20, 10]
    assert router.route([4] * 3, 5) == 2  # 10 < 20 < 100
    assert router.live_tokens() == [100, 20, 18]
    router.finish(0, [1] * 10, 90, [9, 9])
    assert router.live_tokens() == [0, 20, 18]
    assert router.route([5] * 4, 4) == 0
    assert router.started == 5 and router.continued == 0 and router.rows_per_replica == [2, 1, 2]


def test_an_episode_stays_on_its_replica_whatever_the_load():
    router = ReplicaRouter(2)
    first = [1, 2, 3]
    assert router.route(first, 10) == 0
    router.finish(0, first, 10, [4, 5])
    busy = router.route([7] * 50, 500)  # replica 0 idle -> takes the big row; replica 0 now the busiest
    assert busy == 0
    # the next turn extends prompt + completion: back to replica 0 although replica 1 is idle
    turn2 = first + [4, 5] + [6, 6]
    assert router.route(turn2, 10) == 0 and router.continued == 1
    router.finish(0, turn2, 10, [8])
    # a prompt that only shares a prefix of the first turn (another episode of the same state) is a new episode
    sibling = first + [9, 9, 9]
    assert router.route(sibling, 10) == 1 and router.started == 3
    # the longest remembered sequence wins; a sequence is continued once
    turn3 = turn2 + [8, 1]
    assert router.route(turn3, 10) == 0 and router.continued == 2
    router.finish(0, turn3, 10, None)  # a failed row is not remembered
    assert router.route(turn3 + [2], 1) == 1  # a new episode: replica 1 holds 16 live tokens, replica 0 550
    router.forget()


def test_forget_and_bounds():
    router = ReplicaRouter(2, max_remembered=2)
    for i in range(3):  # all on replica 0 (nothing live between them)
        router.finish(router.route([i], 1), [i], 1, [i])
    assert router.route([0, 0, 5], 1) == 0 and router.started == 4  # [0, 0] dropped: oldest beyond 2
    assert router.route([2, 2, 5], 1) == 0 and router.continued == 1
    router.forget()
    assert router.route([1, 1, 5], 1) == 1 and router.continued == 1  # forgotten: a new episode (0 holds 8)
    with pytest.raises(ValueError, match="num_replicas"):
        ReplicaRouter(0)


def test_concurrent_routing_counts_every_row():
    router = ReplicaRouter(4)

    def work(k):
        for i in range(200):
            r = router.route([k, i], 3)
            router.finish(r, [k, i], 3, [1])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert router.live_tokens() == [0, 0, 0, 0] and sum(router.rows_per_replica) == 800


def test_replica_env_pins_each_replica():
    import os

    from bat_jax.rollout.gpus import Gpu
    from bat_jax.rollout.vllm_replicas import replica_env

    gpus = [Gpu(i, f"GPU-{i:08x}-aaaa", index=i + 8) for i in range(8)]  # a parent on physical GPUs 8-15
    assert replica_env(3, 8, gpus, "0.33.0") == {"CUDA_VISIBLE_DEVICES": "GPU-00000003-aaaa", "JAX_PLATFORMS": "cpu"}
    assert replica_env(3, 8, gpus, "0.19.1") == {"CUDA_VISIBLE_DEVICES": "11", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                                 "JAX_PLATFORMS": "cpu"}
    cores = sorted(os.sched_getaffinity(0))
    binds = [replica_env(i, 2, None)["VLLM_CPU_OMP_THREADS_BIND"] for i in range(2)]
    if len(cores) >= 2:  # disjoint equal shares
        per = len(cores) // 2
        assert binds == [",".join(map(str, cores[:per])), ",".join(map(str, cores[per:2 * per]))]
    assert replica_env(0, len(cores) + 1, None)["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(map(str, cores))
