"""Admin-frame authentication: MAC, key id, replay window, epochs."""

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


def test_a_restarted_sender_starts_a_new_epoch_and_old_epochs_are_stale():
    receiver = FabricAuth(KEY, 1, 5)
    old, new = FabricAuth(KEY, 1, 1000), FabricAuth(KEY, 1, 2000)
    old_frame = _signed(old)
    assert receiver.check(decode_frame(_signed(new))) is None
    assert receiver.check(decode_frame(old_frame)) == "stale_epoch"
