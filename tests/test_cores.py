"""Which core a serving process is pinned to (MAILSVC_PIN_CORES): the choice, without I/O."""

from __future__ import annotations

from mailsvc.ops.cores import next_core


def test_each_new_process_takes_the_core_fewest_others_run_on():
    cores = [0, 1, 2]
    taken: list[int | None] = []
    for _ in range(6):
        taken.append(next_core(cores, taken))
    assert taken == [0, 1, 2, 0, 1, 2]
    assert next_core(cores, [0, 2, 0, 2]) == 1
    assert next_core(cores, [1, None, 1]) == 0  # (a process that was not pinned counts nowhere)


def test_the_turn_begins_at_an_offset_so_that_two_servers_spread():
    assert next_core([0, 1], [], start=1) == 1
    assert next_core([0, 1], [1], start=1) == 0
    assert next_core([4, 6, 9], [], start=5) == 9  # (the cores the server may use, in order)
    assert next_core([4, 6, 9], [9], start=5) == 4


def test_with_one_core_or_none_nothing_is_pinned():
    assert next_core([3], []) is None
    assert next_core([], []) is None
