/*
 * storage/_memseg.c -- the in-memory segment, dq.storage.memseg.MemSegment, as one compact
 * structure of fixed-size records instead of Python objects.
 *
 * Why: every item a queue holds in its current log lives here until the log is frozen, and
 * as Python objects (a sorted list of key bytes, a dict of key -> (stats, value) tuples) an
 * entry cost ~200 bytes beyond its value; rotation by memory (memseg_bytes) then froze logs
 * four times sooner than their size asked for. Here an entry costs a 20-byte slot in a
 * sorted leaf, a 28-byte payload record and its value's own bytes in an arena.
 *
 * Layout (all memory from PyMem_Raw*, so tracemalloc and bench/memory.py see all of it):
 *   - leaves: an array of Leaf, each a sorted run of up to LEAF_MAX slots (key + payload
 *     index), with its first key, count and tombstone count kept in the array itself so a
 *     search or a count touches one contiguous array before it touches one leaf;
 *   - payloads: the stats and where the value lies, in insertion order, in chunks of
 *     PAY_CHUNK records (a slot refers to its payload by index: tombstones have none);
 *   - the value arena: values copied end to end into chunks, each an eighth of the values
 *     held so far (ARENA_MIN to ARENA_MAX bytes), so the unfilled end of the current one is
 *     at most an eighth of the values or 256 KiB; a value of ARENA_OWN bytes or more gets a
 *     chunk of its own; a chunk that is left for the next one is shrunk to what it holds.
 *   - groups: a pending entry's group is a 32-bit number beside its payload, in chunks of
 *     PAY_CHUNK made only where some entry is grouped (0: no group, n: name n - 1), and
 *     each name is held once, in a table of the segment's names (an array of str and an
 *     open-addressing hash of their numbers): 4 bytes an entry where a dict of key bytes
 *     to str took ~100.
 * Nothing is ever removed (a log only grows; a cancelled entry is a tombstone key), so
 * payload indexes, arena offsets and name numbers never move, and a name, once some
 * entry uses it, is used until the segment goes.
 *
 * Invariants kept:
 *   - keys are exactly 16 bytes and kept in byte order (memcmp order, which is key order
 *     and Python's bytes order); no key is held twice (a replayed record is ignored);
 *   - leaves[i].first is the first key of leaf i; every key of leaf i is < leaves[i+1].first;
 *     only an empty segment has an empty leaf;
 *   - `allocated` is exactly the bytes held from the allocator; `bytes` is the engine's
 *     estimate that drives rotation: ENTRY_MEMORY per entry plus each value's length;
 *   - every method runs with the GIL held and never releases it, and calls no Python code
 *     while the structure is half changed: the GIL is this structure's lock. Iterators
 *     survive insertions between their steps (they seek again past the last key they gave).
 * Hostile input (keys of another length, stats of another length, values that are not
 * bytes-like, counts out of range) raises TypeError/ValueError/OverflowError and changes
 * nothing; a batch is checked whole before any of it is added.
 *
 * The design is in docs/architecture.md ("Compiled parts").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <limits.h>
#include <stdint.h>
#include <string.h>

#define KEY_SIZE 16
#define STATS_SIZE 16
#define TOMBSTONE 3u
#define LEAF_MIN 4          /* slots of a segment's first leaf; doubled up to LEAF_MAX */
#define LEAF_MAX 256        /* slots per leaf (5 KiB) */
#define PAY_FIRST 4         /* payloads of the first chunk; doubled up to PAY_CHUNK */
#define PAY_CHUNK 256       /* payloads per chunk (7 KiB) */
#define ARENA_MIN 256u      /* the smallest value chunk; each next one an eighth of all */
#define ARENA_MAX (256u * 1024u)
#define ARENA_OWN (64u * 1024u)
#define NONE32 0xFFFFFFFFu
#define NAMES_FIRST 8       /* slots of the first name hash (a power of two) */
#define NO_CHUNK SIZE_MAX

/* What bytes estimates per entry beyond its value: a slot (20 bytes) in leaves filled to
 * 70 % on average when keys come in random order (100 % in key order) is 29, a payload
 * 28, and the leaf and chunk tables and the unfilled ends of the last leaf and chunks a
 * few more. tests/storage/test_memseg_compiled.py checks it against `allocated`. */
#define ENTRY_MEMORY 64

typedef struct __attribute__((packed)) {
    uint8_t key[KEY_SIZE];
    uint32_t pay; /* payload index, NONE32 for a tombstone */
} Slot;

typedef struct __attribute__((packed)) {
    uint8_t stats[STATS_SIZE];
    uint32_t chunk; /* arena chunk, NONE32 for an empty value */
    uint32_t off;
    uint32_t len;
} Payload;

_Static_assert(sizeof(Slot) == 20, "a slot is 20 bytes");
_Static_assert(sizeof(Payload) == 28, "a payload is 28 bytes");

typedef struct {
    uint8_t first[KEY_SIZE];
    Slot *slots;
    uint16_t n, cap, tombs;
} Leaf;

typedef struct {
    uint8_t *p;
    uint32_t cap, used;
} Chunk;

typedef struct {
    PyObject_HEAD
    long long segment_no;
    PyObject *replaced_by;
    long long pending_count;   /* pending entries held */
    long long tombstone_count; /* tombstones held plus those only counted */
    long long kept_tombs;      /* tombstones held */
    long long bytes;
    unsigned long long version; /* bumped by every insertion */
    Leaf *leaves;
    size_t nleaves, leaves_cap;
    Payload **pay;
    size_t npaychunks, paychunks_cap;
    uint32_t npay, pay0_cap;
    Chunk *arena;
    size_t narena, arena_cap, cur;
    size_t arena_bytes; /* value bytes held */
    size_t allocated;
    /* groups: gnum[c][i] is the group of payload c * PAY_CHUNK + i (0: none); a chunk
     * pointer is NULL while no payload of its chunk is grouped */
    uint32_t **gnum;
    size_t ngnum, gnum_cap;
    long long grouped;  /* pending entries with a group */
    PyObject **names;   /* the group names, each an exact str held once */
    size_t nnames, names_cap;
    uint32_t *nhash;    /* open addressing: name number + 1, 0 empty; half full at most */
    size_t nhash_cap;   /* a power of two, or 0 */
    /* next_after(after) is asked the same question several times per dequeued item */
    unsigned long long seen;
    Py_ssize_t after_len; /* -1: nothing remembered */
    uint8_t after[KEY_SIZE];
    PyObject *head;
} MemSeg;

static PyTypeObject MemSegType;
static PyTypeObject EntriesType;
static PyTypeObject KeysType;
static PyTypeObject IterType;

/* ---- memory, counted ---------------------------------------------------------------- */

static void *
seg_alloc(MemSeg *m, size_t n)
{
    void *p = PyMem_RawMalloc(n);
    if (p == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    m->allocated += n;
    return p;
}

static void *
seg_realloc(MemSeg *m, void *p, size_t old, size_t n)
{
    void *q = PyMem_RawRealloc(p, n);
    if (q == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    m->allocated = m->allocated - old + n;
    return q;
}

/* Make room for one more element in an array of `cap` elements of `size` bytes. */
static int
grow_table(MemSeg *m, void **table, size_t *cap, size_t used, size_t size, size_t first)
{
    if (used < *cap) {
        return 0;
    }
    size_t ncap = *cap ? *cap * 2 : first;
    if (ncap > PY_SSIZE_T_MAX / size) {
        PyErr_NoMemory();
        return -1;
    }
    void *q = seg_realloc(m, *table, *cap * size, ncap * size);
    if (q == NULL) {
        return -1;
    }
    *table = q;
    *cap = ncap;
    return 0;
}

/* The number of positional arguments is within [lo, hi] (TypeError otherwise). */
static int
check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t lo, Py_ssize_t hi)
{
    if (nargs < lo || nargs > hi) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd to %zd arguments (%zd given)", name, lo,
                     hi, nargs);
        return 0;
    }
    return 1;
}

/* ---- keys --------------------------------------------------------------------------- */

/* Sign of (16-byte key k) - (q, qlen bytes), in bytes order. */
static inline int
qcmp(const uint8_t *k, const uint8_t *q, Py_ssize_t qlen)
{
    size_t n = qlen < KEY_SIZE ? (size_t)qlen : KEY_SIZE;
    int c = n ? memcmp(k, q, n) : 0;
    if (c != 0) {
        return c;
    }
    return qlen < KEY_SIZE ? 1 : (qlen > KEY_SIZE ? -1 : 0);
}

/* A bytes-like object's bytes, borrowed: *release is set when `view` must be released. */
static int
get_bytes(PyObject *obj, Py_buffer *view, const uint8_t **p, Py_ssize_t *len, int *release)
{
    *release = 0;
    if (PyBytes_Check(obj)) {
        *p = (const uint8_t *)PyBytes_AS_STRING(obj);
        *len = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    *release = 1;
    *p = (const uint8_t *)view->buf;
    *len = view->len;
    return 0;
}

/* The leaf that holds or would hold q: the last whose first key <= q, else the first. */
static size_t
leaf_for(const MemSeg *m, const uint8_t *q, Py_ssize_t qlen)
{
    size_t lo = 0, hi = m->nleaves;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (qcmp(m->leaves[mid].first, q, qlen) > 0) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo ? lo - 1 : 0;
}

/* In a leaf: the first slot whose key is > q (right) or >= q (!right). */
static uint32_t
slot_bound(const Leaf *l, const uint8_t *q, Py_ssize_t qlen, int right)
{
    uint32_t lo = 0, hi = l->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        int c = qcmp(l->slots[mid].key, q, qlen);
        if (c > 0 || (!right && c == 0)) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo;
}

/* Where the first key > q (right) or >= q (!right) is, or would be inserted. */
static void
seek(const MemSeg *m, const uint8_t *q, Py_ssize_t qlen, int right, size_t *li, uint32_t *si)
{
    if (m->nleaves == 0) {
        *li = 0;
        *si = 0;
        return;
    }
    *li = leaf_for(m, q, qlen);
    *si = slot_bound(&m->leaves[*li], q, qlen, right);
}

/* The slot holding key q, or NULL. */
static const Slot *
find(const MemSeg *m, const uint8_t *q, Py_ssize_t qlen)
{
    if (qlen != KEY_SIZE || m->nleaves == 0) {
        return NULL;
    }
    size_t li;
    uint32_t si;
    seek(m, q, qlen, 0, &li, &si);
    const Leaf *l = &m->leaves[li];
    if (si < l->n && memcmp(l->slots[si].key, q, KEY_SIZE) == 0) {
        return &l->slots[si];
    }
    return NULL;
}

/* The first slot at or after (li, si), moving on to the next leaves, or NULL. */
static const Slot *
slot_at(const MemSeg *m, size_t *li, uint32_t *si)
{
    while (*li < m->nleaves && *si >= m->leaves[*li].n) {
        (*li)++;
        *si = 0;
    }
    return *li < m->nleaves ? &m->leaves[*li].slots[*si] : NULL;
}

/* ---- insertion ---------------------------------------------------------------------- */

static int
new_leaf(MemSeg *m, size_t at, uint16_t cap)
{
    if (grow_table(m, (void **)&m->leaves, &m->leaves_cap, m->nleaves, sizeof(Leaf), 4) < 0) {
        return -1;
    }
    Slot *slots = seg_alloc(m, (size_t)cap * sizeof(Slot));
    if (slots == NULL) {
        return -1;
    }
    memmove(&m->leaves[at + 1], &m->leaves[at], (m->nleaves - at) * sizeof(Leaf));
    Leaf *l = &m->leaves[at];
    memset(l->first, 0, KEY_SIZE);
    l->slots = slots;
    l->n = 0;
    l->cap = cap;
    l->tombs = 0;
    m->nleaves++;
    return 0;
}

/* Find where `key` goes. 1: it is there already; 0: (li, si) is its place. */
static int
locate(const MemSeg *m, const uint8_t *key, size_t *li, uint32_t *si)
{
    if (m->nleaves == 0) {
        *li = 0;
        *si = 0;
        return 0;
    }
    const Leaf *last = &m->leaves[m->nleaves - 1];
    if (last->n == 0 || memcmp(last->slots[last->n - 1].key, key, KEY_SIZE) < 0) {
        *li = m->nleaves - 1; /* after every key: the common case of keys in order */
        *si = last->n;
        return 0;
    }
    seek(m, key, KEY_SIZE, 0, li, si);
    const Leaf *l = &m->leaves[*li];
    return *si < l->n && memcmp(l->slots[*si].key, key, KEY_SIZE) == 0;
}

/* Make room for one slot at (li, si), growing or splitting the leaf; (li, si) may move. */
static int
make_room(MemSeg *m, size_t *li, uint32_t *si)
{
    if (m->nleaves == 0) {
        return new_leaf(m, 0, LEAF_MIN);
    }
    Leaf *l = &m->leaves[*li];
    if (l->n < l->cap) {
        return 0;
    }
    if (l->cap < LEAF_MAX) {
        uint16_t ncap = l->cap * 2 > LEAF_MAX ? LEAF_MAX : (uint16_t)(l->cap * 2);
        Slot *s = seg_realloc(m, l->slots, (size_t)l->cap * sizeof(Slot),
                              (size_t)ncap * sizeof(Slot));
        if (s == NULL) {
            return -1;
        }
        l->slots = s;
        l->cap = ncap;
        return 0;
    }
    if (*li == m->nleaves - 1 && *si == l->n) {
        /* appending past the last key: start a new leaf, leave this one full */
        if (new_leaf(m, *li + 1, LEAF_MAX) < 0) {
            return -1;
        }
        (*li)++;
        *si = 0;
        return 0;
    }
    if (new_leaf(m, *li + 1, LEAF_MAX) < 0) {
        return -1;
    }
    Leaf *left = &m->leaves[*li], *right = &m->leaves[*li + 1];
    uint16_t half = left->n / 2;
    right->n = (uint16_t)(left->n - half);
    memcpy(right->slots, &left->slots[half], (size_t)right->n * sizeof(Slot));
    memcpy(right->first, right->slots[0].key, KEY_SIZE);
    left->n = half;
    uint16_t moved = 0;
    for (uint16_t i = 0; i < right->n; i++) {
        moved += (right->slots[i].key[KEY_SIZE - 1] & 3u) == TOMBSTONE;
    }
    right->tombs = moved;
    left->tombs = (uint16_t)(left->tombs - moved);
    if (*si > half) {
        (*li)++;
        *si -= half;
    }
    return 0;
}

static void
put_slot(MemSeg *m, size_t li, uint32_t si, const uint8_t *key, uint32_t pay)
{
    Leaf *l = &m->leaves[li];
    memmove(&l->slots[si + 1], &l->slots[si], (size_t)(l->n - si) * sizeof(Slot));
    memcpy(l->slots[si].key, key, KEY_SIZE);
    l->slots[si].pay = pay;
    l->n++;
    if (si == 0) {
        memcpy(l->first, key, KEY_SIZE);
    }
    if ((key[KEY_SIZE - 1] & 3u) == TOMBSTONE) {
        l->tombs++;
    }
    m->version++;
}

/* Copy a value into the arena. */
static int
arena_put(MemSeg *m, const uint8_t *v, size_t len, uint32_t *chunk, uint32_t *off)
{
    if (len == 0) {
        *chunk = NONE32;
        *off = 0;
        return 0;
    }
    if (m->cur != NO_CHUNK && m->arena[m->cur].cap - m->arena[m->cur].used >= len) {
        Chunk *c = &m->arena[m->cur];
        memcpy(c->p + c->used, v, len);
        *chunk = (uint32_t)m->cur;
        *off = c->used;
        c->used += (uint32_t)len;
        m->arena_bytes += len;
        return 0;
    }
    if (m->narena >= NONE32 - 1) {
        PyErr_SetString(PyExc_OverflowError, "the in-memory segment holds too many values");
        return -1;
    }
    if (grow_table(m, (void **)&m->arena, &m->arena_cap, m->narena, sizeof(Chunk), 4) < 0) {
        return -1;
    }
    uint32_t cap;
    if (len >= ARENA_OWN) {
        cap = (uint32_t)len;
    } else {
        size_t want = m->arena_bytes / 8;
        cap = want < ARENA_MIN ? ARENA_MIN : want > ARENA_MAX ? ARENA_MAX : (uint32_t)want;
        if (cap < len) {
            cap = (uint32_t)len; /* < ARENA_OWN <= ARENA_MAX */
        }
    }
    uint8_t *p = seg_alloc(m, cap);
    if (p == NULL) {
        return -1;
    }
    if (len < ARENA_OWN) {
        if (m->cur != NO_CHUNK) {
            /* left for good: give back what it will never hold */
            Chunk *old = &m->arena[m->cur];
            if (old->used < old->cap) {
                uint8_t *q = PyMem_RawRealloc(old->p, old->used);
                if (q != NULL) {
                    m->allocated -= old->cap - old->used;
                    old->p = q;
                    old->cap = old->used;
                }
            }
        }
        m->cur = m->narena;
    }
    Chunk *c = &m->arena[m->narena];
    c->p = p;
    c->cap = cap;
    c->used = (uint32_t)len;
    memcpy(p, v, len);
    *chunk = (uint32_t)m->narena;
    *off = 0;
    m->narena++;
    m->arena_bytes += len;
    return 0;
}

/* Append a payload (stats, value); its index in *out. */
static int
store_payload(MemSeg *m, const uint8_t *stats, const uint8_t *v, size_t len, uint32_t *out)
{
    if (m->npay >= NONE32 - 1) {
        PyErr_SetString(PyExc_OverflowError, "the in-memory segment holds too many entries");
        return -1;
    }
    uint32_t idx = m->npay;
    size_t ci = idx / PAY_CHUNK, pos = idx % PAY_CHUNK;
    if (ci == 0 && pos == m->pay0_cap) {
        if (m->npaychunks == 0) {
            if (grow_table(m, (void **)&m->pay, &m->paychunks_cap, 0, sizeof(Payload *), 4) < 0) {
                return -1;
            }
            m->pay[0] = NULL;
            m->npaychunks = 1;
        }
        uint32_t ncap = m->pay0_cap ? m->pay0_cap * 2 : PAY_FIRST;
        if (ncap > PAY_CHUNK) {
            ncap = PAY_CHUNK;
        }
        Payload *q = seg_realloc(m, m->pay[0], (size_t)m->pay0_cap * sizeof(Payload),
                                 (size_t)ncap * sizeof(Payload));
        if (q == NULL) {
            return -1;
        }
        m->pay[0] = q;
        m->pay0_cap = ncap;
    } else if (ci > 0 && pos == 0) {
        if (grow_table(m, (void **)&m->pay, &m->paychunks_cap, m->npaychunks, sizeof(Payload *),
                       4) < 0) {
            return -1;
        }
        Payload *q = seg_alloc(m, (size_t)PAY_CHUNK * sizeof(Payload));
        if (q == NULL) {
            return -1;
        }
        m->pay[m->npaychunks++] = q;
    }
    uint32_t chunk, off;
    if (arena_put(m, v, len, &chunk, &off) < 0) {
        return -1;
    }
    Payload *p = &m->pay[ci][pos];
    memcpy(p->stats, stats, STATS_SIZE);
    p->chunk = chunk;
    p->off = off;
    p->len = (uint32_t)len;
    m->npay++;
    *out = idx;
    return 0;
}

/* Add one entry whose key, stats and value were checked. 1 added, 0 already there, -1. */
static int
insert(MemSeg *m, const uint8_t *key, const uint8_t *stats, const uint8_t *v, size_t len)
{
    size_t li;
    uint32_t si;
    if (locate(m, key, &li, &si)) {
        return 0; /* replaying the same record twice is harmless */
    }
    if (make_room(m, &li, &si) < 0) {
        return -1;
    }
    uint32_t pay = NONE32;
    if ((key[KEY_SIZE - 1] & 3u) != TOMBSTONE && store_payload(m, stats, v, len, &pay) < 0) {
        return -1;
    }
    put_slot(m, li, si, key, pay);
    return 1;
}

/* ---- groups ------------------------------------------------------------------------- */

/* Look for the name equal to `name` (an exact str, hash h): its number, or -1 with *at
 * the empty hash slot where it would go. Exact strs hash and compare without running
 * Python code. */
static Py_ssize_t
name_find(const MemSeg *m, PyObject *name, Py_hash_t h, size_t *at)
{
    size_t mask = m->nhash_cap - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        uint32_t n = m->nhash[i];
        if (n == 0) {
            *at = i;
            return -1;
        }
        PyObject *o = m->names[n - 1];
        if (o == name || (PyObject_Hash(o) == h && PyUnicode_Compare(o, name) == 0)) {
            *at = i;
            return (Py_ssize_t)(n - 1);
        }
    }
}

/* Double the name hash (kept at most half full). */
static int
name_hash_grow(MemSeg *m)
{
    size_t ncap = m->nhash_cap ? m->nhash_cap * 2 : NAMES_FIRST;
    if (ncap > PY_SSIZE_T_MAX / sizeof(uint32_t)) {
        PyErr_NoMemory();
        return -1;
    }
    uint32_t *t = PyMem_RawCalloc(ncap, sizeof(uint32_t));
    if (t == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    size_t mask = ncap - 1;
    for (size_t n = 0; n < m->nnames; n++) {
        size_t i = (size_t)PyObject_Hash(m->names[n]) & mask;
        while (t[i]) {
            i = (i + 1) & mask;
        }
        t[i] = (uint32_t)(n + 1);
    }
    PyMem_RawFree(m->nhash);
    m->allocated = m->allocated - m->nhash_cap * sizeof(uint32_t) + ncap * sizeof(uint32_t);
    m->nhash = t;
    m->nhash_cap = ncap;
    return 0;
}

/* The number of `group`'s name (a str), added to the names if it is new. */
static int
name_number(MemSeg *m, PyObject *group, uint32_t *out)
{
    PyObject *name;
    if (PyUnicode_CheckExact(group)) {
        name = group;
        Py_INCREF(name);
    } else if ((name = PyUnicode_FromObject(group)) == NULL) { /* a subclass: its text */
        return -1;
    }
    Py_hash_t h = PyObject_Hash(name);
    if (h == -1) {
        Py_DECREF(name);
        return -1;
    }
    size_t at = 0;
    Py_ssize_t found = m->nhash_cap ? name_find(m, name, h, &at) : -1;
    if (found >= 0) {
        Py_DECREF(name);
        *out = (uint32_t)found;
        return 0;
    }
    if (m->nnames >= NONE32 - 1) {
        Py_DECREF(name);
        PyErr_SetString(PyExc_OverflowError, "the in-memory segment holds too many groups");
        return -1;
    }
    if (grow_table(m, (void **)&m->names, &m->names_cap, m->nnames, sizeof(PyObject *), 4) < 0) {
        Py_DECREF(name);
        return -1;
    }
    if ((m->nnames + 1) * 2 > m->nhash_cap) {
        if (name_hash_grow(m) < 0) {
            Py_DECREF(name);
            return -1;
        }
        name_find(m, name, h, &at);
    }
    m->names[m->nnames] = name; /* the reference taken above */
    m->nhash[at] = (uint32_t)(m->nnames + 1);
    *out = (uint32_t)m->nnames++;
    return 0;
}

/* The group numbers of payload chunk ci, made (all 0) if none of its payloads had one. */
static uint32_t *
gnum_chunk(MemSeg *m, size_t ci)
{
    if (ci >= m->gnum_cap) {
        size_t ncap = m->gnum_cap ? m->gnum_cap : 4;
        while (ncap <= ci) {
            ncap *= 2;
        }
        uint32_t **q = seg_realloc(m, m->gnum, m->gnum_cap * sizeof(uint32_t *),
                                   ncap * sizeof(uint32_t *));
        if (q == NULL) {
            return NULL;
        }
        memset(q + m->gnum_cap, 0, (ncap - m->gnum_cap) * sizeof(uint32_t *));
        m->gnum = q;
        m->gnum_cap = ncap;
    }
    if (m->gnum[ci] == NULL) {
        uint32_t *c = PyMem_RawCalloc(PAY_CHUNK, sizeof(uint32_t));
        if (c == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        m->allocated += PAY_CHUNK * sizeof(uint32_t);
        m->gnum[ci] = c;
    }
    return m->gnum[ci];
}

/* Give payload `pay` (just stored, ungrouped) the group `group` (a str). */
static int
set_group(MemSeg *m, uint32_t pay, PyObject *group)
{
    uint32_t *c = gnum_chunk(m, pay / PAY_CHUNK);
    uint32_t n;
    if (c == NULL || name_number(m, group, &n) < 0) {
        return -1;
    }
    c[pay % PAY_CHUNK] = n + 1;
    m->grouped++;
    return 0;
}

/* The group of a slot's entry (borrowed), or NULL: none, a tombstone, or no slot. */
static PyObject *
group_at(const MemSeg *m, const Slot *s)
{
    if (s == NULL || s->pay == NONE32 || s->pay / PAY_CHUNK >= m->gnum_cap) {
        return NULL;
    }
    const uint32_t *c = m->gnum[s->pay / PAY_CHUNK];
    uint32_t n = c != NULL ? c[s->pay % PAY_CHUNK] : 0;
    return n ? m->names[n - 1] : NULL;
}

/* ---- Python values ------------------------------------------------------------------ */

static PyObject *
key_bytes(const Slot *s)
{
    return PyBytes_FromStringAndSize((const char *)s->key, KEY_SIZE);
}

/* (stats, value) of a slot, or None for a tombstone. */
static PyObject *
entry_of(const MemSeg *m, const Slot *s)
{
    if (s->pay == NONE32) {
        Py_RETURN_NONE;
    }
    const Payload *p = &m->pay[s->pay / PAY_CHUNK][s->pay % PAY_CHUNK];
    PyObject *stats = PyBytes_FromStringAndSize((const char *)p->stats, STATS_SIZE);
    if (stats == NULL) {
        return NULL;
    }
    PyObject *value;
    if (p->chunk == NONE32) {
        value = PyBytes_FromStringAndSize(NULL, 0);
    } else {
        value = PyBytes_FromStringAndSize((const char *)m->arena[p->chunk].p + p->off,
                                          (Py_ssize_t)p->len);
    }
    if (value == NULL) {
        Py_DECREF(stats);
        return NULL;
    }
    PyObject *t = PyTuple_New(2);
    if (t == NULL) {
        Py_DECREF(stats);
        Py_DECREF(value);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, stats);
    PyTuple_SET_ITEM(t, 1, value);
    return t;
}

/* The slot of a key given from Python, or NULL (anything not 16 bytes-like is absent). */
static const Slot *
find_obj(const MemSeg *m, PyObject *key)
{
    Py_buffer view;
    const uint8_t *p;
    Py_ssize_t len;
    int release;
    if (get_bytes(key, &view, &p, &len, &release) < 0) {
        PyErr_Clear();
        return NULL;
    }
    const Slot *s = find(m, p, len);
    if (release) {
        PyBuffer_Release(&view);
    }
    return s;
}

static int
check_key(Py_ssize_t len)
{
    if (len != KEY_SIZE) {
        PyErr_Format(PyExc_ValueError, "an entry key is %d bytes, not %zd", KEY_SIZE, len);
        return -1;
    }
    return 0;
}

static int
check_stats(Py_ssize_t len)
{
    if (len != STATS_SIZE) {
        PyErr_Format(PyExc_ValueError, "entry stats are %d bytes, not %zd", STATS_SIZE, len);
        return -1;
    }
    return 0;
}

static int
check_value(Py_ssize_t len)
{
    if ((size_t)len >= NONE32) {
        PyErr_SetString(PyExc_OverflowError, "a value must be shorter than 4 GiB");
        return -1;
    }
    return 0;
}

static int
count_bytes(MemSeg *m, size_t added, size_t value_bytes)
{
    long long add;
    if (__builtin_mul_overflow((long long)added, (long long)ENTRY_MEMORY, &add) ||
        __builtin_add_overflow(add, (long long)value_bytes, &add) ||
        __builtin_add_overflow(m->bytes, add, &m->bytes)) {
        m->bytes = LLONG_MAX;
    }
    return 0;
}

/* ---- MemSegment --------------------------------------------------------------------- */

static PyObject *
seg_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    MemSeg *m = (MemSeg *)type->tp_alloc(type, 0);
    if (m == NULL) {
        return NULL;
    }
    m->cur = NO_CHUNK;
    m->after_len = -1;
    return (PyObject *)m;
}

static int
seg_init(MemSeg *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"segment_no", NULL};
    long long no;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "L:MemSegment", kwlist, &no)) {
        return -1;
    }
    m->segment_no = no;
    return 0;
}

static int
seg_traverse(MemSeg *m, visitproc visit, void *arg)
{
    Py_VISIT(m->replaced_by);
    Py_VISIT(m->head);
    return 0;
}

static int
seg_clear(MemSeg *m)
{
    Py_CLEAR(m->replaced_by);
    Py_CLEAR(m->head);
    return 0;
}

static void
seg_dealloc(MemSeg *m)
{
    PyObject_GC_UnTrack(m);
    seg_clear(m);
    for (size_t i = 0; i < m->nleaves; i++) {
        PyMem_RawFree(m->leaves[i].slots);
    }
    PyMem_RawFree(m->leaves);
    for (size_t i = 0; i < m->npaychunks; i++) {
        PyMem_RawFree(m->pay[i]);
    }
    PyMem_RawFree(m->pay);
    for (size_t i = 0; i < m->narena; i++) {
        PyMem_RawFree(m->arena[i].p);
    }
    PyMem_RawFree(m->arena);
    for (size_t i = 0; i < m->gnum_cap; i++) {
        PyMem_RawFree(m->gnum[i]);
    }
    PyMem_RawFree(m->gnum);
    for (size_t i = 0; i < m->nnames; i++) {
        Py_DECREF(m->names[i]);
    }
    PyMem_RawFree(m->names);
    PyMem_RawFree(m->nhash);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t
seg_len(MemSeg *m)
{
    return (Py_ssize_t)(m->npay + m->kept_tombs);
}

PyDoc_STRVAR(add_doc,
"add(key, stats, value, group=None)\n--\n\n"
"Add one entry: a pending one (16-byte stats, bytes-like value) or, if the key's type is\n"
"a tombstone, a tombstone (stats, value and group are then ignored), and a pending\n"
"entry's group (a str; group_of). A key already held is ignored: replaying the same record\n"
"twice is harmless.");

static PyObject *
seg_add(MemSeg *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (!check_nargs("add", nargs, 3, 4)) {
        return NULL;
    }
    PyObject *group = nargs == 4 ? args[3] : Py_None;
    if (group != Py_None && !PyUnicode_Check(group)) {
        PyErr_SetString(PyExc_TypeError, "a group must be a str or None");
        return NULL;
    }
    Py_buffer kv, sv, vv;
    const uint8_t *k, *s = NULL, *v = NULL;
    Py_ssize_t klen, slen = 0, vlen = 0;
    int krel, srel = 0, vrel = 0, rc = -1;
    if (get_bytes(args[0], &kv, &k, &klen, &krel) < 0) {
        return NULL;
    }
    if (check_key(klen) < 0) {
        goto done;
    }
    int tomb = (k[KEY_SIZE - 1] & 3u) == TOMBSTONE;
    if (!tomb) {
        if (args[1] == Py_None || args[2] == Py_None) {
            PyErr_SetString(PyExc_TypeError, "a pending entry needs its stats and value");
            goto done;
        }
        if (get_bytes(args[1], &sv, &s, &slen, &srel) < 0 || check_stats(slen) < 0) {
            goto done;
        }
        if (get_bytes(args[2], &vv, &v, &vlen, &vrel) < 0 || check_value(vlen) < 0) {
            goto done;
        }
    }
    rc = insert(m, k, s, v, (size_t)vlen);
    if (rc == 1) {
        if (tomb) {
            m->kept_tombs++;
            m->tombstone_count++;
        } else {
            m->pending_count++;
        }
        count_bytes(m, 1, (size_t)vlen);
        if (!tomb && group != Py_None && set_group(m, m->npay - 1, group) < 0) {
            rc = -1; /* out of memory: the entry is held and counted, its group is not */
        }
    }
done:
    if (krel) {
        PyBuffer_Release(&kv);
    }
    if (srel) {
        PyBuffer_Release(&sv);
    }
    if (vrel) {
        PyBuffer_Release(&vv);
    }
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(add_pending_doc,
"add_pending(entries, stats, groups=None)\n--\n\n"
"add() of a written batch's pending entries, a sequence of (key, value), all with\n"
"`stats` (and `groups`, one str or None per entry, if any is grouped): one call for the\n"
"batch on the path that publishes every write. The batch is checked whole (16-byte\n"
"pending keys, bytes values, as many groups as entries) before any of it is added.");

static PyObject *
seg_add_pending(MemSeg *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (!check_nargs("add_pending", nargs, 2, 3)) {
        return NULL;
    }
    Py_buffer sv;
    const uint8_t *s;
    Py_ssize_t slen;
    int srel;
    if (get_bytes(args[1], &sv, &s, &slen, &srel) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    PyObject *seq = NULL, *gseq = NULL;
    PyObject **groups = NULL;
    if (check_stats(slen) < 0) {
        goto done;
    }
    if (nargs == 3 && args[2] != Py_None) {
        gseq = PySequence_Fast(args[2], "groups must be a sequence of str or None");
        if (gseq == NULL) {
            goto done;
        }
        groups = PySequence_Fast_ITEMS(gseq);
    }
    seq = PySequence_Fast(args[0], "entries must be a sequence of (key, value)");
    if (seq == NULL) {
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (gseq != NULL && PySequence_Fast_GET_SIZE(gseq) != n) {
        PyErr_Format(PyExc_ValueError, "%zd groups for %zd entries", PySequence_Fast_GET_SIZE(gseq),
                     n);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = items[i];
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
            PyErr_Format(PyExc_TypeError, "entry %zd is not a (key, value) tuple", i);
            goto done;
        }
        PyObject *key = PyTuple_GET_ITEM(t, 0), *value = PyTuple_GET_ITEM(t, 1);
        if (!PyBytes_Check(key) || !PyBytes_Check(value)) {
            PyErr_Format(PyExc_TypeError, "entry %zd: key and value must be bytes", i);
            goto done;
        }
        if (check_key(PyBytes_GET_SIZE(key)) < 0 || check_value(PyBytes_GET_SIZE(value)) < 0) {
            goto done;
        }
        if (((uint8_t)PyBytes_AS_STRING(key)[KEY_SIZE - 1] & 3u) == TOMBSTONE) {
            PyErr_Format(PyExc_ValueError, "entry %zd: a tombstone key is not a pending entry", i);
            goto done;
        }
        if (groups != NULL && groups[i] != Py_None && !PyUnicode_Check(groups[i])) {
            PyErr_Format(PyExc_TypeError, "entry %zd: a group must be a str or None", i);
            goto done;
        }
    }
    size_t added = 0, size = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyTuple_GET_ITEM(items[i], 0), *value = PyTuple_GET_ITEM(items[i], 1);
        size_t vlen = (size_t)PyBytes_GET_SIZE(value);
        int rc = insert(m, (const uint8_t *)PyBytes_AS_STRING(key), s,
                        (const uint8_t *)PyBytes_AS_STRING(value), vlen);
        if (rc == 1 && groups != NULL && groups[i] != Py_None &&
            set_group(m, m->npay - 1, groups[i]) < 0) {
            rc = -1;
            added++;
            size += vlen;
        }
        if (rc < 0) {
            /* out of memory part way: what was added is counted, the rest is not there */
            m->pending_count += (long long)added;
            count_bytes(m, added, size);
            goto done;
        }
        added += (size_t)rc;
        size += rc ? vlen : 0;
    }
    m->pending_count += (long long)added;
    count_bytes(m, added, size);
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(seq);
    Py_XDECREF(gseq);
    if (srel) {
        PyBuffer_Release(&sv);
    }
    return result;
}

PyDoc_STRVAR(add_tombstone_behind_doc,
"add_tombstone_behind(key)\n--\n\n"
"Count a tombstone written at run time; do not keep it. Such a tombstone always cancels\n"
"an entry that was delivered, so its key is at or behind the cursor and the forward view\n"
"never needs it; the segment file made from the log carries it. (A log reloaded after a\n"
"restart adds its tombstones with add(), in order: then the view does need them.)");

static int
count_behind(MemSeg *m, long long n)
{
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "a count of tombstones cannot be negative");
        return -1;
    }
    long long t;
    if (__builtin_add_overflow(m->tombstone_count, n, &t)) {
        PyErr_SetString(PyExc_OverflowError, "too many tombstones to count");
        return -1;
    }
    m->tombstone_count = t;
    return 0;
}

static PyObject *
seg_add_tombstone_behind(MemSeg *m, PyObject *key)
{
    if (count_behind(m, 1) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(add_tombstones_behind_doc,
"add_tombstones_behind(n)\n--\n\nadd_tombstone_behind() of n tombstones at once.");

static PyObject *
seg_add_tombstones_behind(MemSeg *m, PyObject *arg)
{
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (count_behind(m, n) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(next_after_doc,
"next_after(after)\n--\n\nThe smallest key held that is greater than `after`, or None.");

static PyObject *
seg_next_after(MemSeg *m, PyObject *after)
{
    Py_buffer view;
    const uint8_t *q;
    Py_ssize_t qlen;
    int release;
    if (get_bytes(after, &view, &q, &qlen, &release) < 0) {
        return NULL;
    }
    if (m->seen == m->version && m->after_len == qlen && m->head != NULL &&
        (qlen == 0 || memcmp(m->after, q, (size_t)qlen) == 0)) {
        if (release) {
            PyBuffer_Release(&view);
        }
        Py_INCREF(m->head);
        return m->head;
    }
    size_t li;
    uint32_t si;
    seek(m, q, qlen, 1, &li, &si);
    const Slot *s = slot_at(m, &li, &si);
    PyObject *head;
    if (s == NULL) {
        head = Py_None;
        Py_INCREF(head);
    } else if ((head = key_bytes(s)) == NULL) {
        if (release) {
            PyBuffer_Release(&view);
        }
        return NULL;
    }
    if (qlen <= KEY_SIZE) {
        if (qlen) {
            memcpy(m->after, q, (size_t)qlen);
        }
        m->after_len = qlen;
        m->seen = m->version;
        Py_INCREF(head);
        Py_XSETREF(m->head, head);
    }
    if (release) {
        PyBuffer_Release(&view);
    }
    return head;
}

PyDoc_STRVAR(net_upto_doc,
"net_upto(key)\n--\n\n"
"Pending entries minus tombstones at or below `key` (for stats). Tombstones counted but\n"
"not kept (add_tombstone_behind) cancel delivered entries, at or behind the queue's\n"
"cursor: they count as below any key at or past the cursor's tombstone, the only keys\n"
"stats asks about.");

static PyObject *
seg_net_upto(MemSeg *m, PyObject *key)
{
    Py_buffer view;
    const uint8_t *q;
    Py_ssize_t qlen;
    int release;
    if (get_bytes(key, &view, &q, &qlen, &release) < 0) {
        return NULL;
    }
    long long all = 0, tombs = 0;
    if (m->nleaves) {
        size_t li;
        uint32_t si;
        seek(m, q, qlen, 1, &li, &si);
        for (size_t i = 0; i < li; i++) {
            all += m->leaves[i].n;
            tombs += m->leaves[i].tombs;
        }
        const Leaf *l = &m->leaves[li];
        all += si;
        for (uint32_t i = 0; i < si; i++) {
            tombs += (l->slots[i].key[KEY_SIZE - 1] & 3u) == TOMBSTONE;
        }
    }
    if (release) {
        PyBuffer_Release(&view);
    }
    long long behind = m->tombstone_count - m->kept_tombs;
    return PyLong_FromLongLong(all - 2 * tombs - behind);
}

static PyObject *
seg_sizeof(MemSeg *m, PyObject *unused)
{
    return PyLong_FromSize_t(Py_TYPE(m)->tp_basicsize + m->allocated);
}

static PyObject *
seg_net_total(MemSeg *m, void *closure)
{
    return PyLong_FromLongLong(m->pending_count - m->tombstone_count);
}

static PyObject *
seg_allocated(MemSeg *m, void *closure)
{
    return PyLong_FromSize_t(m->allocated);
}

PyDoc_STRVAR(group_of_doc,
"group_of(key)\n--\n\n"
"The group of the pending entry `key` (a str), or None: no group, a tombstone, or a key\n"
"not held.");

static PyObject *
seg_group_of(MemSeg *m, PyObject *key)
{
    PyObject *g = group_at(m, find_obj(m, key));
    if (g == NULL) {
        g = Py_None;
    }
    Py_INCREF(g);
    return g;
}

PyDoc_STRVAR(groups_of_doc,
"groups_of(keys)\n--\n\n"
"[group_of(k) for k in keys] for a list of bytes keys (anything else is not held), in one\n"
"call: a key that follows the one before it in the segment is found in a step.");

static PyObject *
seg_groups_of(MemSeg *m, PyObject *keys)
{
    if (!PyList_Check(keys)) {
        PyErr_SetString(PyExc_TypeError, "keys must be a list of bytes");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    size_t li = 0;
    uint32_t si = 0;
    int have = 0; /* (li, si) is the slot of the key before */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i);
        const Slot *s = NULL;
        if (PyBytes_Check(k) && PyBytes_GET_SIZE(k) == KEY_SIZE && m->nleaves) {
            const uint8_t *q = (const uint8_t *)PyBytes_AS_STRING(k);
            if (have) {
                size_t nl = li;
                uint32_t ns = si + 1;
                const Slot *next = slot_at(m, &nl, &ns);
                if (next != NULL && memcmp(next->key, q, KEY_SIZE) == 0) {
                    s = next;
                    li = nl;
                    si = ns;
                }
            }
            if (s == NULL) {
                seek(m, q, KEY_SIZE, 0, &li, &si);
                const Leaf *l = &m->leaves[li];
                if (si < l->n && memcmp(l->slots[si].key, q, KEY_SIZE) == 0) {
                    s = &l->slots[si];
                }
            }
        }
        have = s != NULL;
        PyObject *g = group_at(m, s);
        if (g == NULL) {
            g = Py_None;
        }
        Py_INCREF(g);
        PyList_SET_ITEM(out, i, g);
    }
    return out;
}

static PyObject *
seg_grouped(MemSeg *m, void *closure)
{
    return PyLong_FromLongLong(m->grouped);
}

static PyObject *
seg_group_names(MemSeg *m, void *closure)
{
    PyObject *t = PyTuple_New((Py_ssize_t)m->nnames);
    if (t == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < m->nnames; i++) {
        Py_INCREF(m->names[i]);
        PyTuple_SET_ITEM(t, (Py_ssize_t)i, m->names[i]);
    }
    return t;
}

static PyObject *view_new(PyTypeObject *type, MemSeg *m);

static PyObject *
seg_entries(MemSeg *m, void *closure)
{
    return view_new(&EntriesType, m);
}

static PyObject *
seg_keys(MemSeg *m, void *closure)
{
    return view_new(&KeysType, m);
}

static PyMethodDef seg_methods[] = {
    {"add", (PyCFunction)(void (*)(void))seg_add, METH_FASTCALL, add_doc},
    {"add_pending", (PyCFunction)(void (*)(void))seg_add_pending, METH_FASTCALL,
     add_pending_doc},
    {"add_tombstone_behind", (PyCFunction)seg_add_tombstone_behind, METH_O,
     add_tombstone_behind_doc},
    {"add_tombstones_behind", (PyCFunction)seg_add_tombstones_behind, METH_O,
     add_tombstones_behind_doc},
    {"next_after", (PyCFunction)seg_next_after, METH_O, next_after_doc},
    {"net_upto", (PyCFunction)seg_net_upto, METH_O, net_upto_doc},
    {"group_of", (PyCFunction)seg_group_of, METH_O, group_of_doc},
    {"groups_of", (PyCFunction)seg_groups_of, METH_O, groups_of_doc},
    {"__sizeof__", (PyCFunction)seg_sizeof, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef seg_members[] = {
    {"segment_no", T_LONGLONG, offsetof(MemSeg, segment_no), READONLY,
     "the number of the log this segment mirrors"},
    {"replaced_by", T_OBJECT, offsetof(MemSeg, replaced_by), 0,
     "the segment file this segment was frozen into (a hint for value lookups), or None"},
    {"pending_count", T_LONGLONG, offsetof(MemSeg, pending_count), READONLY,
     "pending entries held"},
    {"tombstone_count", T_LONGLONG, offsetof(MemSeg, tombstone_count), READONLY,
     "tombstones, held or only counted"},
    {"bytes", T_LONGLONG, offsetof(MemSeg, bytes), READONLY,
     "estimated memory of the entries: ENTRY_MEMORY each plus each value's length"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef seg_getset[] = {
    {"net_total", (getter)seg_net_total, NULL, "pending entries minus tombstones, all of them",
     NULL},
    {"allocated", (getter)seg_allocated, NULL,
     "bytes this segment holds from the allocator, exactly", NULL},
    {"entries", (getter)seg_entries, NULL,
     "a read-only mapping: key -> (stats, value) of a pending entry, None of a tombstone",
     NULL},
    {"keys", (getter)seg_keys, NULL, "the keys held, in order (pending and tombstones)", NULL},
    {"grouped", (getter)seg_grouped, NULL, "pending entries held with a group (docs/delivery.md)",
     NULL},
    {"group_names", (getter)seg_group_names, NULL,
     "the groups' names, each once, in the order entries first used them", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods seg_as_sequence = {
    .sq_length = (lenfunc)seg_len,
};

static PyTypeObject MemSegType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dq.storage._memseg.MemSegment",
    .tp_doc = PyDoc_STR("MemSegment(segment_no)\n--\n\n"
                        "The sorted, mutable mirror of one write-ahead log: its entries, "
                        "published once durable."),
    .tp_basicsize = sizeof(MemSeg),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = seg_new,
    .tp_init = (initproc)seg_init,
    .tp_dealloc = (destructor)seg_dealloc,
    .tp_traverse = (traverseproc)seg_traverse,
    .tp_clear = (inquiry)seg_clear,
    .tp_methods = seg_methods,
    .tp_members = seg_members,
    .tp_getset = seg_getset,
    .tp_as_sequence = &seg_as_sequence,
};

/* ---- the entries and keys views, and their iterator --------------------------------- */

typedef struct {
    PyObject_HEAD
    MemSeg *m;
} View;

static PyObject *
view_new(PyTypeObject *type, MemSeg *m)
{
    View *v = PyObject_GC_New(View, type);
    if (v == NULL) {
        return NULL;
    }
    Py_INCREF(m);
    v->m = m;
    PyObject_GC_Track(v);
    return (PyObject *)v;
}

static int
view_traverse(View *v, visitproc visit, void *arg)
{
    Py_VISIT(v->m);
    return 0;
}

static int
view_clear(View *v)
{
    Py_CLEAR(v->m);
    return 0;
}

static void
view_dealloc(View *v)
{
    PyObject_GC_UnTrack(v);
    view_clear(v);
    PyObject_GC_Del(v);
}

static Py_ssize_t
view_len(View *v)
{
    return v->m ? seg_len(v->m) : 0;
}

static int
view_contains(View *v, PyObject *key)
{
    return v->m && find_obj(v->m, key) != NULL;
}

static PyObject *
entries_subscript(View *v, PyObject *key)
{
    const Slot *s = v->m ? find_obj(v->m, key) : NULL;
    if (s == NULL) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return entry_of(v->m, s);
}

static PyObject *
entries_get(View *v, PyObject *const *args, Py_ssize_t nargs)
{
    if (!check_nargs("get", nargs, 1, 2)) {
        return NULL;
    }
    const Slot *s = v->m ? find_obj(v->m, args[0]) : NULL;
    if (s == NULL) {
        PyObject *dflt = nargs == 2 ? args[1] : Py_None;
        Py_INCREF(dflt);
        return dflt;
    }
    return entry_of(v->m, s);
}

typedef struct {
    PyObject_HEAD
    MemSeg *m;
    unsigned long long version;
    size_t li;
    uint32_t si;
    int have_last, done, min_incl, max_incl;
    uint8_t last[KEY_SIZE];
    PyObject *min, *max; /* bytes, or NULL for no bound */
} Iter;

/* Place the iterator where its next key is, from its last key or its lower bound. */
static int
iter_seek(Iter *it)
{
    MemSeg *m = it->m;
    it->version = m->version;
    if (it->have_last) {
        seek(m, it->last, KEY_SIZE, 1, &it->li, &it->si);
    } else if (it->min == NULL) {
        it->li = 0;
        it->si = 0;
    } else {
        seek(m, (const uint8_t *)PyBytes_AS_STRING(it->min), PyBytes_GET_SIZE(it->min),
             !it->min_incl, &it->li, &it->si);
    }
    return 0;
}

static PyObject *
iter_make(MemSeg *m, PyObject *min, int min_incl, PyObject *max, int max_incl)
{
    Iter *it = PyObject_GC_New(Iter, &IterType);
    if (it == NULL) {
        return NULL;
    }
    Py_INCREF(m);
    it->m = m;
    it->have_last = it->done = 0;
    it->min_incl = min_incl;
    it->max_incl = max_incl;
    it->min = it->max = NULL;
    if (min != NULL) {
        it->min = PyBytes_FromObject(min);
    }
    if (max != NULL && !PyErr_Occurred()) {
        it->max = PyBytes_FromObject(max);
    }
    PyObject_GC_Track(it);
    if (PyErr_Occurred()) {
        Py_DECREF(it);
        return NULL;
    }
    iter_seek(it);
    return (PyObject *)it;
}

static int
iter_traverse(Iter *it, visitproc visit, void *arg)
{
    Py_VISIT(it->m);
    return 0;
}

static int
iter_clear(Iter *it)
{
    Py_CLEAR(it->m);
    return 0;
}

static void
iter_dealloc(Iter *it)
{
    PyObject_GC_UnTrack(it);
    iter_clear(it);
    Py_XDECREF(it->min);
    Py_XDECREF(it->max);
    PyObject_GC_Del(it);
}

static PyObject *
iter_next(Iter *it)
{
    if (it->done || it->m == NULL) {
        return NULL;
    }
    MemSeg *m = it->m;
    if (it->version != m->version) {
        iter_seek(it); /* keys were added since the last step */
    }
    const Slot *s = slot_at(m, &it->li, &it->si);
    if (s != NULL && it->max != NULL) {
        int c = qcmp(s->key, (const uint8_t *)PyBytes_AS_STRING(it->max),
                     PyBytes_GET_SIZE(it->max));
        if (c > 0 || (c == 0 && !it->max_incl)) {
            s = NULL;
        }
    }
    if (s == NULL) {
        it->done = 1;
        return NULL;
    }
    memcpy(it->last, s->key, KEY_SIZE);
    it->have_last = 1;
    it->si++;
    return key_bytes(s);
}

static PyObject *
view_iter(View *v)
{
    return iter_make(v->m, NULL, 1, NULL, 1);
}

PyDoc_STRVAR(irange_doc,
"irange(minimum=None, maximum=None, inclusive=(True, True))\n--\n\n"
"An iterator over the keys from `minimum` to `maximum` in order (None: no bound),\n"
"`inclusive` saying whether each bound is included, as SortedList.irange.");

static PyObject *
keys_irange(View *v, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"minimum", "maximum", "inclusive", NULL};
    PyObject *min = Py_None, *max = Py_None, *incl = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OOO:irange", kwlist, &min, &max, &incl)) {
        return NULL;
    }
    int min_incl = 1, max_incl = 1;
    if (incl != NULL) {
        if (!PyTuple_Check(incl) || PyTuple_GET_SIZE(incl) != 2) {
            PyErr_SetString(PyExc_TypeError, "inclusive must be a pair of booleans");
            return NULL;
        }
        if ((min_incl = PyObject_IsTrue(PyTuple_GET_ITEM(incl, 0))) < 0 ||
            (max_incl = PyObject_IsTrue(PyTuple_GET_ITEM(incl, 1))) < 0) {
            return NULL;
        }
    }
    return iter_make(v->m, min == Py_None ? NULL : min, min_incl, max == Py_None ? NULL : max,
                     max_incl);
}

static PyMappingMethods entries_as_mapping = {
    .mp_length = (lenfunc)view_len,
    .mp_subscript = (binaryfunc)entries_subscript,
};

static PySequenceMethods view_as_sequence = {
    .sq_length = (lenfunc)view_len,
    .sq_contains = (objobjproc)view_contains,
};

static PyMethodDef entries_methods[] = {
    {"get", (PyCFunction)(void (*)(void))entries_get, METH_FASTCALL,
     "get(key, default=None)\n--\n\n(stats, value) of a pending entry, None of a tombstone, "
     "default if the key is not held."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef keys_methods[] = {
    {"irange", (PyCFunction)(void (*)(void))keys_irange, METH_VARARGS | METH_KEYWORDS,
     irange_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EntriesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dq.storage._memseg.Entries",
    .tp_doc = PyDoc_STR("A read-only mapping over a MemSegment's entries (iterated in key "
                        "order)."),
    .tp_basicsize = sizeof(View),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)view_dealloc,
    .tp_traverse = (traverseproc)view_traverse,
    .tp_clear = (inquiry)view_clear,
    .tp_as_mapping = &entries_as_mapping,
    .tp_as_sequence = &view_as_sequence,
    .tp_iter = (getiterfunc)view_iter,
    .tp_methods = entries_methods,
};

static PyTypeObject KeysType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dq.storage._memseg.Keys",
    .tp_doc = PyDoc_STR("A MemSegment's keys in order (pending entries and tombstones)."),
    .tp_basicsize = sizeof(View),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)view_dealloc,
    .tp_traverse = (traverseproc)view_traverse,
    .tp_clear = (inquiry)view_clear,
    .tp_as_sequence = &view_as_sequence,
    .tp_iter = (getiterfunc)view_iter,
    .tp_methods = keys_methods,
};

static PyTypeObject IterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dq.storage._memseg.KeyIterator",
    .tp_basicsize = sizeof(Iter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)iter_dealloc,
    .tp_traverse = (traverseproc)iter_traverse,
    .tp_clear = (inquiry)iter_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)iter_next,
};

/* ---- module ------------------------------------------------------------------------- */

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dq.storage._memseg",
    .m_doc = "The in-memory segment as a compact compiled structure (storage/_memseg.c).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__memseg(void)
{
    PyTypeObject *types[] = {&MemSegType, &EntriesType, &KeysType, &IterType};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyType_Ready(types[i]) < 0) {
            return NULL;
        }
    }
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) {
        return NULL;
    }
    Py_INCREF(&MemSegType);
    if (PyModule_AddObject(mod, "MemSegment", (PyObject *)&MemSegType) < 0 ||
        PyModule_AddIntConstant(mod, "ENTRY_MEMORY", ENTRY_MEMORY) < 0 ||
        PyModule_AddIntConstant(mod, "LEAF_MAX", LEAF_MAX) < 0 ||
        PyModule_AddIntConstant(mod, "ARENA_OWN", ARENA_OWN) < 0 ||
        PyModule_AddIntConstant(mod, "ARENA_MAX", ARENA_MAX) < 0) {
        Py_DECREF(&MemSegType);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
