/*
 * A command-ring client written from docs/shm.md alone (no Python).
 *
 *   ring_client DATA_DIR QUEUE [nowake]
 *
 * Attaches through DATA_DIR/dq.sock, then through its ring: enqueues one value (PUT),
 * dequeues it (FIND), releases it (DELETE) and releases it again (must be refused as a
 * stale receipt). Prints one line per step; exits 0 only if every step did what the doc
 * says. With "nowake" it never calls FUTEX_WAKE and says so at attach, like a client that
 * knows only the original design: the server must poll its ring.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/futex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* docs/shm.md, "Command ring": header and slot offsets */
#define HEAD 0
#define TAIL 8
#define CAPACITY 16
#define SLOTS 24
#define SLOT_SIZE 2080
#define S_READY 0
#define S_OP 1
#define S_KEY 2
#define S_VALUE_SIZE 18
#define S_VALUE 22
#define S_RESPONSE_SIZE 1046
#define S_RESPONSE 1050
#define S_RESPONSE_READY 2074

enum { PUT = 0, DELETE = 1, FIND = 2 };

static uint8_t *ring;
static uint64_t capacity;
static int wakes = 1;

static void die(const char *what) {
    fprintf(stderr, "ring_client: %s\n", what);
    exit(2);
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); } /* x86/arm64: LE */
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint16_t get_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* Send one command and wait for its response; returns the status, copies the body. */
static int call(uint8_t op, const uint8_t key[16], const void *value, uint32_t value_size,
                uint8_t *body, uint32_t *body_size) {
    uint64_t *head_p = (uint64_t *)(ring + HEAD), *tail_p = (uint64_t *)(ring + TAIL);
    uint64_t head = __atomic_load_n(head_p, __ATOMIC_ACQUIRE);
    uint64_t next = (head + 1) % capacity;
    while (next == __atomic_load_n(tail_p, __ATOMIC_ACQUIRE)) {
        usleep(100); /* full */
    }
    uint8_t *slot = ring + SLOTS + head * SLOT_SIZE;
    __atomic_store_n(slot + S_READY, 0, __ATOMIC_RELEASE);
    slot[S_OP] = op;
    memcpy(slot + S_KEY, key, 16);
    put_u32(slot + S_VALUE_SIZE, value_size);
    memcpy(slot + S_VALUE, value, value_size);
    put_u32(slot + S_RESPONSE_SIZE, 0);
    __atomic_store_n(slot + S_RESPONSE_READY, 0, __ATOMIC_RELEASE);
    __atomic_store_n(slot + S_READY, 1, __ATOMIC_RELEASE);
    __atomic_store_n(head_p, next, __ATOMIC_RELEASE);
    if (wakes) {
        syscall(SYS_futex, (uint32_t *)head_p, FUTEX_WAKE, 1, NULL, NULL, 0);
    }
    for (long spins = 0; __atomic_load_n(slot + S_RESPONSE_READY, __ATOMIC_ACQUIRE) != 1; spins++) {
        if (spins > 1000) {
            usleep(50);
        }
        if (spins > 200000) {
            die("no response");
        }
    }
    uint32_t size = get_u32(slot + S_RESPONSE_SIZE);
    if (size < 4 || size > 1024) {
        die("bad response_size");
    }
    *body_size = size - 4;
    memcpy(body, slot + S_RESPONSE + 4, size - 4);
    return slot[S_RESPONSE];
}

/* the value of "name":"..." or "name":123 in the one-line JSON reply */
static const char *json_field(const char *json, const char *name, char *out, size_t n) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", name);
    const char *p = strstr(json, pat);
    if (!p) {
        return NULL;
    }
    p += strlen(pat);
    if (*p == '"') {
        p++;
    }
    size_t i = 0;
    while (*p && *p != '"' && *p != ',' && *p != '}' && i + 1 < n) {
        out[i++] = *p++;
    }
    out[i] = 0;
    return out;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        die("usage: ring_client DATA_DIR QUEUE [nowake]");
    }
    wakes = !(argc > 3 && strcmp(argv[3], "nowake") == 0);

    /* attach: connect, one JSON line each way, keep the socket open */
    int sock = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s/dq.sock", argv[1]);
    if (connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0) {
        die("connect");
    }
    char line[4200];
    int n = snprintf(line, sizeof line,
                     "{\"version\":1,\"queue\":\"%s\",\"capacity\":8,\"wakes\":%s}\n", argv[2],
                     wakes ? "true" : "false");
    if (write(sock, line, n) != n) {
        die("write");
    }
    size_t got = 0;
    while (got == 0 || line[got - 1] != '\n') {
        ssize_t r = read(sock, line + got, sizeof line - 1 - got);
        if (r <= 0) {
            die("read");
        }
        got += r;
    }
    line[got] = 0;
    char name[256], size_s[32];
    if (!strstr(line, "\"ok\":true") || !json_field(line, "shm", name, sizeof name) ||
        !json_field(line, "size", size_s, sizeof size_s)) {
        die(line);
    }
    size_t size = strtoull(size_s, NULL, 10);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        die("shm_open");
    }
    ring = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ring == MAP_FAILED) {
        die("mmap");
    }
    capacity = get_u64(ring + CAPACITY);
    printf("attached %s capacity %llu\n", name, (unsigned long long)capacity);

    uint8_t key[16] = {0}, body[1024];
    uint32_t body_size;
    const char *value = "hello from C";

    /* PUT: key = deadline 0, delay_ms 0 (due now); ok body = id, deadline */
    int st = call(PUT, key, value, strlen(value), body, &body_size);
    if (st != 0 || body_size != 16) {
        die("PUT failed");
    }
    uint64_t id = get_u64(body);
    printf("enqueued %llu\n", (unsigned long long)id);

    /* FIND: key = count 1, wait_ms 2000, lease_ms 30000 */
    memset(key, 0, 16);
    put_u32(key, 1);
    put_u32(key + 4, 2000);
    put_u64(key + 8, 30000);
    st = call(FIND, key, "", 0, body, &body_size);
    if (st != 0 || get_u32(body) != 1) {
        die("FIND failed");
    }
    const uint8_t *d = body + 4;
    uint64_t got_id = get_u64(d);
    uint16_t receipt_len = get_u16(d + 44);
    uint32_t value_len = get_u32(d + 46);
    char receipt[256];
    memcpy(receipt, d + 50, receipt_len);
    receipt[receipt_len] = 0;
    printf("dequeued %llu %.*s\n", (unsigned long long)got_id, (int)value_len,
           (const char *)(d + 50 + receipt_len));
    if (got_id != id || value_len != strlen(value) ||
        memcmp(d + 50 + receipt_len, value, value_len) != 0) {
        die("FIND returned something else");
    }

    /* DELETE: key = id, value = receipt */
    memset(key, 0, 16);
    put_u64(key, id);
    st = call(DELETE, key, receipt, receipt_len, body, &body_size);
    printf("released %llu status %d\n", (unsigned long long)id, st);
    if (st != 0) {
        die("DELETE failed");
    }
    st = call(DELETE, key, receipt, receipt_len, body, &body_size);
    printf("released again status %d %.*s\n", st, (int)body_size, (const char *)body);
    if (st != 9) { /* stale_receipt */
        die("second DELETE was not refused as stale");
    }
    munmap(ring, size);
    close(fd);
    close(sock);
    return 0;
}
