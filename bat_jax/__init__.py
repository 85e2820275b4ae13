"""bat_jax: Benchmark-as-Teacher (Stage Bank + BiCuRL) in JAX/Flax."""

__version__ = "0.1.0"
