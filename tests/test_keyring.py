"""The service's own keys: made once, whichever of a process's threads asks first."""

from __future__ import annotations

import threading

from mailsvc.store.keyring import KEYS, Keyring


def test_threads_that_need_the_keys_at_once_make_each_key_once(open_test_store):
    """A new worker's first requests all need the keys: one thread reads (and, the first time
    ever, makes) each of them, and the others wait for it instead of each reading, and each
    offering one in a write transaction of its own."""
    writes: list[object] = []
    keyring = Keyring(_counting_writes(open_test_store(), writes))
    start = threading.Barrier(16)
    found: list[dict[str, bytes]] = []

    def first_request() -> None:
        start.wait()
        keyring.load()
        found.append({name: keyring.key(name) for name in KEYS})

    threads = [threading.Thread(target=first_request) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == 16 and all(keys == found[0] for keys in found)
    assert len(writes) == len(KEYS)  # one key made each, by one thread
    # Another process finds them made: it reads them and writes nothing.
    other = Keyring(_counting_writes(open_test_store(), writes))
    other.load()
    assert {name: other.key(name) for name in KEYS} == found[0]
    assert len(writes) == len(KEYS)


def _counting_writes(store, writes: list[object]):
    """The store, each of its write jobs from now on appended to ``writes``."""
    write = store.write

    def counted(job, durable=True):
        writes.append(job)
        return write(job, durable)

    store.write = counted
    return store
