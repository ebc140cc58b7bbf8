/*
 * udp_relay: the baseline of `topicwire bench fabric` (baseline name "c_relay").
 *
 * A plain UDP relay: every datagram that arrives on 127.0.0.1:LISTEN_PORT is sent on, byte
 * for byte, to DEST_HOST:DEST_PORT from the same socket. One blocking recvmmsg (up to
 * RELAY_BATCH datagrams, MSG_WAITFORONE: it returns as soon as one is there) and one
 * sendmmsg per batch; no parsing, no routing, no copies beyond the kernel's. It is what a
 * hop costs when it does nothing but move datagrams.
 *
 *   udp_relay LISTEN_PORT DEST_HOST DEST_PORT     (LISTEN_PORT 0: the kernel picks one)
 *
 * Prints "READY <port>" on standard output once bound, and on SIGTERM/SIGINT one JSON line
 * {"datagrams_in": N, "datagrams_out": N, "send_errors": N, "batches": N}, exit 0.
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
    if (argc != 4) {
        fprintf(stderr, "usage: udp_relay LISTEN_PORT DEST_HOST DEST_PORT\n");
        return 2;
    }
    int listen_port = parse_port(argv[1], 1);
    int dest_port = parse_port(argv[3], 0);
    struct sockaddr_in dest;
    memset(&dest, 0, sizeof dest);
    dest.sin_family = AF_INET;
    if (listen_port < 0 || dest_port <= 0 || inet_pton(AF_INET, argv[2], &dest.sin_addr) != 1) {
        fprintf(stderr, "udp_relay: bad port or address\n");
        return 2;
    }
    if ((ntohl(dest.sin_addr.s_addr) >> 24) != 127) {
        fprintf(stderr, "udp_relay: the destination must be a loopback address\n");
        return 2;
    }
    dest.sin_port = htons((unsigned short)dest_port);

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
        for (int i = 0; i < n; i++) {
            iov[i].iov_len = msgs[i].msg_len;
            msgs[i].msg_hdr.msg_name = &dest;
            msgs[i].msg_hdr.msg_namelen = sizeof dest;
            msgs[i].msg_hdr.msg_control = NULL;
            msgs[i].msg_hdr.msg_controllen = 0;
            msgs[i].msg_hdr.msg_flags = 0;
        }
        int done = 0;
        while (done < n) {
            int k = sendmmsg(fd, msgs + done, (unsigned int)(n - done), 0);
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
