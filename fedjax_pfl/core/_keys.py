"""The registry of random-key tags: every ``jax.random.fold_in(key, tag)`` that
derives an independent stream in the package takes its tag from here.

One enum, so two uses can never share a tag by accident (``@unique`` refuses a
duplicate value at import time). Add a member here when a method needs a new
stream; never reuse or renumber one (that would change every result drawn from
it).
"""

from __future__ import annotations

import enum


@enum.unique
class KeyTag(enum.IntEnum):
    """``fold_in`` tags; each member's comment says which key it is folded into."""

    COHORT = 0  # round key: the cohort draw
    CLIENT = 1  # round key: the per-client keys (then fold_in(client id))
    SERVER = 2  # round key: the server step (aggregator randomness)
    EVAL = 7  # run key: evaluation-time randomness (finetuning)
    ATTACK = 11  # client key: a malicious client's attack noise
    PERSONAL = 12  # client key: Ditto's personal minibatch stream
    DP_NOISE = 13  # client key: local DP-SGD noise
    FEDFDP_LOSS = 14  # client key: FedFDP's loss-release batch and noise
    EWC_FISHER = 15  # client key: EWC's Fisher minibatches (was 13 before 0.2)
    MAPPER_GLOBAL = 16  # client key: MAPPER's global step (was 14 before 0.2)
    LINDT_LOCAL = 21  # client key: LINDT's local-layer stream
    LINDT_NOISE = 22  # client key: LINDT's noise
    LINDT_FB = 23  # client key: LINDT's fine-tuning (FB) stream
    FEDFDP_LOSS_NOISE = 24  # FEDFDP_LOSS key: the released loss's noise (was 1)
    FEDREP_HEAD = 25  # client key: FedRep's head-training minibatch stream
    ALI_STEPS = 26  # client key: ALI-DPFL's local steps before the last one
    ALI_LOSS = 27  # client key: ALI-DPFL's loss-change batch
    ALI_LOSS_NOISE = 28  # ALI_LOSS key: the released loss change's noise
    NFL_PRIVATE_RUN = 99  # run key: the local-only run of private accuracies
    CLIENT_DP_NOISE = 217  # server key: client-level DP's aggregate noise
