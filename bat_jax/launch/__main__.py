"""`python -m bat_jax.launch --gin_file=bicurl_tiny.gin` (see bat_jax/launch/__init__.py)."""

from absl import app

from bat_jax.launch import main

if __name__ == "__main__":
    app.run(main)
