from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm.hostlist import compress, expand, natural_key


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("n1", ["n1"]),
        ("n[1-4,7]", ["n1", "n2", "n3", "n4", "n7"]),
        ("gpu[001-003]", ["gpu001", "gpu002", "gpu003"]),
        ("gpu[098-100]", ["gpu098", "gpu099", "gpu100"]),
        ("n1,gpu[1-2]", ["n1", "gpu1", "gpu2"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("leaf[1-2]", ["leaf1", "leaf2"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("login", ["login"]),
        ("", []),
        ("(null)", []),
        ("None assigned", []),
        (None, []),
    ],
)
def test_expand(expression: str | None, names: list[str]) -> None:
    assert expand(expression) == names


@pytest.mark.parametrize(
    "bad", ["n[1-", "n1-2]", "n[a-b]", "n[3-1]", "n[[1]]", "n[1,,2]", "n1,,n2", "n[1-2] n3"]
)
def test_expand_refuses_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match=r"host list|range|host name"):
        expand(bad)


@pytest.mark.parametrize(
    ("names", "expression"),
    [
        (["n3", "n1", "n2", "n7"], "n[1-3,7]"),
        (["n1"], "n1"),
        (["n2", "n1", "n1"], "n[1-2]"),
        (["gpu001", "gpu002", "gpu003"], "gpu[001-003]"),
        (["n10", "n9", "n2"], "n[2,9-10]"),
        (["login", "n1", "n2"], "login,n[1-2]"),
        ([], ""),
    ],
)
def test_compress(names: list[str], expression: str) -> None:
    assert compress(names) == expression


names_strategy = st.lists(
    st.builds(
        lambda prefix, number, width, suffix: f"{prefix}{str(number).zfill(width)}{suffix}",
        st.sampled_from(["n", "gpu", "node-", "a1b"]),
        st.integers(min_value=0, max_value=300),
        st.sampled_from([0, 0, 3]),
        st.sampled_from(["", "", "-ib"]),
    ),
    max_size=40,
)


@given(names_strategy)
def test_expand_of_compress_is_the_sorted_set(names: list[str]) -> None:
    expanded = expand(compress(names))
    assert len(expanded) == len(set(expanded))
    assert sorted(expanded, key=natural_key) == sorted(set(names), key=natural_key)


@given(names_strategy)
def test_compress_of_expand_round_trips_canonical_forms(names: list[str]) -> None:
    canonical = compress(names)
    assert compress(expand(canonical)) == canonical
