/*
 * mqtt_load: the load generator of `topicwire bench mqtt` (bench/mqtt.py).
 *
 * One process runs COUNT MQTT 3.1.1 clients of one role in one epoll loop, all to
 * 127.0.0.1:PORT:
 *
 *   mqtt_load pub  PORT COUNT QOS TOPIC_FMT RATE DURATION_S WINDOW PAYLOAD_BYTES ID_PREFIX
 *   mqtt_load sub  PORT COUNT QOS FILTER_FMT STREAMS ID_PREFIX
 *   mqtt_load echo PORT COUNT QOS TOPIC_FMT RATE DURATION_S WINDOW PAYLOAD_BYTES ID_PREFIX
 *
 * TOPIC_FMT and FILTER_FMT may hold one "%d", replaced by the client's index (0..COUNT-1).
 *
 * Two phases. Session set-up is Debian's libmosquitto (non-threaded: mosquitto_socket,
 * loop_read, loop_write): CONNECT/CONNACK, SUBSCRIBE/SUBACK. Then the data path takes the
 * sockets over: PUBLISH, PUBACK and PINGREQ are encoded here and written one buffer per
 * client per wake-up, and what arrives is read 64 KiB at a time and parsed here.
 * libmosquitto's own read path costs three read(2) calls per packet (command byte, length,
 * body), as many as the broker's: a generator built on it spends as much CPU as mosquitto
 * and on a machine with two cores cannot drive mosquitto to its limit. libmosquitto reads
 * exactly one packet at a time, so nothing of the data phase is left in its buffers.
 *
 * pub: connects every client, prints "READY <connect_ms>", then reads commands on standard
 *   input: "PROBE" publishes one probe message per client (not measured; echo: per client
 *   whose own probe has not come back yet), "GO" publishes for
 *   DURATION_S seconds: at RATE messages per second over all clients (message k from client
 *   k mod COUNT, due at start + k / RATE and stamped with that due time, sent whether or
 *   not earlier ones were acknowledged: an open loop, so a broker that falls behind shows
 *   as latency), or with RATE 0 as fast as each client's window allows (at most WINDOW
 *   messages published and not yet done: written to the socket at QoS 0, PUBACKed at QoS
 *   1; a closed loop the broker paces). Then it waits for the outstanding acknowledgements
 *   (at most DRAIN_TIMEOUT_S) and prints one JSON line {"sent", "acked", "start_ns",
 *   "end_ns", "errors"}.
 * sub: connects every client and subscribes its filter (refused: exit 1), prints
 *   "READY <connect_ms>", then counts what arrives (QoS 1: each PUBACKed). Once every stream
 *   has had a probe it prints "FLOWING". "END <expected>" on standard input: it stops when
 *   it has received that many measured messages, after IDLE_STOP_NS without one, or
 *   DRAIN_MAX_NS after END (a broker far behind: the rest counts as lost), and prints one JSON line {"received", "duplicates", "unexpected", "first_ns", "last_ns",
 *   "p50_us", "p99_us", "p999_us", "max_us", "samples"}.
 * echo: pub and sub in one: each client subscribes to its own topic (TOPIC_FMT) and
 *   publishes to it (the connections scenario); after "GO" it waits for its own messages to
 *   come back (as sub after END) and prints one JSON line with the keys of both.
 *
 * Payload (PAYLOAD_BYTES >= 16, zeros after the header):
 *   0       8       12      16
 *   +-------+-------+-------+---
 *   | ts_ns | pub   | seq   | ...   ts_ns: CLOCK_MONOTONIC (one clock for every process of
 *   +-------+-------+-------+---    the machine); pub: the publisher's index; seq: 1, 2, ...
 *                                   per publisher (0: a probe)
 * Streams: every scenario of the bench gives each subscriber one publisher, or each
 * publisher one subscriber; a stream is such a (publisher, subscriber) pair, numbered by the
 * subscriber's index when STREAMS equals COUNT, else by the publisher's index. Each stream
 * keeps a bitmap of the sequence numbers it saw (duplicates). Latency: receive time -
 * ts_ns, into a log-linear histogram (64 sub-buckets per power of two: within 1.6 %).
 *
 * Exit 2 on bad arguments, 1 when a connection fails or a subscription is refused.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <mosquitto.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HOST "127.0.0.1"
#define KEEPALIVE_S 60
#define PING_INTERVAL_NS 20000000000LL /* data phase: PINGREQ from each client this often */
#define IDLE_STOP_NS 5000000000LL      /* after END, stop after this long without a message */
#define DRAIN_MAX_NS 60000000000LL     /* ... or this long after END, whatever still comes */
#define DRAIN_TIMEOUT_S 30             /* pub: wait at most this long for acknowledgements */
#define CONNECT_TIMEOUT_S 240          /* every client connected (and subscribed) within */
#define CONNECT_BATCH 64               /* connects between two polls for CONNACKs */
#define EVENTS 256
#define IN_BYTES 65536                 /* one read at most */
#define SUB_BUCKETS 64
#define SUB_BITS 6
#define MAX_EXP 44                     /* values up to 2^44 ns (~4.9 hours) */
#define BUCKETS ((MAX_EXP - SUB_BITS + 2) * SUB_BUCKETS)
#define MIN_PAYLOAD 16
#define MAX_PAYLOAD 65536

struct buf {
    unsigned char *data;
    size_t len, off, cap;
};

struct client {
    struct mosquitto *mosq;
    int index;
    int fd;
    int raw;            /* the data phase: this file's own reads and writes */
    int connected;
    int subscribed;
    int want_out;       /* EPOLLOUT registered */
    long outstanding;   /* published, not yet done */
    long unflushed;     /* QoS 0 publishes in out not yet written */
    uint32_t seq;
    uint16_t mid;
    struct buf in, out;
    char topic[256];
    size_t topic_len;
};

struct stream {
    uint8_t *seen;
    size_t bits;
    int probed;
};

static int role_pub, role_echo;
static int qos;
static int count;
static int window = 20;
static int payload_bytes = 64;
static int nstreams;
static struct client *clients;
static struct stream *streams;
static int epfd;
static long connected_n, subscribed_n, probed_streams;
static long long sent, acked, received, duplicates, unexpected, errors;
static long long first_ns, last_ns;
static uint64_t hist[BUCKETS];
static uint64_t samples;
static int64_t max_ns;
static unsigned char *payload;
static long long last_ping;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(int code, const char *what) {
    fprintf(stderr, "mqtt_load: %s\n", what);
    exit(code);
}

/* --- latency histogram ------------------------------------------------------------------- */

static int bucket_of(uint64_t v) {
    if (v < SUB_BUCKETS) return (int)v;
    int e = 63 - __builtin_clzll(v);
    if (e > MAX_EXP) return BUCKETS - 1;
    return (e - SUB_BITS + 1) * SUB_BUCKETS + (int)((v >> (e - SUB_BITS)) & (SUB_BUCKETS - 1));
}

static uint64_t bucket_value(int b) {  /* the highest value of bucket b */
    if (b < SUB_BUCKETS) return (uint64_t)b;
    int e = b / SUB_BUCKETS + SUB_BITS - 1;
    uint64_t sub = (uint64_t)(b % SUB_BUCKETS) + SUB_BUCKETS;
    return ((sub + 1) << (e - SUB_BITS)) - 1;
}

static double percentile_us(double p) {
    if (!samples) return 0.0;
    uint64_t rank = (uint64_t)(p / 100.0 * (double)samples + 0.5);
    if (rank < 1) rank = 1;
    uint64_t seen = 0;
    for (int b = 0; b < BUCKETS; b++) {
        seen += hist[b];
        if (seen >= rank) {
            double v = (double)bucket_value(b);
            return (v > (double)max_ns ? (double)max_ns : v) / 1e3;
        }
    }
    return (double)max_ns / 1e3;
}

/* --- buffers and the data path ----------------------------------------------------------- */

static void buf_reserve(struct buf *b, size_t more) {
    if (b->off && b->off == b->len) b->off = b->len = 0;
    if (b->len + more <= b->cap) return;
    if (b->off) {  /* slide the unread part to the front first */
        memmove(b->data, b->data + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->len + more <= b->cap) return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    unsigned char *grown = realloc(b->data, cap);
    if (!grown) die(1, "out of memory");
    b->data = grown;
    b->cap = cap;
}

static void watch(struct client *c) {
    int want = c->raw ? (c->out.len > c->out.off) : (mosquitto_want_write(c->mosq) ? 1 : 0);
    if (want == c->want_out) return;
    struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
    if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0) c->want_out = want;
}

static void flush(struct client *c) {
    while (c->out.len > c->out.off) {
        ssize_t n = send(c->fd, c->out.data + c->out.off, c->out.len - c->out.off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            fprintf(stderr, "mqtt_load: client %d: send: %s\n", c->index, strerror(errno));
            exit(1);
        }
        c->out.off += (size_t)n;
    }
    if (c->out.off == c->out.len) {
        c->out.off = c->out.len = 0;
        if (c->unflushed) {  /* QoS 0 publishes are done once written */
            c->outstanding -= c->unflushed;
            acked += c->unflushed;
            c->unflushed = 0;
        }
    }
    watch(c);
}

static void put_u16(struct buf *b, unsigned v) {
    b->data[b->len++] = (unsigned char)(v >> 8);
    b->data[b->len++] = (unsigned char)v;
}

static void put_length(struct buf *b, size_t v) {
    do {
        unsigned char byte = v & 0x7f;
        v >>= 7;
        b->data[b->len++] = byte | (v ? 0x80 : 0);
    } while (v);
}

static void publish(struct client *c, uint32_t seq, long long ts) {
    memcpy(payload, &ts, 8);
    uint32_t pub = (uint32_t)c->index;
    memcpy(payload + 8, &pub, 4);
    memcpy(payload + 12, &seq, 4);
    size_t remaining = 2 + c->topic_len + (qos ? 2 : 0) + (size_t)payload_bytes;
    buf_reserve(&c->out, remaining + 5);
    struct buf *b = &c->out;
    b->data[b->len++] = (unsigned char)(0x30 | (qos << 1));
    put_length(b, remaining);
    put_u16(b, (unsigned)c->topic_len);
    memcpy(b->data + b->len, c->topic, c->topic_len);
    b->len += c->topic_len;
    if (qos) {
        if (++c->mid == 0) c->mid = 1;
        put_u16(b, c->mid);
    } else {
        c->unflushed++;
    }
    memcpy(b->data + b->len, payload, (size_t)payload_bytes);
    b->len += (size_t)payload_bytes;
    c->outstanding++;
    if (seq) sent++;
}

static void on_payload(struct client *c, const unsigned char *p, size_t len, long long now) {
    if (len < MIN_PAYLOAD) { unexpected++; return; }
    int64_t ts; uint32_t pub, seq;
    memcpy(&ts, p, 8); memcpy(&pub, p + 8, 4); memcpy(&seq, p + 12, 4);
    int s = (nstreams == count) ? c->index : (int)pub;
    if (s < 0 || s >= nstreams) { unexpected++; return; }
    struct stream *st = &streams[s];
    if (seq == 0) {  /* a probe */
        if (!st->probed) {
            st->probed = 1;
            if (++probed_streams == nstreams) { printf("FLOWING\n"); fflush(stdout); }
        }
        return;
    }
    if (seq >= st->bits) {
        size_t bits = st->bits ? st->bits : 4096;
        while (bits <= seq) bits *= 2;
        uint8_t *grown = realloc(st->seen, bits / 8);
        if (!grown) die(1, "out of memory");
        memset(grown + st->bits / 8, 0, (bits - st->bits) / 8);
        st->seen = grown;
        st->bits = bits;
    }
    if (st->seen[seq >> 3] & (1u << (seq & 7))) { duplicates++; return; }
    st->seen[seq >> 3] |= (uint8_t)(1u << (seq & 7));
    received++;
    if (!first_ns) first_ns = now;
    last_ns = now;
    int64_t lat = now - ts;
    if (lat < 1) lat = 1;
    hist[bucket_of((uint64_t)lat)]++;
    samples++;
    if (lat > max_ns) max_ns = lat;
}

/* Every whole packet in c->in: PUBLISH (counted, PUBACKed at QoS 1), PUBACK (one less
 * outstanding), anything else (PINGRESP) skipped. */
static void parse(struct client *c, long long now) {
    struct buf *b = &c->in;
    for (;;) {
        size_t avail = b->len - b->off;
        const unsigned char *p = b->data + b->off;
        if (avail < 2) break;
        size_t remaining = 0, i = 1;
        int shift = 0;
        for (;;) {
            if (i >= avail) return;
            if (i > 4) die(1, "malformed remaining length from the broker");
            remaining |= (size_t)(p[i] & 0x7f) << shift;
            shift += 7;
            if (!(p[i++] & 0x80)) break;
        }
        if (avail < i + remaining) break;
        const unsigned char *body = p + i;
        int type = p[0] >> 4;
        if (type == 3 && remaining >= 2) {
            size_t tlen = ((size_t)body[0] << 8) | body[1];
            int pq = (p[0] >> 1) & 3;
            size_t head = 2 + tlen + (pq ? 2 : 0);
            if (head <= remaining) {
                if (pq) {
                    buf_reserve(&c->out, 4);
                    c->out.data[c->out.len++] = 0x40;
                    c->out.data[c->out.len++] = 2;
                    c->out.data[c->out.len++] = body[2 + tlen];
                    c->out.data[c->out.len++] = body[3 + tlen];
                }
                on_payload(c, body + head, remaining - head, now);
            } else {
                unexpected++;
            }
        } else if (type == 4) {
            c->outstanding--;
            acked++;
        }
        b->off += i + remaining;
    }
    if (b->off == b->len) b->off = b->len = 0;
}

static void raw_read(struct client *c) {
    buf_reserve(&c->in, IN_BYTES);
    ssize_t n = recv(c->fd, c->in.data + c->in.len, IN_BYTES, MSG_DONTWAIT);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        fprintf(stderr, "mqtt_load: client %d: recv: %s\n", c->index, strerror(errno));
        exit(1);
    }
    if (n == 0) {
        fprintf(stderr, "mqtt_load: client %d: the broker closed the connection\n", c->index);
        exit(1);
    }
    c->in.len += (size_t)n;
    parse(c, now_ns());
}

/* --- set-up with libmosquitto ------------------------------------------------------------ */

static void on_connect(struct mosquitto *mosq, void *obj, int rc) {
    struct client *c = obj;
    if (rc != 0) {
        fprintf(stderr, "mqtt_load: client %d refused: %s\n", c->index,
                mosquitto_connack_string(rc));
        exit(1);
    }
    c->connected = 1;
    connected_n++;
    if ((!role_pub || role_echo)
        && mosquitto_subscribe(mosq, NULL, c->topic, qos) != MOSQ_ERR_SUCCESS)
        die(1, "subscribe failed");
}

static void on_subscribe(struct mosquitto *mosq, void *obj, int mid, int n, const int *granted) {
    (void)mosq; (void)mid;
    struct client *c = obj;
    if (n < 1 || granted[0] > 2) {
        fprintf(stderr, "mqtt_load: subscription %s of client %d refused\n", c->topic, c->index);
        exit(1);
    }
    c->subscribed = 1;
    subscribed_n++;
}

static void on_message(struct mosquitto *mosq, void *obj, const struct mosquitto_message *m) {
    (void)mosq; (void)obj; (void)m;
    unexpected++;  /* nothing is published before the data phase */
}

static void handle(struct client *c, uint32_t events) {
    if (c->raw) {
        if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) raw_read(c);
        flush(c);
        return;
    }
    int rc = MOSQ_ERR_SUCCESS;
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) rc = mosquitto_loop_read(c->mosq, 1);
    if (rc == MOSQ_ERR_SUCCESS && (events & EPOLLOUT)) rc = mosquitto_loop_write(c->mosq, 1);
    if (rc != MOSQ_ERR_SUCCESS) {
        fprintf(stderr, "mqtt_load: client %d: %s\n", c->index, mosquitto_strerror(rc));
        exit(1);
    }
    watch(c);
}

static int poll_ns(long long timeout_ns) {  /* epoll_pwait2: a pacing wait finer than 1 ms */
    struct epoll_event ev[EVENTS];
    struct timespec ts = {timeout_ns / 1000000000LL, timeout_ns % 1000000000LL};
    int n = epoll_pwait2(epfd, ev, EVENTS, &ts, NULL);
    if (n < 0 && errno != EINTR) die(1, "epoll_pwait2 failed");
    for (int i = 0; i < n; i++) handle(ev[i].data.ptr, ev[i].events);
    return n;
}

static int poll_once(int timeout_ms) {
    struct epoll_event ev[EVENTS];
    int n = epoll_wait(epfd, ev, EVENTS, timeout_ms);
    if (n < 0 && errno != EINTR) die(1, "epoll_wait failed");
    for (int i = 0; i < n; i++) handle(ev[i].data.ptr, ev[i].events);
    return n;
}

static void misc(void) {
    long long now = now_ns();
    if (now - last_ping < PING_INTERVAL_NS) return;
    last_ping = now;
    for (int i = 0; i < count; i++) {
        struct client *c = &clients[i];
        if (!c->raw) {
            if (mosquitto_loop_misc(c->mosq) != MOSQ_ERR_SUCCESS) errors++;
            watch(c);
            continue;
        }
        buf_reserve(&c->out, 2);
        c->out.data[c->out.len++] = 0xc0;  /* PINGREQ */
        c->out.data[c->out.len++] = 0;
        flush(c);
    }
}

static void connect_all(const char *prefix, int port) {
    for (int i = 0; i < count; i++) {
        struct client *c = &clients[i];
        char id[128];
        snprintf(id, sizeof id, "%s-%d", prefix, i);
        c->mosq = mosquitto_new(id, true, c);
        if (!c->mosq) die(1, "mosquitto_new failed");
        mosquitto_int_option(c->mosq, MOSQ_OPT_PROTOCOL_VERSION, MQTT_PROTOCOL_V311);
        mosquitto_int_option(c->mosq, MOSQ_OPT_TCP_NODELAY, 1);
        mosquitto_connect_callback_set(c->mosq, on_connect);
        mosquitto_subscribe_callback_set(c->mosq, on_subscribe);
        mosquitto_message_callback_set(c->mosq, on_message);
        int rc = mosquitto_connect(c->mosq, HOST, port, KEEPALIVE_S);
        if (rc != MOSQ_ERR_SUCCESS) {
            fprintf(stderr, "mqtt_load: connect %d: %s\n", i, mosquitto_strerror(rc));
            exit(1);
        }
        c->fd = mosquitto_socket(c->mosq);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
        c->want_out = 1;
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev) != 0) die(1, "epoll_ctl failed");
        if (i % CONNECT_BATCH == CONNECT_BATCH - 1) poll_once(0);
    }
    long long deadline = now_ns() + CONNECT_TIMEOUT_S * 1000000000LL;
    int subscribing = !role_pub || role_echo;
    while (connected_n < count || (subscribing && subscribed_n < count)) {
        if (now_ns() > deadline) die(1, "clients not connected in time");
        poll_once(100);
    }
    for (int i = 0; i < count; i++) {  /* the data phase: this file's reads and writes */
        if (mosquitto_want_write(clients[i].mosq)) die(1, "set-up bytes left unwritten");
        clients[i].raw = 1;
        watch(&clients[i]);
    }
    last_ping = now_ns();
}

/* --- the roles --------------------------------------------------------------------------- */

static void read_command(char *line, size_t len) {
    if (!fgets(line, (int)len, stdin)) die(1, "the parent went away");
    line[strcspn(line, "\n")] = 0;
}

static int stdin_ready(void) {
    fd_set set;
    FD_ZERO(&set);
    FD_SET(0, &set);
    struct timeval tv = {0, 0};
    return select(1, &set, NULL, NULL, &tv) > 0;
}

static void print_received(int open) {
    printf("%s\"received\": %lld, \"duplicates\": %lld, \"unexpected\": %lld, "
           "\"first_ns\": %lld, \"last_ns\": %lld, \"p50_us\": %.1f, \"p99_us\": %.1f, "
           "\"p999_us\": %.1f, \"max_us\": %.1f, \"samples\": %llu}\n", open ? "{" : "",
           received, duplicates, unexpected, first_ns, last_ns, percentile_us(50),
           percentile_us(99), percentile_us(99.9), (double)max_ns / 1e3,
           (unsigned long long)samples);
    fflush(stdout);
}

static void wait_received(long long expected) {
    long long idle_since = now_ns(), seen = -1, until = now_ns() + DRAIN_MAX_NS;
    for (;;) {
        long long now = now_ns();
        if (received != seen) { seen = received; idle_since = now; }
        if (received >= expected || now - idle_since > IDLE_STOP_NS || now > until) break;
        poll_once(10);
        misc();
    }
}

static void run_pub(double rate, double duration_s) {
    char line[128];
    for (;;) {
        read_command(line, sizeof line);
        if (strcmp(line, "PROBE") == 0) {
            long long ts = now_ns();
            for (int i = 0; i < count; i++) {
                /* echo: a client whose own probe came back has shown its route; another
                   one would only add to what a broker slower than the rounds still has to
                   deliver before the measured messages */
                if (role_echo && streams[i].probed) continue;
                publish(&clients[i], 0, ts);
                flush(&clients[i]);
            }
            long long until = now_ns() + 20000000LL;
            while (now_ns() < until) poll_once(5);
            continue;
        }
        if (strcmp(line, "GO") == 0) break;
        die(2, "expected PROBE or GO");
    }
    long long start = now_ns();
    long long end = start + (long long)(duration_s * 1e9);
    long long k = 0;
    acked = 0;
    int next = 0;
    for (;;) {
        long long now = now_ns();
        if (now >= end) break;
        if (rate > 0) {
            for (;;) {  /* every message due by now, stamped with its due time */
                long long due = start + (long long)((double)k * 1e9 / rate);
                if (due > now || due >= end) break;
                struct client *c = &clients[k % count];
                publish(c, ++c->seq, due);
                flush(c);
                k++;
            }
            long long due = start + (long long)((double)k * 1e9 / rate);
            long long wait = due - now_ns();
            poll_ns(wait < 0 ? 0 : wait > 50000000LL ? 50000000LL : wait);
        } else {
            int published = 0;
            for (int budget = count; budget--; next = (next + 1) % count) {
                struct client *c = &clients[next];
                if (c->out.len > c->out.off) continue;  /* the socket is full: later */
                long long ts = now_ns();
                while (c->outstanding < window) {
                    publish(c, ++c->seq, ts);
                    published = 1;
                }
                flush(c);
            }
            poll_once(published ? 0 : 1);  /* nothing to do: wait for a PUBACK or room */
        }
        misc();
    }
    long long stop = now_ns();
    long long deadline = stop + DRAIN_TIMEOUT_S * 1000000000LL;
    for (;;) {
        long outstanding = 0;
        for (int i = 0; i < count; i++) outstanding += clients[i].outstanding;
        if (outstanding <= 0 || now_ns() > deadline) break;
        poll_once(10);
        misc();
    }
    if (role_echo) wait_received(sent);  /* its own messages come back to it */
    printf("{\"sent\": %lld, \"acked\": %lld, \"start_ns\": %lld, \"end_ns\": %lld, "
           "\"errors\": %lld%s", sent, acked, start, stop, errors, role_echo ? ", " : "}\n");
    if (role_echo) print_received(0);
    fflush(stdout);
}

static void run_sub(void) {
    char line[128];
    for (;;) {
        poll_once(10);
        misc();
        if (stdin_ready()) {
            read_command(line, sizeof line);
            if (strncmp(line, "END ", 4) != 0) die(2, "expected END <count>");
            wait_received(atoll(line + 4));
            break;
        }
    }
    print_received(1);
}

/* --- arguments --------------------------------------------------------------------------- */

static int parse_int(const char *text, long lo, long hi, const char *what) {
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "mqtt_load: bad %s %s (%ld..%ld)\n", what, text, lo, hi);
        exit(2);
    }
    return (int)v;
}

static void usage(void) {
    fprintf(stderr, "mqtt_load: usage: mqtt_load pub|echo PORT COUNT QOS TOPIC_FMT RATE "
            "DURATION_S WINDOW PAYLOAD_BYTES ID_PREFIX | sub PORT COUNT QOS FILTER_FMT STREAMS "
            "ID_PREFIX\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    role_echo = strcmp(argv[1], "echo") == 0;
    role_pub = role_echo || strcmp(argv[1], "pub") == 0;
    if (!role_pub && strcmp(argv[1], "sub") != 0) usage();
    if ((role_pub && argc != 11) || (!role_pub && argc != 8)) usage();
    int port = parse_int(argv[2], 1, 65535, "port");
    count = parse_int(argv[3], 1, 100000, "count");
    qos = parse_int(argv[4], 0, 1, "qos");
    const char *fmt = argv[5];
    if (strlen(fmt) > 200) die(2, "topic too long");
    const char *pct = strchr(fmt, '%');
    if (pct && (pct[1] != 'd' || strchr(pct + 2, '%'))) die(2, "a topic may hold one %d only");
    double rate = 0, duration_s = 0;
    const char *prefix;
    if (role_pub) {
        char *end;
        rate = strtod(argv[6], &end);
        if (*end || !(rate >= 0)) die(2, "bad rate");
        duration_s = strtod(argv[7], &end);
        if (*end || !(duration_s > 0)) die(2, "bad duration");
        window = parse_int(argv[8], 1, 65535, "window");
        payload_bytes = parse_int(argv[9], MIN_PAYLOAD, MAX_PAYLOAD, "payload bytes");
        prefix = argv[10];
        nstreams = count;
    } else {
        nstreams = parse_int(argv[6], 1, 100000, "streams");
        prefix = argv[7];
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    payload = calloc(1, (size_t)payload_bytes);
    clients = calloc((size_t)count, sizeof *clients);
    streams = calloc((size_t)nstreams, sizeof *streams);
    if (!payload || !clients || !streams) die(1, "out of memory");
    for (int i = 0; i < count; i++) {
        clients[i].index = i;
        snprintf(clients[i].topic, sizeof clients[i].topic, fmt, i);
        clients[i].topic_len = strlen(clients[i].topic);
    }
    mosquitto_lib_init();
    epfd = epoll_create1(0);
    if (epfd < 0) die(1, "epoll_create1 failed");
    long long t0 = now_ns();
    connect_all(prefix, port);
    printf("READY %.1f\n", (double)(now_ns() - t0) / 1e6);
    fflush(stdout);
    if (role_pub) run_pub(rate, duration_s);
    else run_sub();
    for (int i = 0; i < count; i++) {
        struct client *c = &clients[i];
        if (role_pub) {
            /* publishers reset their connections: what a broker far behind has not read
             * yet (a QoS 0 flood fills its receive buffers) is dropped at once instead of
             * being worked off for minutes before the next measurement */
            struct linger reset = {1, 0};
            setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
        } else {  /* DISCONNECT, then close */
            unsigned char disconnect[2] = {0xe0, 0};
            send(c->fd, disconnect, 2, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        mosquitto_destroy(c->mosq);
    }
    mosquitto_lib_cleanup();
    return 0;
}
