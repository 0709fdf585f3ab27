/* The record scanner: the one parser of record batch v2 records (the bytes after the
 * 61-byte batch header, decompressed), shared by the broker's LogValidator, the log
 * cleaner and the consumer's decoder. Layout and rules in strom/records/scanner.py.
 *
 * Every length read from the bytes is checked against the bytes left before it is used,
 * and nothing is allocated from a count before the count is bounded by the bytes left.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *RecordError;

/* The smallest record: length, attributes, timestampDelta, offsetDelta, keyLength,
 * valueLength and headerCount, one byte each. */
#define MIN_RECORD_SIZE 7
/* Above this many payload bytes the validator walks without the GIL. Smaller walks keep it:
 * they take under a millisecond, and the event-loop thread (which validates record sets up to
 * 4 MiB itself, log_validator.WORKER_THRESHOLD_BYTES) could otherwise wait up to the
 * interpreter's switch interval to take the GIL back from a busy worker thread. */
#define NOGIL_THRESHOLD (4 * 1024 * 1024)

typedef enum {
    OK = 0,
    E_VARINT_TRUNCATED,
    E_VARINT_TOO_LONG,
    E_NEGATIVE_LENGTH,
    E_LENGTH_PAST_END,
    E_TRUNCATED_FIELD,
    E_KEY_LENGTH,
    E_VALUE_LENGTH,
    E_FIELD_PAST_RECORD,
    E_HEADER_COUNT,
    E_HEADER_KEY_LENGTH,
    E_HEADER_VALUE_LENGTH,
    E_SIZE_MISMATCH,
    E_OFFSET_DELTA,
    E_TIMESTAMP_OVERFLOW,
} scan_error;

typedef struct {
    Py_ssize_t start;     /* where the record's length varint starts */
    Py_ssize_t body;      /* where its attributes byte is */
    Py_ssize_t after_ts;  /* where its timestamp delta ends */
    Py_ssize_t end;
    int64_t timestamp_delta;
    int32_t offset_delta;
    int32_t length;
    Py_ssize_t key_pos;
    int32_t key_len;      /* -1: null */
    Py_ssize_t value_pos;
    int32_t value_len;    /* -1: null */
    Py_ssize_t headers_pos;  /* after the header count */
    int32_t header_count;
    int64_t bad_value;    /* the offending value, for messages */
} record_t;

/* Zig-zag varint of an int32: at most 5 bytes, the fifth holding only the top 4 bits
 * (Kafka's writers never set more; a longer or wider encoding is malformed). */
static inline scan_error read_varint(const uint8_t *b, Py_ssize_t *pos, Py_ssize_t end, int32_t *out)
{
    Py_ssize_t p = *pos;
    /* One- and two-byte varints (-8192..8191) cover nearly every length and delta. */
    if (p < end && b[p] < 0x80) {
        uint32_t u = b[p];
        *out = (int32_t)((u >> 1) ^ (uint32_t)-(int32_t)(u & 1));
        *pos = p + 1;
        return OK;
    }
    if (end - p >= 2 && b[p + 1] < 0x80) {
        uint32_t u = (uint32_t)(b[p] & 0x7F) | ((uint32_t)b[p + 1] << 7);
        *out = (int32_t)((u >> 1) ^ (uint32_t)-(int32_t)(u & 1));
        *pos = p + 2;
        return OK;
    }
    uint32_t u = 0;
    for (int i = 0; i < 5; i++) {
        if (p >= end)
            return E_VARINT_TRUNCATED;
        uint8_t byte = b[p++];
        if (i == 4 && byte > 0x0F)
            return E_VARINT_TOO_LONG;
        u |= (uint32_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            *out = (int32_t)((u >> 1) ^ (uint32_t)-(int32_t)(u & 1));
            *pos = p;
            return OK;
        }
    }
    return E_VARINT_TOO_LONG;
}

/* Zig-zag varint of an int64: at most 10 bytes, the tenth holding only the top bit. */
static inline scan_error read_varlong(const uint8_t *b, Py_ssize_t *pos, Py_ssize_t end, int64_t *out)
{
    Py_ssize_t p = *pos;
    if (p < end && b[p] < 0x80) {
        uint64_t u = b[p];
        *out = (int64_t)((u >> 1) ^ (uint64_t)-(int64_t)(u & 1));
        *pos = p + 1;
        return OK;
    }
    uint64_t u = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end)
            return E_VARINT_TRUNCATED;
        uint8_t byte = b[p++];
        if (i == 9 && byte > 0x01)
            return E_VARINT_TOO_LONG;
        u |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            *out = (int64_t)((u >> 1) ^ (uint64_t)-(int64_t)(u & 1));
            *pos = p;
            return OK;
        }
    }
    return E_VARINT_TOO_LONG;
}

/* Parse the record at r->start, which must end by `limit`. */
static scan_error parse_record(const uint8_t *b, Py_ssize_t limit, record_t *r)
{
    scan_error e;
    Py_ssize_t p = r->start;
    int32_t length, size;
    if ((e = read_varint(b, &p, limit, &length)))
        return e;
    r->length = length;
    if (length < 0) {
        r->bad_value = length;
        return E_NEGATIVE_LENGTH;
    }
    if (length > limit - p) {
        r->bad_value = length;
        return E_LENGTH_PAST_END;
    }
    r->body = p;
    Py_ssize_t end = p + length;
    r->end = end;
    if (p >= end)
        return E_TRUNCATED_FIELD;
    p++; /* attributes: unused in v2 */
    if ((e = read_varlong(b, &p, end, &r->timestamp_delta)))
        return e;
    r->after_ts = p;
    if ((e = read_varint(b, &p, end, &r->offset_delta)))
        return e;
    if ((e = read_varint(b, &p, end, &size)))
        return e;
    if (size < -1) {
        r->bad_value = size;
        return E_KEY_LENGTH;
    }
    if (size > end - p) {
        r->bad_value = size;
        return E_FIELD_PAST_RECORD;
    }
    r->key_pos = p;
    r->key_len = size;
    if (size > 0)
        p += size;
    if ((e = read_varint(b, &p, end, &size)))
        return e;
    if (size < -1) {
        r->bad_value = size;
        return E_VALUE_LENGTH;
    }
    if (size > end - p) {
        r->bad_value = size;
        return E_FIELD_PAST_RECORD;
    }
    r->value_pos = p;
    r->value_len = size;
    if (size > 0)
        p += size;
    if ((e = read_varint(b, &p, end, &size)))
        return e;
    /* Each header takes at least two bytes (its key and value lengths). */
    if (size < 0 || size > (end - p) / 2) {
        r->bad_value = size;
        return E_HEADER_COUNT;
    }
    r->header_count = size;
    r->headers_pos = p;
    for (int32_t i = 0; i < r->header_count; i++) {
        if ((e = read_varint(b, &p, end, &size)))
            return e;
        if (size < 0) {
            r->bad_value = size;
            return E_HEADER_KEY_LENGTH;
        }
        if (size > end - p) {
            r->bad_value = size;
            return E_FIELD_PAST_RECORD;
        }
        p += size;
        if ((e = read_varint(b, &p, end, &size)))
            return e;
        if (size < -1) {
            r->bad_value = size;
            return E_HEADER_VALUE_LENGTH;
        }
        if (size > end - p) {
            r->bad_value = size;
            return E_FIELD_PAST_RECORD;
        }
        if (size > 0)
            p += size;
    }
    if (p != end) {
        r->bad_value = p - r->body;
        return E_SIZE_MISMATCH;
    }
    return OK;
}

/* Offset deltas rise strictly and stay within the batch's lastOffsetDelta (a client's
 * batch therefore has exactly 0, 1, 2, ...; a cleaned batch may have gaps). */
static inline scan_error check_offset_delta(record_t *r, int32_t *previous, int64_t last_offset_delta)
{
    if (r->offset_delta <= *previous || r->offset_delta > last_offset_delta) {
        r->bad_value = r->offset_delta;
        return E_OFFSET_DELTA;
    }
    *previous = r->offset_delta;
    return OK;
}

static PyObject *raise_error(scan_error e, Py_ssize_t index, const record_t *r, int64_t last_offset_delta)
{
    long long v = (long long)r->bad_value;
    Py_ssize_t at = r->start;
    switch (e) {
    case E_VARINT_TRUNCATED:
        return PyErr_Format(RecordError, "record %zd at byte %zd: a varint runs past its record", index, at);
    case E_VARINT_TOO_LONG:
        return PyErr_Format(RecordError, "record %zd at byte %zd: a varint is too long for its field", index, at);
    case E_NEGATIVE_LENGTH:
        return PyErr_Format(RecordError, "record %zd at byte %zd: invalid record size %lld", index, at, v);
    case E_LENGTH_PAST_END:
        return PyErr_Format(RecordError,
                            "record %zd at byte %zd: invalid record size: expected %lld bytes in record payload, "
                            "but the batch has fewer left",
                            index, at, v);
    case E_TRUNCATED_FIELD:
        return PyErr_Format(RecordError, "record %zd at byte %zd: found invalid record structure", index, at);
    case E_KEY_LENGTH:
        return PyErr_Format(RecordError, "record %zd at byte %zd: invalid key length %lld", index, at, v);
    case E_VALUE_LENGTH:
        return PyErr_Format(RecordError, "record %zd at byte %zd: invalid value length %lld", index, at, v);
    case E_FIELD_PAST_RECORD:
        return PyErr_Format(RecordError, "record %zd at byte %zd: a field of %lld bytes runs past its record",
                            index, at, v);
    case E_HEADER_COUNT:
        return PyErr_Format(RecordError, "record %zd at byte %zd: found invalid number of record headers %lld",
                            index, at, v);
    case E_HEADER_KEY_LENGTH:
        return PyErr_Format(RecordError, "record %zd at byte %zd: invalid negative header key size %lld", index,
                            at, v);
    case E_HEADER_VALUE_LENGTH:
        return PyErr_Format(RecordError, "record %zd at byte %zd: invalid header value length %lld", index, at,
                            v);
    case E_SIZE_MISMATCH:
        return PyErr_Format(RecordError,
                            "record %zd at byte %zd: invalid record size: expected to read %d bytes in record "
                            "payload, but instead read %lld",
                            index, at, (int)r->length, v);
    case E_OFFSET_DELTA:
        return PyErr_Format(RecordError,
                            "record %zd at byte %zd: offset delta %lld does not follow the previous record's "
                            "within the batch's last offset delta %lld",
                            index, at, v, (long long)last_offset_delta);
    case E_TIMESTAMP_OVERFLOW:
        return PyErr_Format(RecordError, "record %zd at byte %zd: timestamp delta %lld overflows", index, at, v);
    default:
        return PyErr_Format(RecordError, "record %zd at byte %zd: malformed", index, at);
    }
}

/* The arguments every scan takes: the payload, [start, end), the batch's record count and
 * lastOffsetDelta. Checks the range and bounds the count by the bytes. */
typedef struct {
    Py_buffer view;
    Py_ssize_t start, end;
    long long count, last_offset_delta;
} scan_args;

static int check_args(scan_args *a)
{
    if (a->start < 0 || a->end < a->start || a->end > a->view.len) {
        PyErr_Format(PyExc_ValueError, "record range [%zd, %zd) outside a buffer of %zd bytes", a->start, a->end,
                     a->view.len);
        return -1;
    }
    if (a->count < 0 || a->count > (a->end - a->start) / MIN_RECORD_SIZE) {
        PyErr_Format(RecordError, "record count %lld does not fit in the batch's %zd bytes of records", a->count,
                     a->end - a->start);
        return -1;
    }
    return 0;
}

static PyObject *trailing_error(Py_ssize_t left, long long count)
{
    return PyErr_Format(RecordError, "%zd bytes left after the batch's %lld declared records", left, count);
}

/* validate(data, start, end, count, last_offset_delta, base_timestamp, earliest, latest,
 *          check_timestamps, check_keys) -> (max_timestamp, keyless, out_of_range)
 *
 * Walks every record. max_timestamp is the largest record timestamp (base + delta);
 * keyless and out_of_range are lists of record indexes (records without a key when
 * check_keys; timestamps other than -1 outside [earliest, latest] when check_timestamps),
 * or None when there are none. */
static PyObject *validate(PyObject *self, PyObject *args)
{
    scan_args a;
    long long base_timestamp, earliest, latest;
    int check_timestamps, check_keys;
    if (!PyArg_ParseTuple(args, "y*nnLLLLLpp", &a.view, &a.start, &a.end, &a.count, &a.last_offset_delta,
                          &base_timestamp, &earliest, &latest, &check_timestamps, &check_keys))
        return NULL;
    PyObject *result = NULL, *keyless = NULL, *out_of_range = NULL;
    if (check_args(&a) < 0)
        goto done;
    const uint8_t *b = (const uint8_t *)a.view.buf;
    record_t r;
    scan_error e = OK;
    Py_ssize_t index = 0, p = a.start;
    int32_t previous = -1;
    int64_t max_timestamp = -1;
    Py_ssize_t keyless_count = 0, bad_timestamps = 0;
    PyThreadState *save = NULL;
    if (a.end - a.start > NOGIL_THRESHOLD)
        save = PyEval_SaveThread();
    for (; index < a.count; index++) {
        r.start = p;
        if ((e = parse_record(b, a.end, &r)) || (e = check_offset_delta(&r, &previous, a.last_offset_delta)))
            break;
        int64_t timestamp;
        if (__builtin_add_overflow((int64_t)base_timestamp, r.timestamp_delta, &timestamp)) {
            r.bad_value = r.timestamp_delta;
            e = E_TIMESTAMP_OVERFLOW;
            break;
        }
        if (timestamp > max_timestamp)
            max_timestamp = timestamp;
        if (check_keys && r.key_len < 0)
            keyless_count++;
        if (check_timestamps && timestamp != -1 && (timestamp < earliest || timestamp > latest))
            bad_timestamps++;
        p = r.end;
    }
    if (save != NULL)
        PyEval_RestoreThread(save);
    if (e) {
        raise_error(e, index, &r, a.last_offset_delta);
        goto done;
    }
    if (p != a.end) {
        trailing_error(a.end - p, a.count);
        goto done;
    }
    if (keyless_count || bad_timestamps) {
        /* Rare: a second pass to name the records (the first one found them well formed). */
        if ((keyless_count && !(keyless = PyList_New(0))) || (bad_timestamps && !(out_of_range = PyList_New(0))))
            goto done;
        p = a.start;
        for (index = 0; index < a.count; index++) {
            r.start = p;
            parse_record(b, a.end, &r);
            int64_t timestamp = (int64_t)base_timestamp + r.timestamp_delta;
            PyObject *i = NULL;
            if (keyless && r.key_len < 0) {
                if (!(i = PyLong_FromSsize_t(index)) || PyList_Append(keyless, i) < 0) {
                    Py_XDECREF(i);
                    goto done;
                }
                Py_DECREF(i);
            }
            if (out_of_range && timestamp != -1 && (timestamp < earliest || timestamp > latest)) {
                if (!(i = PyLong_FromSsize_t(index)) || PyList_Append(out_of_range, i) < 0) {
                    Py_XDECREF(i);
                    goto done;
                }
                Py_DECREF(i);
            }
            p = r.end;
        }
    }
    result = Py_BuildValue("(LOO)", (long long)max_timestamp, keyless ? keyless : Py_None,
                           out_of_range ? out_of_range : Py_None);
done:
    Py_XDECREF(keyless);
    Py_XDECREF(out_of_range);
    PyBuffer_Release(&a.view);
    return result;
}

static PyObject *bytes_or_none(const uint8_t *b, Py_ssize_t pos, int32_t len)
{
    if (len < 0)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)b + pos, len);
}

/* The headers of a record already checked by parse_record, as a tuple of (str, bytes | None).
 * Keys are decoded as UTF-8 with replacement characters, as Kafka's Java client does. */
static PyObject *build_headers(const uint8_t *b, Py_ssize_t p, Py_ssize_t end, int32_t count)
{
    PyObject *headers = PyTuple_New(count);
    if (headers == NULL)
        return NULL;
    for (int32_t i = 0; i < count; i++) {
        int32_t size = 0;
        read_varint(b, &p, end, &size);
        PyObject *key = PyUnicode_DecodeUTF8((const char *)b + p, size, "replace");
        p += size;
        read_varint(b, &p, end, &size);
        PyObject *value = bytes_or_none(b, p, size);
        if (size > 0)
            p += size;
        PyObject *pair = (key && value) ? PyTuple_Pack(2, key, value) : NULL;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (pair == NULL) {
            Py_DECREF(headers);
            return NULL;
        }
        PyTuple_SET_ITEM(headers, i, pair);
    }
    return headers;
}

static PyObject *empty_tuple;

/* The walk shared by decode() and layout(): every record parsed and checked, then handed to
 * `build`, which returns a new reference for the output list. */
typedef PyObject *(*build_fn)(const uint8_t *b, const record_t *r);

static PyObject *walk(PyObject *args, build_fn build)
{
    scan_args a;
    if (!PyArg_ParseTuple(args, "y*nnLL", &a.view, &a.start, &a.end, &a.count, &a.last_offset_delta))
        return NULL;
    PyObject *out = NULL;
    if (check_args(&a) < 0)
        goto done;
    const uint8_t *b = (const uint8_t *)a.view.buf;
    if (!(out = PyList_New((Py_ssize_t)a.count)))
        goto done;
    record_t r;
    scan_error e;
    Py_ssize_t p = a.start;
    int32_t previous = -1;
    for (Py_ssize_t index = 0; index < a.count; index++) {
        r.start = p;
        if ((e = parse_record(b, a.end, &r)) || (e = check_offset_delta(&r, &previous, a.last_offset_delta))) {
            raise_error(e, index, &r, a.last_offset_delta);
            Py_CLEAR(out);
            goto done;
        }
        PyObject *item = build(b, &r);
        if (item == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, index, item);
        p = r.end;
    }
    if (p != a.end) {
        trailing_error(a.end - p, a.count);
        Py_CLEAR(out);
    }
done:
    PyBuffer_Release(&a.view);
    return out;
}

static PyObject *build_decoded(const uint8_t *b, const record_t *r)
{
    PyObject *key = bytes_or_none(b, r->key_pos, r->key_len);
    PyObject *value = key ? bytes_or_none(b, r->value_pos, r->value_len) : NULL;
    PyObject *headers = NULL;
    if (value) {
        if (r->header_count) {
            headers = build_headers(b, r->headers_pos, r->end, r->header_count);
        } else {
            headers = empty_tuple;
            Py_INCREF(headers);
        }
    }
    PyObject *item = NULL;
    if (headers)
        item = Py_BuildValue("(iLOOO)", (int)r->offset_delta, (long long)r->timestamp_delta, key, value, headers);
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(headers);
    return item;
}

/* decode(data, start, end, count, last_offset_delta)
 *   -> [(offset_delta, timestamp_delta, key, value, headers), ...] */
static PyObject *decode(PyObject *self, PyObject *args) { return walk(args, build_decoded); }

static PyObject *build_layout(const uint8_t *b, const record_t *r)
{
    PyObject *key = bytes_or_none(b, r->key_pos, r->key_len);
    if (key == NULL)
        return NULL;
    PyObject *item = Py_BuildValue("(nnnniLOO)", r->start, r->body, r->after_ts, r->end, (int)r->offset_delta,
                                   (long long)r->timestamp_delta, key, r->value_len >= 0 ? Py_True : Py_False);
    Py_DECREF(key);
    return item;
}

/* layout(data, start, end, count, last_offset_delta)
 *   -> [(start, body, after_timestamp, end, offset_delta, timestamp_delta, key, has_value), ...]
 * where the record starts (its length varint), its attributes byte, the end of its
 * timestamp delta and its end: what the log cleaner needs to copy or re-encode it. */
static PyObject *layout(PyObject *self, PyObject *args) { return walk(args, build_layout); }

/* read_headers(data, position, end) -> (headers, position after them): a header count and
 * its headers at `position`, which must end by `end`. */
static PyObject *read_headers(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t p, end;
    if (!PyArg_ParseTuple(args, "y*nn", &view, &p, &end))
        return NULL;
    PyObject *result = NULL;
    const uint8_t *b = (const uint8_t *)view.buf;
    if (p < 0 || end < p || end > view.len) {
        PyErr_SetString(PyExc_ValueError, "header range outside its buffer");
        goto done;
    }
    record_t r = {0};
    r.start = p;
    int32_t count, size;
    Py_ssize_t q = p;
    scan_error e = read_varint(b, &q, end, &count);
    if (!e && (count < 0 || count > (end - q) / 2)) {
        r.bad_value = count;
        e = E_HEADER_COUNT;
    }
    Py_ssize_t first = q;
    for (int32_t i = 0; !e && i < count; i++) {
        if ((e = read_varint(b, &q, end, &size)))
            break;
        if (size < 0 || size > end - q) {
            r.bad_value = size;
            e = size < 0 ? E_HEADER_KEY_LENGTH : E_FIELD_PAST_RECORD;
            break;
        }
        q += size;
        if ((e = read_varint(b, &q, end, &size)))
            break;
        if (size < -1 || size > end - q) {
            r.bad_value = size;
            e = size < -1 ? E_HEADER_VALUE_LENGTH : E_FIELD_PAST_RECORD;
            break;
        }
        if (size > 0)
            q += size;
    }
    if (e) {
        raise_error(e, 0, &r, 0);
        goto done;
    }
    PyObject *headers = build_headers(b, first, end, count);
    if (headers != NULL) {
        result = Py_BuildValue("(On)", headers, q);
        Py_DECREF(headers);
    }
done:
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"validate", validate, METH_VARARGS, "Walk and check every record of a batch; see scanner.py."},
    {"decode", decode, METH_VARARGS, "Every record of a batch as (offset_delta, timestamp_delta, key, value, headers)."},
    {"layout", layout, METH_VARARGS, "Every record of a batch with its byte positions, for the log cleaner."},
    {"read_headers", read_headers, METH_VARARGS, "A record's header count and headers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT, .m_name = "_scanner", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__scanner(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    empty_tuple = PyTuple_New(0);
    RecordError = PyErr_NewExceptionWithDoc("strom.records._scanner.RecordError",
                                            "A malformed record inside a record batch.", PyExc_ValueError, NULL);
    if (empty_tuple == NULL || RecordError == NULL || PyModule_AddObjectRef(m, "RecordError", RecordError) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
