/* The Python face of the installed build (included once, by rkkernels.c, after everything else).
 *
 * The fast path: `_rkkernels.linear_many(T, in, x, items)` with items a tuple of
 * (kind, out, y, part0[, part1[, part2]]) and every array passed as itself (buffer protocol), which
 * costs a fraction of a ctypes call's argument conversion, 200 times per token. The GIL is released
 * around the work. Raises ValueError when an array is not what its kind needs (the Python side then
 * finds and names the culprit). */
#ifndef RKPYTHON_H
#define RKPYTHON_H

/* buffer format of each part by kind (numpy: f float32, e float16, b int8, B uint8) */
static const char *const PART_FORMATS[K_COUNT] = {"f", "e", "bf", "Bee", "B", "B", "B"};

static int64_t part_bytes(int kind, const wmat *w, int j, int rp)
{
    if (rp) /* repacked: q, scales, biases (q8_0: q, scales, weight sums) */
        return j ? 2 * w->out * w->ng : kind == K_Q8_0 ? w->out * w->in : w->out * (w->in / 2);
    switch (kind) {
    case K_F32: return 4 * w->out * w->in;
    case K_F16: return 2 * w->out * w->in;
    case K_Q8: return j ? 4 * w->out : w->out * w->in;
    case K_Q4: return j ? 2 * w->out * w->ng : w->out * w->row_bytes;
    default: return w->out * w->row_bytes;
    }
}

/* Takes a C-contiguous buffer of `fmt` holding `bytes` into *b; 0, or -1 with an exception set. */
static int take_buffer(PyObject *obj, Py_buffer *b, char fmt, int64_t bytes, int writable)
{
    if (PyObject_GetBuffer(obj, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (b->format && b->format[0] == fmt && !b->format[1] && b->len == bytes) return 0;
    PyBuffer_Release(b);
    PyErr_Format(PyExc_ValueError, "an array is not C-contiguous '%c' data of %lld bytes", fmt, (long long)bytes);
    return -1;
}

static PyObject *py_linear_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4 || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "linear_many(T, in, x, items: tuple)");
        return NULL;
    }
    const int64_t T = PyLong_AsLongLong(args[0]), in = PyLong_AsLongLong(args[1]);
    const Py_ssize_t n = PyTuple_GET_SIZE(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (n < 1 || n > MAX_MATRICES || T < 0 || in < 0) {
        PyErr_SetString(PyExc_ValueError, "linear_many: bad matrix count or shape");
        return NULL;
    }
    Py_buffer bufs[1 + 4 * MAX_MATRICES];
    int nbuf = 0, rc = 0;
    int64_t desc[6 * MAX_MATRICES] = {0};
    if (take_buffer(args[2], &bufs[nbuf], 'f', 4 * T * in, 0) < 0) return NULL;
    const float *x = bufs[nbuf++].buf;
    for (Py_ssize_t j = 0; j < n && rc == 0; j++) {
        PyObject *item = PyTuple_GET_ITEM(args[3], j);
        const Py_ssize_t len = PyTuple_Check(item) ? PyTuple_GET_SIZE(item) : 0;
        const int code = len >= 4 ? (int)PyLong_AsLong(PyTuple_GET_ITEM(item, 0)) : -1;
        const int kind = code & ~(RK_Q8A | RK_RP), rp = (code & RK_RP) != 0;
        const int64_t out = len >= 4 ? PyLong_AsLongLong(PyTuple_GET_ITEM(item, 1)) : -1;
        wmat w;
        /* a repacked matrix's parts (q, scales, biases or sums) hold its rows padded to whole panels */
        const char *formats = rp ? (kind == K_Q8_0 ? "beh" : "Bee") : kind >= 0 && kind < K_COUNT ? PART_FORMATS[kind] : "";
        if (PyErr_Occurred() || (rp && !rp_kind(kind)) || wmat_init(&w, kind, rp ? rp_rows(out) : out, in, NULL, NULL, NULL) ||
            len != 3 + (Py_ssize_t)strlen(formats)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "linear_many: bad item");
            rc = -1;
            break;
        }
        desc[6 * j] = code;
        desc[6 * j + 1] = out;
        for (Py_ssize_t a = 2; a < len && rc == 0; a++) {
            const int part = (int)a - 3; /* -1: y */
            const char fmt = part < 0 ? 'f' : formats[part];
            const int64_t bytes = part < 0 ? 4 * T * out : part_bytes(kind, &w, part, rp);
            if (take_buffer(PyTuple_GET_ITEM(item, a), &bufs[nbuf], fmt, bytes, part < 0) < 0) {
                rc = -1;
                break;
            }
            desc[6 * j + a] = (int64_t)(intptr_t)bufs[nbuf++].buf;
        }
    }
    if (rc == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = rk_linear_many((int)n, T, in, x, desc);
        Py_END_ALLOW_THREADS
        if (rc) PyErr_Format(PyExc_ValueError, "linear_many: the kernel failed (code %d)", rc);
    }
    while (nbuf) PyBuffer_Release(&bufs[--nbuf]);
    if (rc) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef rk_methods[] = {
    {"linear_many", (PyCFunction)(void (*)(void))py_linear_many, METH_FASTCALL,
     "linear_many(T, in, x, items): y = x @ W.T into each item's y; items: (kind, out, y, *parts)."},
    {NULL, NULL, 0, NULL},
};

/* One source, several builds (setup.py): each its own module name, e.g. _rkkernels_avx2 */
#ifndef RK_MODULE
#define RK_MODULE _rkkernels
#endif
#define RK_STR_(a) #a
#define RK_STR(a) RK_STR_(a)
#define RK_CAT_(a, b) a##b
#define RK_CAT(a, b) RK_CAT_(a, b)

static struct PyModuleDef rk_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = RK_STR(RK_MODULE),
    .m_doc = "rkmojo kernels: plain C functions (loaded with ctypes by inference.kernels._lib) and a fast "
             "entry point for the installed build.",
    .m_size = -1,
    .m_methods = rk_methods,
};

PyMODINIT_FUNC RK_CAT(PyInit_, RK_MODULE)(void) { return PyModule_Create(&rk_module); }

#endif /* RKPYTHON_H */
