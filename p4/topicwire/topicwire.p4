/*
 * topicwire.p4: the offload pipeline of topicwire for BMv2 (P4_16, v1model).
 *
 * The same match-action pipeline as the software NIC (nic_offload/model.py holds the names,
 * widths and semantics; tests/p4 holds this file to them):
 *
 *   Ethernet / IPv4 / UDP dst 47470 -> native frame header (32 bytes) -> first message
 *   header (40 bytes) -> ACL fields (payload bytes 0..15: four 4-byte fields)
 *     |
 *     v
 *   TopicwireIngress.topic_key   hdr.msg.topic_key exact      (direct counter per key)
 *     drop | punt / miss (CPU port + digest) | forward(port, class) | forward_group(group, class)
 *     |
 *     v  acl_class != 0: ACL stages, chained by acl_state (Camus's shape)
 *   TopicwireIngress.acl_k       (meta.acl_class exact, meta.acl_state exact, meta.field_k range)
 *     acl_next(state) -> next stage | acl_accept | acl_reject / miss | acl_log (+ digest)
 *     |
 *     v
 *   TopicwireIngress.port_map    meta.egress_port exact (a forward's 16-bit logical port: a
 *     to_port(physical) | to_cpu / miss      session, a guaranteed subscriber, a destination
 *     |                                      appliance) -> v1model's 9-bit egress_spec; a
 *     v                                      logical port without an entry goes to the CPU
 *   physical port, or multicast group        port, where the host's data path delivers it
 *
 * The program decides single-message DATA / RETRANSMISSION frames it can validate; every
 * other frame (several messages, admin frames, an authentication trailer, IPv4 options or
 * fragments, a bad IPv4 checksum or inconsistent lengths, anything malformed, other traffic)
 * goes to the CPU port unchanged, where the host and its software NIC decide it
 * (p4/README.md).
 */

#include <core.p4>
#include <v1model.p4>

/* --- wire constants (docs/protocol.md) ---------------------------------------------------- */
const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8>  IP_PROTO_UDP = 17;
const bit<16> NATIVE_UDP_PORT = 47470;
const bit<32> ETHERNET_HEADER_BYTES = 14;
const bit<16> IPV4_HEADER_BYTES = 20;      /* no options: ihl 5 */
const bit<16> UDP_HEADER_BYTES = 8;
const bit<16> NATIVE_MAGIC = 0x5457;
const bit<8>  NATIVE_VERSION = 1;
const bit<8>  FRAME_DATA = 1;
const bit<8>  FRAME_RETRANSMISSION = 8;
const bit<32> FRAME_HEADER_BYTES = 32;
const bit<32> MESSAGE_HEADER_BYTES = 40;
const bit<32> MAX_FRAME_BYTES = 65504;
const bit<32> MAX_PAYLOAD_BYTES = 65432;
const bit<8>  KNOWN_MESSAGE_FLAGS = 0x0f;
const bit<8>  MAX_QOS = 2;

/* --- pipeline constants (nic_offload/model.py) --------------------------------------------- */
const bit<32> ACL_FIELDS_END = 16;          /* payload bytes the four ACL fields need */
const bit<32> ACL_FIELDS_SHORT_MASK = 0xFFFFFFF0;  /* payload_len & mask == 0: shorter than 16 */
const bit<9>  CPU_PORT = 255;
const bit<16> NO_ACL_CLASS = 0;

/* meta.key_action: model.KeyAction (0: table miss) */
const bit<8> KEY_MISS = 0;
const bit<8> KEY_DROP = 1;
const bit<8> KEY_FORWARD = 2;
const bit<8> KEY_FORWARD_GROUP = 3;
const bit<8> KEY_PUNT = 4;

/* meta.acl_verdict: model.AclAction (0: no decision yet) */
const bit<8> ACL_PENDING = 0;
const bit<8> ACL_ACCEPT = 2;
const bit<8> ACL_REJECT = 3;
const bit<8> ACL_LOG = 4;

/* digest reasons: model.DigestReason */
const bit<8> DIGEST_NONE = 0;
const bit<8> DIGEST_UNKNOWN_KEY = 1;
const bit<8> DIGEST_PUNT = 2;
const bit<8> DIGEST_ACL_LOG = 3;

/* --- headers -------------------------------------------------------------------------------- */
header ethernet_t {
    bit<48> dstAddr;
    bit<48> srcAddr;
    bit<16> etherType;
}

header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  diffserv;
    bit<16> totalLen;
    bit<16> identification;
    bit<3>  flags;
    bit<13> fragOffset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdrChecksum;
    bit<32> srcAddr;
    bit<32> dstAddr;
}

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> length;
    bit<16> checksum;
}

/* Native frame header, 32 bytes (datapath/protocol/frame_layout.py). */
header frame_t {
    bit<16> magic;
    bit<8>  version;
    bit<8>  frame_type;
    bit<16> flags;
    bit<16> msg_count;
    bit<32> frame_len;
    bit<32> source_session;
    bit<32> dest_session;
    bit<32> stream_id;
    bit<64> send_ts_ns;
}

/* Message header, 40 bytes (datapath/protocol/message_layout.py). */
header msg_t {
    bit<64> topic_key;
    bit<64> sequence;
    bit<64> publish_ts_ns;
    bit<32> namespace_id;
    bit<16> schema_id;
    bit<8>  qos;
    bit<8>  flags;
    bit<32> payload_len;
    bit<16> topic_len;
    bit<16> reserved;
}

/* ACL fields: model.DEFAULT_ACL_FIELDS, unsigned big-endian at payload offsets 0, 4, 8, 12. */
header acl_fields_t {
    bit<32> field_0;
    bit<32> field_1;
    bit<32> field_2;
    bit<32> field_3;
}

struct headers {
    ethernet_t   ethernet;
    ipv4_t       ipv4;
    udp_t        udp;
    frame_t      frame;
    msg_t        msg;
    acl_fields_t acl_fields;
}

/* model.DIGEST_STRUCT: why, which key, which ACL class. */
struct topicwire_digest_t {
    bit<8>  reason;
    bit<64> topic_key;
    bit<16> acl_class;
}

struct metadata {
    bit<16> acl_class;
    bit<16> acl_state;
    bit<32> field_0;
    bit<32> field_1;
    bit<32> field_2;
    bit<32> field_3;
    bit<8>  key_action;
    bit<16> egress_port;
    bit<16> group;
    bit<8>  acl_verdict;
    bit<8>  digest_reason;
}

/* --- parser ------------------------------------------------------------------------------- */
parser TopicwireParser(packet_in packet, out headers hdr, inout metadata meta,
                       inout standard_metadata_t standard_metadata) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        /* no options, UDP, not a non-first fragment (MF is checked in ingress) */
        transition select(hdr.ipv4.ihl, hdr.ipv4.protocol, hdr.ipv4.fragOffset) {
            (5, IP_PROTO_UDP, 0): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dstPort) {
            NATIVE_UDP_PORT: parse_frame;
            default: accept;
        }
    }

    state parse_frame {
        packet.extract(hdr.frame);
        transition select(hdr.frame.magic, hdr.frame.version, hdr.frame.frame_type) {
            (NATIVE_MAGIC, NATIVE_VERSION, FRAME_DATA): parse_msg;
            (NATIVE_MAGIC, NATIVE_VERSION, FRAME_RETRANSMISSION): parse_msg;
            default: accept;
        }
    }

    state parse_msg {
        packet.extract(hdr.msg);
        /* a payload shorter than the ACL fields leaves them unparsed (the ACL rejects it) */
        transition select(hdr.msg.payload_len) {
            0 &&& ACL_FIELDS_SHORT_MASK: accept;
            default: parse_acl_fields;
        }
    }

    state parse_acl_fields {
        packet.extract(hdr.acl_fields);
        transition accept;
    }
}

/* The IPv4 header checksum, as the host stack checks it; a mismatch sets
 * standard_metadata.checksum_error and the frame goes to the CPU port. */
control TopicwireVerifyChecksum(inout headers hdr, inout metadata meta) {
    apply {
        verify_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

/* --- ingress: topic key, ACL stages, forwarding -------------------------------------------- */
control TopicwireIngress(inout headers hdr, inout metadata meta,
                         inout standard_metadata_t standard_metadata) {

    direct_counter(CounterType.packets_and_bytes) topic_key_counter;

    action drop() {
        meta.key_action = KEY_DROP;
    }

    action forward(bit<16> egress_port, bit<16> acl_class) {
        meta.key_action = KEY_FORWARD;
        meta.egress_port = egress_port;
        meta.acl_class = acl_class;
    }

    action forward_group(bit<16> group, bit<16> acl_class) {
        meta.key_action = KEY_FORWARD_GROUP;
        meta.group = group;
        meta.acl_class = acl_class;
    }

    action punt() {
        meta.key_action = KEY_PUNT;
    }

    table topic_key {
        key = {
            hdr.msg.topic_key: exact;
        }
        actions = {
            drop;
            forward;
            forward_group;
            punt;
        }
        default_action = punt();
        counters = topic_key_counter;
        size = 2097152;
    }

    /* the logical port -> a physical port (model.PORT_MAP_TABLE: the P4 program's alone) */
    action to_port(bit<9> port) {
        standard_metadata.egress_spec = port;
    }

    action to_cpu() {
        standard_metadata.egress_spec = CPU_PORT;
    }

    table port_map {
        key = {
            meta.egress_port: exact;
        }
        actions = {
            to_port;
            to_cpu;
        }
        default_action = to_cpu();
        size = 65536;
    }

    action acl_next(bit<16> state) {
        meta.acl_state = state;
    }

    action acl_accept() {
        meta.acl_verdict = ACL_ACCEPT;
    }

    action acl_reject() {
        meta.acl_verdict = ACL_REJECT;
    }

    action acl_log() {
        meta.acl_verdict = ACL_LOG;
    }

    table acl_0 {
        key = {
            meta.acl_class: exact;
            meta.acl_state: exact;
            meta.field_0: range;
        }
        actions = {
            acl_next;
            acl_accept;
            acl_reject;
            acl_log;
        }
        default_action = acl_reject();
        size = 65536;
    }

    table acl_1 {
        key = {
            meta.acl_class: exact;
            meta.acl_state: exact;
            meta.field_1: range;
        }
        actions = {
            acl_next;
            acl_accept;
            acl_reject;
            acl_log;
        }
        default_action = acl_reject();
        size = 65536;
    }

    table acl_2 {
        key = {
            meta.acl_class: exact;
            meta.acl_state: exact;
            meta.field_2: range;
        }
        actions = {
            acl_next;
            acl_accept;
            acl_reject;
            acl_log;
        }
        default_action = acl_reject();
        size = 65536;
    }

    table acl_3 {
        key = {
            meta.acl_class: exact;
            meta.acl_state: exact;
            meta.field_3: range;
        }
        actions = {
            acl_next;
            acl_accept;
            acl_reject;
            acl_log;
        }
        default_action = acl_reject();
        size = 65536;
    }

    apply {
        if (hdr.msg.isValid()
                && standard_metadata.parser_error == error.NoError
                && standard_metadata.checksum_error == 0
                && hdr.ipv4.flags[0:0] == 0
                && hdr.ipv4.totalLen == hdr.udp.length + IPV4_HEADER_BYTES
                && standard_metadata.packet_length
                       >= ETHERNET_HEADER_BYTES + (bit<32>)hdr.ipv4.totalLen
                && hdr.frame.flags == 0
                && hdr.frame.msg_count == 1
                && hdr.frame.frame_len == (bit<32>)(hdr.udp.length - UDP_HEADER_BYTES)
                && hdr.frame.frame_len <= MAX_FRAME_BYTES
                && hdr.msg.qos <= MAX_QOS
                && (hdr.msg.flags & ~KNOWN_MESSAGE_FLAGS) == 0
                && hdr.msg.payload_len <= MAX_PAYLOAD_BYTES
                && hdr.frame.frame_len == FRAME_HEADER_BYTES + MESSAGE_HEADER_BYTES
                       + ((hdr.msg.payload_len + (bit<32>)hdr.msg.topic_len + 7) & ~32w7)) {
            meta.digest_reason = DIGEST_NONE;
            if (!topic_key.apply().hit) {
                meta.key_action = KEY_MISS;  /* punt() ran as the default action */
            }
            if (meta.key_action == KEY_MISS) {
                standard_metadata.egress_spec = CPU_PORT;
                meta.digest_reason = DIGEST_UNKNOWN_KEY;
            } else if (meta.key_action == KEY_PUNT) {
                standard_metadata.egress_spec = CPU_PORT;
                meta.digest_reason = DIGEST_PUNT;
            } else if (meta.key_action == KEY_DROP) {
                mark_to_drop(standard_metadata);
            } else {
                meta.acl_verdict = ACL_ACCEPT;
                if (meta.acl_class != NO_ACL_CLASS) {
                    if (!hdr.acl_fields.isValid()) {
                        meta.acl_verdict = ACL_REJECT;  /* payload ends before the fields */
                    } else {
                        meta.acl_verdict = ACL_PENDING;
                        meta.acl_state = 0;
                        meta.field_0 = hdr.acl_fields.field_0;
                        meta.field_1 = hdr.acl_fields.field_1;
                        meta.field_2 = hdr.acl_fields.field_2;
                        meta.field_3 = hdr.acl_fields.field_3;
                        acl_0.apply();
                        if (meta.acl_verdict == ACL_PENDING) {
                            acl_1.apply();
                        }
                        if (meta.acl_verdict == ACL_PENDING) {
                            acl_2.apply();
                        }
                        if (meta.acl_verdict == ACL_PENDING) {
                            acl_3.apply();
                        }
                        if (meta.acl_verdict == ACL_PENDING) {
                            meta.acl_verdict = ACL_REJECT;  /* acl_next after the last stage */
                        }
                    }
                }
                if (meta.acl_verdict == ACL_REJECT) {
                    mark_to_drop(standard_metadata);
                } else {
                    if (meta.acl_verdict == ACL_LOG) {
                        meta.digest_reason = DIGEST_ACL_LOG;
                    }
                    if (meta.key_action == KEY_FORWARD_GROUP) {
                        standard_metadata.mcast_grp = meta.group;
                    } else {
                        port_map.apply();
                    }
                }
            }
            if (meta.digest_reason != DIGEST_NONE) {
                digest<topicwire_digest_t>(1, {meta.digest_reason, hdr.msg.topic_key,
                                               meta.acl_class});
            }
        } else {
            /* not a frame this program decides: the host's software NIC does */
            standard_metadata.egress_spec = CPU_PORT;
        }
    }
}

control TopicwireEgress(inout headers hdr, inout metadata meta,
                        inout standard_metadata_t standard_metadata) {
    apply { }
}

control TopicwireComputeChecksum(inout headers hdr, inout metadata meta) {
    apply { }
}

/* The frame leaves as it came: headers are emitted unchanged, the rest of the payload follows. */
control TopicwireDeparser(packet_out packet, in headers hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.frame);
        packet.emit(hdr.msg);
        packet.emit(hdr.acl_fields);
    }
}

V1Switch(TopicwireParser(), TopicwireVerifyChecksum(), TopicwireIngress(), TopicwireEgress(),
         TopicwireComputeChecksum(), TopicwireDeparser()) main;
