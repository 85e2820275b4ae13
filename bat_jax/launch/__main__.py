"""`python -m bat_jax.launch --gin_file=bicurl_tiny.gin` (see bat_jax/launch/__init__.py).

Library INFO chatter (Orbax, JAX, gin) is off by default: without `--verbosity` on the command line the absl
verbosity is WARNING; `--verbosity=0` brings INFO back. The run's own progress lines (`[bat_jax] ...`) are
printed regardless.
"""

from absl import app, flags
from absl import logging as absl_logging

from bat_jax.launch import main


def _main(argv):
    if not flags.FLAGS["verbosity"].present:
        absl_logging.set_verbosity(absl_logging.WARNING)
    main(argv)


if __name__ == "__main__":
    app.run(_main)
