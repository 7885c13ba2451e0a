/*
 * shm/_atomics.c -- ordered loads/stores, CAS, fetch-add and futex wait/wake on any
 * Python buffer (mmap, bytearray, memoryview) at a byte offset.
 *
 * Why: CPython cannot do compare-and-swap or acquire/release accesses on shared memory,
 * and the PyPI `atomics` package costs microseconds per call. Every function here is
 * one `__atomic` builtin or one futex syscall behind a bounds and alignment check.
 *
 * Invariants kept:
 *   - every access is checked: 0 <= off, off + size <= len(buf), address aligned to the
 *     access size; violations raise ValueError, never touch memory;
 *   - loads are acquire, stores are release, read-modify-writes are acq_rel (CAS: strong);
 *   - futexes are *shared* (no FUTEX_PRIVATE_FLAG) so they work across processes on
 *     MAP_SHARED memory;
 *   - the GIL is released around everything that can block (futex wait, spin-wait), and
 *     the buffer stays exported meanwhile so the mapping cannot be closed under us.
 *
 * The protocol docs are in docs/shm.md ("Atomics and waking").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- buffer access ------------------------------------------------------------------ */

/* Export `obj` as a contiguous buffer and check [off, off+size) is inside and aligned. */
static int
get_addr(PyObject *obj, PyObject *off_obj, Py_ssize_t size, int writable, Py_buffer *view,
         char **addr)
{
    Py_ssize_t off = PyNumber_AsSsize_t(off_obj, PyExc_ValueError);
    if (off == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        return -1;
    }
    if (off < 0 || off > view->len - size) {
        PyErr_Format(PyExc_ValueError, "offset %zd out of bounds for a %zd-byte access "
                     "in a buffer of %zd bytes", off, size, view->len);
        PyBuffer_Release(view);
        return -1;
    }
    char *p = (char *)view->buf + off;
    if (((uintptr_t)p) % (uintptr_t)size != 0) {
        PyErr_Format(PyExc_ValueError, "offset %zd is not %zd-byte aligned", off, size);
        PyBuffer_Release(view);
        return -1;
    }
    *addr = p;
    return 0;
}

/* An unsigned value that must fit in `bits` bits (ValueError otherwise). */
static int
get_unsigned(PyObject *obj, int bits, uint64_t *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "value must be an int");
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "value out of range for u%d", bits);
        return -1;
    }
    if (bits < 64 && (v >> bits) != 0) {
        PyErr_Format(PyExc_ValueError, "value out of range for u%d", bits);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

/* A delta for fetch-add/sub: any int, taken modulo 2**64 (the result wraps). */
static int
get_delta(PyObject *obj, uint64_t *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "delta must be an int");
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLongMask(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

static int
check_nargs(const char *name, Py_ssize_t nargs, Py_ssize_t want)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd arguments (%zd given)", name,
                     want, nargs);
        return -1;
    }
    return 0;
}

/* ---- loads and stores --------------------------------------------------------------- */

#define DEFINE_LOAD(NAME, TYPE)                                                           \
    static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs)         \
    {                                                                                     \
        Py_buffer view;                                                                   \
        char *p;                                                                          \
        if (check_nargs(#NAME, nargs, 2) < 0 ||                                           \
            get_addr(args[0], args[1], sizeof(TYPE), 0, &view, &p) < 0) {                 \
            return NULL;                                                                  \
        }                                                                                 \
        TYPE v = __atomic_load_n((TYPE *)p, __ATOMIC_ACQUIRE);                            \
        PyBuffer_Release(&view);                                                          \
        return PyLong_FromUnsignedLongLong((unsigned long long)v);                        \
    }

DEFINE_LOAD(load_u8, uint8_t)
DEFINE_LOAD(load_u32, uint32_t)
DEFINE_LOAD(load_u64, uint64_t)

#define DEFINE_STORE(NAME, TYPE, BITS)                                                    \
    static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs)         \
    {                                                                                     \
        Py_buffer view;                                                                   \
        char *p;                                                                          \
        uint64_t v;                                                                       \
        if (check_nargs(#NAME, nargs, 3) < 0 || get_unsigned(args[2], BITS, &v) < 0 ||    \
            get_addr(args[0], args[1], sizeof(TYPE), 1, &view, &p) < 0) {                 \
            return NULL;                                                                  \
        }                                                                                 \
        __atomic_store_n((TYPE *)p, (TYPE)v, __ATOMIC_RELEASE);                           \
        PyBuffer_Release(&view);                                                          \
        Py_RETURN_NONE;                                                                   \
    }

DEFINE_STORE(store_u8, uint8_t, 8)
DEFINE_STORE(store_u32, uint32_t, 32)
DEFINE_STORE(store_u64, uint64_t, 64)

/* ---- read-modify-write ---------------------------------------------------------------- */

#define DEFINE_CAS(NAME, TYPE, BITS)                                                      \
    static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs)         \
    {                                                                                     \
        Py_buffer view;                                                                   \
        char *p;                                                                          \
        uint64_t expected, desired;                                                       \
        if (check_nargs(#NAME, nargs, 4) < 0 || get_unsigned(args[2], BITS, &expected) < 0 || \
            get_unsigned(args[3], BITS, &desired) < 0 ||                                  \
            get_addr(args[0], args[1], sizeof(TYPE), 1, &view, &p) < 0) {                 \
            return NULL;                                                                  \
        }                                                                                 \
        TYPE exp = (TYPE)expected;                                                        \
        int ok = __atomic_compare_exchange_n((TYPE *)p, &exp, (TYPE)desired, 0,           \
                                             __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);         \
        PyBuffer_Release(&view);                                                          \
        return PyBool_FromLong(ok);                                                       \
    }

DEFINE_CAS(cas_u32, uint32_t, 32)
DEFINE_CAS(cas_u64, uint64_t, 64)

#define DEFINE_RMW(NAME, TYPE, BUILTIN)                                                   \
    static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs)         \
    {                                                                                     \
        Py_buffer view;                                                                   \
        char *p;                                                                          \
        uint64_t delta;                                                                   \
        if (check_nargs(#NAME, nargs, 3) < 0 || get_delta(args[2], &delta) < 0 ||         \
            get_addr(args[0], args[1], sizeof(TYPE), 1, &view, &p) < 0) {                 \
            return NULL;                                                                  \
        }                                                                                 \
        TYPE old = BUILTIN((TYPE *)p, (TYPE)delta, __ATOMIC_ACQ_REL);                     \
        PyBuffer_Release(&view);                                                          \
        return PyLong_FromUnsignedLongLong((unsigned long long)old);                      \
    }

DEFINE_RMW(fetch_add_u32, uint32_t, __atomic_fetch_add)
DEFINE_RMW(fetch_add_u64, uint64_t, __atomic_fetch_add)
DEFINE_RMW(fetch_sub_u32, uint32_t, __atomic_fetch_sub)
DEFINE_RMW(fetch_sub_u64, uint64_t, __atomic_fetch_sub)

static PyObject *
fence(PyObject *self, PyObject *unused)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

/* ---- time and futex ------------------------------------------------------------------ */

static inline int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
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

/* Parse a timeout in seconds: None -> -1 (forever), else >= 0 nanoseconds. */
static int
get_timeout_ns(PyObject *obj, int64_t *out)
{
    if (obj == NULL || obj == Py_None) {
        *out = -1;
        return 0;
    }
    double t = PyFloat_AsDouble(obj);
    if (t == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    if (isnan(t)) {
        PyErr_SetString(PyExc_ValueError, "timeout must not be NaN");
        return -1;
    }
    if (t < 0) {
        t = 0;
    }
    if (t > 1e9) {
        *out = -1; /* effectively forever */
        return 0;
    }
    *out = (int64_t)(t * 1e9);
    return 0;
}

/* One shared FUTEX_WAIT; relative timeout in ns (-1 = none). Returns 0 or an errno. */
static int
futex_wait_raw(uint32_t *addr, uint32_t expected, int64_t timeout_ns)
{
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
        ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
        tsp = &ts;
    }
    long r = syscall(SYS_futex, addr, FUTEX_WAIT, expected, tsp, NULL, 0);
    return r == 0 ? 0 : errno;
}

static PyObject *
py_futex_wait(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "off", "expected", "timeout_s", NULL};
    PyObject *buf, *off, *exp_obj, *timeout_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|O:futex_wait", kwlist, &buf, &off,
                                     &exp_obj, &timeout_obj)) {
        return NULL;
    }
    uint64_t expected;
    int64_t timeout_ns;
    Py_buffer view;
    char *p;
    if (get_unsigned(exp_obj, 32, &expected) < 0 || get_timeout_ns(timeout_obj, &timeout_ns) < 0 ||
        get_addr(buf, off, 4, 0, &view, &p) < 0) {
        return NULL;
    }
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = futex_wait_raw((uint32_t *)p, (uint32_t)expected, timeout_ns);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    switch (err) {
    case 0:
    case EAGAIN:
        Py_RETURN_TRUE;
    case ETIMEDOUT:
        Py_RETURN_FALSE;
    case EINTR:
        if (PyErr_CheckSignals() < 0) {
            return NULL;
        }
        Py_RETURN_TRUE; /* a spurious wake: callers re-check their condition */
    default:
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
}

static PyObject *
py_futex_wake(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "off", "n", NULL};
    PyObject *buf, *off;
    int n = INT_MAX;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|i:futex_wake", kwlist, &buf, &off, &n)) {
        return NULL;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    Py_buffer view;
    char *p;
    if (get_addr(buf, off, 4, 0, &view, &p) < 0) {
        return NULL;
    }
    long r = syscall(SYS_futex, (uint32_t *)p, FUTEX_WAKE, n, NULL, NULL, 0);
    int err = errno;
    PyBuffer_Release(&view);
    if (r < 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(r);
}

/* ---- spin, then park ------------------------------------------------------------------- */

static inline uint64_t
load_sized(const char *p, int size)
{
    switch (size) {
    case 1:
        return __atomic_load_n((const uint8_t *)p, __ATOMIC_ACQUIRE);
    case 4:
        return __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE);
    default:
        return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
    }
}

/*
 * Wait until the `size`-byte value at `p` differs from `old`. Spin for `spin_ns`, then
 * park on the aligned 32-bit futex word `w` (which must change whenever the value does, or
 * be woken by the writer). Runs without the GIL. Returns 0 with *out set (the new value;
 * or the unchanged one after a FUTEX_WAKE, so a waker can interrupt the wait), ETIMEDOUT,
 * or EINTR (the caller checks signals and calls again with the remaining time).
 */
static int
spin_then_park(const char *p, int size, uint64_t old, uint32_t *w, int64_t spin_ns,
               int64_t deadline_ns, uint64_t *out)
{
    int64_t start = now_ns();
    int64_t spin_end = start + spin_ns;
    unsigned i = 0;
    for (;;) {
        uint64_t v = load_sized(p, size);
        if (v != old) {
            *out = v;
            return 0;
        }
        if ((++i & 63) != 0) {
            cpu_relax();
            continue;
        }
        int64_t now = now_ns();
        if (deadline_ns >= 0 && now >= deadline_ns) {
            return ETIMEDOUT;
        }
        if (now < spin_end) {
            cpu_relax();
            continue;
        }
        /* Park: read the futex word, re-check the value, sleep only if still unchanged. */
        uint32_t wv = __atomic_load_n(w, __ATOMIC_ACQUIRE);
        v = load_sized(p, size);
        if (v != old) {
            *out = v;
            return 0;
        }
        int64_t left = deadline_ns >= 0 ? deadline_ns - now : -1;
        int err = futex_wait_raw(w, wv, left);
        if (err == EINTR) {
            return EINTR;
        }
        if (err == 0) {
            /* woken: report the current value even if unchanged, so that a futex_wake
               without a change (e.g. "stop waiting") reaches the caller */
            *out = load_sized(p, size);
            return 0;
        }
    }
}

static PyObject *
spin_wait(PyObject *args, PyObject *kwargs, int size, const char *fmt)
{
    static char *kwlist[] = {"buf", "off", "old", "timeout_s", "spin_us", "futex_off", NULL};
    PyObject *buf, *off, *old_obj, *timeout_obj = Py_None, *futex_off_obj = Py_None;
    double spin_us = 50.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, fmt, kwlist, &buf, &off, &old_obj,
                                     &timeout_obj, &spin_us, &futex_off_obj)) {
        return NULL;
    }
    uint64_t old;
    int64_t timeout_ns;
    if (get_unsigned(old_obj, size * 8, &old) < 0 || get_timeout_ns(timeout_obj, &timeout_ns) < 0) {
        return NULL;
    }
    if (isnan(spin_us) || spin_us < 0) {
        PyErr_SetString(PyExc_ValueError, "spin_us must be >= 0");
        return NULL;
    }
    Py_buffer view, wview;
    char *p, *w;
    if (get_addr(buf, off, size, 0, &view, &p) < 0) {
        return NULL;
    }
    if (futex_off_obj == Py_None) {
        /* Default futex word: the aligned 32-bit word holding the value (low word of a u64). */
        Py_ssize_t o = PyNumber_AsSsize_t(off, PyExc_ValueError);
        futex_off_obj = PyLong_FromSsize_t(o & ~(Py_ssize_t)3);
    }
    else {
        Py_INCREF(futex_off_obj);
    }
    if (futex_off_obj == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int rc = get_addr(buf, futex_off_obj, 4, 0, &wview, &w);
    Py_DECREF(futex_off_obj);
    if (rc < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int64_t deadline_ns = timeout_ns >= 0 ? now_ns() + timeout_ns : -1;
    int64_t spin_ns = (int64_t)(spin_us * 1000.0);
    uint64_t out = 0;
    int err;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        err = spin_then_park(p, size, old, (uint32_t *)w, spin_ns, deadline_ns, &out);
        Py_END_ALLOW_THREADS
        if (err != EINTR) {
            break;
        }
        if (PyErr_CheckSignals() < 0) {
            PyBuffer_Release(&wview);
            PyBuffer_Release(&view);
            return NULL;
        }
        spin_ns = 0;
    }
    PyBuffer_Release(&wview);
    PyBuffer_Release(&view);
    if (err == ETIMEDOUT) {
        Py_RETURN_NONE;
    }
    return PyLong_FromUnsignedLongLong((unsigned long long)out);
}

static PyObject *
spin_wait_u8(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return spin_wait(args, kwargs, 1, "OOO|OdO:spin_wait_u8");
}

static PyObject *
spin_wait_u32(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return spin_wait(args, kwargs, 4, "OOO|OdO:spin_wait_u32");
}

static PyObject *
spin_wait_u64(PyObject *self, PyObject *args, PyObject *kwargs)
{
    return spin_wait(args, kwargs, 8, "OOO|OdO:spin_wait_u64");
}

/* ---- module ------------------------------------------------------------------------------ */

#define FAST(name, doc) {#name, (PyCFunction)(void (*)(void))name, METH_FASTCALL, doc}
#define KW(pyname, cname, doc) \
    {pyname, (PyCFunction)(void (*)(void))cname, METH_VARARGS | METH_KEYWORDS, doc}

static PyMethodDef methods[] = {
    FAST(load_u8, "load_u8(buf, off) -> int: acquire load."),
    FAST(load_u32, "load_u32(buf, off) -> int: acquire load."),
    FAST(load_u64, "load_u64(buf, off) -> int: acquire load."),
    FAST(store_u8, "store_u8(buf, off, v): release store."),
    FAST(store_u32, "store_u32(buf, off, v): release store."),
    FAST(store_u64, "store_u64(buf, off, v): release store."),
    FAST(cas_u32, "cas_u32(buf, off, expected, desired) -> bool: strong acq_rel CAS."),
    FAST(cas_u64, "cas_u64(buf, off, expected, desired) -> bool: strong acq_rel CAS."),
    FAST(fetch_add_u32, "fetch_add_u32(buf, off, delta) -> old value (wraps)."),
    FAST(fetch_add_u64, "fetch_add_u64(buf, off, delta) -> old value (wraps)."),
    FAST(fetch_sub_u32, "fetch_sub_u32(buf, off, delta) -> old value (wraps)."),
    FAST(fetch_sub_u64, "fetch_sub_u64(buf, off, delta) -> old value (wraps)."),
    {"fence", fence, METH_NOARGS, "fence(): sequentially consistent fence."},
    KW("futex_wait", py_futex_wait,
       "futex_wait(buf, off, expected, timeout_s=None) -> bool: sleep while the u32 at off "
       "equals expected; False on timeout. Shared futex, GIL released."),
    KW("futex_wake", py_futex_wake,
       "futex_wake(buf, off, n=INT_MAX) -> int: wake up to n waiters; returns how many."),
    KW("spin_wait_u8", spin_wait_u8,
       "spin_wait_u8(buf, off, old, timeout_s=None, spin_us=50.0, futex_off=None) -> int | None"),
    KW("spin_wait_u32", spin_wait_u32,
       "spin_wait_u32(buf, off, old, timeout_s=None, spin_us=50.0, futex_off=None) -> int | None"),
    KW("spin_wait_u64", spin_wait_u64,
       "spin_wait_u64(buf, off, old, timeout_s=None, spin_us=50.0, futex_off=None) -> int | None"),
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "dq.shm._atomics",
    "Acquire/release loads and stores, CAS, fetch-add and shared futex wait/wake on "
    "Python buffers. See docs/shm.md.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__atomics(void)
{
    return PyModule_Create(&module);
}
