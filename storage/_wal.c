/*
 * storage/_wal.c -- the write-ahead log's record framing and the system calls of a group
 * commit round, compiled.
 *
 * Framing (docs/format.md, "Write-ahead log"): a record is
 *     length u32 | crc32 u32 (over the type byte, then the payload) | type u8 | payload
 * big-endian; CRC-32 is the IEEE polynomial as zlib's crc32 (reflected 0xEDB88320, slice
 * by 8 here). frame_into() appends a whole record to the log's buffer in one call.
 *
 * System calls: pwrite_all() and fdatasync() are the only file steps this module can take,
 * each with the GIL released, and pwrite_fdatasync() is both in one release of the GIL (a
 * durable round's write and its sync: no wait for the GIL between them while another
 * thread runs Python). None of them is called but from storage/fileio.py, the one place
 * every file step goes through: it announces each step to the fault hooks first and
 * keeps the simulated power loss's books (tests/storage/test_wal_seam.py fails if any
 * other module calls them, or if this file makes a system call outside them).
 *
 * No state of this module is used without the GIL: a call without it reads only its own
 * arguments and the buffer it holds exported (the caller's data cannot be freed or
 * resized meanwhile); the descriptor stays open because the log's io_lock is held by
 * the caller (storage/wal.py) around every write and sync.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define RECORD_HEADER 9
/* a CRC over this many bytes or more is computed with the GIL released */
#define CRC_NOGIL 65536

static uint32_t crc_table[8][256];

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        }
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        for (int t = 1; t < 8; t++) {
            uint32_t c = crc_table[t - 1][i];
            crc_table[t][i] = (c >> 8) ^ crc_table[0][c & 0xFF];
        }
    }
}

/* zlib's crc32(crc, p, n): continue the CRC-32 `crc` over n bytes at p. */
static uint32_t
crc32_update(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
              crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
              crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) {
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    }
    return ~crc;
}

static uint32_t
crc32_buffer(uint32_t crc, const uint8_t *p, size_t n)
{
    if (n < CRC_NOGIL) {
        return crc32_update(crc, p, n);
    }
    Py_BEGIN_ALLOW_THREADS
    crc = crc32_update(crc, p, n);
    Py_END_ALLOW_THREADS
    return crc;
}

static void
put_u32be(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* The 9-byte header of a record of type `kind` whose payload is `body`. */
static int
record_header(uint8_t *out, const uint8_t *body, Py_ssize_t len, int kind)
{
    if ((size_t)len > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a log record holds less than 4 GiB");
        return -1;
    }
    uint8_t k = (uint8_t)kind;
    uint32_t crc = crc32_buffer(crc32_update(0, &k, 1), body, (size_t)len);
    put_u32be(out, (uint32_t)len);
    put_u32be(out + 4, crc);
    out[8] = k;
    return 0;
}

static int
check_kind(int kind)
{
    if (kind < 0 || kind > 255) {
        PyErr_Format(PyExc_ValueError, "a record type is one byte, not %d", kind);
        return -1;
    }
    return 0;
}

/* ---- framing ------------------------------------------------------------------------ */

PyDoc_STRVAR(crc32_doc,
"crc32(data, value=0, /)\n--\n\nCRC-32 of `data` continued from `value`, as zlib.crc32.");

static PyObject *
wal_crc32(PyObject *mod, PyObject *args)
{
    Py_buffer data;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32", &data, &value)) {
        return NULL;
    }
    uint32_t crc = crc32_buffer(value, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(header_doc,
"header(body, kind, /)\n--\n\nThe 9-byte header that frames `body` as a record of type `kind`.");

static PyObject *
wal_header(PyObject *mod, PyObject *args)
{
    Py_buffer body;
    int kind;
    if (!PyArg_ParseTuple(args, "y*i:header", &body, &kind)) {
        return NULL;
    }
    uint8_t out[RECORD_HEADER];
    PyObject *res = NULL;
    if (check_kind(kind) == 0 && record_header(out, body.buf, body.len, kind) == 0) {
        res = PyBytes_FromStringAndSize((const char *)out, RECORD_HEADER);
    }
    PyBuffer_Release(&body);
    return res;
}

PyDoc_STRVAR(frame_into_doc,
"frame_into(buffer, body, kind, /)\n--\n\n"
"Append the record framing `body` as type `kind` (header, then body) to the bytearray\n"
"`buffer`; return the record's size.");

static PyObject *
wal_frame_into(PyObject *mod, PyObject *args)
{
    PyObject *buffer;
    Py_buffer body;
    int kind;
    if (!PyArg_ParseTuple(args, "O!y*i:frame_into", &PyByteArray_Type, &buffer, &body, &kind)) {
        return NULL;
    }
    PyObject *res = NULL;
    Py_ssize_t old = PyByteArray_GET_SIZE(buffer);
    if (check_kind(kind) < 0) {
        goto done;
    }
    if (body.len > PY_SSIZE_T_MAX - RECORD_HEADER - old) {
        PyErr_NoMemory();
        goto done;
    }
    uint8_t head[RECORD_HEADER];
    if (record_header(head, body.buf, body.len, kind) < 0) {
        goto done;
    }
    /* fails (BufferError) if the bytearray is exported: then nothing is appended */
    if (PyByteArray_Resize(buffer, old + RECORD_HEADER + body.len) < 0) {
        goto done;
    }
    uint8_t *p = (uint8_t *)PyByteArray_AS_STRING(buffer) + old;
    memcpy(p, head, RECORD_HEADER);
    if (body.len) {
        memcpy(p + RECORD_HEADER, body.buf, (size_t)body.len);
    }
    res = PyLong_FromSsize_t(RECORD_HEADER + body.len);
done:
    PyBuffer_Release(&body);
    return res;
}

/* ---- system calls, each announced by storage/fileio.py ------------------------------ */

/* Write all of [p, p+n) at `off`; 0 or an errno. Call without the GIL. */
static int
do_pwrite_all(int fd, const uint8_t *p, size_t n, long long off)
{
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno;
        }
        if (w == 0) {
            return EIO; /* a regular file never takes nothing: do not spin */
        }
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

static int
do_fdatasync(int fd)
{
    int rc;
    do {
        rc = fdatasync(fd);
    } while (rc < 0 && errno == EINTR);
    return rc < 0 ? errno : 0;
}

static int
parse_write(PyObject *args, const char *fmt, int *fd, Py_buffer *data, long long *off)
{
    if (!PyArg_ParseTuple(args, fmt, fd, data, off)) {
        return -1;
    }
    if (*fd < 0 || *off < 0 || data->len > LLONG_MAX - *off) {
        PyBuffer_Release(data);
        PyErr_SetString(PyExc_ValueError, "descriptor and offset must be >= 0");
        return -1;
    }
    return 0;
}

static PyObject *
raise_errno(int err)
{
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

PyDoc_STRVAR(pwrite_all_doc,
"pwrite_all(fd, data, offset, /)\n--\n\n"
"Write all of `data` at `offset` with the GIL released (OSError on failure: part of it\n"
"may have reached the file). Only storage/fileio.py calls this.");

static PyObject *
wal_pwrite_all(PyObject *mod, PyObject *args)
{
    int fd;
    Py_buffer data;
    long long off;
    if (parse_write(args, "iy*L:pwrite_all", &fd, &data, &off) < 0) {
        return NULL;
    }
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = do_pwrite_all(fd, data.buf, (size_t)data.len, off);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (err) {
        return raise_errno(err);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(fdatasync_doc,
"fdatasync(fd, /)\n--\n\nfdatasync with the GIL released (OSError on failure). Only\n"
"storage/fileio.py calls this.");

static PyObject *
wal_fdatasync(PyObject *mod, PyObject *arg)
{
    int fd;
    if (!PyArg_Parse(arg, "i:fdatasync", &fd)) {
        return NULL;
    }
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = do_fdatasync(fd);
    Py_END_ALLOW_THREADS
    if (err) {
        return raise_errno(err);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(pwrite_fdatasync_doc,
"pwrite_fdatasync(fd, data, offset, /)\n--\n\n"
"pwrite_all then fdatasync in one release of the GIL. A failed write raises OSError and\n"
"nothing is synced; a failed sync returns its errno (0: both done), so the caller can\n"
"tell the two apart. Only storage/fileio.py calls this.");

static PyObject *
wal_pwrite_fdatasync(PyObject *mod, PyObject *args)
{
    int fd;
    Py_buffer data;
    long long off;
    if (parse_write(args, "iy*L:pwrite_fdatasync", &fd, &data, &off) < 0) {
        return NULL;
    }
    int werr, serr = 0;
    Py_BEGIN_ALLOW_THREADS
    werr = do_pwrite_all(fd, data.buf, (size_t)data.len, off);
    if (!werr) {
        serr = do_fdatasync(fd);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (werr) {
        return raise_errno(werr);
    }
    return PyLong_FromLong(serr);
}

static PyMethodDef methods[] = {
    {"crc32", wal_crc32, METH_VARARGS, crc32_doc},
    {"header", wal_header, METH_VARARGS, header_doc},
    {"frame_into", wal_frame_into, METH_VARARGS, frame_into_doc},
    {"pwrite_all", wal_pwrite_all, METH_VARARGS, pwrite_all_doc},
    {"fdatasync", wal_fdatasync, METH_O, fdatasync_doc},
    {"pwrite_fdatasync", wal_pwrite_fdatasync, METH_VARARGS, pwrite_fdatasync_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "dq.storage._wal",
    .m_doc = "The log's record framing and a group commit's system calls (storage/_wal.c).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__wal(void)
{
    crc_init();
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(mod, "RECORD_HEADER", RECORD_HEADER) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
