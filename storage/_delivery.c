/*
 * storage/_delivery.c -- the delivery index, dq.storage._delivery.DeliveryIndex: what a
 * queue's delivery rules (group_limit, leased_limit, fair, rate_limit; docs/delivery.md)
 * need to choose the next item without walking the items they hold back.
 *
 * Why: with many groups every group was a Python object with its held keys in a bytes
 * or bytearray, its name in a dict, heap entries as tuples and its token bucket as a
 * list: ~197 bytes a group beyond its items, and several Python calls per held item
 * passed. Here a group is a 56-byte record in one array, its name held once (the str
 * the leases share), its held keys a FIFO of fixed 16-byte keys (the first one inside
 * the record), and the heaps, the fair ring and the timers C arrays.
 *
 * What it keeps (the rules themselves live here and nowhere else):
 *   - slots: each group's count of live leases (`leased`) and the queue's (`taken`),
 *     grown by `took` when dequeue leases an item and shrunk by `ended` when the end of
 *     a lease is durable;
 *   - held items: the keys the cursor passed that their group may not hand out now,
 *     per group in key order (the order the cursor passed them), and in front of them
 *     the items back from an expired lease (a group's `Back`, made only while such an
 *     item is on its way or arrived);
 *   - eligible groups: a heap of (head key, group) for the oldest held item first, or
 *     with `fair` a round-robin ring of groups; a group that only its rate limit stops
 *     waits in a timer heap for its next token. Entries are checked when popped (the
 *     group's generation and head key), so a stale one costs a pop, never a wrong pick;
 *   - the rate limit's token buckets: the queue's, or one per group kept only while it
 *     is not full again (swept, amortized O(1) a token);
 *   - the marks of items back from an expired lease that the cursor has not reached
 *     (key -> group, an open-addressing table, and a heap of their keys).
 *
 * Invariants kept:
 *   - a live group's record has `name` set (an exact str, or None for the items
 *     without a group); a free record has name NULL and is on the free list; a group
 *     with no lease, no held item and no Back is dropped (an idle group costs nothing);
 *   - a group's keys and its Back's keys are sorted; `indexed` is the number of keys
 *     held in all groups; a mark's group is live (its Back counts the mark in `coming`);
 *   - `allocated` is exactly the bytes held from the allocator (PyMem_Raw*, which
 *     tracemalloc sees);
 *   - every method runs with the GIL held and never releases it (each call is short and
 *     in memory, and the queue's lock is held around it): no Python code runs while the
 *     structure is half changed (names are exact str, whose hash and comparison run no
 *     Python code; a name's release runs no code either).
 * Hostile input (a key of another length, a group that is not a str or None, a clock
 * out of range) raises TypeError/ValueError/OverflowError and changes nothing.
 *
 * The design is in docs/architecture.md ("Compiled parts").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KEY 16
#define MAX_HELD 1000000  /* keys held at most (16 MB of keys): dequeue reads no further */
#define WINDOW 100000     /* with fair: due items read ahead so that groups take turns */
#define READ_BUDGET 4096  /* with fair: entries one dequeue reads into the window at most */
#define NIL UINT32_MAX
#define RING_PEEK 64      /* has_eligible looks at this many ring entries under fair */

/* where remove found a key (put_back takes it back there) */
#define WHERE_HELD 1
#define WHERE_FRONT 2
#define WHERE_RETURNING 3

#define F_QUEUED 1u /* on the fair ring */
#define F_MARK 2u   /* seen by the current walk (configure, remove) */
#define F_PARK 4u   /* emptied by a removal while waiting on the fair ring */

typedef struct {
    uint32_t coming;   /* written back after an expired lease, not reached by the cursor */
    uint32_t n, cap;   /* arrived keys, in key order: delivered before the group's others */
    uint8_t *keys;
} Back;

typedef struct {
    PyObject *name;                           /* NULL: a free record */
    union {
        uint8_t one[KEY];                     /* cap <= 1: the key lives here */
        uint8_t *buf;                         /* cap > 1 */
    } u;
    Back *back;
    uint32_t head;                            /* first held key; a free record: next free */
    uint32_t n, cap;                          /* held keys, room for keys */
    uint32_t leased;
    uint32_t gen;                             /* bumped as the record is freed */
    uint32_t flags;
} Group;

_Static_assert(sizeof(Group) == 56, "a group is 56 bytes");

typedef struct {
    uint8_t key[KEY];
    uint32_t gid, gen;
} HeapEnt;

typedef struct {
    int64_t when;
    uint64_t seq;
    uint32_t gid, gen;
} Timer;

typedef struct {
    uint32_t gid, gen;
} RingEnt;

/* The place on the fair ring of a group a removal emptied (and so dropped), found again
 * by one of the keys it removed: a put_back of them (the removal refused) gives the group
 * that place back. Good while the ring still holds the dropped group's entry. */
typedef struct {
    uint8_t key[KEY];
    uint64_t pos;      /* the entry's number among all ever pushed (ring_popped + index) */
    uint32_t gid, gen; /* the entry as it stands: the dropped group's */
} Parked;

typedef struct {
    double tokens;
    int64_t counted;
} Tokens;

typedef struct {
    PyObject *name;
    Tokens t;
} Bucket;

typedef struct {
    uint8_t key[KEY];
    uint32_t gid; /* NIL: an empty slot */
    uint32_t pad;
} Mark;

/* An open-addressing hash of names to record numbers (slot: number + 1, 0: empty),
 * linear probing, deletion by backward shift; at most three quarters full. */
typedef struct {
    uint32_t *slots;
    size_t cap, n;
} NameHash;

typedef struct {
    PyObject_HEAD
    /* the rules */
    long long group_limit, leased_limit; /* -1: none */
    int fair, has_rules;
    int has_rate, per_group;
    double per_second;
    long long burst_n;
    /* buckets (with has_rate) */
    double per_ms, burst;
    Tokens queue_bucket;
    Bucket *bk;
    size_t nbk, bk_cap, swept;
    NameHash bkh;
    long long rate_refused;
    /* groups */
    Group *g;
    size_t g_cap, g_top; /* records allocated, records ever used */
    uint32_t free_head;
    size_t live;
    NameHash gh;
    long long taken, indexed;
    HeapEnt *heap;
    size_t nheap, heap_cap;
    RingEnt *ring;
    size_t ring_head, ring_n, ring_cap;
    uint64_t ring_popped; /* entries ever taken off the ring's head */
    Parked *parked;
    size_t nparked, parked_cap;
    Timer *timers;
    size_t ntimers, timers_cap;
    uint64_t seq;
    Mark *marks;
    size_t marks_cap, nmarks;
    uint8_t *rkeys; /* a min-heap of the marks' keys (some perhaps gone from `marks`) */
    size_t nrkeys, rkeys_cap;
    size_t allocated;
} Index;

static PyTypeObject IndexType;
static PyObject *str_group, *str_group_limit, *str_leased_limit, *str_fair, *str_rate_limit,
    *str_per_second, *str_burst, *str_per_group;

/* ---- memory, counted ----------------------------------------------------------------- */

static void *
ix_realloc(Index *ix, void *p, size_t old, size_t n)
{
    void *q = PyMem_RawRealloc(p, n ? n : 1);
    if (q == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    ix->allocated = ix->allocated - old + n;
    return q;
}

static void
ix_free(Index *ix, void *p, size_t n)
{
    if (p != NULL) {
        PyMem_RawFree(p);
        ix->allocated -= n;
    }
}

/* Room for one more of `size`-byte elements in an array of `*cap` holding `used`. */
static int
grow(Index *ix, void **arr, size_t *cap, size_t used, size_t size, size_t first)
{
    if (used < *cap) {
        return 0;
    }
    size_t ncap = *cap ? *cap * 2 : first;
    if (ncap > (size_t)PY_SSIZE_T_MAX / size) {
        PyErr_NoMemory();
        return -1;
    }
    void *q = ix_realloc(ix, *arr, *cap * size, ncap * size);
    if (q == NULL) {
        return -1;
    }
    *arr = q;
    *cap = ncap;
    return 0;
}

/* ---- arguments ----------------------------------------------------------------------- */

static int
check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t n)
{
    if (nargs != n) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, n, nargs);
        return 0;
    }
    return 1;
}

/* A group name: an exact str, or None. */
static int
check_name(PyObject *name)
{
    if (name == Py_None || PyUnicode_CheckExact(name)) {
        return 1;
    }
    PyErr_Format(PyExc_TypeError, "a group is a str or None, not %.100s", Py_TYPE(name)->tp_name);
    return 0;
}

/* A 16-byte key (bytes, or any bytes-like object) copied into out. */
static int
get_key(PyObject *obj, uint8_t *out)
{
    if (PyBytes_Check(obj)) {
        if (PyBytes_GET_SIZE(obj) != KEY) {
            PyErr_Format(PyExc_ValueError, "a key is %d bytes, not %zd", KEY,
                         PyBytes_GET_SIZE(obj));
            return -1;
        }
        memcpy(out, PyBytes_AS_STRING(obj), KEY);
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    int ok = view.len == KEY;
    if (ok) {
        memcpy(out, view.buf, KEY);
    } else {
        PyErr_Format(PyExc_ValueError, "a key is %d bytes, not %zd", KEY, view.len);
    }
    PyBuffer_Release(&view);
    return ok ? 0 : -1;
}

/* Any bytes-like object's bytes (a cursor position: perhaps b""), borrowed. */
static int
get_bytes(PyObject *obj, Py_buffer *view)
{
    return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE);
}

static int
get_now(PyObject *obj, int64_t *now)
{
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *now = v;
    return 0;
}

/* Sign of (16-byte key k) - (q, qlen bytes), in bytes order. */
static inline int
qcmp(const uint8_t *k, const uint8_t *q, Py_ssize_t qlen)
{
    size_t n = qlen < KEY ? (size_t)qlen : KEY;
    int c = n ? memcmp(k, q, n) : 0;
    if (c != 0) {
        return c;
    }
    return qlen < KEY ? 1 : (qlen > KEY ? -1 : 0);
}

static inline PyObject *
key_bytes(const uint8_t *k)
{
    return PyBytes_FromStringAndSize((const char *)k, KEY);
}

/* ---- names --------------------------------------------------------------------------- */

static inline Py_hash_t
name_hash(PyObject *name)
{
    if (name == Py_None) {
        return 0x5bd1e995;
    }
    return PyObject_Hash(name); /* an exact str: cached after the first time */
}

static inline int
name_eq(PyObject *a, PyObject *b)
{
    if (a == b) {
        return 1;
    }
    if (a == Py_None || b == Py_None) {
        return 0;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(a);
    int kind = PyUnicode_KIND(a);
    return n == PyUnicode_GET_LENGTH(b) && kind == PyUnicode_KIND(b) &&
           memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)n * (size_t)kind) == 0;
}

/* The records whose first field is their name: groups (stride sizeof(Group)) and
 * buckets (stride sizeof(Bucket)). */
static inline PyObject *
name_at(const void *base, size_t stride, uint32_t i)
{
    return *(PyObject *const *)((const char *)base + (size_t)i * stride);
}

static uint32_t
nh_find(const NameHash *h, const void *base, size_t stride, PyObject *name, Py_hash_t hash,
        size_t *pos)
{
    if (h->cap == 0) {
        return NIL;
    }
    size_t mask = h->cap - 1;
    for (size_t i = (size_t)hash & mask;; i = (i + 1) & mask) {
        uint32_t s = h->slots[i];
        if (s == 0) {
            return NIL;
        }
        if (name_eq(name_at(base, stride, s - 1), name)) {
            if (pos != NULL) {
                *pos = i;
            }
            return s - 1;
        }
    }
}

static void
nh_place(NameHash *h, uint32_t idx, Py_hash_t hash)
{
    size_t mask = h->cap - 1;
    size_t i = (size_t)hash & mask;
    while (h->slots[i] != 0) {
        i = (i + 1) & mask;
    }
    h->slots[i] = idx + 1;
}

/* Room for one more name (rehashing every live one into a table twice the size). */
static int
nh_reserve(Index *ix, NameHash *h, const void *base, size_t stride)
{
    if ((h->n + 1) * 4 <= h->cap * 3) {
        return 0;
    }
    size_t ncap = h->cap ? h->cap * 2 : 16;
    uint32_t *old = h->slots;
    size_t ocap = h->cap;
    uint32_t *slots = ix_realloc(ix, NULL, 0, ncap * sizeof(uint32_t));
    if (slots == NULL) {
        return -1;
    }
    memset(slots, 0, ncap * sizeof(uint32_t));
    h->slots = slots;
    h->cap = ncap;
    for (size_t i = 0; i < ocap; i++) {
        if (old[i] != 0) {
            nh_place(h, old[i] - 1, name_hash(name_at(base, stride, old[i] - 1)));
        }
    }
    ix_free(ix, old, ocap * sizeof(uint32_t));
    return 0;
}

/* Delete the slot at pos (backward shift: no tombstones). */
static void
nh_delete(NameHash *h, const void *base, size_t stride, size_t pos)
{
    size_t mask = h->cap - 1;
    size_t i = pos, j = pos;
    for (;;) {
        j = (j + 1) & mask;
        uint32_t s = h->slots[j];
        if (s == 0) {
            break;
        }
        size_t k = (size_t)name_hash(name_at(base, stride, s - 1)) & mask;
        /* move s back to i unless its home lies cyclically in (i, j] */
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            h->slots[i] = s;
            i = j;
        }
    }
    h->slots[i] = 0;
    h->n--;
}

static void
nh_clear(Index *ix, NameHash *h)
{
    ix_free(ix, h->slots, h->cap * sizeof(uint32_t));
    h->slots = NULL;
    h->cap = h->n = 0;
}

/* ---- a group's held keys ------------------------------------------------------------- */

static inline uint8_t *
gkeys(Group *g)
{
    return g->cap <= 1 ? g->u.one : g->u.buf;
}

static inline uint8_t *
gkey(Group *g, uint32_t i)
{
    return gkeys(g) + (size_t)(g->head + i) * KEY;
}

/* Move the group's keys into a buffer of ncap keys (ncap >= n; 1: the inline key). */
static int
g_resize(Index *ix, Group *g, uint32_t ncap)
{
    uint8_t *from = gkeys(g) + (size_t)g->head * KEY;
    if (ncap <= 1) {
        uint8_t tmp[KEY];
        if (g->n) {
            memcpy(tmp, from, KEY);
        }
        if (g->cap > 1) {
            ix_free(ix, g->u.buf, (size_t)g->cap * KEY);
        }
        if (g->n) {
            memcpy(g->u.one, tmp, KEY);
        }
    } else {
        uint8_t *buf = ix_realloc(ix, NULL, 0, (size_t)ncap * KEY);
        if (buf == NULL) {
            return -1;
        }
        memcpy(buf, from, (size_t)g->n * KEY);
        if (g->cap > 1) {
            ix_free(ix, g->u.buf, (size_t)g->cap * KEY);
        }
        g->u.buf = buf;
    }
    g->cap = ncap;
    g->head = 0;
    return 0;
}

/* Room for one more key at the end. */
static int
g_room(Index *ix, Group *g)
{
    if (g->head + g->n < g->cap) {
        return 0;
    }
    if (g->head > 0 && g->n < g->cap / 2 + 1 && g->cap > 1) {
        memmove(g->u.buf, g->u.buf + (size_t)g->head * KEY, (size_t)g->n * KEY);
        g->head = 0;
        return 0;
    }
    if (g->cap >= UINT32_MAX / 2) {
        PyErr_NoMemory();
        return -1;
    }
    return g_resize(ix, g, g->cap == 0 ? 1 : (g->cap == 1 ? 4 : g->cap * 2));
}

/* The held keys' buffer after one left: gone with the last, halved when a quarter used. */
static void
g_shrink(Index *ix, Group *g)
{
    if (g->n == 0) {
        if (g->cap > 1) {
            ix_free(ix, g->u.buf, (size_t)g->cap * KEY);
        }
        g->cap = 0;
        g->head = 0;
    } else if (g->cap > 8 && g->n * 4 <= g->cap) {
        uint32_t head = g->head;
        if (g_resize(ix, g, g->cap / 2) < 0) { /* no memory: keep the larger buffer */
            PyErr_Clear();
            g->head = head;
        }
    }
}

/* First index i in [0, n) whose key is >= k (right: > k). */
static uint32_t
g_bound(Group *g, const uint8_t *k, Py_ssize_t klen, int right)
{
    uint32_t lo = 0, hi = g->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        int c = qcmp(gkey(g, mid), k, klen);
        if (c > 0 || (!right && c == 0)) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo;
}

static int
g_insert(Index *ix, Group *g, const uint8_t *k)
{
    if (g_room(ix, g) < 0) {
        return -1;
    }
    uint32_t at = g_bound(g, k, KEY, 0);
    uint8_t *p = gkey(g, at);
    memmove(p + KEY, p, (size_t)(g->n - at) * KEY);
    memcpy(p, k, KEY);
    g->n++;
    return 0;
}

static uint32_t
back_find(const Back *b, const uint8_t *k)
{
    for (uint32_t i = 0; i < b->n; i++) {
        if (memcmp(b->keys + (size_t)i * KEY, k, KEY) == 0) {
            return i;
        }
    }
    return NIL;
}

static Back *
g_back(Index *ix, Group *g)
{
    if (g->back == NULL) {
        Back *b = ix_realloc(ix, NULL, 0, sizeof(Back));
        if (b == NULL) {
            return NULL;
        }
        memset(b, 0, sizeof(Back));
        g->back = b;
    }
    return g->back;
}

/* Drop the Back once nothing is on its way and nothing arrived is left. */
static void
g_back_done(Index *ix, Group *g)
{
    Back *b = g->back;
    if (b != NULL && b->coming == 0 && b->n == 0) {
        ix_free(ix, b->keys, (size_t)b->cap * KEY);
        ix_free(ix, b, sizeof(Back));
        g->back = NULL;
    }
}

/* Room for one more arrived key in a Back. */
static int
back_room(Index *ix, Back *b)
{
    if (b->n < b->cap) {
        return 0;
    }
    if (b->cap >= UINT32_MAX / 2) {
        PyErr_NoMemory();
        return -1;
    }
    uint32_t ncap = b->cap ? b->cap * 2 : 2;
    uint8_t *k = ix_realloc(ix, b->keys, (size_t)b->cap * KEY, (size_t)ncap * KEY);
    if (k == NULL) {
        return -1;
    }
    b->keys = k;
    b->cap = ncap;
    return 0;
}

static inline int
g_idle(const Group *g)
{
    return g->leased == 0 && g->back == NULL && g->n == 0;
}

static inline uint32_t
g_held(const Group *g)
{
    return g->n + (g->back != NULL ? g->back->n : 0);
}

/* The key the group hands out next, if it may in order: the first arrived back from a
 * lease, else (none on its way back) its first held one. */
static inline const uint8_t *
g_head(Group *g)
{
    if (g->back != NULL) {
        return g->back->n ? g->back->keys : NULL;
    }
    return g->n ? gkey(g, 0) : NULL;
}

/* The smallest key held. */
static const uint8_t *
g_first(Group *g)
{
    const uint8_t *first = g->n ? gkey(g, 0) : NULL;
    if (g->back != NULL && g->back->n && (first == NULL || memcmp(g->back->keys, first, KEY) < 0)) {
        return g->back->keys;
    }
    return first;
}

/* ---- groups -------------------------------------------------------------------------- */

static inline uint32_t
find_group(Index *ix, PyObject *name, size_t *pos)
{
    return nh_find(&ix->gh, ix->g, sizeof(Group), name, name_hash(name), pos);
}

/* The group named `name` (a checked name), made if it is not there; NIL on no memory. */
static uint32_t
get_group(Index *ix, PyObject *name)
{
    Py_hash_t hash = name_hash(name);
    uint32_t gid = nh_find(&ix->gh, ix->g, sizeof(Group), name, hash, NULL);
    if (gid != NIL) {
        return gid;
    }
    if (nh_reserve(ix, &ix->gh, ix->g, sizeof(Group)) < 0) {
        return NIL;
    }
    if (ix->free_head != NIL) {
        gid = ix->free_head;
        ix->free_head = ix->g[gid].head;
    } else {
        if (ix->g_top >= NIL - 1) {
            PyErr_NoMemory();
            return NIL;
        }
        if (grow(ix, (void **)&ix->g, &ix->g_cap, ix->g_top, sizeof(Group), 16) < 0) {
            return NIL;
        }
        gid = (uint32_t)ix->g_top++;
        ix->g[gid].gen = 0;
    }
    Group *g = &ix->g[gid];
    uint32_t gen = g->gen;
    memset(g, 0, sizeof(Group));
    g->gen = gen;
    Py_INCREF(name);
    g->name = name;
    nh_place(&ix->gh, gid, hash);
    ix->gh.n++;
    ix->live++;
    return gid;
}

static void
drop_group(Index *ix, uint32_t gid)
{
    Group *g = &ix->g[gid];
    size_t pos;
    uint32_t found = find_group(ix, g->name, &pos);
    if (found == gid) {
        nh_delete(&ix->gh, ix->g, sizeof(Group), pos);
    }
    if (g->cap > 1) {
        ix_free(ix, g->u.buf, (size_t)g->cap * KEY);
    }
    if (g->back != NULL) {
        ix_free(ix, g->back->keys, (size_t)g->back->cap * KEY);
        ix_free(ix, g->back, sizeof(Back));
    }
    PyObject *name = g->name;
    uint32_t gen = g->gen + 1;
    memset(g, 0, sizeof(Group));
    g->gen = gen;
    g->head = ix->free_head;
    ix->free_head = gid;
    ix->live--;
    Py_DECREF(name); /* a str or None: runs no code */
}

static inline int
under_limit(const Index *ix, const Group *g)
{
    return ix->group_limit < 0 || g->name == Py_None || g->leased < ix->group_limit;
}

/* ---- token buckets ------------------------------------------------------------------- */

/* The bucket `name` draws from, its tokens counted up to now; a group's bucket that is
 * not kept (full) is *tmp, a full bucket not kept until it is drawn on. */
static Tokens *
bucket(Index *ix, PyObject *name, int64_t now, Tokens *tmp, uint32_t *at)
{
    Tokens *b;
    if (at != NULL) {
        *at = NIL;
    }
    if (!ix->per_group) {
        b = &ix->queue_bucket;
    } else {
        uint32_t i = nh_find(&ix->bkh, ix->bk, sizeof(Bucket), name, name_hash(name), NULL);
        if (i == NIL) {
            tmp->tokens = ix->burst;
            tmp->counted = now;
            return tmp;
        }
        if (at != NULL) {
            *at = i;
        }
        b = &ix->bk[i].t;
    }
    if (now > b->counted) {
        double t = b->tokens + (double)(now - b->counted) * ix->per_ms;
        b->tokens = t < ix->burst ? t : ix->burst;
        b->counted = now;
    }
    return b;
}

static int
has_token(Index *ix, PyObject *name, int64_t now)
{
    Tokens tmp;
    return bucket(ix, name, now, &tmp, NULL)->tokens >= 1.0;
}

/* When the bucket of `name` next holds a whole token (now if it does). */
static int64_t
next_token(Index *ix, PyObject *name, int64_t now)
{
    Tokens tmp;
    Tokens *b = bucket(ix, name, now, &tmp, NULL);
    if (b->tokens >= 1.0) {
        return now;
    }
    /* from when it was counted: the clock may read a little earlier than then */
    double wait = ceil((1.0 - b->tokens) / ix->per_ms);
    int64_t w = wait >= 9.0e18 ? INT64_MAX / 2 : (wait < 1.0 ? 1 : (int64_t)wait);
    int64_t from = now > b->counted ? now : b->counted;
    return from + w;
}

/* Forget the buckets that have filled up again: O(1) a token taken, amortized. */
static int
sweep(Index *ix, int64_t now)
{
    size_t kept = 0;
    for (size_t i = 0; i < ix->nbk; i++) {
        Bucket *b = &ix->bk[i];
        if (b->t.tokens + (double)(now - b->t.counted) * ix->per_ms < ix->burst) {
            ix->bk[kept++] = *b;
        } else {
            Py_DECREF(b->name);
        }
    }
    ix->nbk = kept;
    ix->swept = kept;
    nh_clear(ix, &ix->bkh);
    for (size_t i = 0; i < kept; i++) {
        if (nh_reserve(ix, &ix->bkh, ix->bk, sizeof(Bucket)) < 0) {
            return -1;
        }
        nh_place(&ix->bkh, (uint32_t)i, name_hash(ix->bk[i].name));
        ix->bkh.n++;
    }
    return 0;
}

/* Take a token for a delivery of an item of `name`. */
static int
take_token(Index *ix, PyObject *name, int64_t now)
{
    Tokens tmp;
    uint32_t at;
    Tokens *b = bucket(ix, name, now, &tmp, &at);
    b->tokens -= 1.0;
    if (ix->per_group && at == NIL) {
        if (nh_reserve(ix, &ix->bkh, ix->bk, sizeof(Bucket)) < 0 ||
            grow(ix, (void **)&ix->bk, &ix->bk_cap, ix->nbk, sizeof(Bucket), 16) < 0) {
            return -1;
        }
        Bucket *nb = &ix->bk[ix->nbk];
        Py_INCREF(name);
        nb->name = name;
        nb->t = tmp;
        nh_place(&ix->bkh, (uint32_t)ix->nbk, name_hash(name));
        ix->bkh.n++;
        ix->nbk++;
        if (ix->nbk > 2 * ix->swept + 1024) {
            return sweep(ix, now);
        }
    }
    return 0;
}

static void
clear_buckets(Index *ix, int64_t now)
{
    for (size_t i = 0; i < ix->nbk; i++) {
        Py_DECREF(ix->bk[i].name);
    }
    ix->nbk = 0;
    ix->swept = 0;
    nh_clear(ix, &ix->bkh);
    ix_free(ix, ix->bk, ix->bk_cap * sizeof(Bucket));
    ix->bk = NULL;
    ix->bk_cap = 0;
    ix->queue_bucket.tokens = ix->burst;
    ix->queue_bucket.counted = now;
}

static inline int
group_buckets(const Index *ix)
{
    return ix->has_rate && ix->per_group;
}

/* ---- heaps --------------------------------------------------------------------------- */

static inline int
heap_less(const HeapEnt *a, const HeapEnt *b)
{
    return memcmp(a->key, b->key, KEY) < 0;
}

static inline int
timer_less(const Timer *a, const Timer *b)
{
    return a->when < b->when || (a->when == b->when && a->seq < b->seq);
}

#define DEFINE_HEAP(NAME, T, LESS)                                                   \
    static void NAME##_up(T *h, size_t i)                                            \
    {                                                                                \
        T x = h[i];                                                                  \
        while (i > 0) {                                                              \
            size_t p = (i - 1) / 2;                                                  \
            if (!LESS(&x, &h[p])) {                                                  \
                break;                                                               \
            }                                                                        \
            h[i] = h[p];                                                             \
            i = p;                                                                   \
        }                                                                            \
        h[i] = x;                                                                    \
    }                                                                                \
    static void NAME##_down(T *h, size_t n, size_t i)                                \
    {                                                                                \
        T x = h[i];                                                                  \
        for (;;) {                                                                   \
            size_t c = 2 * i + 1;                                                    \
            if (c >= n) {                                                            \
                break;                                                               \
            }                                                                        \
            if (c + 1 < n && LESS(&h[c + 1], &h[c])) {                               \
                c++;                                                                 \
            }                                                                        \
            if (!LESS(&h[c], &x)) {                                                  \
                break;                                                               \
            }                                                                        \
            h[i] = h[c];                                                             \
            i = c;                                                                   \
        }                                                                            \
        h[i] = x;                                                                    \
    }

DEFINE_HEAP(eheap, HeapEnt, heap_less)
DEFINE_HEAP(theap, Timer, timer_less)

typedef struct {
    uint8_t k[KEY];
} RKey;

static inline int
rkey_less(const RKey *a, const RKey *b)
{
    return memcmp(a->k, b->k, KEY) < 0;
}

DEFINE_HEAP(rheap, RKey, rkey_less)

static int
push_timer(Index *ix, int64_t when, uint32_t gid)
{
    if (grow(ix, (void **)&ix->timers, &ix->timers_cap, ix->ntimers, sizeof(Timer), 16) < 0) {
        return -1;
    }
    Timer *t = &ix->timers[ix->ntimers];
    t->when = when;
    t->seq = ix->seq++;
    t->gid = gid;
    t->gen = ix->g[gid].gen;
    theap_up(ix->timers, ix->ntimers++);
    return 0;
}

static Timer
pop_timer(Index *ix)
{
    Timer top = ix->timers[0];
    ix->timers[0] = ix->timers[--ix->ntimers];
    if (ix->ntimers) {
        theap_down(ix->timers, ix->ntimers, 0);
    }
    return top;
}

static HeapEnt
pop_heap(Index *ix)
{
    HeapEnt top = ix->heap[0];
    ix->heap[0] = ix->heap[--ix->nheap];
    if (ix->nheap) {
        eheap_down(ix->heap, ix->nheap, 0);
    }
    return top;
}

static int
ring_push(Index *ix, uint32_t gid)
{
    if (ix->ring_n == ix->ring_cap) {
        size_t ncap = ix->ring_cap ? ix->ring_cap * 2 : 16;
        RingEnt *r = ix_realloc(ix, NULL, 0, ncap * sizeof(RingEnt));
        if (r == NULL) {
            return -1;
        }
        for (size_t i = 0; i < ix->ring_n; i++) {
            r[i] = ix->ring[(ix->ring_head + i) % ix->ring_cap];
        }
        ix_free(ix, ix->ring, ix->ring_cap * sizeof(RingEnt));
        ix->ring = r;
        ix->ring_cap = ncap;
        ix->ring_head = 0;
    }
    RingEnt *e = &ix->ring[(ix->ring_head + ix->ring_n) % ix->ring_cap];
    e->gid = gid;
    e->gen = ix->g[gid].gen;
    ix->ring_n++;
    return 0;
}

static inline RingEnt *
ring_at(Index *ix, size_t i)
{
    return &ix->ring[(ix->ring_head + i) % ix->ring_cap];
}

static inline int
current(const Index *ix, uint32_t gid, uint32_t gen)
{
    return gid < ix->g_top && ix->g[gid].name != NULL && ix->g[gid].gen == gen;
}

/* ---- places on the fair ring kept for a put_back --------------------------------------- */

/* The ring entry a parked place names, if the ring still holds it as it was. */
static RingEnt *
parked_entry(Index *ix, const Parked *p)
{
    if (p->pos < ix->ring_popped || p->pos - ix->ring_popped >= ix->ring_n) {
        return NULL;
    }
    RingEnt *e = ring_at(ix, (size_t)(p->pos - ix->ring_popped));
    return e->gid == p->gid && e->gen == p->gen ? e : NULL;
}

static int
parked_cmp(const void *a, const void *b)
{
    uint32_t x = ((const Parked *)a)->gid, y = ((const Parked *)b)->gid;
    return (x > y) - (x < y);
}

/* A removal is about to drop the groups of `cand` (one of its removed keys each, gid and
 * gen set; sorted here): keep the places on the ring of those waiting there, so that
 * put_back gives them back. Places the ring no longer holds are let go first. */
static int
park(Index *ix, Parked *cand, size_t n)
{
    size_t kept = 0;
    for (size_t i = 0; i < ix->nparked; i++) {
        if (parked_entry(ix, &ix->parked[i]) != NULL) {
            ix->parked[kept++] = ix->parked[i];
        }
    }
    ix->nparked = kept;
    qsort(cand, n, sizeof(Parked), parked_cmp);
    for (size_t i = 0; i < ix->ring_n; i++) {
        RingEnt *e = ring_at(ix, i);
        if (!current(ix, e->gid, e->gen) || !(ix->g[e->gid].flags & F_PARK)) {
            continue;
        }
        Parked probe = {.gid = e->gid};
        Parked *c = bsearch(&probe, cand, n, sizeof(Parked), parked_cmp);
        if (c == NULL) {
            continue;
        }
        if (grow(ix, (void **)&ix->parked, &ix->parked_cap, ix->nparked, sizeof(Parked), 4) < 0) {
            return -1;
        }
        c->pos = ix->ring_popped + i;
        ix->parked[ix->nparked++] = *c;
    }
    return 0;
}

/* Group gid holds `key` again (put_back): if a removal of that key dropped the group from
 * its place on the ring, which the ring still holds, the group takes that place again
 * (and leaves a later one it took meanwhile). */
static void
unpark(Index *ix, const uint8_t *key, uint32_t gid)
{
    for (size_t i = 0; i < ix->nparked; i++) {
        Parked *p = &ix->parked[i];
        if (memcmp(p->key, key, KEY) != 0) {
            continue;
        }
        RingEnt *e = parked_entry(ix, p);
        ix->parked[i] = ix->parked[--ix->nparked];
        if (e == NULL) {
            return;
        }
        Group *g = &ix->g[gid];
        if (g->flags & F_QUEUED) {
            for (size_t j = 0; j < ix->ring_n; j++) {
                RingEnt *later = ring_at(ix, j);
                if (later->gid == gid && later->gen == g->gen) {
                    later->gid = NIL; /* no group's: passed over */
                }
            }
        }
        e->gid = gid;
        e->gen = g->gen;
        g->flags |= F_QUEUED;
        return;
    }
}

/* ---- choosing ------------------------------------------------------------------------ */

static int rebuild(Index *ix, int64_t now);

/* Put the group where dequeue looks if it may deliver its next held item now; if only
 * its bucket stops it, wake it when its next token comes. */
static int
offer(Index *ix, uint32_t gid, int64_t now)
{
    Group *g = &ix->g[gid];
    const uint8_t *key = g_head(g);
    if (key == NULL || !under_limit(ix, g)) {
        return 0; /* a slot freed, an item arriving or passed offers it again */
    }
    if (group_buckets(ix) && !has_token(ix, g->name, now)) {
        return push_timer(ix, next_token(ix, g->name, now), gid);
    }
    if (ix->fair) {
        if (!(g->flags & F_QUEUED)) {
            if (ring_push(ix, gid) < 0) {
                return -1;
            }
            ix->g[gid].flags |= F_QUEUED;
        }
        return 0;
    }
    if (grow(ix, (void **)&ix->heap, &ix->heap_cap, ix->nheap, sizeof(HeapEnt), 16) < 0) {
        return -1;
    }
    g = &ix->g[gid];
    HeapEnt *e = &ix->heap[ix->nheap];
    memcpy(e->key, g_head(g), KEY);
    e->gid = gid;
    e->gen = g->gen;
    eheap_up(ix->heap, ix->nheap++);
    if (ix->nheap > 2 * ix->live + 1024) {
        return rebuild(ix, now);
    }
    return 0;
}

/* Drop stale entries from the heap and the timers (O(1) per push, amortized). */
static int
rebuild(Index *ix, int64_t now)
{
    ix->nheap = 0;
    ix->ntimers = 0;
    for (size_t gid = 0; gid < ix->g_top; gid++) {
        if (ix->g[gid].name != NULL && offer(ix, (uint32_t)gid, now) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Groups whose next token has come may deliver again. */
static int
tick(Index *ix, int64_t now)
{
    while (ix->ntimers && ix->timers[0].when <= now) {
        Timer t = pop_timer(ix);
        if (current(ix, t.gid, t.gen) && !(ix->g[t.gid].flags & F_QUEUED)) {
            if (offer(ix, t.gid, now) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* The group may deliver with its bucket's token; else it waits on a timer. 1, 0, -1. */
static int
group_token(Index *ix, uint32_t gid, int64_t now)
{
    PyObject *name = ix->g[gid].name;
    if (!group_buckets(ix) || has_token(ix, name, now)) {
        return 1;
    }
    return push_timer(ix, next_token(ix, name, now), gid) < 0 ? -1 : 0;
}

/* The group to hand out from next (NIL: none; an error: NIL with an exception set). */
static uint32_t
next_group(Index *ix, int64_t now)
{
    if (ix->fair) {
        while (ix->ring_n) {
            RingEnt e = *ring_at(ix, 0);
            ix->ring_head = (ix->ring_head + 1) % ix->ring_cap;
            ix->ring_n--;
            ix->ring_popped++;
            if (!current(ix, e.gid, e.gen)) {
                continue;
            }
            Group *g = &ix->g[e.gid];
            g->flags &= ~F_QUEUED;
            if (g_head(g) != NULL && under_limit(ix, g)) {
                int t = group_token(ix, e.gid, now);
                if (t < 0) {
                    return NIL;
                }
                if (t) {
                    return e.gid;
                }
            }
        }
        return NIL;
    }
    while (ix->nheap) {
        HeapEnt e = pop_heap(ix);
        if (!current(ix, e.gid, e.gen)) {
            continue;
        }
        Group *g = &ix->g[e.gid];
        const uint8_t *head = g_head(g);
        if (head != NULL && memcmp(head, e.key, KEY) == 0 && under_limit(ix, g)) {
            int t = group_token(ix, e.gid, now);
            if (t < 0) {
                return NIL;
            }
            if (t) {
                return e.gid;
            }
        }
    }
    return NIL;
}

/* Take the key g_head named into out. */
static void
pop_head(Index *ix, Group *g, uint8_t *out)
{
    ix->indexed--;
    Back *b = g->back;
    if (b != NULL) {
        memcpy(out, b->keys, KEY);
        b->n--;
        memmove(b->keys, b->keys + KEY, (size_t)b->n * KEY);
        g_back_done(ix, g);
        return;
    }
    memcpy(out, gkey(g, 0), KEY);
    g->head++;
    g->n--;
    g_shrink(ix, g);
}

/* The group's head was handed out or set apart: offer its next one, or drop it. */
static int
done_with(Index *ix, uint32_t gid, int64_t now)
{
    if (g_idle(&ix->g[gid])) {
        drop_group(ix, gid);
        return 0;
    }
    return offer(ix, gid, now);
}

/* ---- returning marks ----------------------------------------------------------------- */

static inline size_t
key_hash(const uint8_t *k)
{
    uint64_t a, b;
    memcpy(&a, k, 8);
    memcpy(&b, k + 8, 8);
    uint64_t h = a ^ (b * 0x9E3779B97F4A7C15ull);
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return (size_t)h;
}

static size_t
mark_find(const Index *ix, const uint8_t *k)
{
    if (ix->nmarks == 0) {
        return SIZE_MAX;
    }
    size_t mask = ix->marks_cap - 1;
    for (size_t i = key_hash(k) & mask;; i = (i + 1) & mask) {
        const Mark *m = &ix->marks[i];
        if (m->gid == NIL) {
            return SIZE_MAX;
        }
        if (memcmp(m->key, k, KEY) == 0) {
            return i;
        }
    }
}

static void
mark_place(Mark *marks, size_t cap, const uint8_t *k, uint32_t gid)
{
    size_t mask = cap - 1;
    size_t i = key_hash(k) & mask;
    while (marks[i].gid != NIL) {
        i = (i + 1) & mask;
    }
    memcpy(marks[i].key, k, KEY);
    marks[i].gid = gid;
    marks[i].pad = 0;
}

static int
mark_put(Index *ix, const uint8_t *k, uint32_t gid)
{
    if ((ix->nmarks + 1) * 4 > ix->marks_cap * 3) {
        size_t ncap = ix->marks_cap ? ix->marks_cap * 2 : 16;
        Mark *nm = ix_realloc(ix, NULL, 0, ncap * sizeof(Mark));
        if (nm == NULL) {
            return -1;
        }
        for (size_t i = 0; i < ncap; i++) {
            nm[i].gid = NIL;
        }
        for (size_t i = 0; i < ix->marks_cap; i++) {
            if (ix->marks[i].gid != NIL) {
                mark_place(nm, ncap, ix->marks[i].key, ix->marks[i].gid);
            }
        }
        ix_free(ix, ix->marks, ix->marks_cap * sizeof(Mark));
        ix->marks = nm;
        ix->marks_cap = ncap;
    }
    mark_place(ix->marks, ix->marks_cap, k, gid);
    ix->nmarks++;
    return 0;
}

static void
mark_delete(Index *ix, size_t pos)
{
    size_t mask = ix->marks_cap - 1;
    size_t i = pos, j = pos;
    for (;;) {
        j = (j + 1) & mask;
        Mark *m = &ix->marks[j];
        if (m->gid == NIL) {
            break;
        }
        size_t k = key_hash(m->key) & mask;
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            ix->marks[i] = *m;
            i = j;
        }
    }
    ix->marks[i].gid = NIL;
    ix->nmarks--;
}

/* An item of group gid was written back after its lease ran out, under key k. */
static int
returning_one(Index *ix, const uint8_t *k, uint32_t gid)
{
    if (mark_find(ix, k) != SIZE_MAX) {
        return 0; /* marked already: counted once */
    }
    if (grow(ix, (void **)&ix->rkeys, &ix->rkeys_cap, ix->nrkeys, KEY, 16) < 0) {
        return -1;
    }
    Back *b = g_back(ix, &ix->g[gid]);
    if (b == NULL || mark_put(ix, k, gid) < 0) {
        return -1;
    }
    b->coming++;
    memcpy(ix->rkeys + ix->nrkeys * KEY, k, KEY);
    rheap_up((RKey *)ix->rkeys, ix->nrkeys++);
    return 0;
}

/* An item group gid waited for will not come back: the group goes on without it, or is
 * forgotten if it holds nothing else. 1 if it was offered, 0 if not, -1 on error. */
static int
not_returning(Index *ix, uint32_t gid, int64_t now)
{
    Group *g = &ix->g[gid];
    if (g->back != NULL && g->back->coming) {
        g->back->coming--;
    }
    g_back_done(ix, g);
    if (g_idle(g)) {
        drop_group(ix, gid);
        return 0;
    }
    return offer(ix, gid, now) < 0 ? -1 : 1;
}

/* ---- the type ------------------------------------------------------------------------ */

static void
clear_all(Index *ix)
{
    for (size_t gid = 0; gid < ix->g_top; gid++) {
        Group *g = &ix->g[gid];
        if (g->name == NULL) {
            continue;
        }
        if (g->cap > 1) {
            ix_free(ix, g->u.buf, (size_t)g->cap * KEY);
        }
        if (g->back != NULL) {
            ix_free(ix, g->back->keys, (size_t)g->back->cap * KEY);
            ix_free(ix, g->back, sizeof(Back));
        }
        Py_CLEAR(g->name);
    }
    ix_free(ix, ix->g, ix->g_cap * sizeof(Group));
    ix->g = NULL;
    ix->g_cap = ix->g_top = 0;
    ix->free_head = NIL;
    ix->live = 0;
    nh_clear(ix, &ix->gh);
    ix_free(ix, ix->heap, ix->heap_cap * sizeof(HeapEnt));
    ix->heap = NULL;
    ix->nheap = ix->heap_cap = 0;
    ix_free(ix, ix->ring, ix->ring_cap * sizeof(RingEnt));
    ix->ring = NULL;
    ix->ring_head = ix->ring_n = ix->ring_cap = 0;
    ix_free(ix, ix->parked, ix->parked_cap * sizeof(Parked));
    ix->parked = NULL;
    ix->nparked = ix->parked_cap = 0;
    ix_free(ix, ix->timers, ix->timers_cap * sizeof(Timer));
    ix->timers = NULL;
    ix->ntimers = ix->timers_cap = 0;
    ix->seq = 0;
    ix_free(ix, ix->marks, ix->marks_cap * sizeof(Mark));
    ix->marks = NULL;
    ix->marks_cap = ix->nmarks = 0;
    ix_free(ix, ix->rkeys, ix->rkeys_cap * KEY);
    ix->rkeys = NULL;
    ix->nrkeys = ix->rkeys_cap = 0;
    ix->taken = ix->indexed = 0;
}

static PyObject *
ix_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "DeliveryIndex() takes no arguments");
        return NULL;
    }
    Index *ix = (Index *)type->tp_alloc(type, 0);
    if (ix == NULL) {
        return NULL;
    }
    ix->group_limit = ix->leased_limit = -1;
    ix->free_head = NIL;
    return (PyObject *)ix;
}

static void
ix_dealloc(Index *ix)
{
    clear_all(ix);
    clear_buckets(ix, 0);
    Py_TYPE(ix)->tp_free((PyObject *)ix);
}

static PyObject *
ix_reset(Index *ix, PyObject *unused)
{
    clear_all(ix);
    if (ix->has_rate) {
        clear_buckets(ix, 0);
    }
    Py_RETURN_NONE;
}

/* An optional int attribute >= 1 of the config: -1 for None. */
static int
limit_of(PyObject *config, PyObject *attr, long long *out)
{
    PyObject *v = PyObject_GetAttr(config, attr);
    if (v == NULL) {
        return -1;
    }
    if (v == Py_None) {
        *out = -1;
    } else {
        long long n = PyLong_AsLongLong(v);
        if (n == -1 && PyErr_Occurred()) {
            Py_DECREF(v);
            return -1;
        }
        if (n < 1) {
            Py_DECREF(v);
            PyErr_Format(PyExc_ValueError, "%U must be at least 1", attr);
            return -1;
        }
        *out = n;
    }
    Py_DECREF(v);
    return 0;
}

static PyObject *
ix_configure(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    if (!check_nargs("configure", nargs, 2) || get_now(args[1], &now) < 0) {
        return NULL;
    }
    PyObject *config = args[0];
    long long group_limit, leased_limit;
    int fair, has_rate = 0, per_group = 0;
    double per_second = 0;
    long long burst = 0;
    if (limit_of(config, str_group_limit, &group_limit) < 0 ||
        limit_of(config, str_leased_limit, &leased_limit) < 0) {
        return NULL;
    }
    PyObject *v = PyObject_GetAttr(config, str_fair);
    if (v == NULL) {
        return NULL;
    }
    fair = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (fair < 0) {
        return NULL;
    }
    PyObject *rate = PyObject_GetAttr(config, str_rate_limit);
    if (rate == NULL) {
        return NULL;
    }
    if (rate != Py_None) {
        has_rate = 1;
        PyObject *ps = PyObject_GetAttr(rate, str_per_second);
        PyObject *bu = ps ? PyObject_GetAttr(rate, str_burst) : NULL;
        PyObject *pg = bu ? PyObject_GetAttr(rate, str_per_group) : NULL;
        if (pg != NULL) {
            per_second = PyFloat_AsDouble(ps);
            if (!(per_second == -1.0 && PyErr_Occurred())) {
                burst = PyLong_AsLongLong(bu);
                if (!(burst == -1 && PyErr_Occurred())) {
                    per_group = PyObject_IsTrue(pg);
                }
            }
        }
        Py_XDECREF(ps);
        Py_XDECREF(bu);
        Py_XDECREF(pg);
        if (PyErr_Occurred()) {
            Py_DECREF(rate);
            return NULL;
        }
        if (!(per_second > 0) || !isfinite(per_second) || burst < 1) {
            Py_DECREF(rate);
            PyErr_SetString(PyExc_ValueError,
                            "a rate limit has per_second > 0 and burst >= 1");
            return NULL;
        }
    }
    Py_DECREF(rate);
    ix->group_limit = group_limit;
    ix->leased_limit = leased_limit;
    ix->fair = fair;
    if (has_rate != ix->has_rate ||
        (has_rate && (per_second != ix->per_second || burst != ix->burst_n ||
                      per_group != ix->per_group))) {
        ix->has_rate = has_rate;
        ix->per_second = per_second;
        ix->burst_n = burst;
        ix->per_group = per_group;
        ix->per_ms = per_second / 1000.0;
        ix->burst = (double)burst;
        clear_buckets(ix, now);
    }
    ix->has_rules = group_limit >= 0 || leased_limit >= 0 || fair || has_rate;
    /* the groups waiting for their turn keep their places (a change of config is no
     * turn of theirs), but those the new rules stop, which join again at the back once
     * they may deliver; the others join after them */
    size_t nw = 0;
    uint32_t *waiting = NULL;
    if (ix->ring_n) {
        waiting = PyMem_RawMalloc(ix->ring_n * sizeof(uint32_t));
        if (waiting == NULL) {
            return PyErr_NoMemory();
        }
        for (size_t i = 0; i < ix->ring_n; i++) {
            RingEnt *e = ring_at(ix, i);
            if (current(ix, e->gid, e->gen)) {
                waiting[nw++] = e->gid;
            }
        }
    }
    ix->nheap = 0;
    ix->ring_popped += ix->ring_n; /* the old entries go: a parked place goes with them */
    ix->ring_n = ix->ring_head = 0;
    ix->nparked = 0;
    ix->ntimers = 0;
    for (size_t gid = 0; gid < ix->g_top; gid++) {
        ix->g[gid].flags = 0;
    }
    int err = 0;
    for (size_t i = 0; i < nw && !err; i++) {
        Group *g = &ix->g[waiting[i]];
        if (!(g->flags & F_MARK)) {
            g->flags |= F_MARK;
            err = offer(ix, waiting[i], now) < 0;
        }
    }
    for (size_t gid = 0; gid < ix->g_top && !err; gid++) {
        Group *g = &ix->g[gid];
        if (g->name != NULL && !(g->flags & F_MARK)) {
            err = offer(ix, (uint32_t)gid, now) < 0;
        }
    }
    for (size_t gid = 0; gid < ix->g_top; gid++) {
        ix->g[gid].flags &= ~F_MARK;
    }
    PyMem_RawFree(waiting);
    if (err) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---- slots --------------------------------------------------------------------------- */

static PyObject *
ix_took(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    if (!check_nargs("took", nargs, 2) || !check_name(args[0]) || get_now(args[1], &now) < 0) {
        return NULL;
    }
    uint32_t gid = get_group(ix, args[0]);
    if (gid == NIL) {
        return NULL;
    }
    Group *g = &ix->g[gid];
    g->leased++;
    ix->taken++;
    PyObject *name = g->name;
    Py_INCREF(name);
    if (ix->has_rate && take_token(ix, args[0], now) < 0) {
        Py_DECREF(name);
        return NULL;
    }
    return name;
}

static PyObject *
ix_ended(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    if (!check_nargs("ended", nargs, 2) || get_now(args[1], &now) < 0) {
        return NULL;
    }
    int wake = ix->leased_limit >= 0 && ix->taken >= ix->leased_limit;
    PyObject *it = PyObject_GetIter(args[0]);
    if (it == NULL) {
        return NULL;
    }
    PyObject *pair;
    while ((pair = PyIter_Next(it)) != NULL) {
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            Py_DECREF(pair);
            Py_DECREF(it);
            PyErr_SetString(PyExc_TypeError, "ended() takes (item id, lease) pairs");
            return NULL;
        }
        PyObject *group = PyObject_GetAttr(PyTuple_GET_ITEM(pair, 1), str_group);
        Py_DECREF(pair);
        if (group == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_SetString(PyExc_TypeError, "ended() takes (item id, lease) pairs");
        }
        if (group == NULL || !check_name(group)) {
            Py_XDECREF(group);
            Py_DECREF(it);
            return NULL;
        }
        if (ix->taken > 0) {
            ix->taken--;
        }
        uint32_t gid = find_group(ix, group, NULL);
        Py_DECREF(group);
        if (gid == NIL) {
            continue;
        }
        Group *g = &ix->g[gid];
        if (g->leased) {
            g->leased--;
        }
        if (g_idle(g)) {
            drop_group(ix, gid);
        } else if (g_head(g) != NULL) {
            if (offer(ix, gid, now) < 0) {
                Py_DECREF(it);
                return NULL;
            }
            wake = 1;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        return NULL;
    }
    int active = ix->has_rules || ix->indexed > 0 || ix->nmarks > 0;
    return PyBool_FromLong(wake && active);
}

static int
queue_open(Index *ix, int64_t now)
{
    if (ix->leased_limit >= 0 && ix->taken >= ix->leased_limit) {
        return 0;
    }
    return !ix->has_rate || ix->per_group || has_token(ix, Py_None, now);
}

static PyObject *
ix_queue_open(Index *ix, PyObject *arg)
{
    int64_t now;
    if (get_now(arg, &now) < 0) {
        return NULL;
    }
    return PyBool_FromLong(queue_open(ix, now));
}

static PyObject *
ix_at_leased_limit(Index *ix, PyObject *unused)
{
    return PyBool_FromLong(ix->leased_limit >= 0 && ix->taken >= ix->leased_limit);
}

/* ---- holding ------------------------------------------------------------------------- */

/* An entry of the group `name` may be handed out now (else hold it). */
static int
admits(Index *ix, PyObject *name, int64_t now)
{
    uint32_t gid = find_group(ix, name, NULL);
    if (gid != NIL) {
        Group *g = &ix->g[gid];
        if (g->back != NULL || g->n) { /* items ahead of it, or coming back */
            return 0;
        }
        if (!under_limit(ix, g)) {
            return 0;
        }
    }
    if (group_buckets(ix) && !has_token(ix, name, now)) {
        ix->rate_refused++;
        return 0;
    }
    return 1;
}

static int
hold(Index *ix, PyObject *name, const uint8_t *key, int64_t now)
{
    uint32_t gid = get_group(ix, name);
    if (gid == NIL) {
        return -1;
    }
    Group *g = &ix->g[gid];
    int first = g->n == 0 && g->back == NULL;
    if (g_room(ix, g) < 0) {
        return -1;
    }
    memcpy(gkey(g, g->n), key, KEY);
    g->n++;
    ix->indexed++;
    return first ? offer(ix, gid, now) : 0;
}

static PyObject *
ix_admits(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    if (!check_nargs("admits", nargs, 2) || !check_name(args[0]) || get_now(args[1], &now) < 0) {
        return NULL;
    }
    return PyBool_FromLong(admits(ix, args[0], now));
}

static PyObject *
ix_hold(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    uint8_t key[KEY];
    if (!check_nargs("hold", nargs, 3) || !check_name(args[0]) || get_key(args[1], key) < 0 ||
        get_now(args[2], &now) < 0) {
        return NULL;
    }
    if (hold(ix, args[0], key, now) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
ix_hold_run(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    if (!check_nargs("hold_run", nargs, 5) || get_now(args[4], &now) < 0) {
        return NULL;
    }
    PyObject *keys = args[0], *groups = args[1];
    if (!PyList_Check(keys) || (groups != Py_None && !PyList_Check(groups))) {
        PyErr_SetString(PyExc_TypeError, "hold_run() takes a list of keys and of groups or None");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[2]);
    Py_ssize_t end = i == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (i < 0 || end < i || end > PyList_GET_SIZE(keys) ||
        (groups != Py_None && end > PyList_GET_SIZE(groups))) {
        PyErr_SetString(PyExc_IndexError, "hold_run() range out of the lists");
        return NULL;
    }
    while (i < end) {
        PyObject *name = groups == Py_None ? Py_None : PyList_GET_ITEM(groups, i);
        if (!check_name(name)) {
            return NULL;
        }
        if (admits(ix, name, now)) {
            break;
        }
        uint8_t key[KEY];
        if (get_key(PyList_GET_ITEM(keys, i), key) < 0 || hold(ix, name, key, now) < 0) {
            return NULL;
        }
        i++;
        if (ix->indexed >= MAX_HELD) {
            break;
        }
    }
    return PyLong_FromSsize_t(i);
}

/* ---- items back from an expired lease ------------------------------------------------ */

static int
returning_dict(Index *ix, PyObject *keys)
{
    if (!PyDict_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "the items coming back are a dict of key -> group");
        return -1;
    }
    PyObject *k, *name;
    Py_ssize_t pos = 0;
    while (PyDict_Next(keys, &pos, &k, &name)) {
        uint8_t key[KEY];
        if (get_key(k, key) < 0 || !check_name(name)) {
            return -1;
        }
        uint32_t gid = get_group(ix, name);
        if (gid == NIL || returning_one(ix, key, gid) < 0) {
            return -1;
        }
    }
    return 0;
}

static PyObject *
ix_returning(Index *ix, PyObject *keys)
{
    if (returning_dict(ix, keys) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
ix_rebuilt_returning(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    if (!check_nargs("rebuilt_returning", nargs, 2) || get_now(args[1], &now) < 0) {
        return NULL;
    }
    PyObject *keys = args[0];
    if (!PyDict_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "the items coming back are a dict of key -> group");
        return NULL;
    }
    /* the marks not among keys are dropped (their groups go on) */
    size_t i = 0;
    while (i < ix->marks_cap) {
        Mark *m = &ix->marks[i];
        if (m->gid == NIL) {
            i++;
            continue;
        }
        PyObject *kb = key_bytes(m->key);
        if (kb == NULL) {
            return NULL;
        }
        int in = PyDict_Contains(keys, kb);
        Py_DECREF(kb);
        if (in < 0) {
            return NULL;
        }
        if (in) {
            i++;
            continue;
        }
        uint32_t gid = m->gid;
        mark_delete(ix, i); /* a later mark may have shifted into slot i: look again */
        if (not_returning(ix, gid, now) < 0) {
            return NULL;
        }
    }
    if (returning_dict(ix, keys) < 0) { /* those marked already are left as they are */
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
ix_is_returning(Index *ix, PyObject *arg)
{
    uint8_t key[KEY];
    if (ix->nmarks == 0) {
        Py_RETURN_FALSE;
    }
    if (get_key(arg, key) < 0) {
        return NULL;
    }
    return PyBool_FromLong(mark_find(ix, key) != SIZE_MAX);
}

static PyObject *
ix_arrive(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    uint8_t key[KEY];
    if (!check_nargs("arrive", nargs, 2) || get_key(args[0], key) < 0 ||
        get_now(args[1], &now) < 0) {
        return NULL;
    }
    size_t pos = mark_find(ix, key);
    if (pos == SIZE_MAX) {
        PyErr_SetObject(PyExc_KeyError, args[0]);
        return NULL;
    }
    uint32_t gid = ix->marks[pos].gid;
    Group *g = &ix->g[gid];
    Back *b = g_back(ix, g);
    if (b == NULL || back_room(ix, b) < 0) {
        return NULL;
    }
    mark_delete(ix, pos);
    b->coming--;
    /* in key order: after the others as the cursor reaches them in order, but a mark
     * put back (a refused removal) may arrive behind one that came meanwhile */
    uint32_t at = b->n;
    while (at > 0 && memcmp(b->keys + (size_t)(at - 1) * KEY, key, KEY) > 0) {
        at--;
    }
    memmove(b->keys + (size_t)(at + 1) * KEY, b->keys + (size_t)at * KEY,
            (size_t)(b->n - at) * KEY);
    memcpy(b->keys + (size_t)at * KEY, key, KEY);
    b->n++;
    ix->indexed++;
    if (offer(ix, gid, now) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
ix_passed(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    Py_buffer after;
    if (!check_nargs("passed", nargs, 2) || get_now(args[1], &now) < 0 ||
        get_bytes(args[0], &after) < 0) {
        return NULL;
    }
    int offered = 0;
    while (ix->nrkeys && qcmp(ix->rkeys, after.buf, after.len) <= 0) {
        uint8_t key[KEY];
        memcpy(key, ix->rkeys, KEY);
        ix->nrkeys--;
        if (ix->nrkeys) {
            memcpy(ix->rkeys, ix->rkeys + ix->nrkeys * KEY, KEY);
            rheap_down((RKey *)ix->rkeys, ix->nrkeys, 0);
        }
        size_t pos = mark_find(ix, key);
        if (pos == SIZE_MAX) {
            continue;
        }
        uint32_t gid = ix->marks[pos].gid;
        mark_delete(ix, pos);
        int r = not_returning(ix, gid, now);
        if (r < 0) {
            PyBuffer_Release(&after);
            return NULL;
        }
        offered |= r;
    }
    PyBuffer_Release(&after);
    return PyBool_FromLong(offered);
}

/* ---- choosing (the methods) ---------------------------------------------------------- */

static PyObject *
ix_tick(Index *ix, PyObject *arg)
{
    int64_t now;
    if (get_now(arg, &now) < 0 || tick(ix, now) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
ix_next_held(Index *ix, PyObject *arg)
{
    int64_t now;
    if (get_now(arg, &now) < 0) {
        return NULL;
    }
    uint32_t gid = next_group(ix, now);
    if (gid == NIL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    Group *g = &ix->g[gid];
    uint8_t key[KEY];
    pop_head(ix, g, key);
    PyObject *kb = key_bytes(key);
    if (kb == NULL) {
        return NULL;
    }
    return Py_BuildValue("(NO)", kb, g->name);
}

static PyObject *
ix_done_with(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    if (!check_nargs("done_with", nargs, 2) || !check_name(args[0]) ||
        get_now(args[1], &now) < 0) {
        return NULL;
    }
    uint32_t gid = find_group(ix, args[0], NULL);
    if (gid != NIL && done_with(ix, gid, now) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
ix_has_eligible(Index *ix, PyObject *arg)
{
    int64_t now;
    if (get_now(arg, &now) < 0 || tick(ix, now) < 0) {
        return NULL;
    }
    if (ix->fair) {
        for (size_t i = 0; i < ix->ring_n && i < RING_PEEK; i++) {
            RingEnt *e = ring_at(ix, i);
            if (current(ix, e->gid, e->gen)) {
                Group *g = &ix->g[e->gid];
                if (g_head(g) != NULL && under_limit(ix, g)) {
                    Py_RETURN_TRUE;
                }
            }
        }
        Py_RETURN_FALSE;
    }
    while (ix->nheap) {
        HeapEnt *e = &ix->heap[0];
        if (current(ix, e->gid, e->gen)) {
            Group *g = &ix->g[e->gid];
            const uint8_t *head = g_head(g);
            if (head != NULL && memcmp(head, e->key, KEY) == 0 && under_limit(ix, g)) {
                Py_RETURN_TRUE;
            }
        }
        pop_heap(ix);
    }
    Py_RETURN_FALSE;
}

static PyObject *
ix_next_timer(Index *ix, PyObject *unused)
{
    if (!ix->ntimers) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong(ix->timers[0].when);
}

static PyObject *
ix_queue_token_at(Index *ix, PyObject *arg)
{
    int64_t now;
    if (get_now(arg, &now) < 0) {
        return NULL;
    }
    if (!ix->has_rate || ix->per_group || has_token(ix, Py_None, now)) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong(next_token(ix, Py_None, now));
}

/* ---- operators ----------------------------------------------------------------------- */

/* Where group g holds key: WHERE_FRONT (back from a lease), WHERE_HELD, or 0. */
static int
g_holds(Group *g, const uint8_t *key)
{
    if (g->back != NULL && back_find(g->back, key) != NIL) {
        return WHERE_FRONT;
    }
    uint32_t at = g_bound(g, key, KEY, 0);
    return at < g->n && memcmp(gkey(g, at), key, KEY) == 0 ? WHERE_HELD : 0;
}

static PyObject *
ix_holds(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    uint8_t key[KEY];
    if (!check_nargs("holds", nargs, 2) || get_key(args[0], key) < 0 || !check_name(args[1])) {
        return NULL;
    }
    uint32_t gid = find_group(ix, args[1], NULL);
    return PyBool_FromLong(gid != NIL && g_holds(&ix->g[gid], key));
}

/* Drop key from group g: where it was, or 0. */
static int
g_remove(Index *ix, Group *g, const uint8_t *key)
{
    Back *b = g->back;
    if (b != NULL) {
        uint32_t i = back_find(b, key);
        if (i != NIL) {
            memmove(b->keys + (size_t)i * KEY, b->keys + (size_t)(i + 1) * KEY,
                    (size_t)(b->n - i - 1) * KEY);
            b->n--;
            g_back_done(ix, g);
            return WHERE_FRONT;
        }
    }
    uint32_t at = g_bound(g, key, KEY, 0);
    if (at >= g->n || memcmp(gkey(g, at), key, KEY) != 0) {
        return 0;
    }
    uint8_t *p = gkey(g, at);
    memmove(p, p + KEY, (size_t)(g->n - at - 1) * KEY);
    g->n--;
    g_shrink(ix, g);
    return WHERE_HELD;
}

static PyObject *
ix_remove(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    if (!check_nargs("remove", nargs, 2) || get_now(args[1], &now) < 0) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "remove() takes (key, group) pairs");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    /* checked whole first: a bad pair changes nothing */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
        uint8_t key[KEY];
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "remove() takes (key, group) pairs");
            return NULL;
        }
        if (get_key(PyTuple_GET_ITEM(pair, 0), key) < 0 ||
            !check_name(PyTuple_GET_ITEM(pair, 1))) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    PyObject *out = PyList_New(0);
    uint32_t *touched = PyMem_RawMalloc(((size_t)n + 1) * sizeof(uint32_t));
    /* with fair: a removed held key of each group touched, to keep its place by */
    Parked *cand = ix->fair ? PyMem_RawMalloc(((size_t)n + 1) * sizeof(Parked)) : NULL;
    if (out == NULL || touched == NULL || (ix->fair && cand == NULL)) {
        Py_XDECREF(out);
        PyMem_RawFree(touched);
        PyMem_RawFree(cand);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    size_t nt = 0, nc = 0;
    int err = 0;
    for (Py_ssize_t i = 0; i < n && !err; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *group = PyTuple_GET_ITEM(pair, 1);
        uint8_t key[KEY];
        get_key(PyTuple_GET_ITEM(pair, 0), key);
        uint32_t gid;
        PyObject *row = NULL;
        size_t pos = mark_find(ix, key);
        if (pos != SIZE_MAX) { /* on its way back, ahead of the cursor: its group goes on */
            gid = ix->marks[pos].gid;
            mark_delete(ix, pos);
            Group *g = &ix->g[gid];
            if (g->back != NULL && g->back->coming) {
                g->back->coming--;
            }
            g_back_done(ix, g);
            row = Py_BuildValue("(y#Oi)", (const char *)key, (Py_ssize_t)KEY, g->name,
                                WHERE_RETURNING);
        } else {
            gid = find_group(ix, group, NULL);
            if (gid == NIL) {
                continue;
            }
            int where = g_remove(ix, &ix->g[gid], key);
            if (!where) {
                continue;
            }
            ix->indexed--;
            if (cand != NULL && !(ix->g[gid].flags & F_PARK)) {
                ix->g[gid].flags |= F_PARK;
                memcpy(cand[nc].key, key, KEY);
                cand[nc].gid = gid;
                cand[nc].gen = ix->g[gid].gen;
                nc++;
            }
            row = Py_BuildValue("(y#Oi)", (const char *)key, (Py_ssize_t)KEY, group, where);
        }
        if (row == NULL || PyList_Append(out, row) < 0) {
            err = 1;
        }
        Py_XDECREF(row);
        if (!(ix->g[gid].flags & F_MARK)) {
            ix->g[gid].flags |= F_MARK;
            touched[nt++] = gid;
        }
    }
    /* a group the removal empties is dropped, and leaves its place on the fair ring:
     * kept, in case the removal is refused and put back */
    size_t np = 0;
    for (size_t i = 0; i < nc; i++) {
        Group *g = &ix->g[cand[i].gid];
        if (g_idle(g) && (g->flags & F_QUEUED)) {
            cand[np++] = cand[i];
        } else {
            g->flags &= ~F_PARK;
        }
    }
    if (np && !err) {
        err = park(ix, cand, np) < 0;
    }
    for (size_t i = 0; i < np; i++) {
        ix->g[cand[i].gid].flags &= ~F_PARK;
    }
    for (size_t i = 0; i < nt; i++) {
        ix->g[touched[i]].flags &= ~F_MARK;
    }
    for (size_t i = 0; i < nt && !err; i++) {
        err = done_with(ix, touched[i], now) < 0;
    }
    PyMem_RawFree(touched);
    PyMem_RawFree(cand);
    Py_DECREF(seq);
    if (err) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *
ix_put_back(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    if (!check_nargs("put_back", nargs, 2) || get_now(args[1], &now) < 0) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "put_back() takes what remove() returned");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PySequence_Fast_GET_ITEM(seq, i);
        uint8_t key[KEY];
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 3) {
            PyErr_SetString(PyExc_TypeError, "put_back() takes (key, group, where) rows");
            goto fail;
        }
        long where = PyLong_AsLong(PyTuple_GET_ITEM(row, 2));
        if (where == -1 && PyErr_Occurred()) {
            goto fail;
        }
        PyObject *group = PyTuple_GET_ITEM(row, 1);
        if (get_key(PyTuple_GET_ITEM(row, 0), key) < 0 || !check_name(group)) {
            goto fail;
        }
        if (where < WHERE_HELD || where > WHERE_RETURNING) {
            PyErr_Format(PyExc_ValueError, "no such place to put a key back: %ld", where);
            goto fail;
        }
        uint32_t gid = get_group(ix, group);
        if (gid == NIL) {
            goto fail;
        }
        Group *g = &ix->g[gid];
        if (where == WHERE_RETURNING) {
            if (returning_one(ix, key, gid) < 0) {
                goto fail;
            }
            continue;
        }
        if (g_holds(g, key)) {
            continue; /* held already: once is enough */
        }
        if (where == WHERE_FRONT) {
            Back *b = g_back(ix, g);
            if (b == NULL || back_room(ix, b) < 0) {
                goto fail;
            }
            uint32_t at = 0;
            while (at < b->n && memcmp(b->keys + (size_t)at * KEY, key, KEY) < 0) {
                at++;
            }
            memmove(b->keys + (size_t)(at + 1) * KEY, b->keys + (size_t)at * KEY,
                    (size_t)(b->n - at) * KEY);
            memcpy(b->keys + (size_t)at * KEY, key, KEY);
            b->n++;
        } else if (g_insert(ix, g, key) < 0) {
            goto fail;
        }
        ix->indexed++;
        if (ix->nparked) {
            unpark(ix, key, gid);
        }
        if (offer(ix, gid, now) < 0) {
            goto fail;
        }
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

typedef struct {
    const uint8_t *key;
    uint32_t gid;
} Found;

static int
found_cmp(const void *a, const void *b)
{
    return memcmp(((const Found *)a)->key, ((const Found *)b)->key, KEY);
}

static PyObject *
ix_held_after(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer after;
    if (!check_nargs("held_after", nargs, 2)) {
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (limit < 0) {
        PyErr_SetString(PyExc_ValueError, "held_after() takes a limit >= 0");
        return NULL;
    }
    if (get_bytes(args[0], &after) < 0) {
        return NULL;
    }
    /* up to `limit` keys above `after` from each group's two sorted runs, then sorted */
    size_t cap = 0, n = 0;
    Found *found = NULL;
    for (size_t gid = 0; gid < ix->g_top; gid++) {
        Group *g = &ix->g[gid];
        if (g->name == NULL) {
            continue;
        }
        for (int run = 0; run < 2; run++) {
            const uint8_t *keys;
            uint32_t from, count;
            if (run == 0) {
                from = g_bound(g, after.buf, after.len, 1);
                count = g->n;
                keys = g->n ? gkey(g, 0) : NULL;
            } else {
                if (g->back == NULL) {
                    break;
                }
                keys = g->back->keys;
                count = g->back->n;
                from = 0;
                while (from < count && qcmp(keys + (size_t)from * KEY, after.buf, after.len) <= 0) {
                    from++;
                }
            }
            for (uint32_t i = from; i < count && (Py_ssize_t)(i - from) < limit; i++) {
                if (n == cap) {
                    size_t ncap = cap ? cap * 2 : 64;
                    Found *f = PyMem_RawRealloc(found, ncap * sizeof(Found));
                    if (f == NULL) {
                        PyMem_RawFree(found);
                        PyBuffer_Release(&after);
                        return PyErr_NoMemory();
                    }
                    found = f;
                    cap = ncap;
                }
                found[n].key = keys + (size_t)i * KEY;
                found[n].gid = (uint32_t)gid;
                n++;
            }
        }
    }
    PyBuffer_Release(&after);
    if (n > 1) {
        qsort(found, n, sizeof(Found), found_cmp);
    }
    size_t take = n < (size_t)limit ? n : (size_t)limit;
    PyObject *out = PyList_New((Py_ssize_t)take);
    for (size_t i = 0; out != NULL && i < take; i++) {
        PyObject *row = Py_BuildValue("(y#O)", (const char *)found[i].key, (Py_ssize_t)KEY,
                                      ix->g[found[i].gid].name);
        if (row == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, row);
    }
    PyMem_RawFree(found);
    return out;
}

static PyObject *
ix_oldest_key(Index *ix, PyObject *unused)
{
    const uint8_t *best = NULL;
    for (size_t gid = 0; gid < ix->g_top; gid++) {
        Group *g = &ix->g[gid];
        if (g->name == NULL) {
            continue;
        }
        const uint8_t *k = g_first(g);
        if (k != NULL && (best == NULL || memcmp(k, best, KEY) < 0)) {
            best = k;
        }
    }
    if (best == NULL) {
        Py_RETURN_NONE;
    }
    return key_bytes(best);
}

/* The group may not hand out its held items now. */
static int
blocked(Index *ix, Group *g, int64_t now)
{
    if (g_head(g) == NULL || !under_limit(ix, g)) {
        return 1;
    }
    return group_buckets(ix) && !has_token(ix, g->name, now);
}

static PyObject *
ix_held_back(Index *ix, PyObject *arg)
{
    int64_t now;
    if (get_now(arg, &now) < 0) {
        return NULL;
    }
    long long sum = 0;
    for (size_t gid = 0; gid < ix->g_top; gid++) {
        Group *g = &ix->g[gid];
        if (g->name != NULL && g_held(g) && blocked(ix, g, now)) {
            sum += g_held(g);
        }
    }
    return PyLong_FromLongLong(sum);
}

typedef struct {
    uint64_t total, leased;
    uint32_t gid;
} Busy;

static int
busy_cmp(const void *pa, const void *pb)
{
    const Busy *a = pa, *b = pb;
    if (a->total != b->total) {
        return a->total > b->total ? -1 : 1;
    }
    if (a->leased != b->leased) {
        return a->leased > b->leased ? -1 : 1;
    }
    return a->gid < b->gid ? -1 : (a->gid > b->gid);
}

static PyObject *
ix_busiest(Index *ix, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    if (!check_nargs("busiest", nargs, 2) || get_now(args[1], &now) < 0) {
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[0]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Busy *all = PyMem_RawMalloc((ix->live + 1) * sizeof(Busy));
    if (all == NULL) {
        return PyErr_NoMemory();
    }
    size_t n = 0;
    for (size_t gid = 0; gid < ix->g_top; gid++) {
        Group *g = &ix->g[gid];
        if (g->name != NULL) {
            all[n].leased = g->leased;
            all[n].total = (uint64_t)g->leased + g_held(g);
            all[n].gid = (uint32_t)gid;
            n++;
        }
    }
    qsort(all, n, sizeof(Busy), busy_cmp);
    size_t take = limit < 0 ? 0 : (n < (size_t)limit ? n : (size_t)limit);
    PyObject *out = PyList_New((Py_ssize_t)take);
    for (size_t i = 0; out != NULL && i < take; i++) {
        Group *g = &ix->g[all[i].gid];
        uint32_t held = g_held(g);
        uint32_t back = held && blocked(ix, g, now) ? held : 0;
        PyObject *row = Py_BuildValue("(OIII)", g->name, g->leased, held, back);
        if (row == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, row);
    }
    PyMem_RawFree(all);
    return out;
}

static PyObject *
ix_group_state(Index *ix, PyObject *name)
{
    if (!check_name(name)) {
        return NULL;
    }
    uint32_t gid = find_group(ix, name, NULL);
    if (gid == NIL) {
        Py_RETURN_NONE;
    }
    Group *g = &ix->g[gid];
    return Py_BuildValue("(OIII)", g->name, g->leased, g_held(g),
                         g->back != NULL ? g->back->coming : 0);
}

static PyObject *
ix_group_names(Index *ix, PyObject *unused)
{
    PyObject *out = PyList_New(0);
    for (size_t gid = 0; out != NULL && gid < ix->g_top; gid++) {
        if (ix->g[gid].name != NULL && PyList_Append(out, ix->g[gid].name) < 0) {
            Py_CLEAR(out);
        }
    }
    return out;
}

static PyObject *
ix_sizeof(Index *ix, PyObject *unused)
{
    return PyLong_FromSize_t(Py_TYPE(ix)->tp_basicsize + ix->allocated);
}

/* ---- properties ---------------------------------------------------------------------- */

static PyObject *
get_active(Index *ix, void *c)
{
    return PyBool_FromLong(ix->has_rules || ix->indexed > 0 || ix->nmarks > 0);
}

static PyObject *
get_full(Index *ix, void *c)
{
    return PyBool_FromLong(ix->indexed >= (ix->fair ? WINDOW : MAX_HELD));
}

static PyObject *
get_limit(long long v)
{
    if (v < 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong(v);
}

static PyObject *
get_group_limit(Index *ix, void *c)
{
    return get_limit(ix->group_limit);
}

static PyObject *
get_leased_limit(Index *ix, void *c)
{
    return get_limit(ix->leased_limit);
}

static PyObject *
get_fair(Index *ix, void *c)
{
    return PyBool_FromLong(ix->fair);
}

static PyObject *
get_has_rules(Index *ix, void *c)
{
    return PyBool_FromLong(ix->has_rules);
}

static PyObject *
get_taken(Index *ix, void *c)
{
    return PyLong_FromLongLong(ix->taken);
}

static PyObject *
get_indexed(Index *ix, void *c)
{
    return PyLong_FromLongLong(ix->indexed);
}

static PyObject *
get_rate_refused(Index *ix, void *c)
{
    return PyLong_FromLongLong(ix->rate_refused);
}

static int
set_rate_refused(Index *ix, PyObject *v, void *c)
{
    if (v == NULL) {
        PyErr_SetString(PyExc_TypeError, "rate_refused cannot be deleted");
        return -1;
    }
    long long n = PyLong_AsLongLong(v);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "rate_refused is a count (>= 0)");
        return -1;
    }
    ix->rate_refused = n;
    return 0;
}

static PyObject *
get_returning_count(Index *ix, void *c)
{
    return PyLong_FromSize_t(ix->nmarks);
}

static PyObject *
get_group_count(Index *ix, void *c)
{
    return PyLong_FromSize_t(ix->live);
}

static PyObject *
get_named_groups(Index *ix, void *c)
{
    size_t none = find_group(ix, Py_None, NULL) != NIL;
    return PyLong_FromSize_t(ix->live - none);
}

static PyObject *
get_buckets_kept(Index *ix, void *c)
{
    return PyLong_FromSize_t(ix->nbk);
}

static PyObject *
get_allocated(Index *ix, void *c)
{
    return PyLong_FromSize_t(ix->allocated);
}

static PyGetSetDef ix_getset[] = {
    {"active", (getter)get_active, NULL,
     "dequeue must ask the index: a rule is set, or it holds something", NULL},
    {"full", (getter)get_full, NULL, "the index holds all it may: dequeue reads no further",
     NULL},
    {"group_limit", (getter)get_group_limit, NULL, "the queue's group_limit, or None", NULL},
    {"leased_limit", (getter)get_leased_limit, NULL, "the queue's leased_limit, or None", NULL},
    {"fair", (getter)get_fair, NULL, "the queue's fair", NULL},
    {"has_rules", (getter)get_has_rules, NULL, "some delivery rule is set", NULL},
    {"taken", (getter)get_taken, NULL, "slots taken: live leases and ends not yet durable",
     NULL},
    {"indexed", (getter)get_indexed, NULL, "keys held, in all groups", NULL},
    {"rate_refused", (getter)get_rate_refused, (setter)set_rate_refused,
     "dequeues (or held items) a rate limit refused a delivery, since start", NULL},
    {"returning_count", (getter)get_returning_count, NULL,
     "items back from an expired lease that the cursor has not reached", NULL},
    {"group_count", (getter)get_group_count, NULL,
     "groups the index remembers (a lease, a held item or one on its way back)", NULL},
    {"named_groups", (getter)get_named_groups, NULL, "group_count less the items of no group",
     NULL},
    {"buckets_kept", (getter)get_buckets_kept, NULL,
     "groups whose rate-limit bucket is not known to be full", NULL},
    {"allocated", (getter)get_allocated, NULL, "bytes held from the allocator", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef ix_methods[] = {
    {"reset", (PyCFunction)ix_reset, METH_NOARGS,
     "Forget every slot and held item (the queue reloads: nothing is leased)."},
    {"configure", (PyCFunction)(void (*)(void))ix_configure, METH_FASTCALL,
     "configure(config, now): take the queue's rules (at open, and when they change)."},
    {"took", (PyCFunction)(void (*)(void))ix_took, METH_FASTCALL,
     "took(group, now) -> name: a lease of an item of group began (a slot, a token); the "
     "group's name as the index keeps it, for the lease to share."},
    {"ended", (PyCFunction)(void (*)(void))ix_ended, METH_FASTCALL,
     "ended(leases, now) -> bool: the ends of these (id, lease) pairs are durable; True "
     "when that may let a waiting dequeue take something."},
    {"queue_open", (PyCFunction)ix_queue_open, METH_O,
     "queue_open(now): the queue may hand out one more item now."},
    {"at_leased_limit", (PyCFunction)ix_at_leased_limit, METH_NOARGS,
     "The queue is at its leased_limit."},
    {"admits", (PyCFunction)(void (*)(void))ix_admits, METH_FASTCALL,
     "admits(group, now): an entry of group the view yields may be handed out now."},
    {"hold", (PyCFunction)(void (*)(void))ix_hold, METH_FASTCALL,
     "hold(group, key, now): the cursor passes key, an entry not handed out now."},
    {"hold_run", (PyCFunction)(void (*)(void))ix_hold_run, METH_FASTCALL,
     "hold_run(keys, groups, i, end, now) -> int: hold keys[i:end] up to the first that "
     "may be handed out now (its position), end, or the index full."},
    {"returning", (PyCFunction)ix_returning, METH_O,
     "returning(keys): items were written back after their lease ran out (key -> group)."},
    {"rebuilt_returning", (PyCFunction)(void (*)(void))ix_rebuilt_returning, METH_FASTCALL,
     "rebuilt_returning(keys, now): the items on their way back are exactly these."},
    {"is_returning", (PyCFunction)ix_is_returning, METH_O,
     "is_returning(key): key is an item back from an expired lease, not reached yet."},
    {"arrive", (PyCFunction)(void (*)(void))ix_arrive, METH_FASTCALL,
     "arrive(key, now): the view yielded key, an item back from a lease: hold it first."},
    {"passed", (PyCFunction)(void (*)(void))ix_passed, METH_FASTCALL,
     "passed(after, now) -> bool: marks at or below after that did not come are dropped; "
     "True if a group may hand out a held item now."},
    {"tick", (PyCFunction)ix_tick, METH_O, "tick(now): groups whose token came may deliver."},
    {"next_held", (PyCFunction)ix_next_held, METH_O,
     "next_held(now) -> (key, group) | None: take the next held item that may go now; "
     "call done_with(group, now) once it is handed out or set apart."},
    {"done_with", (PyCFunction)(void (*)(void))ix_done_with, METH_FASTCALL,
     "done_with(group, now): the group's head was handed out: offer its next, or drop it."},
    {"has_eligible", (PyCFunction)ix_has_eligible, METH_O,
     "has_eligible(now): some held item may be handed out now."},
    {"next_timer", (PyCFunction)ix_next_timer, METH_NOARGS,
     "When a group stopped by its rate limit next gets a token, or None."},
    {"queue_token_at", (PyCFunction)ix_queue_token_at, METH_O,
     "queue_token_at(now): when the queue's bucket next holds a token, if none now."},
    {"holds", (PyCFunction)(void (*)(void))ix_holds, METH_FASTCALL,
     "holds(key, group): the group holds key."},
    {"remove", (PyCFunction)(void (*)(void))ix_remove, METH_FASTCALL,
     "remove(pairs, now) -> rows: stop holding these (key, group) pairs; (key, group, "
     "where) of each that was held, for put_back."},
    {"put_back", (PyCFunction)(void (*)(void))ix_put_back, METH_FASTCALL,
     "put_back(rows, now): hold again what remove returned (its write was refused); a "
     "group it emptied takes its place on the fair ring again."},
    {"held_after", (PyCFunction)(void (*)(void))ix_held_after, METH_FASTCALL,
     "held_after(after, limit) -> [(key, group)]: the first limit held items above after, "
     "in key order."},
    {"oldest_key", (PyCFunction)ix_oldest_key, METH_NOARGS, "The smallest key held, or None."},
    {"held_back", (PyCFunction)ix_held_back, METH_O,
     "held_back(now): held items whose group may not hand them out now."},
    {"busiest", (PyCFunction)(void (*)(void))ix_busiest, METH_FASTCALL,
     "busiest(limit, now) -> [(group, leased, waiting, held)]: the groups with the most "
     "leased and held items."},
    {"group_state", (PyCFunction)ix_group_state, METH_O,
     "group_state(group) -> (name, leased, held, coming) | None."},
    {"group_names", (PyCFunction)ix_group_names, METH_NOARGS,
     "The names of the groups the index remembers."},
    {"__sizeof__", (PyCFunction)ix_sizeof, METH_NOARGS, "The object and what it holds."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject IndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dq.storage._delivery.DeliveryIndex",
    .tp_doc = PyDoc_STR("DeliveryIndex()\n--\n\n"
                        "One queue's slots, held items and eligible groups "
                        "(docs/delivery.md)."),
    .tp_basicsize = sizeof(Index),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = ix_new,
    .tp_dealloc = (destructor)ix_dealloc,
    .tp_methods = ix_methods,
    .tp_getset = ix_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dq.storage._delivery",
    .m_doc = "The delivery index as a compact compiled structure (storage/_delivery.c).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__delivery(void)
{
    if (PyType_Ready(&IndexType) < 0) {
        return NULL;
    }
    struct {
        PyObject **p;
        const char *s;
    } names[] = {
        {&str_group, "group"},         {&str_group_limit, "group_limit"},
        {&str_leased_limit, "leased_limit"}, {&str_fair, "fair"},
        {&str_rate_limit, "rate_limit"}, {&str_per_second, "per_second"},
        {&str_burst, "burst"},         {&str_per_group, "per_group"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].p == NULL && (*names[i].p = PyUnicode_InternFromString(names[i].s)) == NULL) {
            return NULL;
        }
    }
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) {
        return NULL;
    }
    Py_INCREF(&IndexType);
    if (PyModule_AddObject(mod, "DeliveryIndex", (PyObject *)&IndexType) < 0 ||
        PyModule_AddIntConstant(mod, "MAX_HELD", MAX_HELD) < 0 ||
        PyModule_AddIntConstant(mod, "WINDOW", WINDOW) < 0 ||
        PyModule_AddIntConstant(mod, "READ_BUDGET", READ_BUDGET) < 0 ||
        PyModule_AddIntConstant(mod, "KEY", KEY) < 0 ||
        PyModule_AddIntConstant(mod, "HELD", WHERE_HELD) < 0 ||
        PyModule_AddIntConstant(mod, "FRONT", WHERE_FRONT) < 0 ||
        PyModule_AddIntConstant(mod, "RETURNING", WHERE_RETURNING) < 0) {
        Py_DECREF(&IndexType);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
