/* The load generator of readline_echo_load (see _loadgen.py, which builds
 * and runs this file), in C so that the client costs as little per line as
 * it can: non-blocking sockets on one epoll, one recv() and one send() per
 * line.
 *
 *   loadgen client PORT CONNECTIONS LINES_PER_CONNECTION TIMEOUT_S
 *       ping-pong lines on each connection to 127.0.0.1:PORT, every echo
 *       compared and CRC-32 checksummed; prints one line of JSON (the keys
 *       of _loadgen.run_client) and closes every connection.
 *   loadgen server CONNECTIONS
 *       a minimal echo server on 127.0.0.1 (ephemeral port, printed first
 *       as "port N"): echoes what each recv() returns, until CONNECTIONS
 *       connections have closed (the --capacity reference).
 *
 * The lines are _loadgen.lines(): line k (0..63) is 16 + 2k bytes, byte j
 * of it 'a' + (5k + 3j) % 26, the last one '\n'; connection c sends lines
 * (7c + t) % 64 for t = 0, 1, ...
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#define N_LINES 64
#define MAX_LINE (16 + 2 * (N_LINES - 1))

static unsigned char lines[N_LINES][MAX_LINE];
static int line_len[N_LINES];
static uint32_t crc_table[256];

static void make_tables(void) {
    for (int k = 0; k < N_LINES; k++) {
        int size = 16 + 2 * k;
        for (int j = 0; j < size - 1; j++)
            lines[k][j] = (unsigned char)(97 + (k * 5 + j * 3) % 26);
        lines[k][size - 1] = '\n';
        line_len[k] = size;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int b = 0; b < 8; b++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

/* zlib.crc32(buf, crc) */
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n--)
        crc = crc_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_seconds(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

struct conn {
    int fd;
    int c;        /* connection number */
    int t;        /* the line in flight */
    int have;     /* bytes of its echo received so far */
    uint32_t crc;
    unsigned char buf[MAX_LINE];
};

static int send_all(int fd, const unsigned char *p, int n) {
    /* a line is at most 142 bytes: on a connection with one line in flight
     * the socket buffer always takes it whole */
    ssize_t w = send(fd, p, (size_t)n, MSG_NOSIGNAL);
    return w == n ? 0 : -1;
}

static int client(int port, int nconn, int per_conn, double timeout) {
    struct conn *cs = calloc((size_t)nconn, sizeof *cs);
    int ep = epoll_create1(0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    long matches = 0, overruns = 0, received = 0, eofs = 0;
    char err[256] = "";
    double t0 = now(), cpu0 = cpu_seconds();
    for (int i = 0; i < nconn; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
            snprintf(err, sizeof err, "connect %d: %s", i, strerror(errno));
            nconn = i;
            if (fd >= 0) close(fd);
            break;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        cs[i].fd = fd;
        cs[i].c = i;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &cs[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    double t_connected = now();
    int active = 0;
    if (per_conn > 0) {
        for (int i = 0; i < nconn; i++) {
            int k = (7 * i) % N_LINES;
            if (send_all(cs[i].fd, lines[k], line_len[k]) == 0)
                active++;
        }
    }
    struct epoll_event evs[256];
    double deadline = now() + timeout;
    unsigned char rbuf[65536];
    while (active > 0) {
        int n = epoll_wait(ep, evs, 256, 1000);
        if (n < 0) {
            if (errno == EINTR) continue;
            snprintf(err, sizeof err, "epoll_wait: %s", strerror(errno));
            break;
        }
        if (n == 0 && now() > deadline) {
            snprintf(err, sizeof err, "timeout: %d connections unfinished", active);
            break;
        }
        for (int e = 0; e < n; e++) {
            struct conn *k = evs[e].data.ptr;
            ssize_t r = recv(k->fd, rbuf, sizeof rbuf, 0);
            if (r < 0) {
                if (errno == EAGAIN || errno == EINTR) continue;
                snprintf(err, sizeof err, "recv: %s", strerror(errno));
                epoll_ctl(ep, EPOLL_CTL_DEL, k->fd, NULL);
                active--;
                continue;
            }
            if (r == 0) {
                eofs++;
                snprintf(err, sizeof err, "connection %d: EOF at line %d", k->c, k->t);
                epoll_ctl(ep, EPOLL_CTL_DEL, k->fd, NULL);
                active--;
                continue;
            }
            int li = (7 * k->c + k->t) % N_LINES;
            int need = line_len[li];
            int take = (int)r;
            if (k->have + take > need) {
                overruns++;
                take = need - k->have;
            }
            memcpy(k->buf + k->have, rbuf, (size_t)take);
            k->have += take;
            if (k->have < need) continue;
            if (memcmp(k->buf, lines[li], (size_t)need) == 0) matches++;
            k->crc = crc32_update(k->crc, k->buf, (size_t)need);
            k->have = 0;
            received++;
            k->t++;
            if (k->t < per_conn) {
                int nl = (7 * k->c + k->t) % N_LINES;
                if (send_all(k->fd, lines[nl], line_len[nl]) != 0) {
                    snprintf(err, sizeof err, "send: %s", strerror(errno));
                    epoll_ctl(ep, EPOLL_CTL_DEL, k->fd, NULL);
                    active--;
                }
            } else {
                epoll_ctl(ep, EPOLL_CTL_DEL, k->fd, NULL);
                active--;
            }
        }
    }
    double t_end = now(), cpu = cpu_seconds() - cpu0;
    long long crc_sum = 0;
    int completed = 0;
    for (int i = 0; i < nconn; i++) {
        crc_sum += cs[i].crc;
        if (cs[i].t == per_conn) completed++;
        close(cs[i].fd);
    }
    close(ep);
    double elapsed = t_end - t0;
    printf("{\"lines\": %ld, \"matches\": %ld, \"overruns\": %ld, \"checksum\": %lld, "
           "\"eofs\": %ld, \"completed_connections\": %d, \"elapsed\": %.9f, "
           "\"connect_s\": %.9f, \"cpu_s\": %.6f, \"cpu_share\": %.4f, \"errors\": [",
           received, matches, overruns, crc_sum, eofs, completed, elapsed,
           t_connected - t0, cpu, elapsed > 0 ? cpu / elapsed : 0.0);
    if (err[0]) {
        putchar('"');
        for (char *p = err; *p; p++)
            if (*p != '"' && *p != '\\') putchar(*p);
        putchar('"');
    }
    printf("]}\n");
    free(cs);
    return 0;
}

static int server(int nconn) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 1024) ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl)) {
        perror("listen");
        return 1;
    }
    printf("port %d\n", ntohs(sa.sin_port));
    fflush(stdout);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    struct epoll_event evs[256];
    unsigned char buf[65536];
    int closed = 0;
    while (closed < nconn) {
        int n = epoll_wait(ep, evs, 256, -1);
        for (int e = 0; e < n; e++) {
            int fd = evs[e].data.fd;
            if (fd == lfd) {
                int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
                if (c < 0) continue;
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
                continue;
            }
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r > 0) {
                send(fd, buf, (size_t)r, MSG_NOSIGNAL);
            } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                close(fd);
                closed++;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    make_tables();
    if (argc == 6 && strcmp(argv[1], "client") == 0)
        return client(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atof(argv[5]));
    if (argc == 3 && strcmp(argv[1], "server") == 0)
        return server(atoi(argv[2]));
    fprintf(stderr, "usage: loadgen client PORT CONNECTIONS LINES TIMEOUT | loadgen server CONNECTIONS\n");
    return 2;
}
