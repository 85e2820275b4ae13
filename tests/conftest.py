"""Test session setup.

XLA_FLAGS must be set before jax is imported anywhere, so that sharding tests see 8 fake CPU devices.
"""

import os

_FAKE_DEVICES = "--xla_force_host_platform_device_count=8"
if _FAKE_DEVICES not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FAKE_DEVICES).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


import pytest  # noqa: E402  (after XLA_FLAGS: importing pytest fixtures must not import jax first)


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def factory(request):
    """Sandbox factory per backend: the non-isolated local one, and Docker (docker-marked; skipped, with the
    reason, when the engine or image is unavailable). Shared by the task-track tests."""
    from bat_jax.tasks.harness import BackendUnavailable, backend_factory

    try:
        return backend_factory(request.param)
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
