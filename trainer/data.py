"""Seeded synthetic token source with an exactly known optimal loss.

An order-k Markov chain over ``vocab_size`` tokens: every context (the last k tokens) has
``branching`` next-token candidates (drawn with replacement) with Dirichlet(alpha) weights.
Sample ``g`` (a global index) is a pure function of ``(data.seed, g)``: its first k tokens are
uniform, the rest follow the chain. Loss is taken only on targets whose full k-token context
is visible, so the Bayes-optimal mean cross-entropy is computable exactly: the context
distribution at each position is the uniform distribution pushed through the chain.

Sharding: step ``s`` (0-based) consumes global samples ``[s*G, (s+1)*G)`` with ``G`` the
global batch; rank ``r`` takes the contiguous slice ``[s*G + r*B, s*G + (r+1)*B)``. The
position that is saved is the global number of samples consumed, so any world size can
continue from it without skipping or repeating a sample.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import torch

from .config import Config, canonical_json

IGNORE_INDEX = -100


class MarkovSource:
    def __init__(self, cfg: Config) -> None:
        d = cfg.data
        self.vocab_size = cfg.vocab_size
        self.order = d.order
        self.seq_len = cfg.seq_len
        self.seed = d.seed
        self.branching = d.branching
        self.alpha = d.alpha
        v, k, b = self.vocab_size, self.order, self.branching
        self.n_contexts = v**k
        rng = np.random.default_rng([d.seed, 0x5EED])
        self.next_tokens = rng.integers(0, v, size=(self.n_contexts, b), dtype=np.int64)
        weights = rng.standard_gamma(self.alpha, size=(self.n_contexts, b))
        weights = np.maximum(weights, 1e-300)
        self.probs = weights / weights.sum(axis=1, keepdims=True)
        self.cdf = np.cumsum(self.probs, axis=1)
        self.cdf[:, -1] = 1.0
        self.context_entropy = self._context_entropy()
        self.optimal_loss = self._optimal_loss()

    # -- exact entropy -------------------------------------------------------------------
    def _context_entropy(self) -> np.ndarray:
        """H(next | context) in nats for every context; duplicate candidates are merged."""
        same = self.next_tokens[:, :, None] == self.next_tokens[:, None, :]  # (C, b, b)
        merged = (same * self.probs[:, None, :]).sum(axis=2)  # prob of token of slot i
        return -(self.probs * np.log(merged)).sum(axis=1)

    def _optimal_loss(self) -> float:
        v, k = self.vocab_size, self.order
        mu = np.full(self.n_contexts, 1.0 / self.n_contexts)
        succ = (np.arange(self.n_contexts)[:, None] * v + self.next_tokens) % self.n_contexts
        n_targets = self.seq_len - k + 1
        total = 0.0
        for i in range(n_targets):
            total += float(mu @ self.context_entropy)
            if i + 1 < n_targets:
                nxt = np.zeros_like(mu)
                np.add.at(nxt, succ.ravel(), (mu[:, None] * self.probs).ravel())
                mu = nxt
        return total / n_targets

    # -- description -----------------------------------------------------------------------
    def definition(self) -> dict[str, Any]:
        return {
            "kind": "markov",
            "vocab_size": self.vocab_size,
            "order": self.order,
            "branching": self.branching,
            "alpha": self.alpha,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "sample_rule": "sample g: rng=numpy.default_rng([seed, g]); k uniform tokens, "
            "then chain; loss on targets with full context",
            "table_sha256": hashlib.sha256(
                self.next_tokens.tobytes() + self.probs.tobytes()
            ).hexdigest(),
        }

    def definition_sha256(self) -> str:
        return hashlib.sha256(canonical_json(self.definition()).encode()).hexdigest()

    def describe(self) -> dict[str, Any]:
        return {
            "definition": self.definition(),
            "sha256": self.definition_sha256(),
            "optimal_loss": self.optimal_loss,
            "optimal_loss_units": "nats per target token",
            "uniform_loss": math.log(self.vocab_size),
            "targets_per_sample": self.seq_len - self.order + 1,
        }

    # -- sampling --------------------------------------------------------------------------
    def samples(self, start: int, count: int) -> np.ndarray:
        """Global samples ``[start, start+count)`` as an int64 array (count, seq_len+1)."""
        v, k, length = self.vocab_size, self.order, self.seq_len + 1
        out = np.empty((count, length), dtype=np.int64)
        u = np.empty((count, length - k), dtype=np.float64)
        for i in range(count):
            rng = np.random.default_rng([self.seed, start + i])
            out[i, :k] = rng.integers(0, v, size=k)
            u[i] = rng.random(length - k)
        ctx = np.zeros(count, dtype=np.int64)
        for j in range(k):
            ctx = ctx * v + out[:, j]
        for t in range(length - k):
            slot = (u[:, t, None] > self.cdf[ctx]).sum(axis=1)
            slot = np.minimum(slot, self.branching - 1)
            tok = self.next_tokens[ctx, slot]
            out[:, k + t] = tok
            ctx = (ctx * v + tok) % self.n_contexts
        return out

    def batch(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets for global samples ``[start, start+count)``."""
        seq = torch.from_numpy(self.samples(start, count))
        x = seq[:, :-1].contiguous()
        y = seq[:, 1:].clone()
        if self.order > 1:
            # target y[:, t] = token t+1; its context is complete only when t+1 >= order
            y[:, : self.order - 1] = IGNORE_INDEX
        return x, y


def rank_slice(samples_consumed: int, rank: int, per_rank_batch: int) -> int:
    """First global sample index rank ``rank`` reads for the step starting at the position."""
    return samples_consumed + rank * per_rank_batch
