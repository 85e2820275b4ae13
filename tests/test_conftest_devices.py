import jax


def test_eight_fake_cpu_devices():
    assert jax.device_count() == 8
    assert all(d.platform == "cpu" for d in jax.devices())
