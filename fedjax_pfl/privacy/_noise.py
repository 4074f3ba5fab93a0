"""The Gaussian mechanism on a pytree, and the private (clipped + noised) gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.models import Model, Params
from fedjax_pfl.validation import is_concrete

from ._clip import clipped_grad


def noise_std(clip, noise_multiplier) -> jax.Array:
    """``noise_multiplier * clip``, and exactly 0 when the multiplier is 0 (also
    for ``clip = inf``, where the product would be NaN)."""
    z = jnp.asarray(noise_multiplier, jnp.float32)
    return jnp.where(z == 0, 0.0, z * jnp.asarray(clip, jnp.float32))


def gaussian_noise(key: jax.Array, tree: Params, std) -> Params:
    """Independent ``N(0, std^2)`` entries shaped like ``tree`` (one subkey per
    leaf, split in tree order)."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(treedef, [
        (std * jax.random.normal(k, a.shape, jnp.float32)).astype(a.dtype)
        for k, a in zip(keys, leaves, strict=True)])


def private_grad(
    model: Model,
    params: Params,
    x: jax.Array,
    y: jax.Array,
    mask: jax.Array,
    key: jax.Array,
    *,
    clip,
    noise_multiplier,
    denominator,
    **clip_kwargs,
) -> tuple[Params, dict]:
    """DP-SGD's gradient (Abadi et al. 2016, eq. 5; FedFDP eq. 12):
    ``(sum_i c_i g_i + N(0, (noise_multiplier * clip)^2 I)) / denominator``
    (+ the regularizer's gradient). ``clip_kwargs`` go to :func:`clipped_grad`.
    A concrete ``noise_multiplier = 0`` draws no noise (same result: drawing
    ``|params|`` normals costs about one plain MLP step on CPU)."""
    grad, info = clipped_grad(model, params, x, y, mask, clip=clip,
                              denominator=denominator, **clip_kwargs)
    if is_concrete(noise_multiplier) and np.all(np.asarray(noise_multiplier) == 0):
        return grad, info
    noise = gaussian_noise(key, grad, noise_std(clip, noise_multiplier))
    grad = jax.tree.map(lambda g, z: g + z / denominator, grad, noise)
    return grad, info


def release_loss(losses: jax.Array, mask: jax.Array, bound, noise_multiplier, key,
                 denominator=None, lower=0.0) -> jax.Array:
    """FedFDP's private loss release (eq. 15): clip each loss to ``[0, bound]``,
    add ``N(0, (noise_multiplier * bound)^2)`` to the masked sum, divide by the
    realised batch size (or ``denominator``). ``lower`` in ``[-bound, 0]``
    clips to ``[lower, bound]`` instead, the same sensitivity ``bound`` (e.g.
    ALI-DPFL's loss changes, ``lower = -bound``)."""
    clipped = jnp.clip(losses, lower, bound) * mask
    den = jnp.maximum(jnp.sum(mask), 1.0) if denominator is None else denominator
    z = jax.random.normal(key, (), jnp.float32)
    return (jnp.sum(clipped) + noise_std(bound, noise_multiplier) * z) / den
