"""Train state, the functional view of an nnx model, and the one jitted, sharded train step.

Details: docs/design.md.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bat_jax.models import mesh as mesh_lib

Batch = Mapping[str, jax.Array]
ApplyFn = Callable[[Any, jax.Array, jax.Array], jax.Array]
# loss_fn(params, micro_batch, normalizers) -> (scalar loss, dict of scalar metrics); the loss and every
# metric must already be divided by the whole-batch normalizers so that micro-batch values add up.
LossFn = Callable[[Any, Batch, Mapping[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]]
NormalizerFn = Callable[[Batch], dict[str, jax.Array]]


@struct.dataclass
class TrainState:
    """Everything a resume needs besides the data cursor.

    Attributes:
      step: optimizer steps taken, ``[] int32``.
      params: pure dict of parameter arrays.
      opt_state: the optax state for ``params``.
    """

    step: jax.Array
    params: Any
    opt_state: Any


class ModelApply:
    """``apply_fn`` of an nnx language model, plus the two halves the learner's losses use.

    ``apply_fn(params, input_ids [B, T] int32, attention_mask [B, T] 0/1) -> logits [B, T, V] float32``. The learner's
    losses use the two halves below so that full float32 logits never exist:

    * ``hidden(params, input_ids, attention_mask) -> [B, T, embed]`` (compute dtype, after the final norm).
    * ``head(params, h [..., embed]) -> [..., V] float32``.
    * ``logit_chunk``: tokens per sequence chunk when the losses apply ``head`` (0 = whole sequence).

    ``options`` (``causal_lm.ForwardOptions``) set remat, the attention block and the activation sharding.
    """

    def __init__(self, graphdef, rest, options=None, logit_chunk: int = 0):
        self._graphdef, self._rest = graphdef, rest
        self.options = options
        self.logit_chunk = int(logit_chunk)

    def _model(self, p):
        return nnx.merge(self._graphdef, p, self._rest)

    def hidden(self, p: Any, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        kw = {} if self.options is None else {"options": self.options}
        return self._model(p).hidden_states(input_ids, attention_mask, **kw)

    def head(self, p: Any, h: jax.Array) -> jax.Array:
        return self._model(p).logits_from_hidden(h)

    def __call__(self, p: Any, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        return self.head(p, self.hidden(p, input_ids, attention_mask))


def split_model(model: nnx.Module, options: Any = None, logit_chunk: int = 0,
                trainable: Any = nnx.Param) -> tuple[ApplyFn, Any, Any]:
    """Functional view of an nnx model.

    Returns:
      ``(apply_fn, params, logical_specs)``: ``apply_fn(full_params, input_ids, attention_mask) -> logits``;
      ``params`` the pure dict of the ``trainable`` variables (an nnx filter: every ``nnx.Param`` by default,
      ``nnx.LoRAParam`` for a LoRA adapter); ``logical_specs`` the same tree with ``PartitionSpec`` leaves of
      logical axis names (empty spec where the model set none). ``full_params`` is ``join(params, frozen)`` with the
      other ``nnx.Param`` (:func:`frozen_params`; none, so ``params`` itself, by default).
      For a model with ``hidden_states`` / ``logits_from_hidden`` (``causal_lm.CausalLM``), ``apply_fn`` is a
      :class:`ModelApply` built with ``options`` and ``logit_chunk``; for any other module a plain function.
    Non-parameter state (buffers, rngs) is captured as a constant of ``apply_fn``.
    """
    graphdef, param_state, _, rest = nnx.split(model, trainable, nnx.Param, ...)
    params = nnx.to_pure_dict(param_state)
    specs = nnx.to_pure_dict(nnx.get_partition_spec(param_state))
    if hasattr(model, "hidden_states") and hasattr(model, "logits_from_hidden"):
        return ModelApply(graphdef, rest, options, logit_chunk), params, specs

    def apply_fn(p: Any, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, p, rest)(input_ids, attention_mask)

    return apply_fn, params, specs


def frozen_params(model: nnx.Module, trainable: Any = nnx.Param) -> tuple[Any, Any]:
    """``(frozen, logical_specs)``: pure dicts of the model's ``nnx.Param`` that ``trainable`` leaves out.

    Empty dicts for the default filter; the base model's weights under a LoRA adapter (``nnx.LoRAParam``)."""
    _, frozen = nnx.state(model, trainable, nnx.Param)
    return nnx.to_pure_dict(frozen), nnx.to_pure_dict(nnx.get_partition_spec(frozen))


def join(params: Any, frozen: Any) -> Any:
    """The full parameter dict: nested dicts ``params`` and ``frozen`` (disjoint leaves) in one.

    ``params`` itself when ``frozen`` is empty."""
    if not frozen:
        return params
    out = dict(params)
    for key, value in frozen.items():
        out[key] = join(out[key], value) if key in out else value
    return out


def train_state_shardings(
    params: Any, param_shardings: Any, tx: optax.GradientTransformation, mesh: Mesh
) -> TrainState:
    """NamedSharding tree for a :class:`TrainState`.

    Optimizer moments follow their parameter, every other optimizer leaf (counts) and ``step`` are replicated."""
    abstract_opt = jax.eval_shape(tx.init, params)
    rep = mesh_lib.replicated(mesh)
    opt_shardings = optax.tree_map_params(
        tx,
        lambda _, s: s,
        abstract_opt,
        param_shardings,
        transform_non_params=lambda _: rep,
    )
    return TrainState(step=rep, params=param_shardings, opt_state=opt_shardings)


def create_train_state(params: Any, tx: optax.GradientTransformation, shardings: TrainState) -> TrainState:
    """Place ``params`` on the mesh and initialise the optimizer there (a fresh optimizer = a round reset)."""

    def init(p: Any) -> TrainState:
        return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p))

    params = jax.device_put(params, shardings.params)
    return jax.jit(init, out_shardings=shardings)(params)


def abstract_train_state(state_like: Any, shardings: Any) -> Any:
    """``jax.ShapeDtypeStruct`` tree with target shardings (for Orbax restore onto any mesh)."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state_like, shardings
    )


def split_micro_batches(batch: Batch, num_micro_batches: int) -> dict[str, jax.Array]:
    """``[B, ...]`` → ``[M, B/M, ...]``; micro-batch ``m`` holds rows ``m, m+M, m+2M, ...``.

    Raises:
      ValueError: the batch size does not divide by ``num_micro_batches``.
    """
    out = {}
    for k, v in batch.items():
        b = v.shape[0]
        if b % num_micro_batches:
            raise ValueError(f"batch field {k!r}: {b} rows do not divide into {num_micro_batches} micro-batches")
        v = v.reshape((b // num_micro_batches, num_micro_batches) + v.shape[1:])
        out[k] = jnp.swapaxes(v, 0, 1)
    return out


def accumulate_gradients(
    loss_fn: LossFn, params: Any, batch: Batch, normalizers: Mapping[str, jax.Array], num_micro_batches: int,
    micro_sharding: Mapping[str, NamedSharding] | None = None, frozen: Any = None,
) -> tuple[jax.Array, dict[str, jax.Array], Any]:
    """Sum of loss, metrics and gradients over micro-batches (= the full-batch values, see module doc).

    ``micro_sharding``: per field, the sharding of the split ``[M, B/M, ...]`` batch (rows of every micro-batch
    spread over the batch axes); applied as a constraint. ``frozen``: parameters the loss reads
    (``join(params, frozen)``) but that get no gradient (a LoRA adapter's base model)."""
    grad_fn = jax.value_and_grad(lambda p, f, b, n: loss_fn(join(p, f), b, n), has_aux=True)
    if num_micro_batches == 1:
        (loss, metrics), grads = grad_fn(params, frozen, batch, normalizers)
        return loss, metrics, grads
    micro = split_micro_batches(batch, num_micro_batches)
    if micro_sharding is not None:
        micro = {k: jax.lax.with_sharding_constraint(v, micro_sharding[k]) if k in micro_sharding else v
                 for k, v in micro.items()}
    first = jax.tree.map(lambda v: v[0], micro)
    (loss_s, metrics_s), grads_s = jax.eval_shape(grad_fn, params, frozen, first, normalizers)
    # accumulate in float32 even for bf16 parameters, cast back at the end
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.promote_types(x.dtype, jnp.float32)), (loss_s, metrics_s, grads_s))

    def body(carry, mb):
        # the barrier ties the parameters to this iteration's micro-batch, so XLA cannot hoist their (FSDP)
        # all-gathers out of the loop and keep every layer's gathered weights alive for the whole step
        p, f, mb = jax.lax.optimization_barrier((params, frozen, mb))
        (loss, metrics), grads = grad_fn(p, f, mb, normalizers)
        return jax.tree.map(lambda c, x: c + x.astype(c.dtype), carry, (loss, metrics, grads)), None

    (loss, metrics, grads), _ = jax.lax.scan(body, zeros, micro)
    grads = jax.tree.map(lambda g, s: g.astype(s.dtype), grads, grads_s)
    return loss, metrics, grads


def _batch_ways(sharding: NamedSharding, dim: int) -> int:
    axes = sharding.spec[dim] if len(sharding.spec) > dim else None
    axes = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
    return int(math.prod(sharding.mesh.shape[a] for a in axes))


def _micro_sharding(sharding: NamedSharding, num_micro_batches: int) -> NamedSharding | None:
    """``[B, ...]`` batch sharding → the ``[M, B/M, ...]`` micro-batch stack's (batch axes on dim 1)."""
    if num_micro_batches == 1 or not isinstance(sharding, NamedSharding) or not len(sharding.spec):
        return None
    return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))


def make_train_step(
    loss_fn: LossFn,
    normalizer_fn: NormalizerFn,
    tx: optax.GradientTransformation,
    state_shardings: TrainState,
    batch_shardings: Mapping[str, NamedSharding],
    num_micro_batches: int = 1,
    frozen_shardings: Any = None,
) -> Callable[..., tuple[TrainState, dict[str, jax.Array]]]:
    """One jitted optimizer step ``(state, batch) -> (state, metrics)``, state donated.

    Args:
      loss_fn: see :data:`LossFn`.
      normalizer_fn: whole-batch denominators (e.g. loss-token and sequence counts), computed before the
        split into micro-batches.
      tx: the optax optimizer.
      state_shardings: from :func:`train_state_shardings` (in and out sharding of the state).
      batch_shardings: one NamedSharding per batch field.
      num_micro_batches: gradient-accumulation steps inside one optimizer step.
      frozen_shardings: the shardings of parameters the loss reads but does not train (a LoRA adapter's base);
        the step is then ``(state, batch, frozen) -> (state, metrics)`` (``frozen`` an argument, not donated, never
        a constant of the program).
    Metrics returned (replicated scalars, no host sync inside the step): the loss function's metrics
    plus ``loss`` and ``grad_norm`` (global L2 norm before clipping).
    """
    if num_micro_batches < 1:
        raise ValueError(f"num_micro_batches must be >= 1, got {num_micro_batches}")

    micro_sharding = {k: _micro_sharding(s, num_micro_batches) for k, s in batch_shardings.items()}

    def step(state: TrainState, batch: Batch, frozen: Any = None) -> tuple[TrainState, dict[str, jax.Array]]:
        normalizers = normalizer_fn(batch)
        micro = {k: v for k, v in micro_sharding.items()
                 if v is not None and batch[k].shape[0] % (num_micro_batches * _batch_ways(v, 1)) == 0}
        loss, metrics, grads = accumulate_gradients(loss_fn, state.params, batch, normalizers, num_micro_batches,
                                                    micro, frozen)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    rep = jax.tree.map(lambda s: mesh_lib.replicated(s.mesh), state_shardings.step)
    in_shardings = (state_shardings, dict(batch_shardings))
    if frozen_shardings is not None:
        in_shardings += (frozen_shardings,)
    return jax.jit(
        step,
        in_shardings=in_shardings,
        out_shardings=(state_shardings, rep),
        donate_argnums=0,
    )


def run_steps(
    step_fn: Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]],
    state: TrainState,
    batches: Iterable[Batch],
    *,
    num_steps: int,
    data_cursor: int = 0,
    checkpointer: Any = None,
    checkpoint_every: int = 0,
    on_metrics: Callable[[int, dict[str, float]], None] | None = None,
) -> tuple[TrainState, int]:
    """Run ``num_steps`` optimizer steps, saving a checkpoint every ``checkpoint_every`` steps.

    Args:
      step_fn: from :func:`make_train_step`.
      state: the train state (donated to each step; do not reuse the argument).
      batches: global batches, already positioned at ``data_cursor`` (batches consumed so far).
      data_cursor: saved with each checkpoint as ``extra['data_cursor']`` (after the step), so a resume
        continues with the next unseen batch.
      checkpointer: a :class:`bat_jax.checkpoint.Checkpointer` or None; saves happen when
        ``state.step % checkpoint_every == 0`` (by the global optimizer step).
      on_metrics: called with (step, host metrics) after every step.
    Returns:
      ``(state, data_cursor)`` after the last step.
    Raises:
      ValueError: ``batches`` ran out before ``num_steps``.
    """
    it = iter(batches)
    for i in range(num_steps):
        try:
            batch = next(it)
        except StopIteration:
            raise ValueError(f"run_steps: batches ran out after {i} of {num_steps} steps") from None
        state, metrics = step_fn(state, batch)
        data_cursor += 1
        step = int(state.step)
        if on_metrics is not None:
            on_metrics(step, {k: float(v) for k, v in metrics.items()})
        if checkpointer is not None and checkpoint_every and step % checkpoint_every == 0:
            checkpointer.save(step, state, extra={"data_cursor": data_cursor})
    return state, data_cursor
