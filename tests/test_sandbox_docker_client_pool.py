"""The docker-py client's HTTP connection pool is sized to the rollout concurrency (no urllib3 'connection pool is
full' warnings when many threads call sandboxes at once). No Docker engine needed: the client points at a
socket that does not exist and is never used."""

import docker
import pytest

from bat_jax.sandbox import docker as docker_backend
from bat_jax.sandbox.backends import BackendUnavailable, backend_factory


def _offline_from_env(made):
    def from_env(**kwargs):
        client = docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.44", **kwargs)
        made.append(client)
        return client
    return from_env


def test_connect_sizes_the_connection_pool(monkeypatch):
    made = []
    monkeypatch.setattr(docker, "from_env", _offline_from_env(made))
    monkeypatch.setattr(docker.DockerClient, "ping", lambda self: True)
    docker_backend.connect(docker_backend.DockerSandboxConfig(max_pool_size=48))
    assert made[0].api.get_adapter("http+docker://localhost").max_pool_size == 48
    docker_backend.connect()
    assert made[1].api.get_adapter("http+docker://localhost").max_pool_size == 32 > 10  # docker-py's default is 10


@pytest.mark.parametrize("concurrency, pool", [(16, 32), (64, 68)])
def test_backend_factory_passes_the_rollout_concurrency(monkeypatch, concurrency, pool):
    seen = []

    def connect(config):
        seen.append(config.max_pool_size)
        raise RuntimeError("no engine in this test")

    monkeypatch.setattr(docker_backend, "connect", connect)
    with pytest.raises(BackendUnavailable, match="no engine in this test"):
        backend_factory("docker", concurrency)
    assert seen == [pool]
