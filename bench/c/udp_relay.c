/*
 * udp_relay: the baseline of `topicwire bench fabric` (baseline name "c_relay").
 *
 * A plain UDP relay: every datagram that arrives on 127.0.0.1:LISTEN_PORT is sent on, byte
 * for byte, to DEST_HOST:DEST_PORT, and to each further DEST_PORT (fan-out: one copy per
 * destination, in the order given, datagram by datagram), from the same socket. One
 * blocking recvmmsg (up to RELAY_BATCH datagrams, MSG_WAITFORONE: it returns as soon as one
 * is there) and one sendmmsg per batch (more when the batch times the destinations exceeds
 * RELAY_SEND_VLEN); no parsing, no routing, no copies beyond the kernel's. It is what a hop
 * costs when it does nothing but move datagrams.
 *
 *   udp_relay LISTEN_PORT DEST_HOST DEST_PORT [DEST_PORT ...]   (LISTEN_PORT 0: the kernel
 *                                                                picks one; at most
 *                                                                RELAY_MAX_DESTS ports)
 *
 * Prints "READY <port>" on standard output once bound, and on SIGTERM/SIGINT one JSON line
 * {"datagrams_in": N, "datagrams_out": N, "send_errors": N, "batches": N}, exit 0
 * (datagrams_out counts the copies: datagrams_in times the destinations when none failed).
 * Exit 2 on bad arguments, 1 when a socket call fails.
 * Only loopback: it binds 127.0.0.1 and refuses a destination outside 127.0.0.0/8.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define RELAY_BATCH 64            /* datagrams per recvmmsg/sendmmsg */
#define RELAY_SLOT_BYTES 65536    /* one datagram at most (the largest UDP payload fits) */
#define RELAY_SOCKET_BUFFER_BYTES (4 * 1024 * 1024) /* as the appliance's UDP channels ask */
#define RELAY_MAX_DESTS 64        /* destination ports (subscribers) at most */
#define RELAY_SEND_VLEN 1024      /* messages per sendmmsg at most (the kernel's UIO_MAXIOV) */

static volatile sig_atomic_t stop_requested = 0;

static void on_signal(int sig) { (void)sig; stop_requested = 1; }

static int parse_port(const char *text, int allow_zero) {
    char *end = NULL;
    long value = strtol(text, &end, 10);
    if (end == text || *end != '\0' || value < (allow_zero ? 0 : 1) || value > 65535)
        return -1;
    return (int)value;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc - 3 > RELAY_MAX_DESTS) {
        fprintf(stderr, "usage: udp_relay LISTEN_PORT DEST_HOST DEST_PORT [DEST_PORT ...] "
                "(at most %d destination ports)\n", RELAY_MAX_DESTS);
        return 2;
    }
    int listen_port = parse_port(argv[1], 1);
    int ndest = argc - 3;
    static struct sockaddr_in dests[RELAY_MAX_DESTS];
    struct in_addr host;
    if (listen_port < 0 || inet_pton(AF_INET, argv[2], &host) != 1) {
        fprintf(stderr, "udp_relay: bad port or address\n");
        return 2;
    }
    if ((ntohl(host.s_addr) >> 24) != 127) {
        fprintf(stderr, "udp_relay: the destination must be a loopback address\n");
        return 2;
    }
    for (int d = 0; d < ndest; d++) {
        int dest_port = parse_port(argv[3 + d], 0);
        if (dest_port <= 0) {
            fprintf(stderr, "udp_relay: bad port or address\n");
            return 2;
        }
        memset(&dests[d], 0, sizeof dests[d]);
        dests[d].sin_family = AF_INET;
        dests[d].sin_addr = host;
        dests[d].sin_port = htons((unsigned short)dest_port);
    }

    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) { perror("udp_relay: socket"); return 1; }
    int size = RELAY_SOCKET_BUFFER_BYTES;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    struct sockaddr_in local;
    memset(&local, 0, sizeof local);
    local.sin_family = AF_INET;
    local.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    local.sin_port = htons((unsigned short)listen_port);
    if (bind(fd, (struct sockaddr *)&local, sizeof local) < 0) {
        perror("udp_relay: bind");
        return 1;
    }
    socklen_t len = sizeof local;
    getsockname(fd, (struct sockaddr *)&local, &len);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: a signal interrupts recvmmsg */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    static char slots[RELAY_BATCH][RELAY_SLOT_BYTES];
    struct iovec iov[RELAY_BATCH];
    struct mmsghdr msgs[RELAY_BATCH];
    static struct mmsghdr out[RELAY_BATCH * RELAY_MAX_DESTS];
    unsigned long long datagrams_in = 0, datagrams_out = 0, send_errors = 0, batches = 0;

    printf("READY %d\n", ntohs(local.sin_port));
    fflush(stdout);

    while (!stop_requested) {
        for (int i = 0; i < RELAY_BATCH; i++) {
            iov[i].iov_base = slots[i];
            iov[i].iov_len = RELAY_SLOT_BYTES;
            memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        int n = recvmmsg(fd, msgs, RELAY_BATCH, MSG_WAITFORONE, NULL);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("udp_relay: recvmmsg");
            return 1;
        }
        datagrams_in += (unsigned long long)n;
        batches++;
        int total = 0; /* copies to send: datagram by datagram, each to every destination */
        for (int i = 0; i < n; i++) {
            iov[i].iov_len = msgs[i].msg_len;
            for (int d = 0; d < ndest; d++, total++) {
                memset(&out[total].msg_hdr, 0, sizeof out[total].msg_hdr);
                out[total].msg_hdr.msg_iov = &iov[i];
                out[total].msg_hdr.msg_iovlen = 1;
                out[total].msg_hdr.msg_name = &dests[d];
                out[total].msg_hdr.msg_namelen = sizeof dests[d];
            }
        }
        int done = 0;
        while (done < total) {
            int want = total - done < RELAY_SEND_VLEN ? total - done : RELAY_SEND_VLEN;
            int k = sendmmsg(fd, out + done, (unsigned int)want, 0);
            if (k < 0) {
                if (errno == EINTR) continue;
                send_errors++; /* e.g. ECONNREFUSED after the receiver left: skip one */
                done++;
                continue;
            }
            done += k;
            datagrams_out += (unsigned long long)k;
        }
    }
    printf("{\"datagrams_in\": %llu, \"datagrams_out\": %llu, \"send_errors\": %llu, "
           "\"batches\": %llu}\n", datagrams_in, datagrams_out, send_errors, batches);
    fflush(stdout);
    close(fd);
    return 0;
}
