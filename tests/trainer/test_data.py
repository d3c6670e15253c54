import numpy as np
import pytest

from trainer.config import validate
from trainer.data import IGNORE_INDEX, MarkovSource


@pytest.fixture(scope="module")
def src():
    return MarkovSource(
        validate({"vocab_size": 16, "seq_len": 24, "data": {"order": 2, "branching": 3, "seed": 7}})
    )


def test_samples_are_pure_function_of_global_index(src):
    whole = src.samples(100, 12)
    parts = np.concatenate([src.samples(100 + i, 1) for i in range(12)])
    assert (whole == parts).all()
    # any split of a global batch over ranks reads the same samples
    two = np.concatenate([src.samples(100, 6), src.samples(106, 6)])
    assert (two == whole).all()
    assert not (src.samples(0, 4) == src.samples(4, 4)).all()
    other = MarkovSource(
        validate({"vocab_size": 16, "seq_len": 24, "data": {"order": 2, "branching": 3, "seed": 8}})
    )
    assert not (other.samples(100, 12) == whole).all()


def test_targets_masked_until_context_complete(src):
    x, y = src.batch(0, 3)
    assert x.shape == y.shape == (3, 24)
    assert (y[:, :1] == IGNORE_INDEX).all()
    assert (y[:, 1:] >= 0).all()
    assert (x[:, 1:] == y[:, :-1].clamp(min=0))[:, 1:].all()


def test_optimal_loss_matches_empirical_nll(src):
    x = src.samples(0, 3000)
    v, k = src.vocab_size, src.order
    nll = []
    for j in range(k, x.shape[1]):
        ctx = x[:, j - 2] * v + x[:, j - 1]
        p = (src.probs[ctx] * (src.next_tokens[ctx] == x[:, j, None])).sum(1)
        nll.append(-np.log(p).mean())
    assert abs(np.mean(nll) - src.optimal_loss) < 0.02
    assert 0 < src.optimal_loss < np.log(3) + 1e-9


def test_deterministic_chain_has_zero_entropy():
    s = MarkovSource(validate({"vocab_size": 8, "seq_len": 8, "data": {"branching": 1}}))
    assert s.optimal_loss == 0.0
    d = s.describe()
    assert d["sha256"] == s.definition_sha256() and len(d["sha256"]) == 64
