/*
 * A pgoutput row tuple straight to its JSON image, for capture's hot path.
 *
 * encode(payload, pos, names, kinds) reads the TupleData at payload[pos:] and returns
 * (image, key, end): the row image as a JSON object, the key columns' as another (None
 * when no column is a key), and the offset after the tuple. It returns None whenever
 * the tuple is anything but the usual case: a count other than the relation's, an
 * unchanged TOASTed value, a binary value, a truncated message, text that is not
 * UTF-8, an integer not in PostgreSQL's canonical form or out of 64 bits, a float
 * whose text is not a JSON number of a finite double, a boolean other than t or f, a
 * float in the key (see put_value). The caller then
 * takes the general path (protocol/_pgoutput.py and the assembler's dictionaries),
 * which decodes what this one does not, or says what is wrong with it: so this file
 * never raises for the stream's content, and never decides anything the Python code
 * does not decide the same way.
 *
 * names: one bytes per column, its JSON-encoded name followed by ':'.
 * kinds: one byte per column, how its text becomes JSON: 't' a string, 'i' an integer,
 * 'b' a boolean, 'f' a float (NaN and the infinities as strings); upper case for a key
 * column.
 *
 * The same value as the general path, always; the same bytes, except for floats in
 * the image, whose digits are PostgreSQL's (shortest exact) where the general path
 * prints orjson's. A key's bytes are the same on both paths: Kafka partitions and
 * compacts by them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#define FALL_BACK 1 /* not the usual case: the general path decides */
#define FAILED (-1) /* out of memory: a Python exception is set */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buffer;

static int reserve(Buffer *b, Py_ssize_t more) {
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return FAILED;
        }
        cap *= 2;
    }
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return FAILED;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int put(Buffer *b, const char *s, Py_ssize_t n) {
    if (reserve(b, n))
        return FAILED;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

static const char HEX[] = "0123456789abcdef";

/* A JSON string, escaped as orjson escapes: '"', '\\' and the control characters. */
static int put_string(Buffer *b, const unsigned char *s, Py_ssize_t n) {
    if (n > (PY_SSIZE_T_MAX - 2) / 6) /* its escaped length might not fit a Py_ssize_t */
        return FALL_BACK;
    Py_ssize_t escaped = n + 2; /* counted first: a large value reserves what it needs, no more */
    int ascii = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        ascii &= c < 0x80;
        if (c == '"' || c == '\\' || c == '\b' || c == '\t' || c == '\n' || c == '\f' || c == '\r')
            escaped += 1;
        else if (c < 0x20)
            escaped += 5;
    }
    if (!ascii) { /* valid UTF-8 exactly as Python's strict decoding judges it */
        PyObject *text = PyUnicode_DecodeUTF8((const char *)s, n, "strict");
        if (text == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                return FAILED;
            PyErr_Clear();
            return FALL_BACK;
        }
        Py_DECREF(text);
    }
    if (reserve(b, escaped))
        return FAILED;
    char *out = b->data + b->len;
    *out++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\') {
            *out++ = '\\';
            *out++ = (char)c;
        } else if (c < 0x20) {
            *out++ = '\\';
            switch (c) {
            case '\b': *out++ = 'b'; break;
            case '\t': *out++ = 't'; break;
            case '\n': *out++ = 'n'; break;
            case '\f': *out++ = 'f'; break;
            case '\r': *out++ = 'r'; break;
            default:
                *out++ = 'u'; *out++ = '0'; *out++ = '0';
                *out++ = HEX[c >> 4]; *out++ = HEX[c & 15];
            }
        } else {
            *out++ = (char)c;
        }
    }
    *out++ = '"';
    b->len = out - b->data;
    return 0;
}

static int digits(const unsigned char *s, Py_ssize_t n, Py_ssize_t *i) {
    Py_ssize_t start = *i;
    while (*i < n && s[*i] >= '0' && s[*i] <= '9')
        (*i)++;
    return *i > start;
}

/* An integer as PostgreSQL prints it, within 64 bits (orjson's range is wider). */
static int put_integer(Buffer *b, const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = s[0] == '-';
    Py_ssize_t first = i, count;
    if (!digits(s, n, &i) || i != n)
        return FALL_BACK;
    count = n - first;
    if ((s[first] == '0' && count > 1) || (first && count == 1 && s[1] == '0') || count > 19
        || (count == 19 && memcmp(s + first, first ? "9223372036854775808" : "9223372036854775807", 19) > 0))
        return FALL_BACK;
    return put(b, (const char *)s, n);
}

/* A float as PostgreSQL prints it: its digits when they are a JSON number of a finite
   double (".0" added when they read as an integer, so that a reader sees a float), NaN
   and the infinities as strings (JSON has no such numbers). */
static int put_float(Buffer *b, const unsigned char *s, Py_ssize_t n) {
    if ((n == 3 && memcmp(s, "NaN", 3) == 0) || (n == 8 && memcmp(s, "Infinity", 8) == 0)
        || (n == 9 && memcmp(s, "-Infinity", 9) == 0))
        return put_string(b, s, n);
    Py_ssize_t i = s[0] == '-';
    int integral = 1;
    if (i < n && s[i] == '0')
        i++;
    else if (!digits(s, n, &i))
        return FALL_BACK;
    if (i < n && s[i] == '.') {
        i++;
        integral = 0;
        if (!digits(s, n, &i))
            return FALL_BACK;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        integral = 0;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (!digits(s, n, &i))
            return FALL_BACK;
    }
    char text[64];
    if (i != n || n >= (Py_ssize_t)sizeof text)
        return FALL_BACK;
    memcpy(text, s, n);
    text[n] = '\0';
    double value = PyOS_string_to_double(text, NULL, NULL); /* out of a double's range: infinite */
    if (value == -1.0 && PyErr_Occurred())
        return FAILED;
    if (!isfinite(value))
        return FALL_BACK;
    if (put(b, (const char *)s, n))
        return FAILED;
    return integral ? put(b, ".0", 2) : 0;
}

static int put_value(Buffer *b, char kind, const unsigned char *s, Py_ssize_t n) {
    switch (kind | 0x20) { /* lower case: the kind, key or not */
    case 't':
        return put_string(b, s, n);
    case 'i':
        return n > 0 ? put_integer(b, s, n) : FALL_BACK;
    case 'f':
        /* In a key, orjson's digits (the general path's), never PostgreSQL's: Kafka
           partitions and compacts by the key's bytes, which must not depend on the path. */
        if (kind == 'F')
            return FALL_BACK;
        return n > 0 ? put_float(b, s, n) : FALL_BACK;
    case 'b':
        if (n == 1 && (s[0] == 't' || s[0] == 'f'))
            return s[0] == 't' ? put(b, "true", 4) : put(b, "false", 5);
        return FALL_BACK;
    }
    return FALL_BACK;
}

static PyObject *encode(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1]) || !PyTuple_Check(args[2])
        || !PyBytes_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "encode(payload: bytes, pos: int, names: tuple[bytes, ...], kinds: bytes)");
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    PyObject *names = args[2];
    const char *kinds = PyBytes_AS_STRING(args[3]);
    Py_ssize_t columns = PyTuple_GET_SIZE(names);
    if (PyBytes_GET_SIZE(args[3]) != columns) {
        PyErr_Format(PyExc_ValueError, "%zd names but %zd kinds", columns, PyBytes_GET_SIZE(args[3]));
        return NULL;
    }
    if (pos < 0 || pos > size - 2 || (int16_t)((buf[pos] << 8) | buf[pos + 1]) != columns) /* Int16, signed */
        Py_RETURN_NONE;
    pos += 2;

    Buffer image = {0}, key = {0};
    int keyed = 0, status = put(&image, "{", 1);
    if (status == 0)
        status = put(&key, "{", 1);
    for (Py_ssize_t c = 0; c < columns && status == 0; c++) {
        PyObject *name = PyTuple_GET_ITEM(names, c);
        if (!PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "names must be bytes");
            status = FAILED;
            break;
        }
        if (pos >= size) {
            status = FALL_BACK;
            break;
        }
        unsigned char tag = buf[pos++];
        const unsigned char *value = NULL;
        Py_ssize_t length = 0;
        if (tag == 't') {
            if (size - pos < 4) {
                status = FALL_BACK;
                break;
            }
            uint32_t n = ((uint32_t)buf[pos] << 24) | ((uint32_t)buf[pos + 1] << 16) | ((uint32_t)buf[pos + 2] << 8)
                         | buf[pos + 3];
            pos += 4;
            if ((uint64_t)n > (uint64_t)(size - pos)) {
                status = FALL_BACK;
                break;
            }
            value = buf + pos;
            length = (Py_ssize_t)n;
            pos += length;
        } else if (tag != 'n') { /* 'u' (unchanged TOAST), 'b' (binary) or damage */
            status = FALL_BACK;
            break;
        }
        int is_key = kinds[c] >= 'A' && kinds[c] <= 'Z';
        Buffer *targets[2] = {&image, is_key ? &key : NULL};
        for (int t = 0; t < 2 && status == 0 && targets[t] != NULL; t++) {
            Buffer *b = targets[t];
            if (b->len > 1)
                status = put(b, ",", 1);
            if (status == 0)
                status = put(b, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name));
            if (status == 0)
                status = value == NULL ? put(b, "null", 4) : put_value(b, kinds[c], value, length);
        }
        keyed |= is_key;
    }
    if (status == 0)
        status = put(&image, "}", 1);
    if (status == 0)
        status = put(&key, "}", 1);
    PyObject *result = NULL;
    if (status == FALL_BACK) {
        result = Py_NewRef(Py_None);
    } else if (status == 0) {
        PyObject *key_json = keyed ? PyBytes_FromStringAndSize(key.data, key.len) : Py_NewRef(Py_None);
        PyObject *image_json = PyBytes_FromStringAndSize(image.data, image.len);
        if (key_json != NULL && image_json != NULL)
            result = Py_BuildValue("(OOn)", image_json, key_json, pos);
        Py_XDECREF(key_json);
        Py_XDECREF(image_json);
    }
    PyMem_Free(image.data);
    PyMem_Free(key.data);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", (PyCFunction)(void (*)(void))encode, METH_FASTCALL,
     "encode(payload, pos, names, kinds) -> (image, key, end) or None: see the module's source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rowjson", "A pgoutput row tuple straight to JSON.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__rowjson(void) { return PyModule_Create(&module); }
