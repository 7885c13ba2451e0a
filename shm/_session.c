/*
 * shm/_session.c -- the server's side of one command ring (docs/shm.md, "Command ring"),
 * compiled: the wait for commands, the copy and decoding of each slot, the order in which
 * commands start, and the encoding and publishing of every answer.
 *
 * Why: a ring request used to wake a Python thread that read the slot, decoded it, built
 * the engine's arguments, and wrote the answer, all in Python; that Python cost as much as
 * the request's own engine work. Here the session thread waits on the futex with the GIL
 * released, and enters Python once per command, calling one method of the session's
 * handler (shm/command_handler.py) with arguments already decoded and checked; the
 * handler makes the engine call (the operation's rules stay in storage/itemops.py and the
 * engine, the one place every front end calls). Durable answers are encoded here by the
 * thread that resolves the write's future.
 *
 * Invariants kept:
 *   - nothing shared is trusted: head is checked against the session's own capacity, the
 *     server keeps its own tail, and every slot is copied into private memory before any
 *     field is looked at (a client rewriting its slot meanwhile hurts only itself); every
 *     length is checked before it is used, every error is an answer with the status and
 *     the words the Python decoder had (docs/shm.md, "Status codes"), and a slot that is
 *     not ready raises MalformedSlot (the client is dropped);
 *   - answers are published in ring order: a command's answer is written into its slots
 *     when it is known, but response_ready is set (release), the client woken and tail
 *     moved (release) only once every earlier command is answered;
 *   - durable commands (PUT, DELETE, REQUEUE, PUT_MANY, DELETE_MANY) start at once and
 *     share the engine's group commit; a run of PUTs (or DELETEs) taken in one pass is
 *     one engine batch (refused as a whole: each command alone); every other command runs
 *     once every earlier one is answered;
 *   - no state of a session is touched without the GIL: the session thread gives it up
 *     only to wait (for head, or for earlier answers: a private futex word), and reads
 *     nothing of the session meanwhile but the shared head and that word. The ring's
 *     buffer stays exported until close(), after which answers still due are dropped.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- layout (docs/shm.md) ------------------------------------------------------------ */

#define HEAD_OFF 0
#define TAIL_OFF 8
#define CAPACITY_OFF 16
#define SLOTS_OFF 24
#define SLOT_SIZE 2080
#define S_READY 0
#define S_OP 1
#define S_KEY 2
#define S_VALUE_SIZE 18
#define S_VALUE 22
#define S_RESPONSE_SIZE 1046
#define S_RESPONSE 1050
#define S_RESPONSE_READY 2074
#define S_WAKE_WORD 2072
#define VALUE_MAX 1024
#define BODY_MAX 1020 /* a response's body in one slot: 1024 less the 4-byte head */
#define MAX_CAPACITY 4096
#define DELIVERY_HEAD 50
#define RUN_MAX 64 /* PUTs or DELETEs started as one engine batch at most */
#define PUT_MANY_REPLACE 1 /* PUT_MANY flag: keyed items replace their key's pending item */

enum {
    OP_PUT = 0, OP_DELETE, OP_FIND, OP_REQUEUE, OP_EXTEND, OP_STATS, OP_BIND, OP_CONTINUE,
    OP_PART, OP_PUT_MANY, OP_DELETE_MANY, OP_KNOWN
};
enum {
    ST_OK = 0, ST_VALUE_TOO_LARGE = 3, ST_NOT_BOUND = 13, ST_UNKNOWN_OP = 14,
    ST_MALFORMED = 15, ST_INTERNAL = 16, ST_NO_CONTINUATION = 17
};
#define FLAG_MORE 0x01
#define FLAG_NO_QUEUE 0x02
#define FLAG_DRAINING 0x04
#define FLAG_GROUPS 0x08 /* FIND: each delivery carries group_len u8 and its group */
#define GROUP_MAX 255    /* a group's bytes on the ring: its length is a u8 */

#define IDLE_PARK_NS 2000000000LL  /* a safety net: stop() wakes a parked session */
#define POLL_MIN_NS 500000LL       /* clients that do not wake the server: polled, */
#define POLL_MAX_NS 20000000LL     /* backing off to this while idle */
#define STOP_POLL_NS 200000000LL   /* how soon a wait for answers notices a stop */

/* the state of a taken slot: read, then answered (written), then published (idle) */
enum { SLOT_IDLE = 0, SLOT_PENDING = 1, SLOT_ANSWERED = 2 };
/* how a durable write's result becomes each command's answer */
enum { K_PUT = 0, K_RELEASED, K_REQUEUED, K_PUT_MANY, K_DELETE_MANY };

static PyObject *MalformedSlot; /* dq.shm.errors */
static PyObject *ProtocolError;
static PyObject *s_result, *s_add_done_callback, *s_id, *s_deadline, *s_duplicate,
    *s_replaced, *s_error, *s_message, *s_receipt, *s_lease_expires, *s_stats, *s_enqueue_time,
    *s_requeue_time, *s_dequeue_count, *s_value, *s_group, *s_queue_exists, *s_draining,
    *s_enqueue_one, *s_enqueue, *s_release_one, *s_release, *s_requeue, *s_extend,
    *s_find, *s_stats_m, *s_bind, *s_put_many, *s_delete_many, *s_error_m;

static inline uint64_t
le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* x86-64 and aarch64 Linux: little-endian, as the ring */
}

static inline uint32_t
le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t
le16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int
futex_wait(uint32_t *addr, uint32_t expected, int64_t timeout_ns, int private)
{
    struct timespec ts = {(time_t)(timeout_ns / 1000000000LL), (long)(timeout_ns % 1000000000LL)};
    long r = syscall(SYS_futex, addr, private ? FUTEX_WAIT_PRIVATE : FUTEX_WAIT, expected, &ts,
                     NULL, 0);
    return r == 0 ? 0 : errno;
}

static void
futex_wake(uint32_t *addr, int n, int private)
{
    syscall(SYS_futex, addr, private ? FUTEX_WAKE_PRIVATE : FUTEX_WAKE, n, NULL, NULL, 0);
}

/* ---- a growable byte buffer ------------------------------------------------------------ */

typedef struct {
    uint8_t *p;
    Py_ssize_t len, cap;
} Buf;

static int
buf_reserve(Buf *b, Py_ssize_t more)
{
    if (more > PY_SSIZE_T_MAX / 2 - b->len) {
        PyErr_NoMemory();
        return -1;
    }
    if (b->len + more <= b->cap) {
        return 0;
    }
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more) {
        cap *= 2;
    }
    uint8_t *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static int
buf_put(Buf *b, const void *data, Py_ssize_t n)
{
    if (buf_reserve(b, n) < 0) {
        return -1;
    }
    if (n) {
        memcpy(b->p + b->len, data, (size_t)n);
    }
    b->len += n;
    return 0;
}

static int
buf_u64(Buf *b, uint64_t v)
{
    return buf_put(b, &v, 8);
}

/* ---- a copied command ------------------------------------------------------------------- */

typedef struct {
    uint32_t index;
    uint8_t op;
    uint8_t key[16];
    uint32_t value_size;              /* as the client wrote it */
    uint32_t len;                     /* bytes copied: value_size if <= 1024, else 0 */
    uint8_t value[VALUE_MAX];
} Cmd;

/* ---- the session ------------------------------------------------------------------------ */

typedef struct {
    uint8_t state;
    uint16_t span; /* on a command's first slot: how many slots it took */
} SlotState;

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    uint8_t *base;
    uint32_t capacity;
    uint32_t next;    /* the next slot to read */
    uint32_t tail;    /* the next slot to publish (our own: the shared one is only written) */
    SlotState *slots;
    PyObject *handler;
    PyObject *statuses; /* dict: error code -> status */
    PyObject *watch;    /* None, or called with the new tail after every move (tests) */
    int bound;
    int groups; /* the client asked for its deliveries' groups at attach (FLAG_GROUPS) */
    int stopping;
    uint32_t published; /* private futex word: bumped when tail reaches next */
    /* the rest of the last answer that did not fit its slots (CONTINUE) */
    PyObject *rest;
    Py_ssize_t rest_at;
    int rest_flags;
    /* PARTs read, waiting for their command: first slot, count, their bytes */
    uint32_t parts_first, nparts;
    int parts_too_large, parts_nonempty;
    Buf parts;
    Cmd *run; /* a run of PUTs or DELETEs being taken */
    int serving, waiting;
    PyObject *later; /* the session's own group commit, to run before it waits (or NULL) */
} Session;

static PyTypeObject SessionType;
static PyTypeObject AnswerType;

static inline uint8_t *
slot_at(Session *s, uint32_t index)
{
    return s->base + SLOTS_OFF + (size_t)SLOT_SIZE * index;
}

/* Raise `cls`(message, **context) (dq.shm.errors: str() shows the context). */
static void
raise_shm(PyObject *cls, const char *message, const char *k1, long long v1, const char *k2,
          long long v2)
{
    PyObject *kw = PyDict_New();
    PyObject *args = Py_BuildValue("(s)", message);
    if (kw && args) {
        PyObject *a = k1 ? PyLong_FromLongLong(v1) : NULL;
        PyObject *b = k2 ? PyLong_FromLongLong(v2) : NULL;
        if ((!k1 || (a && PyDict_SetItemString(kw, k1, a) == 0)) &&
            (!k2 || (b && PyDict_SetItemString(kw, k2, b) == 0))) {
            PyObject *exc = PyObject_Call(cls, args, kw);
            if (exc) {
                PyErr_SetObject(cls, exc);
                Py_DECREF(exc);
            }
        }
        Py_XDECREF(a);
        Py_XDECREF(b);
    }
    Py_XDECREF(kw);
    Py_XDECREF(args);
}

/* ---- writing and publishing answers ------------------------------------------------------- */

static int publish_ready(Session *s);

/* Write one answer over the `nslots` slots from `first`: 1020 bytes of body a slot, MORE on
   every slot another chunk follows. A body longer than the slots is kept for CONTINUE
   (`whole`) or cut. Marks the command answered; publishing is publish_ready()'s. */
static void
write_answer(Session *s, uint32_t first, uint32_t nslots, int status, int flags,
             const uint8_t *body, Py_ssize_t len, PyObject *owner, int whole)
{
    if (!s->has_view) {
        return; /* closed meanwhile (a write resolved as its client went): dropped */
    }
    Py_ssize_t room = (Py_ssize_t)nslots * BODY_MAX;
    if (len > room) {
        if (whole && owner != NULL) {
            Py_INCREF(owner);
            Py_XSETREF(s->rest, owner);
            s->rest_at = room;
            s->rest_flags = flags;
        }
        else {
            len = room;
        }
    }
    for (uint32_t k = 0; k < nslots; k++) {
        uint8_t *slot = slot_at(s, (first + k) % s->capacity);
        Py_ssize_t at = (Py_ssize_t)k * BODY_MAX;
        Py_ssize_t n = at >= len ? 0 : (len - at < BODY_MAX ? len - at : BODY_MAX);
        uint8_t head[4] = {(uint8_t)status,
                           (uint8_t)(flags | (at + BODY_MAX < len ? FLAG_MORE : 0)), 0, 0};
        uint32_t size = 4 + (uint32_t)n;
        memcpy(slot + S_RESPONSE_SIZE, &size, 4);
        memcpy(slot + S_RESPONSE, head, 4);
        if (n) {
            memcpy(slot + S_RESPONSE + 4, body + at, (size_t)n);
        }
    }
    s->slots[first].span = (uint16_t)nslots;
    s->slots[first].state = SLOT_ANSWERED;
}

static void
write_text(Session *s, uint32_t first, uint32_t nslots, int status, const char *text)
{
    write_answer(s, first, nslots, status, 0, (const uint8_t *)text, (Py_ssize_t)strlen(text),
                 NULL, 0);
}

/* Publish every answered command at tail, in ring order: response_ready (release) on each
   of its slots, one wake on its last, then tail (release). */
static int
publish_ready(Session *s)
{
    if (!s->has_view) {
        return 0;
    }
    int moved = 0;
    while (s->tail != s->next && s->slots[s->tail].state == SLOT_ANSWERED) {
        uint32_t span = s->slots[s->tail].span, last = s->tail;
        for (uint32_t k = 0; k < span; k++) {
            last = (s->tail + k) % s->capacity;
            __atomic_store_n(slot_at(s, last) + S_RESPONSE_READY, 1, __ATOMIC_RELEASE);
            s->slots[last].state = SLOT_IDLE;
            s->slots[last].span = 0;
        }
        futex_wake((uint32_t *)(slot_at(s, last) + S_WAKE_WORD), INT_MAX, 0);
        s->tail = (s->tail + span) % s->capacity;
        __atomic_store_n((uint64_t *)(s->base + TAIL_OFF), (uint64_t)s->tail, __ATOMIC_RELEASE);
        moved = 1;
        if (s->watch != Py_None) {
            PyObject *r = PyObject_CallFunction(s->watch, "I", s->tail);
            if (r == NULL) {
                return -1;
            }
            Py_DECREF(r);
            if (!s->has_view) {
                return 0;
            }
        }
    }
    if (moved && s->waiting) { /* the session thread waits for earlier answers */
        __atomic_add_fetch(&s->published, 1, __ATOMIC_RELEASE);
        futex_wake(&s->published, INT_MAX, 1);
    }
    return 0;
}

/* An exception raised by the engine or the handler, as (status, body): the handler's
   error() (shm/command_handler.py) maps the storage errors' codes. `exc` is borrowed. */
static void
answer_error(Session *s, uint32_t first, uint32_t nslots, PyObject *exc, int whole)
{
    PyObject *r = PyObject_CallMethodOneArg(s->handler, s_error_m, exc);
    int status;
    char *body;
    Py_ssize_t len;
    if (r != NULL && PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2 &&
        PyBytes_Check(PyTuple_GET_ITEM(r, 1)) &&
        (status = PyLong_AsLong(PyTuple_GET_ITEM(r, 0))) >= 0 && status < 256 &&
        PyBytes_AsStringAndSize(PyTuple_GET_ITEM(r, 1), &body, &len) == 0) {
        write_answer(s, first, nslots, status, 0, (uint8_t *)body, len, PyTuple_GET_ITEM(r, 1),
                     whole);
    }
    else {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "error() must return (status, bytes)");
        }
        PyErr_WriteUnraisable(s->handler);
        write_text(s, first, nslots, ST_INTERNAL, "internal error");
    }
    Py_XDECREF(r);
}

/* The exception set now (taken), answered for the `count` commands from `first` (`whole`:
   a message longer than the slots is kept for CONTINUE, as any answer given at once). */
static void
answer_exception_n(Session *s, uint32_t first, uint32_t count, uint32_t nslots, int whole)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value == NULL) {
        value = Py_None;
        Py_INCREF(value);
    }
    else if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    for (uint32_t i = 0; i < count; i++) {
        answer_error(s, (first + i) % s->capacity, nslots, value, whole);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

static void
answer_exception(Session *s, uint32_t first, uint32_t nslots, int whole)
{
    answer_exception_n(s, first, 1, nslots, whole);
}

/* The status of an item error code ("stale_receipt" ...): INTERNAL if unknown. */
static int
status_of(Session *s, PyObject *code)
{
    PyObject *v = PyDict_GetItemWithError(s->statuses, code);
    if (v == NULL) {
        PyErr_Clear();
        return ST_INTERNAL;
    }
    long st = PyLong_AsLong(v);
    if (st < 0 || st > 255) {
        PyErr_Clear();
        return ST_INTERNAL;
    }
    return (int)st;
}

static int
get_u64(PyObject *obj, PyObject *name, uint64_t *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        return -1;
    }
    if (v == Py_None) {
        *out = 0;
    }
    else {
        *out = PyLong_AsUnsignedLongLong(v);
    }
    Py_DECREF(v);
    return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

/* an ASCII str's bytes (receipts): -1 with an exception for anything else */
static int
ascii_of(PyObject *str, const char **p, Py_ssize_t *n)
{
    if (!PyUnicode_Check(str) || !PyUnicode_IS_ASCII(str)) {
        PyErr_SetString(PyExc_ValueError, "a receipt is not an ASCII str");
        return -1;
    }
    *p = (const char *)PyUnicode_DATA(str);
    *n = PyUnicode_GET_LENGTH(str);
    return 0;
}

/* An item outcome's error, answered as its status and (message or error) in UTF-8;
   0 if it has none, 1 if answered, -1 on an exception. */
static int
outcome_error(Session *s, PyObject *outcome, uint32_t index)
{
    PyObject *error = PyObject_GetAttr(outcome, s_error);
    if (error == NULL) {
        return -1;
    }
    if (error == Py_None) {
        Py_DECREF(error);
        return 0;
    }
    PyObject *message = PyObject_GetAttr(outcome, s_message);
    if (message == NULL) {
        Py_DECREF(error);
        return -1;
    }
    PyObject *text = PyObject_IsTrue(message) == 1 ? message : error;
    Py_ssize_t n;
    const char *p = PyUnicode_Check(text) ? PyUnicode_AsUTF8AndSize(text, &n) : NULL;
    int status = status_of(s, error);
    if (p != NULL) {
        write_answer(s, index, 1, status, 0, (const uint8_t *)p, n, NULL, 0);
    }
    Py_DECREF(error);
    Py_DECREF(message);
    if (p == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "an item error is not a str");
        }
        return -1;
    }
    return 1;
}

/* One command's answer from its durable write's result (the future resolved). */
static int
answer_result(Session *s, int kind, uint32_t index, uint32_t nslots, PyObject *result,
              Py_ssize_t pos)
{
    if (kind == K_PUT) {
        PyObject *done = PySequence_GetItem(result, pos);
        uint64_t v[2];
        int ok = done != NULL && get_u64(done, s_id, &v[0]) == 0 &&
                 get_u64(done, s_deadline, &v[1]) == 0;
        Py_XDECREF(done);
        if (!ok) {
            return -1;
        }
        write_answer(s, index, 1, ST_OK, 0, (uint8_t *)v, 16, NULL, 0);
        return 0;
    }
    if (kind == K_RELEASED || kind == K_REQUEUED) {
        if (kind == K_REQUEUED && PySequence_Size(result) != 1) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "a requeue answers one outcome");
            }
            return -1;
        }
        PyObject *outcome = PySequence_GetItem(result, pos);
        if (outcome == NULL) {
            return -1;
        }
        int e = outcome_error(s, outcome, index);
        if (e == 0) {
            uint64_t deadline = 0;
            if (kind == K_REQUEUED && get_u64(outcome, s_deadline, &deadline) < 0) {
                e = -1;
            }
            else {
                write_answer(s, index, 1, ST_OK, 0, (uint8_t *)&deadline,
                             kind == K_REQUEUED ? 8 : 0, NULL, 0);
            }
        }
        Py_DECREF(outcome);
        return e < 0 ? -1 : 0;
    }
    Buf b = {0};
    PyObject *seq = PySequence_Fast(result, "a batch's result is a sequence");
    if (seq == NULL) {
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int rc = 0;
    if (kind == K_PUT_MANY) {
        for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
            PyObject *e = PySequence_Fast_GET_ITEM(seq, i);
            /* how u8: 0 a new item, 1 a duplicate, 2 replaced (docs/shm.md) */
            uint64_t id, deadline;
            uint8_t how;
            PyObject *d, *r;
            if (get_u64(e, s_id, &id) < 0 || get_u64(e, s_deadline, &deadline) < 0 ||
                (d = PyObject_GetAttr(e, s_duplicate)) == NULL) {
                rc = -1;
                break;
            }
            int t = PyObject_IsTrue(d);
            Py_DECREF(d);
            if ((r = PyObject_GetAttr(e, s_replaced)) == NULL) {
                rc = -1;
                break;
            }
            int t2 = PyObject_IsTrue(r);
            Py_DECREF(r);
            how = t2 == 1 ? 2 : t == 1 ? 1 : 0;
            if (t < 0 || t2 < 0 || buf_u64(&b, id) < 0 || buf_u64(&b, deadline) < 0 ||
                buf_put(&b, &how, 1) < 0) {
                rc = -1;
            }
        }
    }
    else { /* K_DELETE_MANY: a status byte per item, then each failed one's message */
        Py_ssize_t room = (Py_ssize_t)nslots * BODY_MAX, failed = 0;
        if (buf_reserve(&b, n) < 0) {
            rc = -1;
        }
        for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
            PyObject *error = PyObject_GetAttr(PySequence_Fast_GET_ITEM(seq, i), s_error);
            if (error == NULL) {
                rc = -1;
                break;
            }
            uint8_t st = error == Py_None ? 0 : (uint8_t)status_of(s, error);
            failed += st != 0;
            Py_DECREF(error);
            buf_put(&b, &st, 1);
        }
        Py_ssize_t left = room - n - 2 * failed;
        for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
            if (b.p[i] == 0) {
                continue;
            }
            PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
            PyObject *message = PyObject_GetAttr(o, s_message);
            PyObject *error = message ? PyObject_GetAttr(o, s_error) : NULL;
            if (error == NULL) {
                Py_XDECREF(message);
                rc = -1;
                break;
            }
            PyObject *text = PyObject_IsTrue(message) == 1 ? message
                             : PyObject_IsTrue(error) == 1 ? error : NULL;
            Py_ssize_t len = 0;
            const char *p = "";
            if (text != NULL && (p = PyUnicode_AsUTF8AndSize(text, &len)) == NULL) {
                rc = -1;
            }
            Py_DECREF(message);
            Py_DECREF(error);
            if (rc < 0) {
                break;
            }
            if (len > (left > 0 ? left : 0)) {
                len = left > 0 ? left : 0;
            }
            left -= len;
            uint16_t l16 = (uint16_t)len;
            if (buf_put(&b, &l16, 2) < 0 || buf_put(&b, p, len) < 0) {
                rc = -1;
            }
        }
    }
    Py_DECREF(seq);
    if (rc == 0) {
        write_answer(s, index, nslots, ST_OK, 0, b.p, b.len, NULL, 0);
    }
    PyMem_Free(b.p);
    return rc;
}

/* ---- the answer to a durable write: a callable the write's future calls --------------------- */

typedef struct {
    PyObject_HEAD
    Session *session;
    uint32_t first;  /* the first command's (first) slot */
    uint32_t count;  /* commands: consecutive slots, one each (a run) */
    uint32_t nslots; /* slots of the one command (a batch op over PARTs) */
    int kind;
} Answer;

static PyObject *
answer_call(Answer *self, PyObject *args, PyObject *kwargs)
{
    PyObject *future;
    if (!PyArg_ParseTuple(args, "O:answer", &future)) {
        return NULL;
    }
    Session *s = self->session;
    if (!s->has_view) {
        Py_RETURN_NONE; /* the session is gone: so is its client */
    }
    PyObject *result = PyObject_CallMethodNoArgs(future, s_result);
    if (result == NULL) {
        answer_exception_n(s, self->first, self->count, self->nslots, 0);
    }
    for (uint32_t i = 0; result != NULL && i < self->count; i++) {
        uint32_t index = (self->first + i) % s->capacity;
        if (answer_result(s, self->kind, index, self->nslots, result, i) < 0) {
            answer_exception(s, index, self->nslots, 0);
        }
    }
    Py_XDECREF(result);
    if (publish_ready(s) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static void
answer_dealloc(Answer *self)
{
    Py_XDECREF(self->session);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject AnswerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dq.shm._session.Answer",
    .tp_basicsize = sizeof(Answer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Answers the commands of one durable write when its future resolves.",
    .tp_call = (ternaryfunc)answer_call,
    .tp_dealloc = (destructor)answer_dealloc,
};

/* Hand a started write's future its answer. `started` is the handler's return (NULL: it
   raised, and each command is answered with the error). */
static int
await_write(Session *s, PyObject *started, uint32_t first, uint32_t count, uint32_t nslots,
            int kind)
{
    if (started == NULL) {
        answer_exception_n(s, first, count, nslots, 0);
        return publish_ready(s);
    }
    Answer *a = PyObject_New(Answer, &AnswerType);
    if (a == NULL) {
        Py_DECREF(started);
        return -1;
    }
    Py_INCREF(s);
    a->session = s;
    a->first = first;
    a->count = count;
    a->nslots = nslots;
    a->kind = kind;
    PyObject *r = PyObject_CallMethodOneArg(started, s_add_done_callback, (PyObject *)a);
    Py_DECREF(a);
    Py_DECREF(started);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* ---- decoding --------------------------------------------------------------------------- */

static PyObject *
opt_u64(uint64_t v)
{
    if (v == 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromUnsignedLongLong(v);
}

/* A receipt: ASCII, not empty; NULL with *why set if not (no exception). */
static PyObject *
receipt_of(const uint8_t *p, Py_ssize_t n, const char **why)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] & 0x80) {
            *why = "receipt is not ASCII";
            return NULL;
        }
    }
    if (n == 0) {
        *why = "receipt is empty";
        return NULL;
    }
    *why = NULL;
    return PyUnicode_DecodeASCII((const char *)p, n, "strict");
}

/* Copy the slot at `index` into `c`, then clear its ready byte (taken: never processed
   twice). MalformedSlot if the client moved head past a slot it did not fill. */
static int
read_slot(Session *s, uint32_t index, Cmd *c)
{
    uint8_t *slot = slot_at(s, index);
    if (__atomic_load_n(slot + S_READY, __ATOMIC_ACQUIRE) != 1) {
        raise_shm(MalformedSlot, "head moved past a slot that is not ready", "slot", index, NULL,
                  0);
        return -1;
    }
    c->index = index;
    c->op = slot[S_OP];
    memcpy(c->key, slot + S_KEY, 16);
    c->value_size = le32(slot + S_VALUE_SIZE);
    c->len = c->value_size <= VALUE_MAX ? c->value_size : 0;
    memcpy(c->value, slot + S_VALUE, c->len);
    __atomic_store_n(slot + S_READY, 0, __ATOMIC_RELEASE);
    s->slots[index].state = SLOT_PENDING;
    s->slots[index].span = 0;
    return 0;
}

static void
clear_rest(Session *s)
{
    Py_CLEAR(s->rest);
}

/* Run the group commit the session's writes asked for (``later``): before the session
   waits for anything — the next command, or the answers of its earlier ones, which that
   commit makes durable. */
static void
run_later(Session *s)
{
    while (s->later != NULL) {
        PyObject *fn = s->later;
        s->later = NULL;
        PyObject *r = PyObject_CallNoArgs(fn);
        if (r == NULL) {
            PyErr_WriteUnraisable(fn);
        }
        Py_XDECREF(r);
        Py_DECREF(fn);
    }
}

/* ---- commands that run once every earlier one is answered ---------------------------------- */

/* Wait (GIL released) until every command before `index` is published. 0, or 1 if the
   session stops meanwhile. */
static int
wait_answered(Session *s, uint32_t index)
{
    run_later(s);
    while (s->tail != index) {
        if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
            return 1;
        }
        uint32_t seen = __atomic_load_n(&s->published, __ATOMIC_ACQUIRE);
        s->waiting = 1;
        Py_BEGIN_ALLOW_THREADS
        futex_wait(&s->published, seen, STOP_POLL_NS, 1);
        Py_END_ALLOW_THREADS
        s->waiting = 0;
    }
    return 0;
}

/* A delivery's group as the ring carries it: none (length 0), or 1..255 ASCII bytes.
   -1 with an exception for anything else (the engine keeps 1-128 printable ASCII
   characters: anything else is a bug, answered `internal`, never a cut or a wrapped
   length byte). `group` is borrowed. */
static int
group_of(PyObject *group, const char **p, uint8_t *n)
{
    if (group == Py_None) {
        *p = "";
        *n = 0;
        return 0;
    }
    if (!PyUnicode_Check(group) || !PyUnicode_IS_ASCII(group) ||
        PyUnicode_GET_LENGTH(group) < 1 || PyUnicode_GET_LENGTH(group) > GROUP_MAX) {
        PyErr_SetString(PyExc_ValueError, "a group is not a str of 1-255 ASCII characters");
        return -1;
    }
    *p = (const char *)PyUnicode_DATA(group);
    *n = (uint8_t)PyUnicode_GET_LENGTH(group);
    return 0;
}

/* The FIND's answer: n u32, then each delivery (docs/shm.md); with `groups` each
   delivery's head has group_len u8 after value_len, and its group follows its value. */
static int
encode_deliveries(PyObject *got, Buf *b, int *flags, int groups)
{
    PyObject *seq = PySequence_Fast(got, "a dequeue answers a list");
    if (seq == NULL) {
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint32_t n32 = (uint32_t)n;
    int rc = buf_put(b, &n32, 4);
    for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
        PyObject *d = PySequence_Fast_GET_ITEM(seq, i);
        uint64_t f[5] = {0};
        uint64_t count = 0;
        PyObject *stats = NULL, *receipt = NULL, *value = NULL, *group = NULL;
        const char *rp, *gp = "";
        Py_ssize_t rn;
        char *vp;
        Py_ssize_t vn;
        uint8_t gn = 0;
        rc = -1;
        if (get_u64(d, s_id, &f[0]) == 0 && get_u64(d, s_deadline, &f[1]) == 0 &&
            get_u64(d, s_lease_expires, &f[2]) == 0 &&
            (stats = PyObject_GetAttr(d, s_stats)) != NULL &&
            get_u64(stats, s_enqueue_time, &f[3]) == 0 &&
            get_u64(stats, s_requeue_time, &f[4]) == 0 &&
            get_u64(stats, s_dequeue_count, &count) == 0 &&
            (receipt = PyObject_GetAttr(d, s_receipt)) != NULL && ascii_of(receipt, &rp, &rn) == 0 &&
            (value = PyObject_GetAttr(d, s_value)) != NULL &&
            PyBytes_AsStringAndSize(value, &vp, &vn) == 0 &&
            (!groups ||
             ((group = PyObject_GetAttr(d, s_group)) != NULL && group_of(group, &gp, &gn) == 0))) {
            if (count > UINT32_MAX || rn > UINT16_MAX || vn > (Py_ssize_t)UINT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "a delivery field is out of range");
            }
            else {
                uint8_t head[DELIVERY_HEAD + 1];
                uint32_t c32 = (uint32_t)count, v32 = (uint32_t)vn;
                uint16_t r16 = (uint16_t)rn;
                memcpy(head, f, 40);
                memcpy(head + 40, &c32, 4);
                memcpy(head + 44, &r16, 2);
                memcpy(head + 46, &v32, 4);
                head[DELIVERY_HEAD] = gn;
                if (buf_put(b, head, DELIVERY_HEAD + (groups ? 1 : 0)) == 0 &&
                    buf_put(b, rp, rn) == 0 && buf_put(b, vp, vn) == 0 &&
                    buf_put(b, gp, gn) == 0) {
                    rc = 0;
                }
            }
        }
        Py_XDECREF(stats);
        Py_XDECREF(receipt);
        Py_XDECREF(value);
        Py_XDECREF(group);
    }
    Py_DECREF(seq);
    if (rc < 0) {
        return -1;
    }
    PyObject *exists = PyObject_GetAttr(got, s_queue_exists);
    PyObject *draining = exists ? PyObject_GetAttr(got, s_draining) : NULL;
    int e = exists ? PyObject_IsTrue(exists) : -1;
    int dr = draining ? PyObject_IsTrue(draining) : -1;
    Py_XDECREF(exists);
    Py_XDECREF(draining);
    if (e < 0 || dr < 0) {
        return -1;
    }
    *flags = (e ? 0 : FLAG_NO_QUEUE) | (dr ? FLAG_DRAINING : 0) | (groups ? FLAG_GROUPS : 0);
    return 0;
}

/* A command that is answered at once, over `nslots` slots from `first` (a FIND may take
   PARTs for its answer's room): FIND, EXTEND, STATS, BIND, CONTINUE, an unknown op, and
   every refusal of a durable one. `c` is the command itself (the last of its slots). */
static void
run_now(Session *s, Cmd *c, uint32_t first, uint32_t nslots)
{
    int op = c->op;
    if (op != OP_CONTINUE) {
        clear_rest(s);
    }
    if (c->value_size > VALUE_MAX) {
        write_text(s, first, nslots, ST_VALUE_TOO_LARGE, "value_size exceeds the 1024-byte slot");
        return;
    }
    if (op == OP_BIND) {
        PyObject *name = PyBytes_FromStringAndSize((const char *)c->value, c->len);
        PyObject *r = name ? PyObject_CallMethodOneArg(s->handler, s_bind, name) : NULL;
        Py_XDECREF(name);
        if (r == NULL) {
            answer_exception(s, first, nslots, 1);
            return;
        }
        Py_DECREF(r);
        s->bound = 1;
        write_answer(s, first, nslots, ST_OK, 0, NULL, 0, NULL, 0);
        return;
    }
    if (op == OP_CONTINUE) {
        if (s->rest == NULL) {
            write_text(s, first, nslots, ST_NO_CONTINUATION, "no response continues");
            return;
        }
        PyObject *rest = s->rest;
        Py_ssize_t size = PyBytes_GET_SIZE(rest), at = s->rest_at;
        Py_ssize_t end = at + BODY_MAX < size ? at + BODY_MAX : size;
        int more = at + BODY_MAX < size;
        int flags = s->rest_flags | (more ? FLAG_MORE : 0);
        Py_INCREF(rest);
        if (more) {
            s->rest_at = at + BODY_MAX;
        }
        else {
            clear_rest(s);
        }
        /* a slice of the rest (one slot: a CONTINUE never takes PARTs), its MORE as the
           rest says */
        write_answer(s, first, nslots, ST_OK, flags, (uint8_t *)PyBytes_AS_STRING(rest) + at,
                     end - at, NULL, 0);
        Py_DECREF(rest);
        return;
    }
    if (op >= OP_KNOWN) {
        char text[32];
        snprintf(text, sizeof text, "unknown op %d", op);
        write_text(s, first, nslots, ST_UNKNOWN_OP, text);
        return;
    }
    if (!s->bound) {
        write_text(s, first, nslots, ST_NOT_BOUND, "no queue bound: send BIND first");
        return;
    }
    uint64_t a = le64(c->key), b = le64(c->key + 8);
    const char *why = NULL;
    if (op == OP_EXTEND) {
        PyObject *receipt = receipt_of(c->value, c->len, &why);
        if (receipt == NULL) {
            if (why == NULL) {
                answer_exception(s, first, nslots, 1);
                return;
            }
            write_text(s, first, nslots, ST_MALFORMED, why);
            return;
        }
        if (b == 0) {
            Py_DECREF(receipt);
            write_text(s, first, nslots, ST_MALFORMED, "EXTEND needs lease_ms > 0");
            return;
        }
        PyObject *r = PyObject_CallMethod(s->handler, "extend", "KOK", (unsigned long long)a,
                                          receipt, (unsigned long long)b);
        Py_DECREF(receipt);
        PyObject *outcome = r ? PySequence_GetItem(r, 0) : NULL;
        Py_XDECREF(r);
        int e = outcome ? outcome_error(s, outcome, first) : -1;
        if (e == 0) {
            uint64_t expires;
            PyObject *rc = NULL;
            const char *rp;
            Py_ssize_t rn;
            if (get_u64(outcome, s_lease_expires, &expires) == 0 &&
                (rc = PyObject_GetAttr(outcome, s_receipt)) != NULL &&
                (rc == Py_None ? (rp = "", rn = 0, 0) : ascii_of(rc, &rp, &rn)) == 0 &&
                rn <= UINT16_MAX) {
                PyObject *body = PyBytes_FromStringAndSize(NULL, 10 + rn);
                if (body != NULL) {
                    uint8_t *b = (uint8_t *)PyBytes_AS_STRING(body);
                    uint16_t r16 = (uint16_t)rn;
                    memcpy(b, &expires, 8);
                    memcpy(b + 8, &r16, 2);
                    memcpy(b + 10, rp, (size_t)rn);
                    write_answer(s, first, nslots, ST_OK, 0, b, 10 + rn, body, 1);
                    Py_DECREF(body);
                }
                else {
                    e = -1;
                }
            }
            else {
                e = -1;
            }
            Py_XDECREF(rc);
        }
        Py_XDECREF(outcome);
        if (e < 0) {
            answer_exception(s, first, nslots, 1);
        }
        return;
    }
    if (op == OP_FIND) {
        uint32_t count = le32(c->key), wait_ms = le32(c->key + 4);
        uint64_t lease = le64(c->key + 8);
        PyObject *lease_obj = opt_u64(lease);
        PyObject *got = lease_obj ? PyObject_CallMethod(s->handler, "find", "IIO",
                                                        count ? count : 1, wait_ms, lease_obj)
                                  : NULL;
        Py_XDECREF(lease_obj);
        Buf body = {0};
        int flags = 0;
        if (got == NULL || encode_deliveries(got, &body, &flags, s->groups) < 0) {
            Py_XDECREF(got);
            PyMem_Free(body.p);
            answer_exception(s, first, nslots, 1);
            return;
        }
        Py_DECREF(got);
        PyObject *whole = PyBytes_FromStringAndSize((char *)body.p, body.len);
        PyMem_Free(body.p);
        if (whole == NULL) {
            answer_exception(s, first, nslots, 1);
            return;
        }
        write_answer(s, first, nslots, ST_OK, flags, (uint8_t *)PyBytes_AS_STRING(whole),
                     PyBytes_GET_SIZE(whole), whole, 1);
        Py_DECREF(whole);
        return;
    }
    if (op == OP_STATS) {
        PyObject *r = PyObject_CallMethodNoArgs(s->handler, s_stats_m);
        char *p;
        Py_ssize_t n;
        if (r == NULL || PyBytes_AsStringAndSize(r, &p, &n) < 0) {
            Py_XDECREF(r);
            answer_exception(s, first, nslots, 1);
            return;
        }
        write_answer(s, first, nslots, ST_OK, 0, (uint8_t *)p, n, r, 1);
        Py_DECREF(r);
        return;
    }
    /* a durable op refused before it started (the caller answers the rest) */
    write_text(s, first, nslots, ST_INTERNAL, "internal error: not a command answered at once");
}

/* ---- durable commands ---------------------------------------------------------------------- */

/* One durable command alone (PUT, DELETE, REQUEUE): started, or answered with its refusal. */
static int
start_one(Session *s, Cmd *c)
{
    uint32_t index = c->index;
    clear_rest(s);
    if (c->value_size > VALUE_MAX) {
        write_text(s, index, 1, ST_VALUE_TOO_LARGE, "value_size exceeds the 1024-byte slot");
        return publish_ready(s);
    }
    if (!s->bound) {
        write_text(s, index, 1, ST_NOT_BOUND, "no queue bound: send BIND first");
        return publish_ready(s);
    }
    uint64_t a = le64(c->key), b = le64(c->key + 8);
    const char *why = NULL;
    PyObject *started;
    int kind;
    if (c->op == OP_PUT) {
        PyObject *value = PyBytes_FromStringAndSize((const char *)c->value, c->len);
        PyObject *deadline = opt_u64(a), *delay = opt_u64(b);
        started = value && deadline && delay
                      ? PyObject_CallMethodObjArgs(s->handler, s_enqueue_one, value, deadline,
                                                   delay, NULL)
                      : NULL;
        Py_XDECREF(value);
        Py_XDECREF(deadline);
        Py_XDECREF(delay);
        kind = K_PUT;
    }
    else if (c->op == OP_DELETE) {
        PyObject *receipt = receipt_of(c->value, c->len, &why);
        if (receipt == NULL && why != NULL) {
            write_text(s, index, 1, ST_MALFORMED, why);
            return publish_ready(s);
        }
        PyObject *id = receipt ? PyLong_FromUnsignedLongLong(a) : NULL;
        started = id ? PyObject_CallMethodObjArgs(s->handler, s_release_one, id, receipt, NULL)
                     : NULL;
        Py_XDECREF(id);
        Py_XDECREF(receipt);
        kind = K_RELEASED;
    }
    else { /* REQUEUE: delay_ms u64, then the receipt */
        if (c->len < 8) {
            char text[96];
            snprintf(text, sizeof text,
                     "REQUEUE value must start with delay_ms u64 (size=%u)", c->len);
            write_text(s, index, 1, ST_MALFORMED, text);
            return publish_ready(s);
        }
        PyObject *receipt = receipt_of(c->value + 8, c->len - 8, &why);
        if (receipt == NULL && why != NULL) {
            write_text(s, index, 1, ST_MALFORMED, why);
            return publish_ready(s);
        }
        PyObject *id = receipt ? PyLong_FromUnsignedLongLong(a) : NULL;
        PyObject *deadline = id ? opt_u64(b) : NULL;
        PyObject *delay = deadline ? opt_u64(le64(c->value)) : NULL;
        started = delay ? PyObject_CallMethodObjArgs(s->handler, s_requeue, id, receipt,
                                                     deadline, delay, NULL)
                        : NULL;
        Py_XDECREF(id);
        Py_XDECREF(receipt);
        Py_XDECREF(deadline);
        Py_XDECREF(delay);
        kind = K_REQUEUED;
    }
    return await_write(s, started, index, 1, 1, kind);
}

/* A run of consecutive PUTs (or DELETEs): one engine batch when it is more than one and
   every command in it is well formed; refused as a whole (nothing written), or not
   batchable, each command alone. */
static int
start_run(Session *s, Cmd *run, uint32_t n)
{
    if (n == 0) {
        return 0;
    }
    if (n > 1 && s->bound) {
        PyObject *items = PyList_New(n);
        int ok = items != NULL;
        for (uint32_t i = 0; ok && i < n; i++) {
            Cmd *c = &run[i];
            PyObject *item = NULL;
            if (c->value_size > VALUE_MAX) {
                ok = 0;
                break;
            }
            if (c->op == OP_PUT) {
                item = Py_BuildValue("(y#NN)", c->value, (Py_ssize_t)c->len,
                                     opt_u64(le64(c->key)), opt_u64(le64(c->key + 8)));
            }
            else {
                const char *why;
                PyObject *receipt = receipt_of(c->value, c->len, &why);
                if (receipt != NULL) {
                    item = Py_BuildValue("(KN)", (unsigned long long)le64(c->key), receipt);
                }
            }
            if (item == NULL) {
                ok = 0;
                break;
            }
            PyList_SET_ITEM(items, i, item);
        }
        PyErr_Clear();
        if (ok) {
            clear_rest(s);
            PyObject *started = PyObject_CallMethodOneArg(
                s->handler, run[0].op == OP_PUT ? s_enqueue : s_release, items);
            Py_DECREF(items);
            if (started != NULL) {
                return await_write(s, started, run[0].index, n, 1,
                                   run[0].op == OP_PUT ? K_PUT : K_RELEASED);
            }
            PyErr_Clear(); /* refused as a whole: nothing of it was written */
        }
        else {
            Py_XDECREF(items);
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        if (start_one(s, &run[i]) < 0) {
            return -1;
        }
    }
    return 0;
}

/* PUT_MANY's body: count x (deadline u64, delay_ms u64, value_len u32, key_len u8, key,
   value) -> [(value, deadline, delay, key)]; NULL with `text` set if malformed. */
static PyObject *
decode_put_many(const uint8_t *body, Py_ssize_t end, uint32_t count, char *text, size_t tn)
{
    PyObject *out = PyList_New(0);
    Py_ssize_t pos = 0;
    for (uint32_t i = 0; out && i < count; i++) {
        if (pos + 21 > end) {
            snprintf(text, tn, "PUT_MANY body truncated (offset=%zd)", pos);
            goto malformed;
        }
        uint64_t deadline = le64(body + pos), delay = le64(body + pos + 8);
        uint32_t vlen = le32(body + pos + 16);
        uint8_t klen = body[pos + 20];
        pos += 21;
        if (pos + (Py_ssize_t)klen + (Py_ssize_t)vlen > end) {
            snprintf(text, tn, "PUT_MANY body truncated (offset=%zd)", pos);
            goto malformed;
        }
        PyObject *key = Py_None;
        Py_INCREF(key);
        if (klen) {
            Py_DECREF(key);
            key = PyUnicode_DecodeUTF8((const char *)body + pos, klen, "strict");
            if (key == NULL) {
                PyErr_Clear();
                snprintf(text, tn, "key is not UTF-8 (offset=%zd)", pos);
                goto malformed;
            }
        }
        pos += klen;
        PyObject *item = Py_BuildValue("(y#NNN)", body + pos, (Py_ssize_t)vlen, opt_u64(deadline),
                                       opt_u64(delay), key);
        pos += vlen;
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(item);
    }
    if (out && pos != end) {
        snprintf(text, tn, "PUT_MANY body longer than its items (size=%zd, used=%zd)", end, pos);
        goto malformed;
    }
    return out;
malformed:
    Py_XDECREF(out);
    return NULL;
}

/* DELETE_MANY's body: count x (id u64, receipt_len u16, receipt) -> [(id, receipt)]. */
static PyObject *
decode_delete_many(const uint8_t *body, Py_ssize_t end, uint32_t count, char *text, size_t tn)
{
    PyObject *out = PyList_New(0);
    Py_ssize_t pos = 0;
    for (uint32_t i = 0; out && i < count; i++) {
        if (pos + 10 > end) {
            snprintf(text, tn, "DELETE_MANY body truncated (offset=%zd)", pos);
            goto malformed;
        }
        uint64_t id = le64(body + pos);
        uint16_t rlen = le16(body + pos + 8);
        pos += 10;
        if (pos + rlen > end) {
            snprintf(text, tn, "DELETE_MANY body truncated (offset=%zd)", pos);
            goto malformed;
        }
        const char *why;
        PyObject *receipt = receipt_of(body + pos, rlen, &why);
        if (receipt == NULL) {
            if (why == NULL) {
                Py_CLEAR(out);
                break;
            }
            snprintf(text, tn, "%s", why);
            goto malformed;
        }
        pos += rlen;
        PyObject *item = Py_BuildValue("(KN)", (unsigned long long)id, receipt);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(item);
    }
    if (out && pos != end) {
        snprintf(text, tn, "DELETE_MANY body longer than its items (size=%zd, used=%zd)", end,
                 pos);
        goto malformed;
    }
    return out;
malformed:
    Py_XDECREF(out);
    return NULL;
}

/* A command with the PARTs before it, or a batch op alone: a batch op starts like any
   durable write; anything else (a FIND given room for its answer) runs once every earlier
   command is answered. 1 if the session stopped first. The PARTs' bytes are in s->parts. */
static int
start_span(Session *s, Cmd *c)
{
    uint32_t first = s->nparts ? s->parts_first : c->index, nslots = s->nparts + 1;
    int too_large = s->parts_too_large || c->value_size > VALUE_MAX;
    int nonempty = s->parts_nonempty;
    s->nparts = 0;
    s->parts_too_large = s->parts_nonempty = 0;
    clear_rest(s);
    int many = c->op == OP_PUT_MANY || c->op == OP_DELETE_MANY;
    if (!many) {
        if (wait_answered(s, first)) {
            return 1;
        }
        if (too_large) {
            write_text(s, first, nslots, ST_VALUE_TOO_LARGE,
                       "value_size exceeds the 1024-byte slot");
        }
        else if (c->op != OP_FIND || nonempty) {
            write_text(s, first, nslots, ST_MALFORMED,
                       "PART slots precede PUT_MANY, DELETE_MANY or FIND only");
        }
        else {
            run_now(s, c, first, nslots);
        }
        return publish_ready(s);
    }
    if (too_large) {
        write_text(s, first, nslots, ST_VALUE_TOO_LARGE, "value_size exceeds the 1024-byte slot");
        return publish_ready(s);
    }
    if (!s->bound) {
        write_text(s, first, nslots, ST_NOT_BOUND, "no queue bound: send BIND first");
        return publish_ready(s);
    }
    if (buf_put(&s->parts, c->value, c->len) < 0) {
        return -1;
    }
    Py_ssize_t end = s->parts.len;
    uint32_t count = le32(c->key), size = le32(c->key + 4);
    uint64_t flags = le64(c->key + 8); /* PUT_MANY: bit 0 REPLACE; DELETE_MANY: unused */
    char text[128];
    if ((Py_ssize_t)size != end) {
        snprintf(text, sizeof text, "body_size does not match the body sent (size=%u, got=%zd)",
                 size, end);
        write_text(s, first, nslots, ST_MALFORMED, text);
        return publish_ready(s);
    }
    if (c->op == OP_PUT_MANY && (flags & ~(uint64_t)PUT_MANY_REPLACE)) {
        snprintf(text, sizeof text, "PUT_MANY flags has unknown bits (flags=%llu)",
                 (unsigned long long)flags);
        write_text(s, first, nslots, ST_MALFORMED, text);
        return publish_ready(s);
    }
    PyObject *items = c->op == OP_PUT_MANY
                          ? decode_put_many(s->parts.p, end, count, text, sizeof text)
                          : decode_delete_many(s->parts.p, end, count, text, sizeof text);
    if (items == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        write_text(s, first, nslots, ST_MALFORMED, text);
        return publish_ready(s);
    }
    /* a replacing PUT_MANY: put_many(items, True); what a repeated key does then is the
       enqueue's rule (storage/dedup.py), not the ring's */
    PyObject *started =
        c->op == OP_PUT_MANY && (flags & PUT_MANY_REPLACE)
            ? PyObject_CallMethodObjArgs(s->handler, s_put_many, items, Py_True, NULL)
            : PyObject_CallMethodOneArg(s->handler,
                                        c->op == OP_PUT_MANY ? s_put_many : s_delete_many, items);
    Py_DECREF(items);
    return await_write(s, started, first, 1, nslots,
                       c->op == OP_PUT_MANY ? K_PUT_MANY : K_DELETE_MANY);
}

static int
start_span_parts(Session *s, Cmd *c)
{
    int rc = start_span(s, c);
    s->parts.len = 0;
    return rc;
}

/* ---- the loop ------------------------------------------------------------------------------ */

/* The client's head, checked: ProtocolError beyond capacity. */
static int
load_head(Session *s, uint32_t *head)
{
    uint64_t h = __atomic_load_n((uint64_t *)(s->base + HEAD_OFF), __ATOMIC_ACQUIRE);
    if (h >= s->capacity) {
        raise_shm(ProtocolError, "head beyond capacity", "head", (long long)h, "capacity",
                  s->capacity);
        return -1;
    }
    *head = (uint32_t)h;
    return 0;
}

/* Take every command in [next, head), and what arrives meanwhile. 1 if stopping. */
static int
process(Session *s, uint32_t head)
{
    Cmd *run = s->run, c;
    uint32_t nrun = 0;
    int rc = 0;
    while (s->next != head && !__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
        uint32_t index = s->next;
        if (read_slot(s, index, &c) < 0) {
            rc = -1;
            break;
        }
        s->next = (index + 1) % s->capacity;
        int op = c.op;
        if (op == OP_PART) { /* answered with the command it belongs to */
            if ((rc = start_run(s, run, nrun)) < 0) {
                break;
            }
            nrun = 0;
            if (s->nparts == 0) {
                s->parts_first = index;
            }
            s->nparts++;
            s->parts_too_large |= c.value_size > VALUE_MAX;
            s->parts_nonempty |= c.len > 0;
            if (buf_put(&s->parts, c.value, c.len) < 0) {
                rc = -1;
                break;
            }
        }
        else if (s->nparts || op == OP_PUT_MANY || op == OP_DELETE_MANY) {
            if ((rc = start_run(s, run, nrun)) < 0) {
                break;
            }
            nrun = 0;
            if ((rc = start_span_parts(s, &c)) != 0) {
                break;
            }
        }
        else if (op == OP_PUT || op == OP_DELETE || op == OP_REQUEUE) {
            if (nrun && (run[0].op != op || op == OP_REQUEUE || nrun == RUN_MAX)) {
                if ((rc = start_run(s, run, nrun)) < 0) {
                    break;
                }
                nrun = 0;
            }
            run[nrun++] = c;
        }
        else {
            if ((rc = start_run(s, run, nrun)) < 0) {
                break;
            }
            nrun = 0;
            if (wait_answered(s, index)) {
                rc = 1;
                break;
            }
            run_now(s, &c, index, 1);
            if ((rc = publish_ready(s)) < 0) {
                break;
            }
        }
        if (s->next == head && s->has_view && load_head(s, &head) < 0) {
            rc = -1; /* pick up what arrived meanwhile */
            break;
        }
    }
    if (rc >= 0 && nrun) {
        int r = start_run(s, run, nrun);
        rc = r < 0 ? r : rc;
    }
    run_later(s);
    return rc;
}

static inline void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Wait (without the GIL) until head differs from `old`, stop() is called, or `timeout_ns`
   pass: spin for `spin_ns`, then park on head's low word (where a client wakes us). */
static void
wait_head(uint64_t *headp, uint64_t old, int *stopping, int64_t spin_ns, int64_t timeout_ns)
{
    int64_t start = now_ns(), end = start + timeout_ns;
    if (spin_ns > 0) {
        for (unsigned i = 1;; i++) {
            if (__atomic_load_n(headp, __ATOMIC_ACQUIRE) != old ||
                __atomic_load_n(stopping, __ATOMIC_ACQUIRE)) {
                return;
            }
            if ((i & 63) == 0 && now_ns() - start >= spin_ns) {
                break;
            }
            cpu_relax();
        }
    }
    for (;;) {
        uint32_t w = __atomic_load_n((uint32_t *)headp, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(headp, __ATOMIC_ACQUIRE) != old ||
            __atomic_load_n(stopping, __ATOMIC_ACQUIRE)) {
            return;
        }
        int64_t left = end - now_ns();
        if (left <= 0) {
            return;
        }
        int err = futex_wait((uint32_t *)headp, w, left, 0);
        if (err == 0 || err == ETIMEDOUT) {
            return; /* woken (a command, or stop()): the caller looks */
        }
    }
}

static PyObject *
session_serve(Session *s, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"wakes", "spin_us", NULL};
    int wakes = 1;
    double spin_us = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|pd:serve", kwlist, &wakes, &spin_us)) {
        return NULL;
    }
    if (isnan(spin_us) || spin_us < 0 || spin_us > 1e6) {
        PyErr_SetString(PyExc_ValueError, "spin_us must be within 0..1e6");
        return NULL;
    }
    if (!s->has_view || s->serving) {
        PyErr_SetString(PyExc_RuntimeError, "the session is closed or served already");
        return NULL;
    }
    s->serving = 1;
    int64_t spin_ns = (int64_t)(spin_us * 1000.0), poll_ns = POLL_MIN_NS;
    uint64_t *headp = (uint64_t *)(s->base + HEAD_OFF);
    PyObject *ret = Py_None;
    while (!__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
        uint64_t old = s->next;
        int64_t timeout = wakes ? IDLE_PARK_NS : poll_ns;
        Py_BEGIN_ALLOW_THREADS
        wait_head(headp, old, &s->stopping, spin_ns, timeout);
        Py_END_ALLOW_THREADS
        if (__atomic_load_n(&s->stopping, __ATOMIC_ACQUIRE)) {
            break;
        }
        uint32_t head;
        if (load_head(s, &head) < 0) {
            ret = NULL;
            break;
        }
        if (head == s->next) {
            poll_ns = poll_ns * 2 < POLL_MAX_NS ? poll_ns * 2 : POLL_MAX_NS;
            continue;
        }
        poll_ns = POLL_MIN_NS;
        if (process(s, head) < 0) {
            ret = NULL;
            break;
        }
    }
    s->serving = 0;
    Py_XINCREF(ret);
    return ret;
}

/* ---- the type ---------------------------------------------------------------------------- */

static int
session_init(Session *s, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buffer", "capacity", "handler", "statuses",
                             "bound",  "watch",    "groups",  NULL};
    PyObject *buffer, *handler, *statuses, *watch = Py_None;
    unsigned int capacity;
    int bound = 0, groups = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OIOO!|pOp:RingSession", kwlist, &buffer,
                                     &capacity, &handler, &PyDict_Type, &statuses, &bound,
                                     &watch, &groups)) {
        return -1;
    }
    if (s->has_view) {
        PyErr_SetString(PyExc_RuntimeError, "a RingSession is initialised once");
        return -1;
    }
    if (capacity < 2 || capacity > MAX_CAPACITY) {
        PyErr_SetString(PyExc_ValueError, "capacity out of range");
        return -1;
    }
    if (PyObject_GetBuffer(buffer, &s->view, PyBUF_WRITABLE) < 0) {
        return -1;
    }
    if (s->view.len < SLOTS_OFF + (Py_ssize_t)SLOT_SIZE * capacity ||
        ((uintptr_t)s->view.buf & 7) != 0) {
        PyBuffer_Release(&s->view);
        PyErr_SetString(PyExc_ValueError, "the buffer is smaller than the ring or misaligned");
        return -1;
    }
    s->slots = PyMem_Calloc(capacity, sizeof(SlotState));
    s->run = PyMem_Malloc(sizeof(Cmd) * RUN_MAX);
    if (s->slots == NULL || s->run == NULL) {
        PyBuffer_Release(&s->view);
        PyErr_NoMemory();
        return -1;
    }
    s->has_view = 1;
    s->base = s->view.buf;
    s->capacity = capacity;
    Py_INCREF(handler);
    Py_INCREF(statuses);
    Py_INCREF(watch);
    s->handler = handler;
    s->statuses = statuses;
    s->watch = watch;
    s->bound = bound;
    s->groups = groups;
    uint64_t header[3] = {0, 0, capacity};
    memcpy(s->base, header, sizeof header);
    return 0;
}

static PyObject *
session_stop(Session *s, PyObject *unused)
{
    __atomic_store_n(&s->stopping, 1, __ATOMIC_RELEASE);
    if (s->has_view) {
        futex_wake((uint32_t *)(s->base + HEAD_OFF), INT_MAX, 0);
    }
    __atomic_add_fetch(&s->published, 1, __ATOMIC_RELEASE);
    futex_wake(&s->published, INT_MAX, 1);
    Py_RETURN_NONE;
}

static PyObject *
session_close(Session *s, PyObject *unused)
{
    if (s->serving) {
        PyErr_SetString(PyExc_RuntimeError, "close() while serve() runs: stop() it first");
        return NULL;
    }
    __atomic_store_n(&s->stopping, 1, __ATOMIC_RELEASE);
    if (s->has_view) {
        s->has_view = 0;
        s->base = NULL;
        PyBuffer_Release(&s->view);
    }
    clear_rest(s);
    Py_CLEAR(s->later); /* it refers back to this session (a cycle otherwise) */
    Py_RETURN_NONE;
}

static PyObject *
session_later(Session *s, PyObject *fn)
{
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "later() takes a callable");
        return NULL;
    }
    if (s->later != NULL) { /* one commit runs everything noted: keep the first */
        Py_RETURN_NONE;
    }
    Py_INCREF(fn);
    s->later = fn;
    Py_RETURN_NONE;
}

static PyObject *
session_get_tail(Session *s, void *closure)
{
    return PyLong_FromUnsignedLong(s->tail);
}

static PyObject *
session_get_bound(Session *s, void *closure)
{
    return PyBool_FromLong(s->bound);
}

static void
session_dealloc(Session *s)
{
    if (s->has_view) {
        PyBuffer_Release(&s->view);
    }
    PyMem_Free(s->slots);
    PyMem_Free(s->run);
    PyMem_Free(s->parts.p);
    Py_XDECREF(s->handler);
    Py_XDECREF(s->statuses);
    Py_XDECREF(s->watch);
    Py_XDECREF(s->rest);
    Py_XDECREF(s->later);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef session_methods[] = {
    {"serve", (PyCFunction)(void (*)(void))session_serve, METH_VARARGS | METH_KEYWORDS,
     "serve(wakes=True, spin_us=0.0): answer the ring's commands until stop() or close(); "
     "raises ProtocolError (MalformedSlot) for a ring that breaks the protocol."},
    {"stop", (PyCFunction)session_stop, METH_NOARGS,
     "stop(): make serve() return (from any thread); answers still due are still published."},
    {"close", (PyCFunction)session_close, METH_NOARGS,
     "close(): release the ring's buffer; answers still due are dropped."},
    {"later", (PyCFunction)session_later, METH_O,
     "later(fn): call fn() (the session's own group commit) once the commands taken in this "
     "pass are started, or before the session waits for earlier answers, on its thread."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef session_getset[] = {
    {"tail", (getter)session_get_tail, NULL, "the next slot to publish", NULL},
    {"bound", (getter)session_get_bound, NULL, "whether a queue is bound", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SessionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dq.shm._session.RingSession",
    .tp_basicsize = sizeof(Session),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RingSession(buffer, capacity, handler, statuses, bound=False, watch=None, "
              "groups=False): the server's side of one command ring (docs/shm.md); writes the "
              "ring's header. groups: FIND answers carry each delivery's group (FLAG_GROUPS).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)session_init,
    .tp_dealloc = (destructor)session_dealloc,
    .tp_methods = session_methods,
    .tp_getset = session_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "dq.shm._session",
    "The server's side of a command ring: wait, decode, start, answer. See docs/shm.md.",
    -1,
    NULL,
    NULL,
    NULL,
    NULL,
    NULL,
};

#define INTERN(var, text)                                  \
    if ((var = PyUnicode_InternFromString(text)) == NULL) { \
        return NULL;                                       \
    }

PyMODINIT_FUNC
PyInit__session(void)
{
    INTERN(s_result, "result");
    INTERN(s_add_done_callback, "add_done_callback");
    INTERN(s_id, "id");
    INTERN(s_deadline, "deadline");
    INTERN(s_duplicate, "duplicate");
    INTERN(s_replaced, "replaced");
    INTERN(s_error, "error");
    INTERN(s_message, "message");
    INTERN(s_receipt, "receipt");
    INTERN(s_lease_expires, "lease_expires");
    INTERN(s_stats, "stats");
    INTERN(s_enqueue_time, "enqueue_time");
    INTERN(s_requeue_time, "requeue_time");
    INTERN(s_dequeue_count, "dequeue_count");
    INTERN(s_value, "value");
    INTERN(s_group, "group");
    INTERN(s_queue_exists, "queue_exists");
    INTERN(s_draining, "draining");
    INTERN(s_enqueue_one, "enqueue_one");
    INTERN(s_enqueue, "enqueue");
    INTERN(s_release_one, "release_one");
    INTERN(s_release, "release");
    INTERN(s_requeue, "requeue");
    INTERN(s_extend, "extend");
    INTERN(s_find, "find");
    INTERN(s_stats_m, "stats");
    INTERN(s_bind, "bind");
    INTERN(s_put_many, "put_many");
    INTERN(s_delete_many, "delete_many");
    INTERN(s_error_m, "error");
    PyObject *errors = PyImport_ImportModule("dq.shm.errors");
    if (errors == NULL) {
        return NULL;
    }
    MalformedSlot = PyObject_GetAttrString(errors, "MalformedSlot");
    ProtocolError = PyObject_GetAttrString(errors, "ProtocolError");
    Py_DECREF(errors);
    if (MalformedSlot == NULL || ProtocolError == NULL) {
        return NULL;
    }
    if (PyType_Ready(&SessionType) < 0 || PyType_Ready(&AnswerType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&SessionType);
    if (PyModule_AddObject(m, "RingSession", (PyObject *)&SessionType) < 0) {
        Py_DECREF(&SessionType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
