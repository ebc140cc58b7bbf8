"""A session's publishable keys grown (``DataPlaneAgent.allow_keys``, one command per frame
of a batched registration): the session table patched in its row equals the table built
anew from every session's set (``express.build_sessions``)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np

from appliance.dataplane import express


def _session(sid: int, keys: set[int]) -> SimpleNamespace:
    return SimpleNamespace(session_id=sid, allowed=set(keys), acl_class=0, auth_slot=-1)


def _same(a: express.SessionTable, b: express.SessionTable) -> bool:
    return (np.array_equal(a.bounds, b.bounds) and np.array_equal(a.keys, b.keys)
            and np.array_equal(a.ids, b.ids) and a.rows == b.rows)


def test_keys_allowed_in_turn_patch_the_table_as_a_build_makes_it():
    rng = random.Random(7)
    sessions = {sid: _session(sid, {rng.randrange(1, 1 << 60) for _ in range(rng.randint(0, 50))})
                for sid in range(1, 6)}
    dp = SimpleNamespace(_by_peer={("udp", 100 + sid): s for sid, s in sessions.items()})
    table = express.build_sessions(dp)
    for _ in range(40):
        session = sessions[rng.randint(1, 5)]
        keys = [rng.randrange(1, 1 << 60) for _ in range(rng.randint(1, 30))]
        keys += rng.sample(sorted(session.allowed), min(3, len(session.allowed)))  # held
        fresh = [k for k in dict.fromkeys(keys) if k not in session.allowed]
        session.allowed.update(fresh)
        express.keys_added(session, np.asarray(fresh, np.uint64))
        table = express.session_keys_changed(table, session)
        assert _same(table, express.build_sessions(dp))
    # the sorted copy was merged, not rebuilt from the set
    assert all(s._sorted_allowed is not None for s in sessions.values())


def test_a_stale_sorted_copy_is_rebuilt_from_the_set():
    session = _session(1, {5, 3})
    assert express.allowed_keys(session).tolist() == [3, 5]
    session.allowed.update({9, 1})  # changed behind the copy's back (no keys_added)
    express.keys_added(session, np.asarray([7], np.uint64))
    session.allowed.add(7)
    assert express.allowed_keys(session).tolist() == [1, 3, 5, 7, 9]
