/*
 * server/_hotwire.c -- the HTTP fast path's request bodies and answers, compiled.
 *
 * Parsing: the JSON bodies of POST /v1/queues/{queue}/items, /release and /dequeue
 * (docs/http.md) read straight into what the operations take (storage/itemops.py's
 * arguments: NewItem and Release objects, a dequeue's fields), where pydantic's
 * validate_json made dicts that Python then turned into those objects. The parser is
 * driven by the three schemas (server/schemas.py) and accepts a strict part of what
 * they accept: JSON as RFC 8259 writes it, each field at most once, integers written as
 * integers, strings of valid UTF-8 (escapes included, surrogates only in pairs), values
 * within the schema's bounds (given by bind(), from storage/validation.py and
 * storage/codec.py: the rules stay in one place). Anything else -- a float or a string
 * where an integer goes (pydantic's lax mode takes 5.0 and "5"), a repeated key, an
 * unknown key, a value out of bounds, invalid base64, deadline with delay_ms, an array
 * longer than the batch limit, malformed JSON -- answers None and the request goes to
 * the FastAPI app (Responder.fall_back), which validates it with pydantic and words any
 * error as it always did. So an accepted body gives exactly what pydantic and
 * server/schemas.py's to_new_items / to_releases give; tests/server/test_hotwire.py
 * checks that differentially with Hypothesis, on valid and hostile bodies.
 *
 * The parser knows the shapes, so it never recurses: nesting is at most
 * object > array > object, and any other value ends the parse.
 *
 * Formatting: the answers of an enqueue (server/answers.py's EnqueueResponse), a dequeue
 * (DequeueResponse: each value as text when it is valid UTF-8 and base64 was not asked
 * for, else base64) and a release (Results), and an answer's HTTP message (status line
 * and headers prepared by server/protocol.py, the length, the body) in one allocation.
 * Strings are escaped as json.dumps escapes them (ASCII only).
 *
 * No I/O and no waits: everything here runs with the GIL held, on the event loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ bound at import */

static PyTypeObject *new_item_type;   /* dq.storage.types.NewItem */
static PyTypeObject *release_type;    /* dq.storage.types.Release */
/* the slots' member descriptors, in NewItem's field order */
static PyObject *item_slots[6];
static PyObject *release_slots[2];
static uint64_t max_deadline, max_id, lease_low, lease_high;
static Py_ssize_t receipt_low, receipt_high;
static int bound;

static PyObject *s_keep, *s_replace, *s_utf8, *s_base64;
static PyObject *n_id, *n_deadline, *n_duplicate, *n_replaced, *n_error, *n_message,
    *n_receipt, *n_lease_expires, *n_value, *n_stats, *n_group, *n_last_error,
    *n_last_error_at, *n_enqueue_time, *n_requeue_time, *n_dequeue_count;

/* ------------------------------------------------------------------ the reader */

/* Bytes that stand for themselves inside a JSON string, read or written: printable
 * ASCII but '"' and '\\' (written, 0x7f is escaped as json.dumps escapes it; read, it
 * is plain, but rare enough to take the slower way). */
static unsigned char plain_byte[256];

static void
plain_init(void)
{
    for (int c = 0x20; c < 0x7f; c++) {
        plain_byte[c] = c != '"' && c != '\\';
    }
}

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} Cur;

static inline void
ws(Cur *c)
{
    while (c->p < c->end &&
           (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) {
        c->p++;
    }
}

/* Consume `ch` after optional whitespace; 0 when it is not there. */
static inline int
expect(Cur *c, unsigned char ch)
{
    ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A growable byte buffer: a string's decoded bytes, or an answer being written. */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
    char small[256];
} Buf;

static void
buf_init(Buf *b)
{
    b->data = b->small;
    b->len = 0;
    b->cap = (Py_ssize_t)sizeof(b->small);
}

static void
buf_free(Buf *b)
{
    if (b->data != b->small) {
        PyMem_Free(b->data);
    }
    buf_init(b);
}

static int
buf_grow(Buf *b, Py_ssize_t more)
{
    if (b->len + more <= b->cap) {
        return 0;
    }
    Py_ssize_t cap = b->cap;
    while (cap < b->len + more) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *data;
    if (b->data == b->small) {
        data = PyMem_Malloc((size_t)cap);
        if (data != NULL) {
            memcpy(data, b->small, (size_t)b->len);
        }
    }
    else {
        data = PyMem_Realloc(b->data, (size_t)cap);
    }
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int
buf_put(Buf *b, const char *s, Py_ssize_t n)
{
    if (buf_grow(b, n) < 0) {
        return -1;
    }
    memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

#define BUF_LIT(b, s) buf_put((b), (s), (Py_ssize_t)(sizeof(s) - 1))

static int
buf_utf8(Buf *b, uint32_t cp)
{
    char out[4];
    Py_ssize_t n;
    if (cp < 0x80) {
        out[0] = (char)cp;
        n = 1;
    }
    else if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    }
    else if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    }
    else {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return buf_put(b, out, n);
}

/* The length of the valid UTF-8 sequence at p (a code point past U+007F), or 0. */
static inline int
utf8_seq(const unsigned char *p, const unsigned char *end)
{
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF) {
        return end - p >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) {
            return 0;
        }
        if (c == 0xE0 && p[1] < 0xA0) {
            return 0; /* overlong */
        }
        if (c == 0xED && p[1] >= 0xA0) {
            return 0; /* a surrogate */
        }
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 ||
            (p[3] & 0xC0) != 0x80) {
            return 0;
        }
        if (c == 0xF0 && p[1] < 0x90) {
            return 0; /* overlong */
        }
        if (c == 0xF4 && p[1] >= 0x90) {
            return 0; /* past U+10FFFF */
        }
        return 4;
    }
    return 0;
}

static inline int
hex4(const unsigned char *p, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char h = p[i];
        v <<= 4;
        if (h >= '0' && h <= '9') {
            v |= (uint32_t)(h - '0');
        }
        else if (h >= 'a' && h <= 'f') {
            v |= (uint32_t)(h - 'a' + 10);
        }
        else if (h >= 'A' && h <= 'F') {
            v |= (uint32_t)(h - 'A' + 10);
        }
        else {
            return 0;
        }
    }
    *out = v;
    return 1;
}

/* A JSON string at c->p (after whitespace). Its text, as UTF-8, is either a span of
 * the input (*start, *len: no escapes in it) or, with escapes, the bytes decoded into
 * `b` (*start == NULL); *chars: its length in code points. 0: not a valid string. */
static int
read_string(Cur *c, Buf *b, const unsigned char **start, Py_ssize_t *len, Py_ssize_t *chars)
{
    ws(c);
    if (c->p >= c->end || *c->p != '"') {
        return 0;
    }
    const unsigned char *p = ++c->p, *end = c->end, *run = p;
    Py_ssize_t n = 0;
    int escaped = 0;
    b->len = 0;
    while (p < end) {
        const unsigned char *plain = p;
        while (p < end && plain_byte[*p]) {
            p++;
        }
        n += p - plain;
        if (p == end) {
            break;
        }
        unsigned char ch = *p;
        if (ch == '"') {
            if (escaped) {
                if (buf_put(b, (const char *)run, p - run) < 0) {
                    return -1;
                }
                *start = NULL;
                *len = b->len;
            }
            else {
                *start = run;
                *len = p - run;
            }
            *chars = n;
            c->p = p + 1;
            return 1;
        }
        if (ch < 0x20) {
            return 0;
        }
        if (ch < 0x80) {
            if (ch == '\\') {
                if (buf_put(b, (const char *)run, p - run) < 0) {
                    return -1;
                }
                escaped = 1;
                if (end - p < 2) {
                    return 0;
                }
                unsigned char e = p[1];
                char out;
                p += 2;
                switch (e) {
                case '"': out = '"'; break;
                case '\\': out = '\\'; break;
                case '/': out = '/'; break;
                case 'b': out = '\b'; break;
                case 'f': out = '\f'; break;
                case 'n': out = '\n'; break;
                case 'r': out = '\r'; break;
                case 't': out = '\t'; break;
                case 'u': {
                    uint32_t cp;
                    if (end - p < 4 || !hex4(p, &cp)) {
                        return 0;
                    }
                    p += 4;
                    if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        return 0; /* a lone low surrogate */
                    }
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        uint32_t lo;
                        if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, &lo) ||
                            lo < 0xDC00 || lo > 0xDFFF) {
                            return 0; /* a high surrogate without its low one */
                        }
                        p += 6;
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    }
                    if (buf_utf8(b, cp) < 0) {
                        return -1;
                    }
                    n++;
                    run = p;
                    continue;
                }
                default:
                    return 0;
                }
                if (buf_put(b, &out, 1) < 0) {
                    return -1;
                }
                n++;
                run = p;
                continue;
            }
            p++;
            n++;
            continue;
        }
        int k = utf8_seq(p, end);
        if (k == 0) {
            return 0;
        }
        p += k;
        n++;
    }
    return 0; /* unterminated */
}

/* A str from what read_string read. */
static PyObject *
string_object(const unsigned char *start, Py_ssize_t len, Buf *b)
{
    const char *s = start != NULL ? (const char *)start : b->data;
    return PyUnicode_DecodeUTF8(s, len, NULL); /* valid UTF-8: it cannot fail but on memory */
}

/* A JSON integer literal, no fraction or exponent, within [0, 2**64): 1 and *out, or 0
 * (anything else, including a negative number, a float or an overflow). */
static int
read_uint(Cur *c, uint64_t *out)
{
    ws(c);
    const unsigned char *p = c->p, *end = c->end;
    if (p >= end || *p < '0' || *p > '9') {
        return 0;
    }
    uint64_t v = 0;
    if (*p == '0') {
        p++;
    }
    else {
        while (p < end && *p >= '0' && *p <= '9') {
            uint64_t d = (uint64_t)(*p - '0');
            if (v > (UINT64_MAX - d) / 10) {
                return 0;
            }
            v = v * 10 + d;
            p++;
        }
    }
    if (p < end && ((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E')) {
        return 0; /* a leading zero, a fraction or an exponent */
    }
    c->p = p;
    *out = v;
    return 1;
}

static inline int
read_null(Cur *c)
{
    ws(c);
    if (c->end - c->p >= 4 && memcmp(c->p, "null", 4) == 0) {
        c->p += 4;
        return 1;
    }
    return 0;
}

static inline int
at_null(Cur *c)
{
    ws(c);
    return c->p < c->end && *c->p == 'n';
}

/* An object's next key: 1 with the key (decoded) in `key`, 0 at the object's end (the
 * closing brace consumed), -1 not valid (or an error set). `first`: no comma before. */
static int
next_key(Cur *c, Buf *key, const unsigned char **kstart, Py_ssize_t *klen, int first)
{
    ws(c);
    if (c->p >= c->end) {
        return -1;
    }
    if (*c->p == '}') {
        c->p++;
        return 0;
    }
    if (!first) {
        if (*c->p != ',') {
            return -1;
        }
        c->p++;
    }
    Py_ssize_t chars;
    int r = read_string(c, key, kstart, klen, &chars);
    if (r != 1) {
        return -1;
    }
    if (*kstart == NULL) {
        *kstart = (const unsigned char *)key->data;
    }
    if (!expect(c, ':')) {
        return -1;
    }
    return 1;
}

static inline int
key_is(const unsigned char *k, Py_ssize_t n, const char *name)
{
    size_t m = strlen(name);
    return (size_t)n == m && memcmp(k, name, m) == 0;
}

/* "utf-8" (0), "base64" (1), or -1. */
static int
read_encoding(Cur *c, Buf *tmp)
{
    const unsigned char *s;
    Py_ssize_t n, chars;
    if (read_string(c, tmp, &s, &n, &chars) != 1) {
        return -1;
    }
    if (s == NULL) {
        s = (const unsigned char *)tmp->data;
    }
    if (key_is(s, n, "utf-8")) {
        return 0;
    }
    if (key_is(s, n, "base64")) {
        return 1;
    }
    return -1;
}

/* ------------------------------------------------------------------ base64 */

static signed char b64_value[256];

static void
b64_init(void)
{
    const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    memset(b64_value, -1, sizeof(b64_value));
    for (int i = 0; i < 64; i++) {
        b64_value[(unsigned char)alphabet[i]] = (signed char)i;
    }
}

/* base64.b64decode(s, validate=True) for standard base64 with its '=' padding (length a
 * multiple of 4, '=' only at the end); NULL without an error set when `s` is not so. */
static PyObject *
b64_decode(const unsigned char *s, Py_ssize_t n)
{
    if (n % 4 != 0) {
        return NULL;
    }
    Py_ssize_t pad = 0;
    if (n > 0 && s[n - 1] == '=') {
        pad = (n > 1 && s[n - 2] == '=') ? 2 : 1;
    }
    Py_ssize_t out_len = n / 4 * 3 - pad;
    PyObject *out = PyBytes_FromStringAndSize(NULL, out_len);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t w = 0;
    for (Py_ssize_t i = 0; i < n; i += 4) {
        int last = i + 4 == n;
        uint32_t v = 0;
        for (int j = 0; j < 4; j++) {
            unsigned char ch = s[i + j];
            if (last && ch == '=' && j >= 4 - pad) {
                v <<= 6;
                continue;
            }
            signed char d = b64_value[ch];
            if (d < 0) {
                Py_DECREF(out);
                return NULL;
            }
            v = (v << 6) | (uint32_t)d;
        }
        int bytes = last ? 3 - (int)pad : 3;
        if (bytes >= 1) {
            o[w++] = (unsigned char)(v >> 16);
        }
        if (bytes >= 2) {
            o[w++] = (unsigned char)(v >> 8);
        }
        if (bytes >= 3) {
            o[w++] = (unsigned char)v;
        }
    }
    return out;
}

/* ------------------------------------------------------------------ objects */

/* A frozen slots dataclass made as server/schemas.py's _new_item makes it: allocated,
 * each slot written through its member descriptor (steals nothing). */
static PyObject *
make(PyTypeObject *type, PyObject **slots, PyObject **values, int n)
{
    PyObject *obj = type->tp_alloc(type, 0);
    if (obj == NULL) {
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (Py_TYPE(slots[i])->tp_descr_set(slots[i], obj, values[i]) < 0) {
            Py_DECREF(obj);
            return NULL;
        }
    }
    return obj;
}

static PyObject *
uint_object(uint64_t v)
{
    return PyLong_FromUnsignedLongLong((unsigned long long)v);
}

/* One {"id", "receipt"} of a release or dequeue body: a Release, or NULL (with an error
 * set only on memory). */
static PyObject *
read_release(Cur *c, Buf *key, Buf *tmp)
{
    if (!expect(c, '{')) {
        return NULL;
    }
    uint64_t id = 0;
    int have_id = 0;
    PyObject *receipt = NULL;
    for (int first = 1;; first = 0) {
        const unsigned char *k;
        Py_ssize_t kn;
        int r = next_key(c, key, &k, &kn, first);
        if (r == 0) {
            break;
        }
        if (r < 0) {
            goto fail;
        }
        if (key_is(k, kn, "id") && !have_id) {
            if (!read_uint(c, &id) || id > max_id) {
                goto fail;
            }
            have_id = 1;
        }
        else if (key_is(k, kn, "receipt") && receipt == NULL) {
            const unsigned char *s;
            Py_ssize_t n, chars;
            if (read_string(c, tmp, &s, &n, &chars) != 1 || chars < receipt_low ||
                chars > receipt_high) {
                goto fail;
            }
            receipt = string_object(s, n, tmp);
            if (receipt == NULL) {
                goto fail;
            }
        }
        else {
            goto fail; /* unknown or repeated */
        }
    }
    if (!have_id || receipt == NULL) {
        goto fail;
    }
    PyObject *id_obj = uint_object(id);
    if (id_obj == NULL) {
        goto fail;
    }
    PyObject *values[2] = {id_obj, receipt};
    PyObject *release = make(release_type, release_slots, values, 2);
    Py_DECREF(id_obj);
    Py_DECREF(receipt);
    return release;
fail:
    Py_XDECREF(receipt);
    return NULL;
}

/* One item of an enqueue body: a NewItem, or NULL (with an error set only on memory). */
static PyObject *
read_new_item(Cur *c, Buf *key, Buf *tmp)
{
    if (!expect(c, '{')) {
        return NULL;
    }
    enum { VALUE, ENCODING, DEADLINE, DELAY, KEY, GROUP, ON_DUP, FIELDS };
    int seen[FIELDS] = {0};
    const unsigned char *value = NULL;
    Py_ssize_t value_len = 0;
    Buf value_buf;
    buf_init(&value_buf);
    int encoding = 0, on_dup = 0;
    uint64_t deadline = 0, delay = 0;
    int have_deadline = 0, have_delay = 0;
    PyObject *item_key = NULL, *group = NULL, *out = NULL;
    for (int first = 1;; first = 0) {
        const unsigned char *k;
        Py_ssize_t kn;
        int r = next_key(c, key, &k, &kn, first);
        if (r == 0) {
            break;
        }
        if (r < 0) {
            goto done;
        }
        int f;
        if (key_is(k, kn, "value")) {
            f = VALUE;
        }
        else if (key_is(k, kn, "encoding")) {
            f = ENCODING;
        }
        else if (key_is(k, kn, "deadline")) {
            f = DEADLINE;
        }
        else if (key_is(k, kn, "delay_ms")) {
            f = DELAY;
        }
        else if (key_is(k, kn, "key")) {
            f = KEY;
        }
        else if (key_is(k, kn, "group")) {
            f = GROUP;
        }
        else if (key_is(k, kn, "on_duplicate")) {
            f = ON_DUP;
        }
        else {
            goto done;
        }
        if (seen[f]) {
            goto done;
        }
        seen[f] = 1;
        switch (f) {
        case VALUE: {
            Py_ssize_t chars;
            if (read_string(c, &value_buf, &value, &value_len, &chars) != 1) {
                goto done;
            }
            if (value == NULL) {
                value = (const unsigned char *)value_buf.data;
            }
            break;
        }
        case ENCODING:
            encoding = read_encoding(c, tmp);
            if (encoding < 0) {
                goto done;
            }
            break;
        case DEADLINE:
        case DELAY: {
            if (read_null(c)) {
                break;
            }
            uint64_t v;
            if (!read_uint(c, &v) || v > max_deadline) {
                goto done;
            }
            if (f == DEADLINE) {
                deadline = v;
                have_deadline = 1;
            }
            else {
                delay = v;
                have_delay = 1;
            }
            break;
        }
        case KEY:
        case GROUP: {
            if (read_null(c)) {
                break;
            }
            const unsigned char *s;
            Py_ssize_t n, chars;
            if (read_string(c, tmp, &s, &n, &chars) != 1) {
                goto done;
            }
            PyObject *text = string_object(s, n, tmp);
            if (text == NULL) {
                goto done;
            }
            if (f == KEY) {
                item_key = text;
            }
            else {
                group = text;
            }
            break;
        }
        case ON_DUP: {
            const unsigned char *s;
            Py_ssize_t n, chars;
            if (read_string(c, tmp, &s, &n, &chars) != 1) {
                goto done;
            }
            if (s == NULL) {
                s = (const unsigned char *)tmp->data;
            }
            if (key_is(s, n, "keep")) {
                on_dup = 0;
            }
            else if (key_is(s, n, "replace")) {
                on_dup = 1;
            }
            else {
                goto done;
            }
            break;
        }
        }
    }
    if (!seen[VALUE] || (have_deadline && have_delay)) {
        goto done; /* pydantic's or to_new_items' refusal to word */
    }
    PyObject *data = encoding == 0
                         ? PyBytes_FromStringAndSize((const char *)value, value_len)
                         : b64_decode(value, value_len);
    if (data == NULL) {
        goto done;
    }
    PyObject *dl = have_deadline ? uint_object(deadline) : Py_NewRef(Py_None);
    PyObject *dy = have_delay ? uint_object(delay) : Py_NewRef(Py_None);
    if (dl != NULL && dy != NULL) {
        PyObject *values[6] = {data, dl, dy, item_key ? item_key : Py_None,
                               group ? group : Py_None, on_dup ? s_replace : s_keep};
        out = make(new_item_type, item_slots, values, 6);
    }
    Py_DECREF(data);
    Py_XDECREF(dl);
    Py_XDECREF(dy);
done:
    Py_XDECREF(item_key);
    Py_XDECREF(group);
    buf_free(&value_buf);
    return out;
}

typedef PyObject *(*ReadOne)(Cur *, Buf *, Buf *);

/* A JSON array of at most `limit` elements each read by `one`, into a list (at least
 * `min` long); NULL when not so (an error set only on memory). */
static PyObject *
read_array(Cur *c, ReadOne one, Py_ssize_t min, Py_ssize_t limit, Buf *key, Buf *tmp)
{
    if (!expect(c, '[')) {
        return NULL;
    }
    PyObject *list = PyList_New(0);
    if (list == NULL) {
        return NULL;
    }
    ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
    }
    else {
        for (;;) {
            if (PyList_GET_SIZE(list) >= limit) {
                goto fail; /* over the batch limit: the app's middleware answers 413 */
            }
            PyObject *x = one(c, key, tmp);
            if (x == NULL) {
                goto fail;
            }
            int r = PyList_Append(list, x);
            Py_DECREF(x);
            if (r < 0) {
                goto fail;
            }
            ws(c);
            if (c->p < c->end && *c->p == ',') {
                c->p++;
                continue;
            }
            if (c->p < c->end && *c->p == ']') {
                c->p++;
                break;
            }
            goto fail;
        }
    }
    if (PyList_GET_SIZE(list) < min) {
        goto fail;
    }
    return list;
fail:
    Py_DECREF(list);
    return NULL;
}

/* The end of the body: only whitespace left. */
static inline int
at_end(Cur *c)
{
    ws(c);
    return c->p == c->end;
}

/* None, without the memory error that may have stopped the parse. */
static PyObject *
declined(void)
{
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static int
check_bound(void)
{
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "dq.server._hotwire: bind() was not called");
        return -1;
    }
    return 0;
}

/* {"items": [...]} of an enqueue or a release. */
static PyObject *
parse_items(Py_buffer *body, Py_ssize_t limit, ReadOne one)
{
    Cur c = {body->buf, (const unsigned char *)body->buf + body->len};
    Buf key, tmp;
    buf_init(&key);
    buf_init(&tmp);
    PyObject *items = NULL;
    if (!expect(&c, '{')) {
        goto fail;
    }
    for (int first = 1;; first = 0) {
        const unsigned char *k;
        Py_ssize_t kn;
        int r = next_key(&c, &key, &k, &kn, first);
        if (r == 0) {
            break;
        }
        if (r < 0 || !key_is(k, kn, "items") || items != NULL) {
            goto fail;
        }
        items = read_array(&c, one, 1, limit, &key, &tmp);
        if (items == NULL) {
            goto fail;
        }
    }
    if (items == NULL || !at_end(&c)) {
        goto fail;
    }
    buf_free(&key);
    buf_free(&tmp);
    return items;
fail:
    Py_XDECREF(items);
    buf_free(&key);
    buf_free(&tmp);
    return declined();
}

static PyObject *
enqueue_body(PyObject *self, PyObject *args)
{
    Py_buffer body;
    Py_ssize_t limit;
    if (check_bound() < 0 || !PyArg_ParseTuple(args, "y*n:enqueue_body", &body, &limit)) {
        return NULL;
    }
    PyObject *out = parse_items(&body, limit, read_new_item);
    PyBuffer_Release(&body);
    return out;
}

static PyObject *
release_body(PyObject *self, PyObject *args)
{
    Py_buffer body;
    Py_ssize_t limit;
    if (check_bound() < 0 || !PyArg_ParseTuple(args, "y*n:release_body", &body, &limit)) {
        return NULL;
    }
    PyObject *out = parse_items(&body, limit, read_release);
    PyBuffer_Release(&body);
    return out;
}

/* A dequeue's count: any integer pydantic reads as a 64-bit signed one (the rules --
 * 1 to the batch limit -- are the operation's, storage/itemops.py's check_dequeue). */
static int
read_count(Cur *c, long long *out)
{
    ws(c);
    int neg = 0;
    if (c->p < c->end && *c->p == '-') {
        neg = 1;
        c->p++;
        if (c->p >= c->end || *c->p < '0' || *c->p > '9') {
            return 0; /* a minus sign, then whitespace or nothing */
        }
    }
    uint64_t v;
    if (!read_uint(c, &v) || v > (uint64_t)INT64_MAX) {
        return 0;
    }
    *out = neg ? -(long long)v : (long long)v;
    return 1;
}

static PyObject *
dequeue_body(PyObject *self, PyObject *args)
{
    Py_buffer body;
    Py_ssize_t limit;
    if (check_bound() < 0 || !PyArg_ParseTuple(args, "y*n:dequeue_body", &body, &limit)) {
        return NULL;
    }
    Cur c = {body.buf, (const unsigned char *)body.buf + body.len};
    Buf key, tmp;
    buf_init(&key);
    buf_init(&tmp);
    enum { COUNT, LEASE, WAIT, ENCODING, RELEASE, FIELDS };
    int seen[FIELDS] = {0};
    long long count = 1;
    uint64_t lease = 0, wait = 0;
    int have_lease = 0, encoding = -1;
    PyObject *release = NULL, *out = NULL;
    if (!expect(&c, '{')) {
        goto done;
    }
    for (int first = 1;; first = 0) {
        const unsigned char *k;
        Py_ssize_t kn;
        int r = next_key(&c, &key, &k, &kn, first);
        if (r == 0) {
            break;
        }
        if (r < 0) {
            goto done;
        }
        int f;
        if (key_is(k, kn, "count")) {
            f = COUNT;
        }
        else if (key_is(k, kn, "lease_ms")) {
            f = LEASE;
        }
        else if (key_is(k, kn, "wait_ms")) {
            f = WAIT;
        }
        else if (key_is(k, kn, "encoding")) {
            f = ENCODING;
        }
        else if (key_is(k, kn, "release")) {
            f = RELEASE;
        }
        else {
            goto done;
        }
        if (seen[f]) {
            goto done;
        }
        seen[f] = 1;
        switch (f) {
        case COUNT:
            if (!read_count(&c, &count)) {
                goto done;
            }
            break;
        case LEASE:
            if (read_null(&c)) {
                break;
            }
            if (!read_uint(&c, &lease) || lease < lease_low || lease > lease_high) {
                goto done;
            }
            have_lease = 1;
            break;
        case WAIT:
            if (!read_uint(&c, &wait) || wait > max_deadline) {
                goto done;
            }
            break;
        case ENCODING:
            if (read_null(&c)) {
                break;
            }
            encoding = read_encoding(&c, &tmp);
            if (encoding < 0) {
                goto done;
            }
            break;
        case RELEASE:
            if (at_null(&c)) {
                if (!read_null(&c)) {
                    goto done;
                }
                break;
            }
            release = read_array(&c, read_release, 0, limit, &key, &tmp);
            if (release == NULL) {
                goto done;
            }
            break;
        }
    }
    if (!at_end(&c)) {
        goto done;
    }
    out = Py_BuildValue("(LNKNO)", count,
                        have_lease ? uint_object(lease) : Py_NewRef(Py_None),
                        (unsigned long long)wait,
                        encoding < 0 ? Py_NewRef(Py_None)
                                     : Py_NewRef(encoding ? s_base64 : s_utf8),
                        release ? release : Py_None);
done:
    Py_XDECREF(release);
    buf_free(&key);
    buf_free(&tmp);
    PyBuffer_Release(&body);
    if (out == NULL) {
        return declined();
    }
    return out;
}

/* ------------------------------------------------------------------ answers */

/* `u` in decimal into out (at least 20 bytes), right-aligned: the first digit's offset. */
static inline int
decimal(char *out, unsigned long long u)
{
    int i = 20;
    do {
        out[--i] = (char)('0' + u % 10);
        u /= 10;
    } while (u != 0);
    return i;
}

static int
put_decimal(Buf *b, unsigned long long u)
{
    char s[20];
    int i = decimal(s, u);
    return buf_put(b, s + i, 20 - i);
}

/* An int as Python's repr writes it (json.dumps and %d alike). */
static int
put_int(Buf *b, PyObject *v)
{
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "an integer was expected, not %.100s",
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow == 0) {
        if (x == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (x < 0) {
            if (BUF_LIT(b, "-") < 0) {
                return -1;
            }
            return put_decimal(b, 0 - (unsigned long long)x);
        }
        return put_decimal(b, (unsigned long long)x);
    }
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(v);
        if (!(u == (unsigned long long)-1 && PyErr_Occurred())) {
            return put_decimal(b, u);
        }
        PyErr_Clear();
    }
    PyObject *text = PyObject_Str(v);
    if (text == NULL) {
        return -1;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(text, &n);
    int r = s == NULL ? -1 : buf_put(b, s, n);
    Py_DECREF(text);
    return r;
}

/* A value as json.dumps writes it: an int (a bool as true/false) or a str. */
static int
put_json_scalar(Buf *b, PyObject *v);

static const char hexdigits[] = "0123456789abcdef";

/* One code point as json.dumps (ensure_ascii) writes it. */
static int
put_escaped(Buf *b, uint32_t ch)
{
    char esc[12];
    Py_ssize_t m = 2;
    esc[0] = '\\';
    switch (ch) {
    case '"': esc[1] = '"'; break;
    case '\\': esc[1] = '\\'; break;
    case '\b': esc[1] = 'b'; break;
    case '\f': esc[1] = 'f'; break;
    case '\n': esc[1] = 'n'; break;
    case '\r': esc[1] = 'r'; break;
    case '\t': esc[1] = 't'; break;
    default: {
        uint32_t units[2];
        int k = 1;
        if (ch >= 0x10000) {
            uint32_t v = ch - 0x10000;
            units[0] = 0xD800 | (v >> 10);
            units[1] = 0xDC00 | (v & 0x3FF);
            k = 2;
        }
        else {
            units[0] = ch;
        }
        m = 0;
        for (int u = 0; u < k; u++) {
            esc[m++] = '\\';
            esc[m++] = 'u';
            esc[m++] = hexdigits[(units[u] >> 12) & 0xF];
            esc[m++] = hexdigits[(units[u] >> 8) & 0xF];
            esc[m++] = hexdigits[(units[u] >> 4) & 0xF];
            esc[m++] = hexdigits[units[u] & 0xF];
        }
    }
    }
    return buf_put(b, esc, m);
}

/* A str quoted as json.dumps quotes it (ensure_ascii). */
static int
put_quoted(Buf *b, PyObject *s)
{
    if (!PyUnicode_Check(s)) {
        PyErr_Format(PyExc_TypeError, "a str was expected, not %.100s", Py_TYPE(s)->tp_name);
        return -1;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (buf_grow(b, n + 2) < 0 || BUF_LIT(b, "\"") < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (kind == PyUnicode_1BYTE_KIND) { /* a run of plain characters at once */
            const unsigned char *p = (const unsigned char *)data;
            Py_ssize_t j = i;
            while (j < n && plain_byte[p[j]]) {
                j++;
            }
            if (j > i && buf_put(b, (const char *)p + i, j - i) < 0) {
                return -1;
            }
            i = j;
            if (i == n) {
                break;
            }
        }
        Py_UCS4 ch = PyUnicode_READ(kind, data, i);
        if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\') {
            char one = (char)ch;
            if (buf_put(b, &one, 1) < 0) {
                return -1;
            }
            continue;
        }
        if (put_escaped(b, ch) < 0) {
            return -1;
        }
    }
    return BUF_LIT(b, "\"");
}

static int
put_json_scalar(Buf *b, PyObject *v)
{
    if (v == Py_True) {
        return BUF_LIT(b, "true");
    }
    if (v == Py_False) {
        return BUF_LIT(b, "false");
    }
    if (PyUnicode_Check(v)) {
        return put_quoted(b, v);
    }
    return put_int(b, v);
}

static PyObject *
buf_bytes(Buf *b)
{
    PyObject *out = PyBytes_FromStringAndSize(b->data, b->len);
    buf_free(b);
    return out;
}

/* An attribute's truth, -1 on error. */
static int
attr_true(PyObject *o, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) {
        return -1;
    }
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

static int
put_attr_int(Buf *b, PyObject *o, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) {
        return -1;
    }
    int r = put_int(b, v);
    Py_DECREF(v);
    return r;
}

/* server/answers.py's EnqueueResponse: {"items":[{"id","deadline","duplicate"[,"replaced"]}]} */
static PyObject *
enqueued(PyObject *self, PyObject *done)
{
    PyObject *seq = PySequence_Fast(done, "enqueued() takes a sequence");
    if (seq == NULL) {
        return NULL;
    }
    Buf b;
    buf_init(&b);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (BUF_LIT(&b, "{\"items\":[") < 0) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(seq, i);
        if ((i > 0 && BUF_LIT(&b, ",") < 0) || BUF_LIT(&b, "{\"id\":") < 0 ||
            put_attr_int(&b, e, n_id) < 0 || BUF_LIT(&b, ",\"deadline\":") < 0 ||
            put_attr_int(&b, e, n_deadline) < 0) {
            goto fail;
        }
        int replaced = attr_true(e, n_replaced);
        int duplicate = replaced ? 0 : attr_true(e, n_duplicate);
        if (replaced < 0 || duplicate < 0) {
            goto fail;
        }
        int r = replaced    ? BUF_LIT(&b, ",\"duplicate\":false,\"replaced\":true}")
                : duplicate ? BUF_LIT(&b, ",\"duplicate\":true}")
                            : BUF_LIT(&b, ",\"duplicate\":false}");
        if (r < 0) {
            goto fail;
        }
    }
    if (BUF_LIT(&b, "]}") < 0) {
        goto fail;
    }
    Py_DECREF(seq);
    return buf_bytes(&b);
fail:
    Py_DECREF(seq);
    buf_free(&b);
    return NULL;
}

/* One ItemResult, as server/answers.py's outcome_dict then json.dumps write it. */
static int
put_outcome(Buf *b, PyObject *o)
{
    PyObject *f[5] = {NULL};
    PyObject *names[5] = {n_error, n_message, n_receipt, n_deadline, n_lease_expires};
    int r = -1;
    for (int i = 0; i < 5; i++) {
        f[i] = PyObject_GetAttr(o, names[i]);
        if (f[i] == NULL) {
            goto done;
        }
    }
    PyObject *error = f[0], *message = f[1], *receipt = f[2], *deadline = f[3],
             *lease = f[4];
    if (BUF_LIT(b, "{\"id\":") < 0) {
        goto done;
    }
    PyObject *id = PyObject_GetAttr(o, n_id);
    if (id == NULL) {
        goto done;
    }
    int plain = error == Py_None && receipt == Py_None && deadline == Py_None &&
                lease == Py_None;
    /* a plain success is written with %d (answers.py's f-string), the rest by json.dumps */
    int w = plain ? put_int(b, id) : put_json_scalar(b, id);
    Py_DECREF(id);
    if (w < 0) {
        goto done;
    }
    if (plain) {
        r = BUF_LIT(b, ",\"ok\":true}");
        goto done;
    }
    if ((error == Py_None ? BUF_LIT(b, ",\"ok\":true") : BUF_LIT(b, ",\"ok\":false")) < 0) {
        goto done;
    }
    if (error != Py_None) {
        int t = PyObject_IsTrue(message);
        if (t < 0 || BUF_LIT(b, ",\"error\":") < 0 || put_json_scalar(b, error) < 0 ||
            BUF_LIT(b, ",\"message\":") < 0 || put_json_scalar(b, t ? message : error) < 0) {
            goto done;
        }
    }
    if (receipt != Py_None &&
        (BUF_LIT(b, ",\"receipt\":") < 0 || put_json_scalar(b, receipt) < 0)) {
        goto done;
    }
    if (deadline != Py_None &&
        (BUF_LIT(b, ",\"deadline\":") < 0 || put_json_scalar(b, deadline) < 0)) {
        goto done;
    }
    if (lease != Py_None &&
        (BUF_LIT(b, ",\"lease_expires\":") < 0 || put_json_scalar(b, lease) < 0)) {
        goto done;
    }
    r = BUF_LIT(b, "}");
done:
    for (int i = 0; i < 5; i++) {
        Py_XDECREF(f[i]);
    }
    return r;
}

/* The ItemResults of `outcomes`, comma-separated. */
static int
put_outcomes(Buf *b, PyObject *outcomes)
{
    PyObject *seq = PySequence_Fast(outcomes, "outcomes must be a sequence");
    if (seq == NULL) {
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((i > 0 && BUF_LIT(b, ",") < 0) ||
            put_outcome(b, PySequence_Fast_GET_ITEM(seq, i)) < 0) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* server/answers.py's Results: {"results":[...]} */
static PyObject *
results(PyObject *self, PyObject *outcomes)
{
    Buf b;
    buf_init(&b);
    if (BUF_LIT(&b, "{\"results\":[") < 0 || put_outcomes(&b, outcomes) < 0 ||
        BUF_LIT(&b, "]}") < 0) {
        buf_free(&b);
        return NULL;
    }
    return buf_bytes(&b);
}

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* base64.b64encode(data), quoted. */
static int
put_base64(Buf *b, const unsigned char *p, Py_ssize_t n)
{
    if (buf_grow(b, (n + 2) / 3 * 4 + 2) < 0) {
        return -1;
    }
    char *o = b->data + b->len;
    *o++ = '"';
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *o++ = b64_alphabet[v >> 18];
        *o++ = b64_alphabet[(v >> 12) & 63];
        *o++ = b64_alphabet[(v >> 6) & 63];
        *o++ = b64_alphabet[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        *o++ = b64_alphabet[v >> 18];
        *o++ = b64_alphabet[(v >> 12) & 63];
        *o++ = '=';
        *o++ = '=';
    }
    else if (n - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        *o++ = b64_alphabet[v >> 18];
        *o++ = b64_alphabet[(v >> 12) & 63];
        *o++ = b64_alphabet[(v >> 6) & 63];
        *o++ = '=';
    }
    *o++ = '"';
    b->len = o - b->data;
    return 0;
}

/* UTF-8 bytes as json.dumps(data.decode()) writes them: 1, or 0 when they are not valid
 * UTF-8 (the buffer back as it was), -1 on error. */
static int
put_utf8_quoted(Buf *b, const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t mark = b->len;
    const unsigned char *end = p + n, *run;
    if (buf_grow(b, n + 2) < 0 || BUF_LIT(b, "\"") < 0) {
        return -1;
    }
    while (p < end) {
        run = p;
        while (p < end && plain_byte[*p]) {
            p++;
        }
        if (p > run && buf_put(b, (const char *)run, p - run) < 0) {
            return -1;
        }
        if (p == end) {
            break;
        }
        uint32_t cp;
        if (*p < 0x80) {
            cp = *p++;
        }
        else {
            int k = utf8_seq(p, end);
            if (k == 0) {
                b->len = mark;
                return 0;
            }
            cp = k == 2 ? (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F)
                 : k == 3 ? (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 |
                                (p[2] & 0x3F)
                          : (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 |
                                (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
            p += k;
        }
        if (put_escaped(b, cp) < 0) {
            return -1;
        }
    }
    return BUF_LIT(b, "\"") < 0 ? -1 : 1;
}


/* An attribute written with `put`. */
static int
put_attr(Buf *b, PyObject *o, PyObject *name, int (*put)(Buf *, PyObject *))
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) {
        return -1;
    }
    int r = put(b, v);
    Py_DECREF(v);
    return r;
}

/* One delivered item (ItemOut), as server/answers.py wrote it. */
static int
put_delivery(Buf *b, PyObject *d, int force_base64)
{
    if (BUF_LIT(b, "{\"id\":") < 0 || put_attr(b, d, n_id, put_int) < 0 ||
        BUF_LIT(b, ",\"receipt\":") < 0 || put_attr(b, d, n_receipt, put_quoted) < 0 ||
        BUF_LIT(b, ",\"value\":") < 0) {
        return -1;
    }
    PyObject *value = PyObject_GetAttr(d, n_value);
    if (value == NULL) {
        return -1;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(value, &view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(value);
        return -1;
    }
    int text = force_base64 ? 0 : put_utf8_quoted(b, view.buf, view.len);
    if (text == 0) {
        text = put_base64(b, view.buf, view.len) < 0 ? -1 : 2;
    }
    PyBuffer_Release(&view);
    Py_DECREF(value);
    if (text < 0) {
        return -1;
    }
    if ((text == 1 ? BUF_LIT(b, ",\"encoding\":\"utf-8\",\"deadline\":")
                   : BUF_LIT(b, ",\"encoding\":\"base64\",\"deadline\":")) < 0 ||
        put_attr(b, d, n_deadline, put_int) < 0) {
        return -1;
    }
    PyObject *stats = PyObject_GetAttr(d, n_stats);
    if (stats == NULL) {
        return -1;
    }
    int r = (BUF_LIT(b, ",\"stats\":{\"enqueue_time\":") < 0 ||
             put_attr(b, stats, n_enqueue_time, put_int) < 0 ||
             BUF_LIT(b, ",\"requeue_time\":") < 0 ||
             put_attr(b, stats, n_requeue_time, put_int) < 0 ||
             BUF_LIT(b, ",\"dequeue_count\":") < 0 ||
             put_attr(b, stats, n_dequeue_count, put_int) < 0)
                ? -1
                : 0;
    Py_DECREF(stats);
    if (r < 0 || BUF_LIT(b, "},\"lease_expires\":") < 0 ||
        put_attr(b, d, n_lease_expires, put_int) < 0 || BUF_LIT(b, ",\"group\":") < 0) {
        return -1;
    }
    PyObject *group = PyObject_GetAttr(d, n_group);
    if (group == NULL) {
        return -1;
    }
    r = group == Py_None ? BUF_LIT(b, "null") : put_quoted(b, group);
    Py_DECREF(group);
    if (r < 0) {
        return -1;
    }
    PyObject *error = PyObject_GetAttr(d, n_last_error);
    if (error == NULL) {
        return -1;
    }
    if (error != Py_None) { /* said only for an item that failed before */
        r = BUF_LIT(b, ",\"last_error\":") < 0 || put_quoted(b, error) < 0 ||
                    BUF_LIT(b, ",\"last_error_at\":") < 0
                ? -1
                : 0;
        PyObject *at = r < 0 ? NULL : PyObject_GetAttr(d, n_last_error_at);
        if (at == NULL) {
            r = -1;
        }
        else {
            int t = PyObject_IsTrue(at); /* `last_error_at or 0` */
            r = t < 0 ? -1 : t ? put_int(b, at) : BUF_LIT(b, "0");
            Py_DECREF(at);
        }
    }
    Py_DECREF(error);
    return r < 0 ? -1 : BUF_LIT(b, "}");
}

/* server/answers.py's DequeueResponse: dequeued(got, encoding, released, queue_exists). */
static PyObject *
dequeued(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"got", "encoding", "released", "queue_exists", NULL};
    PyObject *got, *encoding, *released = Py_None;
    int exists = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|Op:dequeued", names, &got, &encoding,
                                     &released, &exists)) {
        return NULL;
    }
    int force = encoding != Py_None && PyUnicode_Check(encoding) &&
                PyUnicode_CompareWithASCIIString(encoding, "base64") == 0;
    PyObject *seq = PySequence_Fast(got, "dequeued() takes a sequence");
    if (seq == NULL) {
        return NULL;
    }
    Buf b;
    buf_init(&b);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (BUF_LIT(&b, "{\"items\":[") < 0) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((i > 0 && BUF_LIT(&b, ",") < 0) ||
            put_delivery(&b, PySequence_Fast_GET_ITEM(seq, i), force) < 0) {
            goto fail;
        }
    }
    int r;
    if (released != Py_None) {
        r = BUF_LIT(&b, "],\"released\":[") < 0 || put_outcomes(&b, released) < 0 ||
                    BUF_LIT(&b, "]}") < 0
                ? -1
                : 0;
    }
    else if (!exists) {
        r = BUF_LIT(&b, "],\"queue_exists\":false}");
    }
    else {
        r = BUF_LIT(&b, "]}");
    }
    if (r < 0) {
        goto fail;
    }
    Py_DECREF(seq);
    return buf_bytes(&b);
fail:
    Py_DECREF(seq);
    buf_free(&b);
    return NULL;
}

/* head + the body's length in decimal + tail + body: an answer's HTTP message. */
static PyObject *
message(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1]) ||
        !PyBytes_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "message(head, tail, body) takes three bytes");
        return NULL;
    }
    Py_ssize_t nh = PyBytes_GET_SIZE(args[0]), nt = PyBytes_GET_SIZE(args[1]),
               nb = PyBytes_GET_SIZE(args[2]);
    char digits[20];
    int first = decimal(digits, (unsigned long long)nb), nd = 20 - first;
    PyObject *out = PyBytes_FromStringAndSize(NULL, nh + nd + nt + nb);
    if (out == NULL) {
        return NULL;
    }
    char *o = PyBytes_AS_STRING(out);
    memcpy(o, PyBytes_AS_STRING(args[0]), (size_t)nh);
    memcpy(o + nh, digits + first, (size_t)nd);
    memcpy(o + nh + nd, PyBytes_AS_STRING(args[1]), (size_t)nt);
    memcpy(o + nh + nd + nt, PyBytes_AS_STRING(args[2]), (size_t)nb);
    return out;
}

/* ------------------------------------------------------------------ binding */

static PyObject *
slot_of(PyTypeObject *type, const char *name)
{
    PyObject *d = PyDict_GetItemString(type->tp_dict, name); /* borrowed */
    if (d == NULL || Py_TYPE(d)->tp_descr_set == NULL) {
        PyErr_Format(PyExc_TypeError, "%.100s.%s is not a slot", type->tp_name, name);
        return NULL;
    }
    return Py_NewRef(d);
}

static PyObject *
bind(PyObject *self, PyObject *args)
{
    PyObject *item, *rel;
    unsigned long long md, mi, ll, lh;
    Py_ssize_t rl, rh;
    if (!PyArg_ParseTuple(args, "O!O!KKKKnn:bind", &PyType_Type, &item, &PyType_Type, &rel,
                          &md, &mi, &ll, &lh, &rl, &rh)) {
        return NULL;
    }
    static const char *item_fields[6] = {"value", "deadline", "delay_ms",
                                         "key", "group", "on_duplicate"};
    static const char *release_fields[2] = {"id", "receipt"};
    PyObject *slots[8];
    for (int i = 0; i < 8; i++) {
        slots[i] = i < 6 ? slot_of((PyTypeObject *)item, item_fields[i])
                         : slot_of((PyTypeObject *)rel, release_fields[i - 6]);
        if (slots[i] == NULL) {
            for (int j = 0; j < i; j++) {
                Py_DECREF(slots[j]);
            }
            return NULL;
        }
    }
    for (int i = 0; i < 6; i++) {
        Py_XSETREF(item_slots[i], slots[i]);
    }
    for (int i = 0; i < 2; i++) {
        Py_XSETREF(release_slots[i], slots[6 + i]);
    }
    Py_XSETREF(new_item_type, (PyTypeObject *)Py_NewRef(item));
    Py_XSETREF(release_type, (PyTypeObject *)Py_NewRef(rel));
    max_deadline = md;
    max_id = mi;
    lease_low = ll;
    lease_high = lh;
    receipt_low = rl;
    receipt_high = rh;
    bound = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(NewItem, Release, max_deadline, max_id, lease_low, lease_high, receipt_low, "
     "receipt_high): the types to make and the schema's bounds"},
    {"enqueue_body", enqueue_body, METH_VARARGS,
     "enqueue_body(body, limit) -> list[NewItem] | None (None: the app's to answer)"},
    {"release_body", release_body, METH_VARARGS,
     "release_body(body, limit) -> list[Release] | None"},
    {"dequeue_body", dequeue_body, METH_VARARGS,
     "dequeue_body(body, limit) -> (count, lease_ms, wait_ms, encoding, release) | None"},
    {"enqueued", enqueued, METH_O, "enqueued(done) -> bytes: EnqueueResponse"},
    {"results", results, METH_O, "results(outcomes) -> bytes: Results"},
    {"dequeued", (PyCFunction)(void (*)(void))dequeued, METH_VARARGS | METH_KEYWORDS,
     "dequeued(got, encoding, released, queue_exists) -> bytes: DequeueResponse"},
    {"message", (PyCFunction)(void (*)(void))message, METH_FASTCALL,
     "message(head, tail, body) -> head + len(body) + tail + body"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hotwire",
    "The HTTP fast path's request bodies and answers (server/_hotwire.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

#define INTERN(var, text)                                                                   \
    do {                                                                                    \
        var = PyUnicode_InternFromString(text);                                             \
        if (var == NULL) {                                                                  \
            return NULL;                                                                    \
        }                                                                                   \
    } while (0)

PyMODINIT_FUNC
PyInit__hotwire(void)
{
    b64_init();
    plain_init();
    INTERN(s_keep, "keep");
    INTERN(s_replace, "replace");
    INTERN(s_utf8, "utf-8");
    INTERN(s_base64, "base64");
    INTERN(n_id, "id");
    INTERN(n_deadline, "deadline");
    INTERN(n_duplicate, "duplicate");
    INTERN(n_replaced, "replaced");
    INTERN(n_error, "error");
    INTERN(n_message, "message");
    INTERN(n_receipt, "receipt");
    INTERN(n_lease_expires, "lease_expires");
    INTERN(n_value, "value");
    INTERN(n_stats, "stats");
    INTERN(n_group, "group");
    INTERN(n_last_error, "last_error");
    INTERN(n_last_error_at, "last_error_at");
    INTERN(n_enqueue_time, "enqueue_time");
    INTERN(n_requeue_time, "requeue_time");
    INTERN(n_dequeue_count, "dequeue_count");
    return PyModule_Create(&module);
}
