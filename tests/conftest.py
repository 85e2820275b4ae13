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
