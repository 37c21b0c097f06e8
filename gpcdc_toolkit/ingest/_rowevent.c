/*
 * A decoded row event straight to its row of the ingest schema, for Spark's readers.
 *
 * row(topic, partition, offset, timestamp_ms, key, decoded) returns the tuple that
 * ingest/_rows.py's to_row returns for the same message, or None whenever the message
 * is anything but a row event of the usual form: another kind, a field the protocol
 * knows of the wrong type or out of range, a field missing that to_row needs, a
 * top-level field other than the row event's own, a key that is not UTF-8, an image
 * value that is an object or an array (written as JSON text by the general path), a
 * value of a subclass (orjson makes none; converting one could run Python code). The
 * caller then takes the general path (protocol.problem_of and to_row), which reads
 * what this one does not, or keeps the message as a corrupt record: so this file never
 * decides anything the Python code does not decide the same way, and raises only when
 * memory runs out.
 *
 * The checks are protocol/_events.py's for a row event (its _TYPES, _SOURCE_TYPES,
 * _ITEMS and required fields); the tuple is _rows.py's COLUMNS order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define WIDTH 30       /* len(COLUMNS) */
#define UNCHANGED_AT 25 /* COLUMNS' "unchanged" */
#define FALL_BACK 1    /* not the usual case: the general path decides */
#define FAILED (-1)    /* out of memory: a Python exception is set */

static PyObject *ROW_KIND, *TRUE_TEXT, *FALSE_TEXT;

/* Whether the str `name` is the ASCII text `want`. */
static int is(PyObject *name, const char *want, Py_ssize_t length) {
    return PyUnicode_IS_COMPACT_ASCII(name) && PyUnicode_GET_LENGTH(name) == length &&
           memcmp(PyUnicode_DATA(name), want, length) == 0;
}

#define IS(name, literal) is(name, literal, sizeof(literal) - 1)

/* An integer field: an int (never a bool) within `bits` bits, or None where `optional`. */
static int integer(PyObject *value, int bits, int optional) {
    if (value == Py_None)
        return optional;
    if (!PyLong_CheckExact(value))
        return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return bits == 64 || (v >= INT32_MIN && v <= INT32_MAX);
}

/* The source's nine fields, in the order of the tuple's columns after "kind". */
enum { SEGMENT, GXID, TXID, COMMIT_LSN, TS_MS, SCHEMA, TABLE, SEQ, ONE_PHASE, SOURCE_FIELDS };

/* 0 with every field of `source` set and of its type, else FALL_BACK. */
static int read_source(PyObject *source, PyObject **fields) {
    PyObject *name, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(source, &pos, &name, &value)) {
        int field, ok;
        if (!PyUnicode_Check(name))
            continue;
        if (IS(name, "segment"))
            field = SEGMENT, ok = integer(value, 32, 0);
        else if (IS(name, "gxid"))
            field = GXID, ok = integer(value, 64, 1);
        else if (IS(name, "txId"))
            field = TXID, ok = integer(value, 64, 1);
        else if (IS(name, "commit_lsn"))
            field = COMMIT_LSN, ok = integer(value, 64, 0);
        else if (IS(name, "ts_ms"))
            field = TS_MS, ok = integer(value, 64, 1);
        else if (IS(name, "schema"))
            field = SCHEMA, ok = PyUnicode_CheckExact(value);
        else if (IS(name, "table"))
            field = TABLE, ok = PyUnicode_CheckExact(value);
        else if (IS(name, "seq"))
            field = SEQ, ok = integer(value, 32, 0);
        else if (IS(name, "one_phase"))
            field = ONE_PHASE, ok = value == Py_None || value == Py_True || value == Py_False;
        else
            continue; /* a field the protocol does not know: read by no one */
        if (!ok)
            return FALL_BACK;
        fields[field] = value;
    }
    for (int i = 0; i < SOURCE_FIELDS; i++)
        if (fields[i] == NULL)
            return FALL_BACK;
    return 0;
}

/* A row image with every value as text (_rows._image), or NULL: *status says why. */
static PyObject *image(PyObject *values, int *status) {
    if (values == Py_None)
        return Py_NewRef(Py_None);
    PyObject *out = PyDict_New();
    if (out == NULL) {
        *status = FAILED;
        return NULL;
    }
    PyObject *name, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(values, &pos, &name, &value)) {
        PyObject *text;
        if (value == Py_None || PyUnicode_CheckExact(value))
            text = Py_NewRef(value);
        else if (value == Py_True || value == Py_False)
            text = Py_NewRef(value == Py_True ? TRUE_TEXT : FALSE_TEXT);
        else if (PyLong_CheckExact(value) || PyFloat_CheckExact(value)) { /* no Python code runs here */
            text = PyObject_Str(value);
            if (text == NULL) { /* say, more digits than Python prints: the general path says so */
                *status = PyErr_ExceptionMatches(PyExc_MemoryError) ? FAILED : FALL_BACK;
                if (*status == FALL_BACK)
                    PyErr_Clear();
                Py_DECREF(out);
                return NULL;
            }
        } else { /* an object or an array (JSON text), or a subclass: the general path */
            *status = FALL_BACK;
            Py_DECREF(out);
            return NULL;
        }
        int set = PyDict_SetItem(out, name, text);
        Py_DECREF(text);
        if (set < 0) {
            *status = FAILED;
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *row(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "row() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *key = args[4], *decoded = args[5];
    if (!PyDict_CheckExact(decoded))
        Py_RETURN_NONE;
    PyObject *op = NULL, *source = NULL, *before = NULL, *after = NULL, *unchanged = Py_None;
    PyObject *name, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(decoded, &pos, &name, &value)) {
        int ok;
        if (!PyUnicode_Check(name))
            Py_RETURN_NONE;
        if (IS(name, "op"))
            op = value, ok = PyUnicode_CheckExact(value);
        else if (IS(name, "source"))
            source = value, ok = PyDict_CheckExact(value);
        else if (IS(name, "before"))
            before = value, ok = value == Py_None || PyDict_CheckExact(value);
        else if (IS(name, "after"))
            after = value, ok = value == Py_None || PyDict_CheckExact(value);
        else if (IS(name, "unchanged")) {
            unchanged = value, ok = PyList_CheckExact(value);
            for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(value); i++)
                ok = PyUnicode_Check(PyList_GET_ITEM(value, i));
        } else /* the envelope's ts_ms and transaction, which the protocol does not check, and no other */
            ok = IS(name, "ts_ms") || IS(name, "transaction");
        if (!ok)
            Py_RETURN_NONE;
    }
    if (op == NULL || source == NULL || before == NULL || after == NULL)
        Py_RETURN_NONE;
    PyObject *fields[SOURCE_FIELDS] = {NULL};
    if (read_source(source, fields) == FALL_BACK)
        Py_RETURN_NONE;

    PyObject *key_text;
    if (key == Py_None)
        key_text = Py_NewRef(Py_None);
    else if (PyBytes_CheckExact(key)) {
        key_text = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), "strict");
        if (key_text == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                return NULL;
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    } else
        Py_RETURN_NONE;
    int status = 0;
    PyObject *before_text = image(before, &status);
    PyObject *after_text = before_text == NULL ? NULL : image(after, &status);
    if (after_text == NULL) {
        Py_DECREF(key_text);
        Py_XDECREF(before_text);
        if (status == FAILED)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *out = PyTuple_New(WIDTH);
    if (out == NULL) {
        Py_DECREF(key_text);
        Py_DECREF(before_text);
        Py_DECREF(after_text);
        return NULL;
    }
    PyObject *values[] = {args[0], args[1], args[2], args[3], ROW_KIND, fields[SEGMENT], fields[GXID], fields[TXID],
                          fields[COMMIT_LSN], fields[TS_MS], op, fields[SCHEMA], fields[TABLE], fields[SEQ],
                          fields[ONE_PHASE]};
    Py_ssize_t n = sizeof(values) / sizeof(values[0]);
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(out, i, Py_NewRef(values[i]));
    PyTuple_SET_ITEM(out, n, key_text); /* the references made above, handed on */
    PyTuple_SET_ITEM(out, n + 1, before_text);
    PyTuple_SET_ITEM(out, n + 2, after_text);
    for (Py_ssize_t i = n + 3; i < WIDTH; i++)
        PyTuple_SET_ITEM(out, i, Py_NewRef(i == UNCHANGED_AT ? unchanged : Py_None));
    return out;
}

static PyMethodDef methods[] = {
    {"row", (PyCFunction)(void (*)(void))row, METH_FASTCALL,
     "row(topic, partition, offset, timestamp_ms, key, decoded) -> tuple or None: see the module's source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rowevent", "A decoded row event straight to its row.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__rowevent(void) {
    ROW_KIND = PyUnicode_InternFromString("row");
    TRUE_TEXT = PyUnicode_InternFromString("true");
    FALSE_TEXT = PyUnicode_InternFromString("false");
    PyObject *created = ROW_KIND && TRUE_TEXT && FALSE_TEXT ? PyModule_Create(&module) : NULL;
    if (created == NULL) {
        Py_CLEAR(ROW_KIND);
        Py_CLEAR(TRUE_TEXT);
        Py_CLEAR(FALSE_TEXT);
    }
    return created;
}
