"""Orbax checkpoints for the learner.

Latest-N and best-by-Overall are kept by separate rules; a step restores onto any mesh; a run resumes with its
optimizer state and data cursor, falling back past a corrupted newest step; a LoRA run's frozen base is recorded.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import warnings
from typing import Any, Callable, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocp_managers

from bat_jax.atomic_io import atomic_write
from bat_jax.errors import ConfigValueError

logger = logging.getLogger(__name__)

_NAME_PREFIX = "ckpt-"


def checkpoint_name(step: int) -> str:
    """The name the controller and the ledger use for Orbax step `step` (a round's checkpoint): 'ckpt-<step>'."""
    return f"{_NAME_PREFIX}{int(step)}"


def checkpoint_step(name: str) -> int:
    """The Orbax step of a checkpoint name from `checkpoint_name`.

    Raises:
      ValueError: naming the text when it is not 'ckpt-<non-negative int>'.
    """
    digits = name.removeprefix(_NAME_PREFIX) if isinstance(name, str) else ""
    if not name.startswith(_NAME_PREFIX) or not digits.isdigit():
        raise ValueError(f"checkpoint name {name!r} is not 'ckpt-<step>'")
    return int(digits)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Where and what to keep.

    Attributes:
      directory: checkpoint root (local path or any path Orbax/epath accepts, e.g. gs://).
      keep_latest: how many most recent steps to keep, 3 (released code: keep 3).
      keep_best: how many best steps by ``best_metric`` to keep, 1.
      best_metric: key of the metrics dict that ranks steps, ``'overall'`` (Overall, 0–1 scale).
      best_mode: ``'max'`` (higher is better) or ``'min'``.
      save_every: optimizer steps between saves (used by the training loops), 5.
      async_save: let Orbax write in the background (``wait()`` before reading the directory).
    """

    directory: str
    keep_latest: int = 3
    keep_best: int = 1
    best_metric: str = "overall"
    best_mode: str = "max"
    save_every: int = 5
    async_save: bool = False

    def __post_init__(self):
        if self.best_mode not in ("max", "min"):
            raise ValueError(f"CheckpointConfig.best_mode must be 'max' or 'min', got {self.best_mode!r}")
        if self.keep_latest < 1:
            raise ValueError(f"CheckpointConfig.keep_latest must be >= 1, got {self.keep_latest}")


@dataclasses.dataclass(frozen=True)
class Restored:
    """Result of :meth:`Checkpointer.restore`: the step read, its state pytree and its JSON extra."""

    step: int
    state: Any
    extra: dict[str, Any]


#: The file beside a LoRA run's steps that names the frozen base they were trained over (`Checkpointer.check_base`).
BASE_RECORD = "lora_base.json"


@dataclasses.dataclass(frozen=True)
class BaseRecord:
    """The frozen base a LoRA run's adapter checkpoints were trained over.

    Attributes:
      path: the base checkpoint directory (absolute), or the tiny default's description.
      digest: `base_digest` of the base weights as the learner holds them (after `LoRAConfig.base_dtype`).
    """

    path: str
    digest: str


def base_digest(tree: Any, gather: Callable[[Any], Any] = np.asarray) -> str:
    """``'sha256:<hex>'`` over the leaves of ``tree`` in sorted dotted-path order.

    For each leaf the hash takes one line ``'<path> <dtype> <shape>\\n'`` and then the leaf's bytes in C order.
    ``gather`` brings one leaf at a time to the host (with several processes `learn.distributed.host_gather`, a
    collective every process calls)."""
    digest = hashlib.sha256()
    leaves = sorted((jax.tree_util.keystr(p, simple=True, separator="."), x)
                    for p, x in jax.tree_util.tree_leaves_with_path(tree))
    for path, leaf in leaves:
        host = np.ascontiguousarray(gather(leaf))
        digest.update(f"{path} {host.dtype} {tuple(host.shape)}\n".encode())
        digest.update(host.reshape(-1).view(np.uint8))
    return "sha256:" + digest.hexdigest()


class _Pinned(ocp_managers.PreservationPolicy):
    """Keeps the steps in a set the owner may change between saves."""

    def __init__(self):
        self.steps: frozenset[int] = frozenset()

    def should_preserve(self, checkpoints, *, context):
        return [info.step in self.steps for info in checkpoints]


class Checkpointer:
    """A thin owner of one ``orbax.checkpoint.CheckpointManager`` with the retention rules above."""

    def __init__(self, config: CheckpointConfig):
        self.config = config
        self._pinned = _Pinned()
        metric = config.best_metric
        get_metric = lambda m: float(m[metric])  # noqa: E731
        policy = ocp_managers.AnyPreservationPolicy(
            [
                ocp_managers.LatestN(n=config.keep_latest),
                ocp_managers.BestN(
                    get_metric_fn=get_metric,
                    reverse=config.best_mode == "min",
                    n=config.keep_best,
                    keep_checkpoints_without_metrics=False,
                ),
                self._pinned,
            ]
        )
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policy,
            # best_fn only makes Orbax write the metrics to disk (so the best rule survives a restart);
            # retention itself is decided by ``policy``.
            best_fn=get_metric,
            best_mode=config.best_mode,
            enable_async_checkpointing=config.async_save,
            cleanup_tmp_directories=True,
            create=True,
        )
        self._manager = ocp.CheckpointManager(config.directory, options=options, item_names=("state", "extra"))
        # Orbax removes a killed run's temporary step directories in a background thread and waits for it only
        # in its first save(); wait here so that listing, restoring or deleting never races that cleanup
        # (orbax-checkpoint 0.12.8, pinned; no public call waits for it).
        self._manager._maybe_await_cleanup_tmp_directory()  # noqa: SLF001

    def check_base(self, record: BaseRecord | None) -> None:
        """Refuses to resume a run over another frozen base; records ``record`` while no step exists yet.

        ``record`` is the run's LoRA base, or None for a full-weight run. The record is written as `BASE_RECORD`
        (temp then rename) beside the steps. Call it before the first save, on one process.

        Raises:
          errors.ConfigValueError: one line: steps exist over a base with another digest (both paths and digests
            named), steps of a LoRA run and a full-weight run or the other way round.
        """
        path = pathlib.Path(self.config.directory) / BASE_RECORD
        saved = BaseRecord(**json.loads(path.read_text())) if path.is_file() else None
        if self.all_steps():
            where = f"checkpoints under {self.config.directory}"
            if record is None and saved is not None:
                raise ConfigValueError(f"{where} hold a LoRA adapter over base {saved.path!r} ({saved.digest}); this "
                                       "run trains every weight: bind policy.PolicyConfig.lora as that run did or "
                                       "use another run directory")
            if record is not None and saved is None:
                raise ConfigValueError(f"{where} hold full weights, not a LoRA adapter over base {record.path!r}: "
                                       "unbind policy.PolicyConfig.lora or use another run directory")
            if record is not None and saved.digest != record.digest:
                raise ConfigValueError(f"{where} hold a LoRA adapter trained over base {saved.path!r} "
                                       f"({saved.digest}), but this run's base {record.path!r} is {record.digest}: "
                                       "bind policy.PolicyConfig.checkpoint_dir to that base or use another run "
                                       "directory")
        if record is not None and record != saved:
            atomic_write(path, json.dumps(dataclasses.asdict(record), indent=1).encode())

    def save(
        self,
        step: int,
        state: Any,
        *,
        metrics: Mapping[str, float] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Save ``state`` (any pytree of arrays, e.g. a TrainState) at ``step``.

        Args:
          metrics: scalars for ranking (must contain ``best_metric`` for the best rule to consider it).
          extra: small JSON-able dict saved beside the state (data cursor, round index, ...).
        Raises:
          ValueError: ``metrics`` given without ``best_metric``.
        """
        if metrics is not None and self.config.best_metric not in metrics:
            raise ValueError(f"checkpoint metrics {sorted(metrics)} lack best_metric {self.config.best_metric!r}")
        self._manager.save(
            int(step),
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave(dict(extra or {}))
            ),
            metrics=None if metrics is None else {k: float(v) for k, v in metrics.items()},
            force=True,
        )
        if not self.config.async_save:
            self._manager.wait_until_finished()

    def pin(self, steps) -> None:
        """Steps kept by every later save's retention pass, whatever their rank (replaces the previous set)."""
        self._pinned.steps = frozenset(int(x) for x in steps)

    def wait(self) -> None:
        """Block until any background save has finished."""
        self._manager.wait_until_finished()

    def delete(self, step: int) -> None:
        """Removes one saved step (e.g. one a killed run saved but never recorded as done).

        Raises:
          FileNotFoundError: the step does not exist.
        """
        self._manager.wait_until_finished()
        self._manager.delete(int(step))

    def all_steps(self) -> list[int]:
        """Steps present on disk, ascending."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """Newest step on disk (not checked for readability), or None."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        """The step with the best ``best_metric`` among those saved with metrics, or None."""
        best: tuple[float, int] | None = None
        sign = 1.0 if self.config.best_mode == "max" else -1.0
        for step in self.all_steps():
            metrics = self._manager.metrics(step)
            if not metrics or self.config.best_metric not in metrics:
                continue
            key = (sign * float(metrics[self.config.best_metric]), -step)  # ties → the earlier step
            if best is None or key > best:
                best = key
        return None if best is None else -best[1]

    def restore_params(self, like: Any, step: int) -> Any:
        """The ``params`` saved at `step`, on the shardings of `like`.

        `like`: a pytree of ``jax.Array`` (e.g. the learner's current parameters) whose shapes, dtypes and shardings
        the restored parameters take. Errors as :meth:`restore` with a step."""
        abstract = {"params": jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                                           like)}
        return self.restore(abstract, step=step).state["params"]

    def restore(self, target: Any, step: int | None = None) -> Restored:
        """Restore the state into ``target``'s structure, shapes, dtypes and shardings.

        Args:
          target: pytree of ``jax.ShapeDtypeStruct`` with ``sharding`` set for the *current* mesh (see
            :func:`bat_jax.learn.train_state.abstract_train_state`), so a checkpoint written on 8 devices
            restores onto 1 and vice versa.
          step: a given step (errors propagate), or None: the newest readable step. An unreadable newest
            step (corrupt or partial files) triggers a ``RuntimeWarning`` naming it and a fall back to the
            next older step.
        Raises:
          FileNotFoundError: no checkpoint (or none readable) under the directory.
        """
        if step is not None:
            return self._restore_step(int(step), target)
        steps = self.all_steps()
        if not steps:
            raise FileNotFoundError(f"no checkpoint under {self.config.directory}")
        errors = []
        for s in reversed(steps):
            try:
                return self._restore_step(s, target)
            except Exception as e:  # noqa: BLE001 - any read failure means "this step is unusable"
                errors.append(f"step {s}: {type(e).__name__}: {e}")
                warnings.warn(
                    f"checkpoint step {s} under {self.config.directory} is unreadable "
                    f"({type(e).__name__}: {str(e)[:200]}); falling back to an older step",
                    RuntimeWarning,
                    stacklevel=2,
                )
        raise FileNotFoundError(f"no readable checkpoint under {self.config.directory}: " + "; ".join(errors))

    def _restore_step(self, step: int, target: Any) -> Restored:
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(target), extra=ocp.args.JsonRestore()),
        )
        return Restored(step=step, state=out["state"], extra=dict(out["extra"] or {}))

    def close(self) -> None:
        """Finish pending writes and release the manager."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
