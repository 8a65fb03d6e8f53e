"""Which core a serving process is pinned to (MAILSVC_PIN_CORES): the choice, without I/O."""

from __future__ import annotations

import os

from mailsvc.ops.cores import cpu_list, next_core, spread, usable


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


def test_one_hyperthread_of_each_physical_core_comes_first():
    # Four physical cores whose second hyperthreads are 4 to 7 (as many clouds number them),
    # then cores whose hyperthreads are neighbours (0 and 1 share a core).
    rank = {cpu: 0 if cpu < 4 else 1 for cpu in range(8)}
    assert spread(range(8), rank) == [0, 1, 2, 3, 4, 5, 6, 7]
    neighbours = {cpu: cpu % 2 for cpu in range(8)}
    order = spread(range(8), neighbours)
    assert order == [0, 2, 4, 6, 1, 3, 5, 7]
    # Any two processes pinned in turn, from any offset, are on two physical cores.
    for start in range(8):
        first = next_core(order, [], start)
        second = next_core(order, [first], start)
        assert first is not None and second is not None and first // 2 != second // 2, start


def test_the_kernels_cpu_lists_are_read():
    assert cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert cpu_list("5") == {5}
    assert cpu_list("") == set() and cpu_list("x-1,2") == {2}


def test_the_cores_of_this_machine_are_those_this_process_may_use():
    assert sorted(usable()) == sorted(os.sched_getaffinity(0))
