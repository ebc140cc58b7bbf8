"""Fabric frame authentication: MAC, key id, link binding, replay window, epochs."""

from appliance.control.auth import FabricAuth
from datapath.protocol import admin_layout as al
from datapath.protocol.codec import decode_frame, encode_admin
from datapath.protocol.frame_layout import FrameType

KEY = bytes(range(32))


def _signed(auth, source=7):
    frame = encode_admin(FrameType.HELLO, [al.Hello(source, 1, 100, al.NodeRole.CORE, 0, "n")],
                         source_session=source, auth=auth.next_auth())
    return bytes(auth.sign(frame))


def test_an_authentic_frame_is_accepted_once_and_its_replay_is_rejected():
    sender, receiver = FabricAuth(KEY, 1, 1000), FabricAuth(KEY, 1, 5)
    frame = _signed(sender)
    assert receiver.check(decode_frame(frame)) is None
    assert receiver.check(decode_frame(frame)) == "replay"
    later = _signed(sender)
    assert receiver.check(decode_frame(later)) is None
    assert receiver.rejected == {"replay": 1} and receiver.accepted == 2


def test_out_of_order_frames_within_the_window_are_accepted():
    sender, receiver = FabricAuth(KEY, 1, 1000), FabricAuth(KEY, 1, 5)
    frames = [_signed(sender) for _ in range(5)]
    for i in (4, 0, 2, 1, 3):
        assert receiver.check(decode_frame(frames[i])) is None
    assert receiver.check(decode_frame(frames[2])) == "replay"


def test_forged_unsigned_and_foreign_key_frames_are_rejected():
    receiver = FabricAuth(KEY, 1, 5)
    rogue = FabricAuth(bytes(32), 1, 1000)
    assert receiver.check(decode_frame(_signed(rogue))) == "bad_mac"
    assert receiver.check(decode_frame(_signed(FabricAuth(KEY, 2, 1000)))) == "unknown_key"
    plain = encode_admin(FrameType.HELLO, [al.Hello(7, 1, 100, al.NodeRole.CORE, 0, "n")],
                         source_session=7)
    assert receiver.check(decode_frame(plain)) == "no_trailer"
    tampered = bytearray(_signed(FabricAuth(KEY, 1, 1000)))
    tampered[40] ^= 1
    assert receiver.check(decode_frame(bytes(tampered))) == "bad_mac"


def test_a_restarted_sender_counts_on_from_its_start_time_and_its_old_frames_are_replays():
    receiver = FabricAuth(KEY, 1, 5)
    start_ns = 1_700_000_000_000_000_000
    old = FabricAuth(KEY, 1, start_ns // 1_000_000, start_ns)
    captured = [_signed(old) for _ in range(3)]
    assert receiver.check(decode_frame(captured[0])) is None
    # restarted 2 s later: its epoch field wrapped (low 32 bits of ms), its counter did not
    new = FabricAuth(KEY, 1, (start_ns + 2 * 10**9) // 1_000_000, start_ns + 2 * 10**9)
    assert receiver.check(decode_frame(_signed(new))) is None
    assert [receiver.check(decode_frame(f)) for f in captured] == ["replay"] * 3


def test_a_frame_is_accepted_only_on_the_link_it_was_signed_for():
    sender, receiver = FabricAuth(KEY, 1, 1), FabricAuth(KEY, 1, 2)

    def frame(ftype, dest):
        entries = [al.Hello(7, 1, 100, al.NodeRole.CORE, 0, "n")] if ftype is not \
            FrameType.CONTROL else [al.Control(al.ControlKind.ECHO, '{"ts":0}')]
        return decode_frame(bytes(sender.sign(encode_admin(
            ftype, entries, source_session=7, dest_session=dest, auth=sender.next_auth()))))

    assert receiver.check(frame(FrameType.CONTROL, 9), link=8) == "wrong_link"
    assert receiver.check(frame(FrameType.HELLO, 5), link=8, hello_link=4) == "wrong_link"
    assert receiver.check(frame(FrameType.HELLO, 4), link=8, hello_link=4) is None
    assert receiver.check(frame(FrameType.CONTROL, 8), link=8) is None
    # the data path's form: a frame signed by appending a trailer, checked from its bytes
    plain = encode_admin(FrameType.NAK, [al.SeqRange(1, 5)], source_session=7,
                         dest_session=8, stream_id=1)
    signed = sender.signed_copy(memoryview(plain))
    assert decode_frame(bytes(signed)).auth is not None
    assert receiver.check_bytes(memoryview(signed), 7, 8, link=9) == "wrong_link"
    assert receiver.check_bytes(memoryview(signed), 7, 8, link=8) is None
    assert receiver.check_bytes(memoryview(signed), 7, 8, link=8) == "replay"
    assert receiver.check_bytes(memoryview(bytes(plain)), 7, 8, link=8) == "no_trailer"


def test_a_reliable_stream_frame_is_accepted_only_by_the_incarnation_it_was_made_for():
    """A stream made for the destination's earlier epoch is refused by its restarted
    incarnation, and by nothing else than its MAC's binding (control/auth.py)."""
    sender = FabricAuth(KEY, 1, 1_700_000_000_000)
    old, new = 1_700_000_500_000, 1_700_000_900_000  # the destination's epochs
    plain = encode_admin(FrameType.NAK, [al.SeqRange(1, 5)], source_session=7,
                         dest_session=8, stream_id=1)
    restarted = FabricAuth(KEY, 1, new)
    stale = sender.signed_copy(memoryview(plain), bind=old)
    assert restarted.check_bytes(memoryview(stale), 7, 8, link=8,
                                 bind=restarted.incarnation) == "bad_mac"
    fresh = sender.signed_copy(memoryview(plain), bind=new)
    assert restarted.check_bytes(memoryview(fresh), 7, 8, link=8,
                                 bind=restarted.incarnation) is None
    # the whole epoch, not its low 32 bits, is bound: epochs equal modulo 2^32 differ
    wrapped = sender.signed_copy(memoryview(plain), bind=new + (1 << 32))
    assert restarted.check_bytes(memoryview(wrapped), 7, 8, link=8,
                                 bind=restarted.incarnation) == "bad_mac"
