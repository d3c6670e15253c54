"""How one watcher cycle shares its reading between researchers (pure; ``jobs.rundir``
uses it).

A cycle reads at most ``capacity`` new metric bytes over every job it reads (what the
batched reader's commands of one round may answer, see ``jobs.rundir.cycle_metrics_bytes``).
The capacity is shared max-min fairly, first between accounts (all of one account's jobs
together), then between the jobs of each account: nobody gets more than they asked for,
and nobody who got less than they asked for got less than anyone else at their level.

The bound this gives (tested in ``tests/jobs/test_read_shares.py``): in every cycle, a job
of an account that has ``J`` jobs with new bytes, among ``A`` such accounts, is given at
least ``min(its new bytes, capacity // (A * J))`` bytes, whatever the other accounts
write. So another account's volume never defers a job's read to a later cycle; it can only
make a job that itself has more than its share take more cycles to catch up (at most
``ceil(new bytes / (capacity // (A * J)))``).

The directories are also sent to the reader interleaved between accounts, starting at an
account that turns with each cycle (``interleaved``): the files read whole (checkpoint
manifests, acceptance), whose sizes the listing does not give, go first to each account
in turn, so one account's many large manifests defer another's by at most ``A - 1``
cycles, and only when the manifests of one round do not fit the reader's budget at all.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


def water_fill(wants: dict[K, int], capacity: int) -> dict[K, int]:
    """Max-min fair shares of ``capacity`` for ``wants`` (each at most what it wants). The
    smallest wants are met first; the rest share what is left equally (integer bytes: a
    remainder below one byte per claimant stays unused)."""
    shares: dict[K, int] = {}
    left = max(0, capacity)
    ordered = sorted(wants.items(), key=lambda item: item[1])
    for index, (key, want) in enumerate(ordered):
        give = min(max(0, want), left // (len(ordered) - index))
        shares[key] = give
        left -= give
    return shares


def fair_shares(wants: dict[K, tuple[str, int]], capacity: int) -> dict[K, int]:
    """Per job (``wants``: job -> (account, bytes it has new)): the accounts' fair shares of
    ``capacity``, each split fairly between that account's jobs."""
    by_account: dict[str, dict[K, int]] = {}
    for key, (account, want) in wants.items():
        by_account.setdefault(account, {})[key] = max(0, want)
    accounts = water_fill(
        {account: sum(jobs.values()) for account, jobs in by_account.items()}, capacity
    )
    shares: dict[K, int] = {}
    for account, jobs in by_account.items():
        shares.update(water_fill(jobs, accounts[account]))
    return shares


def interleaved(items: Sequence[T], account_of: Callable[[T], str], turn: int) -> list[T]:
    """``items`` reordered one account at a time (the first of each account, then the
    second of each, ...), the accounts in name order starting at ``turn`` modulo their
    number, so that no account is always last."""
    by_account: dict[str, list[T]] = {}
    for item in items:
        by_account.setdefault(account_of(item), []).append(item)
    names = sorted(by_account)
    if not names:
        return []
    start = turn % len(names)
    names = names[start:] + names[:start]
    ordered: list[T] = []
    depth = max(len(group) for group in by_account.values())
    for level in range(depth):
        ordered += [by_account[name][level] for name in names if level < len(by_account[name])]
    return ordered
