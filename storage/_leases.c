/*
 * storage/_leases.c -- the in-flight set, dq.storage._leases.Leases: who holds which
 * item, until when, under which receipt (docs/http.md, "Receipts"; docs/storage.md).
 *
 * Why: a leased item was a Lease dataclass, its key bytes, its ints, a dict entry and a
 * tuple in each of two lazily pruned indexes (the expiry heap, the dequeue-order deque):
 * ~454 bytes a lease (bench/memory.py), and a queue may have millions out under long
 * leases. Here a lease is one 96-byte record in a dense array, found by its id through
 * an open-addressing table of 4-byte slots, and placed in two heaps of 4-byte record
 * numbers (expiry order; dequeue order) that each record knows its place in, so an
 * ended or extended lease leaves nothing behind.
 *
 * What it keeps (the rules of a lease live here and nowhere else):
 *   - records: key (16 bytes), id, the item's stats as leased (enqueue and requeue time,
 *     delivery count), when the lease ends (`expires`), the delivery number its receipt
 *     names, when the delivery began (`since`: extends keep it), and two references:
 *     `source` (where the pending entry lives, a hint for value lookups) and `group` (the
 *     item's group name, shared with the delivery index, or None);
 *   - receipts `<epoch>.<id hex>.<delivery hex>`: the epoch is random per Leases (a queue
 *     opening), the delivery number grows by one per lease, so a receipt names one
 *     delivery; `check` is the one place that says why a receipt names no live lease
 *     (InvalidReceipt, ItemNotFound, StaleReceipt, in that order, as the Python did);
 *   - the expiry heap ordered by (expires, id), so `pop_expired` hands back leases in
 *     that order, and the dequeue-order heap by (since, id) for `oldest_since`.
 *
 * Invariants kept:
 *   - records [0, n) are the live leases (a removal moves the last record into the hole
 *     and fixes its table slot and heap places), `ids` maps each live id to its record,
 *     xheap/oheap hold every record once and rec.xpos/rec.opos are their places;
 *   - `allocated` is exactly the bytes held from the allocator (PyMem_Raw*, which
 *     tracemalloc sees);
 *   - every method runs with the GIL held and changes the structure with no Python code
 *     in between; references a removal lets go of are dropped only once the structure is
 *     whole again (a source's release could run code).
 * Hostile input (a key of another length, a receipt of any shape, ids out of range)
 * raises the engine's errors or TypeError/ValueError/OverflowError and changes nothing.
 *
 * Lease objects are snapshots made on demand (check, take, pop, get, values,
 * pop_expired): immutable, carrying everything `restore` needs to put the same delivery
 * back after a refused write.
 *
 * The design is in docs/architecture.md ("Compiled parts").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define KEY 16
#define NOSLOT 0u /* an empty slot of the id table (slots hold record + 1) */

typedef struct {
    uint8_t key[KEY];
    uint64_t id;
    int64_t enq, req, expires, since;
    uint64_t delivery;
    PyObject *source; /* a reference (None included) */
    PyObject *group;  /* a reference: an exact str, or None */
    uint32_t cnt;
    uint32_t xpos, opos; /* places in the expiry and dequeue-order heaps */
    uint32_t pad;
} Rec;

_Static_assert(sizeof(Rec) == 96, "a lease is 96 bytes");

typedef struct {
    PyObject_HEAD
    PyObject *epoch; /* str */
    Rec *r;
    size_t n, cap;
    uint32_t *slots; /* id table: record + 1, NOSLOT empty; linear probing */
    size_t scap;     /* a power of two, or 0 */
    uint32_t *xheap, *oheap; /* record numbers; both sized like r */
    uint64_t deliveries;
    size_t allocated;
} Leases;

typedef struct {
    PyObject_HEAD
    PyObject *key;
    long long enqueue_time, requeue_time, dequeue_count, expires, delivery, since;
    PyObject *source;
    PyObject *group;
} Lease;

static PyTypeObject LeasesType, LeaseType;
static PyObject *InvalidReceipt, *ItemNotFound, *StaleReceipt;
static PyObject *str_id, *str_receipt;

/* ---- memory, counted ----------------------------------------------------------------- */

static void
ls_free(Leases *ls, void *p, size_t n)
{
    if (p != NULL) {
        PyMem_RawFree(p);
        ls->allocated -= n;
    }
}

/* Records, and the heaps beside them, sized for `cap` leases (cap >= n): all three
 * blocks or, failing, none changed. */
static int
resize_records(Leases *ls, size_t cap)
{
    if (cap >= UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "too many leases");
        return -1;
    }
    Rec *r = PyMem_RawMalloc(cap * sizeof(Rec));
    uint32_t *x = PyMem_RawMalloc(cap * 4);
    uint32_t *o = PyMem_RawMalloc(cap * 4);
    if (r == NULL || x == NULL || o == NULL) {
        PyMem_RawFree(r);
        PyMem_RawFree(x);
        PyMem_RawFree(o);
        PyErr_NoMemory();
        return -1;
    }
    if (ls->n) {
        memcpy(r, ls->r, ls->n * sizeof(Rec));
        memcpy(x, ls->xheap, ls->n * 4);
        memcpy(o, ls->oheap, ls->n * 4);
    }
    ls_free(ls, ls->r, ls->cap * sizeof(Rec));
    ls_free(ls, ls->xheap, ls->cap * 4);
    ls_free(ls, ls->oheap, ls->cap * 4);
    ls->r = r;
    ls->xheap = x;
    ls->oheap = o;
    ls->allocated += cap * (sizeof(Rec) + 8);
    ls->cap = cap;
    return 0;
}

/* ---- the id table -------------------------------------------------------------------- */

static inline size_t
id_hash(uint64_t id, size_t mask)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 17) & mask;
}

/* The slot holding id, or the empty slot where it would go. */
static inline size_t
slot_of(const Leases *ls, uint64_t id)
{
    size_t mask = ls->scap - 1, i = id_hash(id, mask);
    for (;;) {
        uint32_t s = ls->slots[i];
        if (s == NOSLOT || ls->r[s - 1].id == id) {
            return i;
        }
        i = (i + 1) & mask;
    }
}

static inline Rec *
find(const Leases *ls, uint64_t id)
{
    if (ls->n == 0) {
        return NULL;
    }
    uint32_t s = ls->slots[slot_of(ls, id)];
    return s == NOSLOT ? NULL : &ls->r[s - 1];
}

/* A table of `scap` slots holding the live records. */
static int
rehash(Leases *ls, size_t scap)
{
    uint32_t *slots = PyMem_RawCalloc(scap, 4);
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    ls_free(ls, ls->slots, ls->scap * 4);
    ls->allocated += scap * 4;
    ls->slots = slots;
    ls->scap = scap;
    size_t mask = scap - 1;
    for (size_t k = 0; k < ls->n; k++) {
        size_t i = id_hash(ls->r[k].id, mask);
        while (slots[i] != NOSLOT) {
            i = (i + 1) & mask;
        }
        slots[i] = (uint32_t)k + 1;
    }
    return 0;
}

/* Delete slot i (linear probing: shift back the entries after it). */
static void
slot_delete(Leases *ls, size_t i)
{
    size_t mask = ls->scap - 1, j = i;
    for (;;) {
        j = (j + 1) & mask;
        uint32_t s = ls->slots[j];
        if (s == NOSLOT) {
            break;
        }
        size_t home = id_hash(ls->r[s - 1].id, mask);
        /* the entry at j may move to i if its home is not in (i, j] (cyclically) */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            ls->slots[i] = s;
            i = j;
        }
    }
    ls->slots[i] = NOSLOT;
}

/* ---- the heaps ----------------------------------------------------------------------- */

static inline int
x_less(const Leases *ls, uint32_t a, uint32_t b)
{
    const Rec *p = &ls->r[a], *q = &ls->r[b];
    return p->expires < q->expires || (p->expires == q->expires && p->id < q->id);
}

static inline int
o_less(const Leases *ls, uint32_t a, uint32_t b)
{
    const Rec *p = &ls->r[a], *q = &ls->r[b];
    return p->since < q->since || (p->since == q->since && p->id < q->id);
}

#define HEAP_FNS(NAME, HEAP, POS, LESS)                                                      \
    static void NAME##_up(Leases *ls, size_t i)                                              \
    {                                                                                        \
        uint32_t *h = ls->HEAP, v = h[i];                                                    \
        while (i > 0) {                                                                      \
            size_t p = (i - 1) / 2;                                                          \
            if (!LESS(ls, v, h[p])) {                                                        \
                break;                                                                       \
            }                                                                                \
            h[i] = h[p];                                                                     \
            ls->r[h[i]].POS = (uint32_t)i;                                                   \
            i = p;                                                                           \
        }                                                                                    \
        h[i] = v;                                                                            \
        ls->r[v].POS = (uint32_t)i;                                                          \
    }                                                                                        \
    static void NAME##_down(Leases *ls, size_t i)                                            \
    {                                                                                        \
        uint32_t *h = ls->HEAP, v = h[i];                                                    \
        size_t n = ls->n;                                                                    \
        for (;;) {                                                                           \
            size_t c = 2 * i + 1;                                                            \
            if (c >= n) {                                                                    \
                break;                                                                       \
            }                                                                                \
            if (c + 1 < n && LESS(ls, h[c + 1], h[c])) {                                     \
                c++;                                                                         \
            }                                                                                \
            if (!LESS(ls, h[c], v)) {                                                        \
                break;                                                                       \
            }                                                                                \
            h[i] = h[c];                                                                     \
            ls->r[h[i]].POS = (uint32_t)i;                                                   \
            i = c;                                                                           \
        }                                                                                    \
        h[i] = v;                                                                            \
        ls->r[v].POS = (uint32_t)i;                                                          \
    }                                                                                        \
    /* Take the entry at place i out (the heap holds n + 1 entries, n after). */             \
    static void NAME##_remove(Leases *ls, size_t i)                                          \
    {                                                                                        \
        size_t last = ls->n;                                                                 \
        if (i == last) {                                                                     \
            return;                                                                          \
        }                                                                                    \
        ls->HEAP[i] = ls->HEAP[last];                                                        \
        ls->r[ls->HEAP[i]].POS = (uint32_t)i;                                                \
        NAME##_up(ls, i);                                                                    \
        NAME##_down(ls, ls->r[ls->HEAP[i]].POS);                                             \
    }

HEAP_FNS(x, xheap, xpos, x_less)
HEAP_FNS(o, oheap, opos, o_less)

/* ---- records ------------------------------------------------------------------------- */

/* Add a lease (its id not live; references stolen). Raises only before changing
 * anything, and then keeps the references' ownership with the caller. */
static int
insert(Leases *ls, const Rec *rec)
{
    if (ls->n == ls->cap && resize_records(ls, ls->cap ? ls->cap + ls->cap / 2 : 16) < 0) {
        return -1;
    }
    if ((ls->n + 1) * 4 > ls->scap * 3 && rehash(ls, ls->scap ? ls->scap * 2 : 32) < 0) {
        return -1;
    }
    size_t k = ls->n;
    ls->r[k] = *rec;
    ls->slots[slot_of(ls, rec->id)] = (uint32_t)k + 1;
    ls->n = k + 1;
    ls->xheap[k] = (uint32_t)k;
    ls->oheap[k] = (uint32_t)k;
    x_up(ls, k);
    o_up(ls, k);
    return 0;
}

/* Take record `rec` out; its references pass to *out. Never fails. */
static void
take_out(Leases *ls, Rec *rec, Rec *out)
{
    *out = *rec;
    size_t k = (size_t)(rec - ls->r);
    slot_delete(ls, slot_of(ls, rec->id));
    ls->n--;
    x_remove(ls, out->xpos);
    o_remove(ls, out->opos);
    size_t last = ls->n;
    if (k != last) { /* the last record fills the hole */
        Rec *moved = &ls->r[last];
        ls->slots[slot_of(ls, moved->id)] = (uint32_t)k + 1;
        ls->xheap[moved->xpos] = (uint32_t)k;
        ls->oheap[moved->opos] = (uint32_t)k;
        ls->r[k] = *moved;
    }
    /* shrink when far emptier than the room (a burst of leases gone); a refused
     * shrink keeps the room it had */
    if (ls->cap > 64 && ls->n < ls->cap / 4 && resize_records(ls, ls->cap / 2) < 0) {
        PyErr_Clear();
    }
    if (ls->scap > 64 && ls->n * 8 < ls->scap) {
        if (rehash(ls, ls->scap / 2) < 0) {
            PyErr_Clear(); /* the old table still holds every lease */
        }
    }
}

static PyObject *
receipt_of(Leases *ls, uint64_t id, uint64_t delivery)
{
    char buf[48];
    int len = snprintf(buf, sizeof buf, ".%llx.%llx", (unsigned long long)id,
                       (unsigned long long)delivery);
    PyObject *tail = PyUnicode_FromStringAndSize(buf, len);
    if (tail == NULL) {
        return NULL;
    }
    PyObject *out = PyUnicode_Concat(ls->epoch, tail);
    Py_DECREF(tail);
    return out;
}

/* A Lease snapshot of `rec`; with `steal` its references pass to the snapshot. */
static PyObject *
snapshot(const Rec *rec, int steal)
{
    Lease *l = PyObject_GC_New(Lease, &LeaseType);
    if (l == NULL) {
        return NULL;
    }
    l->key = PyBytes_FromStringAndSize((const char *)rec->key, KEY);
    if (l->key == NULL) {
        l->source = l->group = NULL;
        Py_DECREF(l);
        return NULL;
    }
    l->enqueue_time = rec->enq;
    l->requeue_time = rec->req;
    l->dequeue_count = rec->cnt;
    l->expires = rec->expires;
    l->delivery = (long long)rec->delivery;
    l->since = rec->since;
    l->source = rec->source;
    l->group = rec->group;
    if (!steal) {
        Py_INCREF(l->source);
        Py_INCREF(l->group);
    }
    PyObject_GC_Track(l);
    return (PyObject *)l;
}

static void
drop_refs(Rec *rec)
{
    Py_DECREF(rec->source);
    Py_DECREF(rec->group);
}

/* ---- arguments ----------------------------------------------------------------------- */

static int
check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, nargs);
        return 0;
    }
    return 1;
}

static int
get_i64(PyObject *obj, int64_t *out)
{
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = v;
    return 0;
}

/* An item id: a non-negative int within 64 bits. */
static int
get_id(PyObject *obj, uint64_t *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "an item id is an int");
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    *out = v;
    return 0;
}

static int
get_key(PyObject *obj, uint8_t *key)
{
    if (!PyBytes_Check(obj) || PyBytes_GET_SIZE(obj) != KEY) {
        PyErr_SetString(PyExc_TypeError, "a lease's key is 16 bytes");
        return -1;
    }
    memcpy(key, PyBytes_AS_STRING(obj), KEY);
    return 0;
}

static int
check_group(PyObject *group)
{
    if (group != Py_None && !PyUnicode_CheckExact(group)) {
        PyErr_SetString(PyExc_TypeError, "a lease's group is a str or None");
        return 0;
    }
    return 1;
}

/* ---- receipts ------------------------------------------------------------------------ */

static void
raise_error(PyObject *cls, const char *message, PyObject *item_id, PyObject *receipt)
{
    PyObject *args = Py_BuildValue("(s)", message);
    PyObject *kw = args ? PyDict_New() : NULL;
    if (kw != NULL && PyDict_SetItem(kw, str_id, item_id) == 0 &&
        (receipt == NULL || PyDict_SetItem(kw, str_receipt, receipt) == 0)) {
        PyObject *exc = PyObject_Call(cls, args, kw);
        if (exc != NULL) {
            PyErr_SetObject(cls, exc);
            Py_DECREF(exc);
        }
    }
    Py_XDECREF(args);
    Py_XDECREF(kw);
}

/* The number a hex part of a receipt spells, as int(part, 16) reads it: 1 and *v set
 * when it fits 64 bits, 0 with *big set to the int when it does not (or is negative),
 * -1 with ValueError cleared and *malformed set when int() refuses it, -1 on another
 * error. Plain lowercase/uppercase hex digits are read here; anything else (a sign,
 * spaces, `0x`, underscores) goes through int() itself, so the rule stays Python's. */
static int
hex_part(PyObject *s, Py_ssize_t start, Py_ssize_t end, uint64_t *v, PyObject **big,
         int *malformed)
{
    *big = NULL;
    *malformed = 0;
    Py_ssize_t len = end - start;
    if (len > 0 && len <= 16 && PyUnicode_KIND(s) == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *p = PyUnicode_1BYTE_DATA(s) + start;
        uint64_t x = 0;
        Py_ssize_t i = 0;
        for (; i < len; i++) {
            Py_UCS1 c = p[i];
            unsigned d;
            if (c >= '0' && c <= '9') {
                d = c - '0';
            } else if (c >= 'a' && c <= 'f') {
                d = c - 'a' + 10;
            } else if (c >= 'A' && c <= 'F') {
                d = c - 'A' + 10;
            } else {
                break;
            }
            x = x << 4 | d;
        }
        if (i == len) {
            *v = x;
            return 1;
        }
    }
    PyObject *part = PyUnicode_Substring(s, start, end);
    if (part == NULL) {
        return -1;
    }
    PyObject *num = PyLong_FromUnicodeObject(part, 16);
    Py_DECREF(part);
    if (num == NULL) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
            *malformed = 1;
        }
        return -1;
    }
    unsigned long long u = PyLong_AsUnsignedLongLong(num);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        *big = num;
        return 0;
    }
    Py_DECREF(num);
    *v = u;
    return 1;
}

/* The live record `receipt` names for item `item_id`, or NULL with the engine's error
 * set (docs/http.md): malformed or another item's receipt is InvalidReceipt, an id
 * never enqueued ItemNotFound, a delivery that is over StaleReceipt. */
static Rec *
check(Leases *ls, PyObject *item_id, PyObject *receipt, PyObject *next_id, int64_t now)
{
    static const char *malformed_msg = "malformed receipt";
    Py_ssize_t dot1 = -1, dot2 = -1, len = 0;
    int shape = PyUnicode_Check(receipt);
    if (shape) {
        len = PyUnicode_GET_LENGTH(receipt);
        dot1 = PyUnicode_FindChar(receipt, '.', 0, len, 1);
        if (dot1 == -2) {
            return NULL;
        }
        dot2 = dot1 < 0 ? -1 : PyUnicode_FindChar(receipt, '.', dot1 + 1, len, 1);
        if (dot2 == -2) {
            return NULL;
        }
        Py_ssize_t dot3 = dot2 < 0 ? -1 : PyUnicode_FindChar(receipt, '.', dot2 + 1, len, 1);
        if (dot3 == -2) {
            return NULL;
        }
        shape = dot1 >= 0 && dot2 >= 0 && dot3 < 0;
    }
    if (!shape) {
        raise_error(InvalidReceipt, malformed_msg, item_id, receipt);
        return NULL;
    }
    uint64_t rid = 0, delivery = 0;
    PyObject *rbig, *dbig;
    int bad;
    int rfit = hex_part(receipt, dot1 + 1, dot2, &rid, &rbig, &bad);
    if (rfit < 0) {
        if (bad) {
            raise_error(InvalidReceipt, malformed_msg, item_id, receipt);
        }
        return NULL;
    }
    int dfit = hex_part(receipt, dot2 + 1, len, &delivery, &dbig, &bad);
    if (dfit < 0) {
        Py_XDECREF(rbig);
        if (bad) {
            raise_error(InvalidReceipt, malformed_msg, item_id, receipt);
        }
        return NULL;
    }
    Py_XDECREF(dbig); /* a delivery beyond 64 bits names no lease: dfit 0 says so */
    /* rid != item_id, as Python compares them */
    int same;
    if (rbig != NULL) {
        same = PyObject_RichCompareBool(rbig, item_id, Py_EQ);
        Py_DECREF(rbig);
        if (same < 0) {
            return NULL;
        }
        if (same) { /* equal to an id beyond 64 bits: never enqueued */
            raise_error(ItemNotFound, "no item with this id was ever enqueued here", item_id,
                        NULL);
            return NULL;
        }
    } else {
        same = 0;
        if (PyLong_Check(item_id)) {
            int overflow;
            long long v = PyLong_AsLongLongAndOverflow(item_id, &overflow);
            if (v == -1 && PyErr_Occurred()) {
                return NULL;
            }
            if (!overflow) {
                same = v >= 0 && (uint64_t)v == rid;
            } else if (overflow > 0) {
                unsigned long long u = PyLong_AsUnsignedLongLong(item_id);
                if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                    PyErr_Clear();
                } else {
                    same = (uint64_t)u == rid;
                }
            }
        } else {
            PyObject *r = PyLong_FromUnsignedLongLong(rid);
            if (r == NULL) {
                return NULL;
            }
            same = PyObject_RichCompareBool(r, item_id, Py_EQ);
            Py_DECREF(r);
            if (same < 0) {
                return NULL;
            }
        }
    }
    if (!same) {
        raise_error(InvalidReceipt, "receipt is for another item", item_id, receipt);
        return NULL;
    }
    /* item_id >= next_id or item_id <= 0 (rid: the same number, within 64 bits) */
    int ge = PyObject_RichCompareBool(item_id, next_id, Py_GE);
    if (ge < 0) {
        return NULL;
    }
    if (ge || rid == 0) {
        raise_error(ItemNotFound, "no item with this id was ever enqueued here", item_id, NULL);
        return NULL;
    }
    Py_ssize_t elen = PyUnicode_GET_LENGTH(ls->epoch);
    int epoch_ok = dot1 == elen &&
                   PyUnicode_Tailmatch(receipt, ls->epoch, 0, dot1, -1) == 1;
    if (PyErr_Occurred()) {
        return NULL;
    }
    Rec *rec = find(ls, rid);
    if (!epoch_ok || rec == NULL || !dfit || rec->delivery != delivery || rec->expires <= now) {
        raise_error(StaleReceipt,
                    "that delivery is over (released, requeued, expired, or the server "
                    "restarted)",
                    item_id, NULL);
        return NULL;
    }
    return rec;
}

/* ---- methods ------------------------------------------------------------------------- */

static PyObject *
ls_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Leases() takes no arguments");
        return NULL;
    }
    PyObject *secrets = PyImport_ImportModule("secrets");
    if (secrets == NULL) {
        return NULL;
    }
    PyObject *epoch = PyObject_CallMethod(secrets, "token_hex", "i", 4);
    Py_DECREF(secrets);
    if (epoch == NULL) {
        return NULL;
    }
    Leases *ls = (Leases *)type->tp_alloc(type, 0);
    if (ls == NULL) {
        Py_DECREF(epoch);
        return NULL;
    }
    ls->epoch = epoch;
    return (PyObject *)ls;
}

static int
ls_traverse(Leases *ls, visitproc visit, void *arg)
{
    for (size_t k = 0; k < ls->n; k++) {
        Py_VISIT(ls->r[k].source);
        Py_VISIT(ls->r[k].group);
    }
    return 0;
}

/* Forget every lease (the references dropped once the structure is empty). */
static int
ls_clear(Leases *ls)
{
    Rec *r = ls->r;
    size_t n = ls->n, cap = ls->cap;
    uint32_t *x = ls->xheap, *o = ls->oheap, *slots = ls->slots;
    size_t scap = ls->scap;
    ls->r = NULL;
    ls->xheap = ls->oheap = ls->slots = NULL;
    ls->n = ls->cap = ls->scap = 0;
    for (size_t k = 0; k < n; k++) {
        drop_refs(&r[k]);
    }
    ls_free(ls, r, cap * sizeof(Rec));
    ls_free(ls, x, cap * 4);
    ls_free(ls, o, cap * 4);
    ls_free(ls, slots, scap * 4);
    return 0;
}

static void
ls_dealloc(Leases *ls)
{
    PyObject_GC_UnTrack(ls);
    ls_clear(ls);
    Py_CLEAR(ls->epoch);
    Py_TYPE(ls)->tp_free((PyObject *)ls);
}

static Py_ssize_t
ls_len(Leases *ls)
{
    return (Py_ssize_t)ls->n;
}

static int
ls_contains(Leases *ls, PyObject *item_id)
{
    if (!PyLong_Check(item_id)) {
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(item_id);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return find(ls, v) != NULL;
}

/* add(item_id, key, enqueue_time, requeue_time, dequeue_count, expires, source, since,
 *     group) -> receipt */
static PyObject *
ls_add(Leases *ls, PyObject *const *args, Py_ssize_t nargs)
{
    if (!check_nargs("add", nargs, 9)) {
        return NULL;
    }
    Rec rec;
    memset(&rec, 0, sizeof rec);
    int64_t cnt;
    if (get_id(args[0], &rec.id) < 0 || get_key(args[1], rec.key) < 0 ||
        get_i64(args[2], &rec.enq) < 0 || get_i64(args[3], &rec.req) < 0 ||
        get_i64(args[4], &cnt) < 0 || get_i64(args[5], &rec.expires) < 0 ||
        get_i64(args[7], &rec.since) < 0 || !check_group(args[8])) {
        return NULL;
    }
    if (cnt < 0 || cnt > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a delivery count is a u32");
        return NULL;
    }
    rec.cnt = (uint32_t)cnt;
    if (find(ls, rec.id) != NULL) {
        PyErr_Format(PyExc_ValueError, "item %llu is leased already",
                     (unsigned long long)rec.id);
        return NULL;
    }
    rec.delivery = ls->deliveries + 1;
    PyObject *receipt = receipt_of(ls, rec.id, rec.delivery);
    if (receipt == NULL) {
        return NULL;
    }
    rec.source = args[6];
    rec.group = args[8];
    if (insert(ls, &rec) < 0) {
        Py_DECREF(receipt);
        return NULL;
    }
    Py_INCREF(rec.source);
    Py_INCREF(rec.group);
    ls->deliveries = rec.delivery;
    return receipt;
}

/* restore(item_id, lease): put back a lease taken for a write that was refused. */
static PyObject *
ls_restore(Leases *ls, PyObject *const *args, Py_ssize_t nargs)
{
    if (!check_nargs("restore", nargs, 2)) {
        return NULL;
    }
    if (!PyObject_TypeCheck(args[1], &LeaseType)) {
        PyErr_SetString(PyExc_TypeError, "restore() takes a Lease");
        return NULL;
    }
    Lease *l = (Lease *)args[1];
    Rec rec;
    memset(&rec, 0, sizeof rec);
    if (get_id(args[0], &rec.id) < 0 || get_key(l->key, rec.key) < 0 ||
        !check_group(l->group)) {
        return NULL;
    }
    if (l->dequeue_count < 0 || l->dequeue_count > UINT32_MAX || l->delivery < 0) {
        PyErr_SetString(PyExc_OverflowError, "a lease out of range");
        return NULL;
    }
    if (find(ls, rec.id) != NULL) {
        PyErr_Format(PyExc_ValueError, "item %llu is leased already",
                     (unsigned long long)rec.id);
        return NULL;
    }
    rec.enq = l->enqueue_time;
    rec.req = l->requeue_time;
    rec.cnt = (uint32_t)l->dequeue_count;
    rec.expires = l->expires;
    rec.since = l->since;
    rec.delivery = (uint64_t)l->delivery;
    rec.source = l->source;
    rec.group = l->group;
    if (insert(ls, &rec) < 0) {
        return NULL;
    }
    Py_INCREF(rec.source);
    Py_INCREF(rec.group);
    Py_RETURN_NONE;
}

static int
check_args(Leases *ls, const char *name, PyObject *const *args, Py_ssize_t nargs,
           Py_ssize_t want, int64_t *now)
{
    return check_nargs(name, nargs, want) && get_i64(args[3], now) == 0;
}

/* check(item_id, receipt, next_id, now) -> Lease */
static PyObject *
ls_check(Leases *ls, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    if (!check_args(ls, "check", args, nargs, 4, &now)) {
        return NULL;
    }
    Rec *rec = check(ls, args[0], args[1], args[2], now);
    return rec == NULL ? NULL : snapshot(rec, 0);
}

/* take(item_id, receipt, next_id, now) -> Lease: check, then end the lease. */
static PyObject *
ls_take(Leases *ls, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now;
    if (!check_args(ls, "take", args, nargs, 4, &now)) {
        return NULL;
    }
    Rec *rec = check(ls, args[0], args[1], args[2], now);
    if (rec == NULL) {
        return NULL;
    }
    PyObject *lease = snapshot(rec, 0);
    if (lease == NULL) {
        return NULL;
    }
    Rec out;
    take_out(ls, rec, &out);
    drop_refs(&out);
    return lease;
}

/* extend(item_id, receipt, next_id, now, expires) -> receipt: check, then move the end. */
static PyObject *
ls_extend(Leases *ls, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t now, expires;
    if (!check_args(ls, "extend", args, nargs, 5, &now) || get_i64(args[4], &expires) < 0) {
        return NULL;
    }
    Rec *rec = check(ls, args[0], args[1], args[2], now);
    if (rec == NULL) {
        return NULL;
    }
    PyObject *receipt = receipt_of(ls, rec->id, rec->delivery);
    if (receipt == NULL) {
        return NULL;
    }
    int64_t old = rec->expires;
    size_t pos = rec->xpos;
    rec->expires = expires;
    if (expires < old) {
        x_up(ls, pos);
    } else {
        x_down(ls, pos);
    }
    return receipt;
}

static PyObject *
ls_pop(Leases *ls, PyObject *item_id)
{
    uint64_t id;
    if (get_id(item_id, &id) < 0) {
        return NULL;
    }
    Rec *rec = find(ls, id);
    if (rec == NULL) {
        PyErr_SetObject(PyExc_KeyError, item_id);
        return NULL;
    }
    Rec out;
    take_out(ls, rec, &out);
    PyObject *lease = snapshot(&out, 1);
    if (lease == NULL) {
        drop_refs(&out);
    }
    return lease;
}

static PyObject *
ls_get(Leases *ls, PyObject *item_id)
{
    if (!PyLong_Check(item_id)) {
        Py_RETURN_NONE;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(item_id);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Rec *rec = find(ls, v);
    if (rec == NULL) {
        Py_RETURN_NONE;
    }
    return snapshot(rec, 0);
}

static PyObject *
ls_values(Leases *ls, PyObject *unused)
{
    PyObject *out = PyList_New((Py_ssize_t)ls->n);
    if (out == NULL) {
        return NULL;
    }
    for (size_t k = 0; k < ls->n; k++) {
        PyObject *lease = snapshot(&ls->r[k], 0);
        PyObject *pair = lease ? Py_BuildValue("(KN)", (unsigned long long)ls->r[k].id, lease)
                               : NULL;
        if (pair == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)k, pair);
    }
    return out;
}

static PyObject *
ls_oldest_since(Leases *ls, PyObject *unused)
{
    if (ls->n == 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong(ls->r[ls->oheap[0]].since);
}

static PyObject *
ls_next_expiry(Leases *ls, PyObject *unused)
{
    if (ls->n == 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong(ls->r[ls->xheap[0]].expires);
}

static PyObject *
ls_pop_expired(Leases *ls, PyObject *arg)
{
    int64_t now;
    if (get_i64(arg, &now) < 0) {
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    while (ls->n > 0 && ls->r[ls->xheap[0]].expires <= now) {
        Rec *rec = &ls->r[ls->xheap[0]];
        PyObject *lease = snapshot(rec, 0);
        PyObject *pair =
            lease ? Py_BuildValue("(KN)", (unsigned long long)rec->id, lease) : NULL;
        if (pair == NULL || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(out);
            return NULL; /* the leases not yet listed stay */
        }
        Py_DECREF(pair);
        Rec gone;
        take_out(ls, rec, &gone);
        drop_refs(&gone); /* the snapshot holds its own references */
    }
    return out;
}

static PyObject *
ls_sizeof(Leases *ls, PyObject *unused)
{
    return PyLong_FromSize_t(Py_TYPE(ls)->tp_basicsize + ls->allocated);
}

static PyObject *
get_epoch(Leases *ls, void *c)
{
    return Py_NewRef(ls->epoch);
}

static PyObject *
get_allocated(Leases *ls, void *c)
{
    return PyLong_FromSize_t(ls->allocated);
}

static PyMethodDef ls_methods[] = {
    {"add", (PyCFunction)(void (*)(void))ls_add, METH_FASTCALL,
     "add(item_id, key, enqueue_time, requeue_time, dequeue_count, expires, source, since, "
     "group) -> receipt: lease an item (not leased now) as a new delivery."},
    {"restore", (PyCFunction)(void (*)(void))ls_restore, METH_FASTCALL,
     "restore(item_id, lease): put back a lease taken for a write that was then refused: "
     "the same delivery, so its receipt still works."},
    {"check", (PyCFunction)(void (*)(void))ls_check, METH_FASTCALL,
     "check(item_id, receipt, next_id, now) -> Lease: the live lease the receipt names, or "
     "raise InvalidReceipt, ItemNotFound or StaleReceipt."},
    {"take", (PyCFunction)(void (*)(void))ls_take, METH_FASTCALL,
     "take(item_id, receipt, next_id, now) -> Lease: check, then end the lease."},
    {"extend", (PyCFunction)(void (*)(void))ls_extend, METH_FASTCALL,
     "extend(item_id, receipt, next_id, now, expires) -> receipt: check, then make the "
     "lease end at expires (the same delivery)."},
    {"pop", (PyCFunction)ls_pop, METH_O, "pop(item_id) -> Lease: end a lease (KeyError)."},
    {"get", (PyCFunction)ls_get, METH_O, "get(item_id) -> Lease | None."},
    {"values", (PyCFunction)ls_values, METH_NOARGS,
     "Every live lease as (id, Lease): for operator reads (browse, stats)."},
    {"oldest_since", (PyCFunction)ls_oldest_since, METH_NOARGS,
     "The earliest dequeue time of a live lease, None if none."},
    {"next_expiry", (PyCFunction)ls_next_expiry, METH_NOARGS,
     "When the first live lease runs out, None if none."},
    {"pop_expired", (PyCFunction)ls_pop_expired, METH_O,
     "pop_expired(now) -> [(id, Lease)]: end the leases that ran out by now, in (expires, "
     "id) order."},
    {"__sizeof__", (PyCFunction)ls_sizeof, METH_NOARGS, "The object and what it holds."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ls_getset[] = {
    {"epoch", (getter)get_epoch, NULL, "the random first part of this set's receipts", NULL},
    {"allocated", (getter)get_allocated, NULL, "bytes held from the allocator", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods ls_as_sequence = {
    .sq_length = (lenfunc)ls_len,
    .sq_contains = (objobjproc)ls_contains,
};

static PyTypeObject LeasesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dq.storage._leases.Leases",
    .tp_doc = PyDoc_STR("Leases()\n--\n\n"
                        "One queue's in-flight set: who holds which item, until when, under "
                        "which receipt."),
    .tp_basicsize = sizeof(Leases),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = ls_new,
    .tp_dealloc = (destructor)ls_dealloc,
    .tp_traverse = (traverseproc)ls_traverse,
    .tp_clear = (inquiry)ls_clear,
    .tp_methods = ls_methods,
    .tp_getset = ls_getset,
    .tp_as_sequence = &ls_as_sequence,
};

/* ---- Lease --------------------------------------------------------------------------- */

static PyObject *
lease_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"key", "enqueue_time", "requeue_time", "dequeue_count", "expires",
                             "delivery", "source", "since", "group", NULL};
    PyObject *key, *source, *group = Py_None;
    long long enq, req, cnt, expires, delivery, since = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "SLLLLLO|LO:Lease", kwlist, &key, &enq, &req,
                                     &cnt, &expires, &delivery, &source, &since, &group)) {
        return NULL;
    }
    if (PyBytes_GET_SIZE(key) != KEY) {
        PyErr_SetString(PyExc_TypeError, "a lease's key is 16 bytes");
        return NULL;
    }
    if (!check_group(group)) {
        return NULL;
    }
    Lease *l = (Lease *)type->tp_alloc(type, 0);
    if (l == NULL) {
        return NULL;
    }
    l->key = Py_NewRef(key);
    l->enqueue_time = enq;
    l->requeue_time = req;
    l->dequeue_count = cnt;
    l->expires = expires;
    l->delivery = delivery;
    l->since = since;
    l->source = Py_NewRef(source);
    l->group = Py_NewRef(group);
    return (PyObject *)l;
}

static int
lease_traverse(Lease *l, visitproc visit, void *arg)
{
    Py_VISIT(l->source);
    Py_VISIT(l->group);
    return 0;
}

static int
lease_clear(Lease *l)
{
    Py_CLEAR(l->source);
    Py_CLEAR(l->group);
    return 0;
}

static void
lease_dealloc(Lease *l)
{
    PyObject_GC_UnTrack(l);
    Py_CLEAR(l->key);
    lease_clear(l);
    Py_TYPE(l)->tp_free((PyObject *)l);
}

static PyObject *
lease_repr(Lease *l)
{
    return PyUnicode_FromFormat("Lease(key=%R, enqueue_time=%lld, requeue_time=%lld, "
                                "dequeue_count=%lld, expires=%lld, delivery=%lld, since=%lld, "
                                "group=%R)",
                                l->key, l->enqueue_time, l->requeue_time, l->dequeue_count,
                                l->expires, l->delivery, l->since, l->group);
}

static PyMemberDef lease_members[] = {
    {"key", T_OBJECT, offsetof(Lease, key), READONLY, "the item's 16-byte key"},
    {"enqueue_time", T_LONGLONG, offsetof(Lease, enqueue_time), READONLY, NULL},
    {"requeue_time", T_LONGLONG, offsetof(Lease, requeue_time), READONLY, NULL},
    {"dequeue_count", T_LONGLONG, offsetof(Lease, dequeue_count), READONLY,
     "deliveries of the item, this one included"},
    {"expires", T_LONGLONG, offsetof(Lease, expires), READONLY, "when the lease ends"},
    {"delivery", T_LONGLONG, offsetof(Lease, delivery), READONLY,
     "the delivery its receipt names"},
    {"since", T_LONGLONG, offsetof(Lease, since), READONLY,
     "when this delivery began (dequeue time; extends keep it)"},
    {"source", T_OBJECT, offsetof(Lease, source), READONLY,
     "where the pending entry lives (a hint for value lookups)"},
    {"group", T_OBJECT, offsetof(Lease, group), READONLY, "the item's group, or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LeaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dq.storage._leases.Lease",
    .tp_doc = PyDoc_STR("Lease(key, enqueue_time, requeue_time, dequeue_count, expires, "
                        "delivery, source, since=0, group=None)\n--\n\n"
                        "One live delivery as it was when read (a snapshot)."),
    .tp_basicsize = sizeof(Lease),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = lease_new,
    .tp_dealloc = (destructor)lease_dealloc,
    .tp_traverse = (traverseproc)lease_traverse,
    .tp_clear = (inquiry)lease_clear,
    .tp_repr = (reprfunc)lease_repr,
    .tp_members = lease_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dq.storage._leases",
    .m_doc = "The in-flight set as compact compiled records (storage/_leases.c).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__leases(void)
{
    if (PyType_Ready(&LeasesType) < 0 || PyType_Ready(&LeaseType) < 0) {
        return NULL;
    }
    if (str_id == NULL && ((str_id = PyUnicode_InternFromString("id")) == NULL ||
                           (str_receipt = PyUnicode_InternFromString("receipt")) == NULL)) {
        return NULL;
    }
    if (InvalidReceipt == NULL) {
        PyObject *errors = PyImport_ImportModule("dq.storage.errors");
        if (errors == NULL) {
            return NULL;
        }
        InvalidReceipt = PyObject_GetAttrString(errors, "InvalidReceipt");
        ItemNotFound = PyObject_GetAttrString(errors, "ItemNotFound");
        StaleReceipt = PyObject_GetAttrString(errors, "StaleReceipt");
        Py_DECREF(errors);
        if (InvalidReceipt == NULL || ItemNotFound == NULL || StaleReceipt == NULL) {
            Py_CLEAR(InvalidReceipt);
            Py_CLEAR(ItemNotFound);
            Py_CLEAR(StaleReceipt);
            return NULL;
        }
    }
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) {
        return NULL;
    }
    Py_INCREF(&LeasesType);
    Py_INCREF(&LeaseType);
    if (PyModule_AddObject(mod, "Leases", (PyObject *)&LeasesType) < 0 ||
        PyModule_AddObject(mod, "Lease", (PyObject *)&LeaseType) < 0 ||
        PyModule_AddIntConstant(mod, "KEY", KEY) < 0 ||
        PyModule_AddIntConstant(mod, "RECORD", sizeof(Rec)) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
