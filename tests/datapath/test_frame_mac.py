"""The DATA frame MAC kernels (datapath/protocol/frame_mac.py) against their hashlib twin:
signing, checking, link binding, key ids, and the replay window."""

import numpy as np
import pytest

from datapath.protocol import _kernels as kern
from datapath.protocol import frame_layout as fl
from datapath.protocol import frame_mac as fm
from datapath.protocol._kernels import write_frame_header

KEY = bytes(range(32))
RELIABLE = 1 << 31
SLOT = 256
PEER = 4242
SENDER, RECEIVER = 5, 11


def frames(n, stream=3, body=64):
    buf = np.zeros(n * SLOT, np.uint8)
    offsets = np.arange(n, dtype=np.int64) * SLOT
    lengths = np.full(n, fl.FRAME_HEADER_BYTES + body, np.int64)
    for i in range(n):
        o = int(offsets[i])
        write_frame_header(buf, o, o + int(lengths[i]), 1, int(fl.FrameType.DATA), SENDER, 99,
                           stream, 0)
        buf[o + 32:o + int(lengths[i])] = (np.arange(body) + i) % 251
    return buf, offsets, lengths, np.full(n, PEER, np.int64)


def sign(buf, offsets, lengths, peers, n, key=KEY, key_id=7, node=SENDER, receiver=RECEIVER,
         seq=1_000):
    ab, ac = fm.new_state(key, key_id, 1, node, seq)
    kern.sign_frames(buf, offsets, lengths, peers, n, SLOT, np.array([PEER], np.int64),
                   np.array([receiver], np.int64), -1, 123_456_789, ab, ac)
    return ac


class Checker:
    def __init__(self, key=KEY, key_id=7, node=RECEIVER, sender=SENDER):
        self.ab, self.ac = fm.new_state(key, key_id, 1, node, 0)
        self.windows = fm.new_windows(2)
        self.sender = sender
        self.node = node

    def check(self, buf, offsets, lengths, peers, which):
        verdicts = np.zeros(len(offsets), np.int8)
        idx = np.asarray(which, np.int64)
        kern.check_frames(buf, offsets, lengths, peers, idx, len(idx), RELIABLE,
                        np.array([PEER], np.int64), np.array([self.sender], np.int64),
                        np.array([0], np.int64), self.node, self.ab, self.ac, self.windows,
                        verdicts)
        return verdicts[idx].tolist()

    def counts(self):
        return dict(zip(fm.REASONS, self.ac[fm.A_ACCEPTED:].tolist()))


def test_a_signed_frame_carries_the_trailer_and_the_mac_of_its_hashlib_twin():
    buf, offsets, lengths, peers = frames(3)
    ac = sign(buf, offsets, lengths, peers, 3)
    assert ac[fm.A_SIGNED] == 3 and lengths.tolist() == [128] * 3
    for i in range(3):
        frame = bytes(buf[offsets[i]:offsets[i] + lengths[i]])
        assert frame[fl.FLAGS_OFFSET + 1] & int(fl.FrameFlags.AUTH_TRAILER)
        assert int.from_bytes(frame[8:12], "big") == 128
        assert int.from_bytes(frame[24:32], "big") == 123_456_789  # stamped by the signer
        key_id, epoch, seq = fl.AUTH_TRAILER_STRUCT.unpack_from(frame, 128 - 32)
        assert (key_id, epoch, seq) == (7, 1, 1_001 + i)
        assert frame[-16:] == fm.mac_py(KEY, frame[:-16], SENDER, RECEIVER)
        # the send time is outside the MAC: a hop may stamp it again
        assert fm.mac_py(KEY, frame[:24] + bytes(8) + frame[32:-16], SENDER, RECEIVER) == \
            frame[-16:]


def test_frames_already_signed_by_their_plane_are_left_alone():
    buf, offsets, lengths, peers = frames(1)
    sign(buf, offsets, lengths, peers, 1)
    before = bytes(buf[:SLOT])
    ac = sign(buf, offsets, lengths, peers, 1, seq=5_000)
    assert ac[fm.A_SIGNED] == 0 and bytes(buf[:SLOT]) == before


def test_a_frame_without_room_or_for_an_unknown_peer_goes_unsigned_and_is_counted():
    buf, offsets, lengths, peers = frames(2, body=SLOT - 32 - 24)
    peers[1] = 1
    ac = sign(buf, offsets, lengths, peers, 2)
    assert ac[fm.A_UNSIGNED] == 2 and ac[fm.A_SIGNED] == 0


def test_the_checker_accepts_a_good_frame_and_removes_its_trailer():
    buf, offsets, lengths, peers = frames(2)
    plain = bytes(buf[:96])
    sign(buf, offsets, lengths, peers, 2)
    checker = Checker()
    assert checker.check(buf, offsets, lengths, peers, [0, 1]) == [fm.OK, fm.OK]
    assert lengths.tolist() == [96, 96]
    frame = bytes(buf[:96])
    assert frame[:24] == plain[:24] and frame[32:] == plain[32:]  # as it was, send time aside
    assert checker.counts()["accepted"] == 2


@pytest.mark.parametrize("change, reason", [
    (lambda b: b.__setitem__(40, b[40] ^ 1), "bad_mac"),       # a payload bit
    (lambda b: b.__setitem__(15, b[15] ^ 1), "bad_mac"),       # the source session
    (lambda b: b.__setitem__(128 - 9, b[128 - 9] ^ 1), "bad_mac"),  # the sequence
    (lambda b: b.__setitem__(128 - 29, 8), "unknown_key"),    # the key id
    (lambda b: b.__setitem__(5, 0), "no_trailer"),             # the flag cleared
])
def test_any_change_to_a_signed_frame_is_refused_by_reason(change, reason):
    buf, offsets, lengths, peers = frames(1)
    sign(buf, offsets, lengths, peers, 1)
    change(buf)
    checker = Checker()
    assert checker.check(buf, offsets, lengths, peers, [0]) == [fm.REFUSED]
    assert checker.counts()[reason] == 1
    assert lengths[0] == 128  # a refused frame is left as it came


def test_a_frame_for_another_link_or_signed_with_another_key_is_refused():
    buf, offsets, lengths, peers = frames(1)
    sign(buf, offsets, lengths, peers, 1, receiver=12)  # signed for node 12
    assert Checker().check(buf, offsets, lengths, peers, [0]) == [fm.REFUSED]
    buf, offsets, lengths, peers = frames(1)
    sign(buf, offsets, lengths, peers, 1)
    assert Checker(sender=6).check(buf, offsets, lengths, peers, [0]) == [fm.REFUSED]
    buf, offsets, lengths, peers = frames(1)
    sign(buf, offsets, lengths, peers, 1, key=bytes(32))
    checker = Checker()
    assert checker.check(buf, offsets, lengths, peers, [0]) == [fm.REFUSED]
    assert checker.counts()["bad_mac"] == 1


def test_frames_the_mac_does_not_cover_are_not_touched():
    buf, offsets, lengths, peers = frames(2, stream=RELIABLE | 4)
    buf[offsets[1] + fl.TYPE_OFFSET] = int(fl.FrameType.CONTROL)
    buf[offsets[1] + fl.STREAM_ID_OFFSET:offsets[1] + 24] = 0
    checker = Checker()
    assert checker.check(buf, offsets, lengths, peers, [0, 1]) == [fm.NOT_SUBJECT] * 2
    assert sum(checker.counts().values()) == 0


def test_a_frame_from_a_peer_that_is_no_neighbour_is_left_to_the_caller_unchecked():
    buf, offsets, lengths, peers = frames(1)
    sign(buf, offsets, lengths, peers, 1)
    peers[0] = 77
    checker = Checker()
    assert checker.check(buf, offsets, lengths, peers, [0]) == [fm.NOT_SUBJECT]
    assert sum(checker.counts().values()) == 0 and lengths[0] == 128


def test_a_link_without_a_window_is_refused():
    buf, offsets, lengths, peers = frames(1)
    sign(buf, offsets, lengths, peers, 1)
    checker = Checker()
    verdicts = np.zeros(1, np.int8)
    kern.check_frames(buf, offsets, lengths, peers, np.zeros(1, np.int64), 1, RELIABLE,
                    np.array([PEER], np.int64), np.array([SENDER], np.int64),
                    np.array([-1], np.int64), RECEIVER, checker.ab, checker.ac,
                    checker.windows, verdicts)
    assert verdicts[0] == fm.REFUSED and checker.counts()["links_full"] == 1


def signed_copies(seqs):
    """One signed frame per sequence in ``seqs`` (in that order)."""
    out = []
    for seq in seqs:
        buf, offsets, lengths, peers = frames(1)
        sign(buf, offsets, lengths, peers, 1, seq=seq - 1)
        out.append((buf, offsets, lengths, peers))
    return out


def window_verdicts(seqs):
    checker = Checker()
    return [checker.check(*f, [0])[0] == fm.OK for f in signed_copies(seqs)]


def test_the_replay_window_takes_new_and_late_frames_and_refuses_repeats_and_old_ones():
    base = 10**18
    w = fm.WINDOW_BITS
    assert window_verdicts([base, base]) == [True, False]                 # a repeat
    assert window_verdicts([base + 5, base + 3, base + 4, base + 3]) == [True, True, True,
                                                                          False]
    assert window_verdicts([base + w, base + 1]) == [True, False]          # below the window
    assert window_verdicts([base + w, base + 65]) == [True, True]          # late, within it
    # the window slides: bits of sequences far below are cleared, not taken for repeats
    assert window_verdicts([base, base + 3 * w, base + 3 * w - 5, base + 5 * w + 1,
                            base + 3 * w]) == [True, True, True, True, False]
    # a restarted sender starts from its start time: far above, accepted
    assert window_verdicts([base, base + 10**12, base + 1]) == [True, True, False]


def test_the_window_against_a_set_of_seen_sequences_on_random_orders():
    rng = np.random.default_rng(7)
    base = 10**15
    seqs = (base + rng.integers(0, 4 * fm.WINDOW_BITS, 600)).tolist()
    got = window_verdicts(seqs)
    seen: set[int] = set()
    high = -1
    for seq, ok in zip(seqs, got):
        too_old = high >= 0 and (high >> 6) - (seq >> 6) >= fm.WINDOW_WORDS
        expect = not too_old and seq not in seen
        assert ok == expect, (seq, high)
        if ok:
            seen.add(seq)
            high = max(high, seq)


# --- frames from an appliance to a client session ----------------------------------------------
def session_keys(*keys):
    rows = fm.new_session_keys(len(keys))
    for i, key in enumerate(keys):
        rows[i, 0] = len(key)
        rows[i, fm.SESSION_KEY_AT:fm.SESSION_KEY_AT + len(key)] = np.frombuffer(key, np.uint8)
    return rows


def sign_down(buf, offsets, lengths, peers, n, dests, slots, keys, seq=500):
    ab, ac = fm.new_state(b"\x00", 0, 0, 1, seq)
    kern.sign_session_frames(buf, offsets, lengths, peers, n, SLOT, np.asarray(dests, np.int64),
                             np.arange(len(dests), dtype=np.int64), np.asarray(slots, np.int64),
                             123_456_789, ab, ac, keys)
    return ac


class DownChecker:
    """A client's check (``check_down_frames``) under ``key``."""

    def __init__(self, key=KEY, mode=kern.DOWN_KEYED, login=False):
        self.ab, self.ac = fm.new_state(key, 0, 0, 0, 0)
        self.window = fm.new_windows(1)[0]
        self.mode, self.login = mode, login

    def check(self, buf, offsets, lengths, n):
        verdicts = np.zeros(n, np.int8)
        kern.check_down_frames(buf, offsets, lengths, n, self.mode, self.login, self.ab,
                               self.ac, self.window, verdicts)
        return verdicts.tolist()

    def counts(self):
        return dict(zip(fm.REASONS[:-1], self.ac[fm.A_ACCEPTED:fm.A_ACCEPTED + 5].tolist()))


def test_frames_to_a_session_with_a_key_carry_the_mac_of_their_hashlib_twin():
    """Only frames to the destinations of sessions with a key are signed, each under its
    session's key, with a sequence counting up over all of them."""
    other = bytes(range(100, 132))
    buf, offsets, lengths, peers = frames(3)
    peers[:] = [10, 20, 30]  # 30: a session without a key (not listed)
    ac = sign_down(buf, offsets, lengths, peers, 3, [10, 20], [1, 0], session_keys(other, KEY))
    assert lengths.tolist() == [32 + 64 + 32] * 2 + [32 + 64]
    assert int(ac[fm.A_SIGNED]) == 2 and int(ac[fm.A_UNSIGNED]) == 0
    for i, key in ((0, KEY), (1, other)):
        o, n = int(offsets[i]), int(lengths[i])
        frame = bytes(buf[o:o + n])
        assert frame[5] & int(fl.FrameFlags.AUTH_TRAILER)
        assert int.from_bytes(frame[-16 - 8:-16], "big") == 501 + i
        assert frame[-16:] == fm.mac_down_py(key, frame[:-16])
        assert frame[-16:] != fm.mac_py(key, frame[:-16], 0, 0)  # not the other direction's
    assert not buf[int(offsets[2]) + 5] & int(fl.FrameFlags.AUTH_TRAILER)


def test_the_client_takes_its_sessions_frames_once_and_refuses_the_others_by_reason():
    buf, offsets, lengths, peers = frames(4)
    sign_down(buf, offsets, lengths, peers, 3, [PEER], [0], session_keys(KEY))
    lengths[3] = fl.FRAME_HEADER_BYTES + 64  # frame 3 unsigned
    signed = buf.copy(), lengths.copy()
    buf[int(offsets[1]) + 40] ^= 1  # a byte changed
    client = DownChecker()
    assert client.check(buf, offsets, lengths, 4) == [fm.OK, fm.REFUSED, fm.OK, fm.REFUSED]
    assert lengths[0] == fl.FRAME_HEADER_BYTES + 64  # trailer removed
    again_buf, again_len = signed
    assert client.check(again_buf, offsets, again_len, 1) == [fm.REFUSED]  # a replay
    stranger = DownChecker(key=bytes(32))
    sbuf, slen = signed[0].copy(), signed[1].copy()
    assert stranger.check(sbuf, offsets, slen, 1) == [fm.REFUSED]  # another session's key
    assert client.counts() == {"accepted": 2, "no_trailer": 1, "unknown_key": 0,
                               "bad_mac": 1, "replay": 1}
    assert stranger.counts()["bad_mac"] == 1


def test_a_login_takes_unsigned_control_frames_only_unverified_and_an_open_session_anything():
    buf, offsets, lengths, peers = frames(2)
    buf[int(offsets[1]) + fl.TYPE_OFFSET] = int(fl.FrameType.CONTROL)
    assert DownChecker(mode=kern.DOWN_LOGIN).check(buf, offsets, lengths, 2) == [
        fm.REFUSED, kern.UNVERIFIED]
    waiting = DownChecker(login=True)  # keyed, the login's answer not yet in
    assert waiting.check(buf, offsets, lengths, 2) == [fm.REFUSED, kern.UNVERIFIED]
    assert DownChecker().check(buf, offsets, lengths, 2) == [fm.REFUSED, fm.REFUSED]
    assert DownChecker(mode=kern.DOWN_OPEN).check(buf, offsets, lengths, 2) == [
        fm.NOT_SUBJECT] * 2
