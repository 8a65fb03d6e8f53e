"""Identifiers: an ordered id's text sorts as the time it was made, whatever its digits."""

from __future__ import annotations

import random
import re

from mailsvc.ids import new_id, new_ordered_id


def test_ordered_ids_sort_as_their_times_across_every_digit():
    # Times that carry every base32 digit over, and times at random over the whole 48 bits
    # (base32's own alphabet puts 2 to 7 after z, which would sort them first).
    rng = random.Random(16)
    times = list(range(0, 70)) + [rng.randrange(2**48) for _ in range(3000)]
    times += [(1 << shift) - 1 for shift in range(1, 48)] + [1 << shift for shift in range(48)]
    times = sorted(set(times))
    ids = [new_ordered_id("em", milliseconds / 1000) for milliseconds in times]
    assert sorted(ids) == ids
    assert all(re.fullmatch(r"em_[a-z2-7]{26}", identifier) for identifier in ids)


def test_ordered_ids_of_one_millisecond_differ_in_their_random_part():
    ids = {new_ordered_id("em", 1_795_000_000.123) for _ in range(1000)}
    assert len(ids) == 1000
    # The time is the first 9 characters and 3 bits of the 10th; the rest is random.
    assert len({identifier[:12] for identifier in ids}) == 1
    assert len({identifier[:13] for identifier in ids}) > 1
    assert len({identifier[-16:] for identifier in ids}) == 1000


def test_other_ids_stay_random():
    ids = [new_id("key") for _ in range(50)]
    assert len({identifier[:7] for identifier in ids}) > 40
    assert all(re.fullmatch(r"key_[a-z2-7]{26}", identifier) for identifier in ids)
