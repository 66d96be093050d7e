"""A tiny byte-level transformer language model (Flax), its optimizer (optax) and one training step.

Small enough to train a few hundred steps on two CPU cores in well under a minute; nothing in it
knows the platform, so the same code runs on a TPU VM or a GPU. Dropout draws its randomness from
`jax.random.fold_in(key, step)`: the step's randomness is the same whether or not the run resumed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from data import VOCAB

State = dict[str, Any]  # {"params": ..., "opt_state": ...}: what a checkpoint holds, with its step


class Block(nn.Module):
    """Pre-norm self-attention and MLP, each with a residual; no biases (fewer arrays to checkpoint)."""

    width: int
    heads: int
    dropout: float

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        causal = nn.make_causal_mask(jnp.ones(x.shape[:2], dtype=jnp.int32))
        attention = nn.SelfAttention(self.heads, dropout_rate=self.dropout, deterministic=not train, use_bias=False)
        x = x + attention(nn.LayerNorm(use_bias=False)(x), mask=causal)
        hidden = nn.gelu(nn.Dense(4 * self.width, use_bias=False)(nn.LayerNorm(use_bias=False)(x)))
        return x + nn.Dropout(self.dropout, deterministic=not train)(nn.Dense(self.width, use_bias=False)(hidden))


class ByteLM(nn.Module):
    """Bytes in, next-byte logits out."""

    length: int
    width: int = 64
    layers: int = 2
    heads: int = 4
    dropout: float = 0.1

    @nn.compact
    def __call__(self, tokens: jax.Array, train: bool = False) -> jax.Array:
        x = nn.Embed(VOCAB, self.width)(tokens)
        x = x + self.param("positions", nn.initializers.normal(0.02), (self.length, self.width))[: tokens.shape[1]]
        for _ in range(self.layers):
            x = Block(self.width, self.heads, self.dropout)(x, train)
        return nn.Dense(VOCAB, use_bias=False)(nn.LayerNorm(use_bias=False)(x))


def optimizer(learning_rate: float) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate))


def initial_state(model: ByteLM, tx: optax.GradientTransformation, key: jax.Array) -> State:
    params = model.init(key, jnp.zeros((1, model.length), dtype=jnp.int32))["params"]
    return {"params": params, "opt_state": tx.init(params)}


def train_step_fn(
    model: ByteLM, tx: optax.GradientTransformation, dropout_key: jax.Array
) -> Callable[[State, jax.Array, jax.Array], tuple[State, jax.Array]]:
    """(state, batch, step) -> (new state, loss); jit it with the shardings of the run."""

    def step_fn(state: State, batch: jax.Array, step: jax.Array) -> tuple[State, jax.Array]:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        rngs = {"dropout": jax.random.fold_in(dropout_key, step)}

        def loss_fn(params: Any) -> jax.Array:
            logits = model.apply({"params": params}, inputs, train=True, rngs=rngs)
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss

    return step_fn
