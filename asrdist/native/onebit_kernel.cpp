/* 1-bit column quantization kernels for asrdist (see asrdist/parallel/onebit_kernel.py for the
   wire format and the semantics; ReferenceQuantizer there is the specification this code matches
   bit for bit). Built by torch.utils.cpp_extension through asrdist.native, bound with the plain
   Python C API (no torch or pybind11 headers: the build takes seconds); every call releases the
   GIL while it runs. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#define restrict __restrict__

static int trailing_ones(int64_t i) { int t = 0; while (i & 1) { ++t; i >>= 1; } return t; }
static int num_levels(int64_t rows) { int l = 0; while (rows) { ++l; rows >>= 1; } return l; }

/* The subtree just stored at level t absorbs the stored subtrees of levels [from, t): the
   binary-counter form of the reference's pairwise row sums. */
static void carry(float* restrict pos_slots, float* restrict neg_slots, int from, int t, int64_t width) {
    float* restrict pt = pos_slots + t * width;
    float* restrict nt = neg_slots + t * width;
    for (int l = from; l < t; ++l) {
        const float* restrict pl = pos_slots + l * width;
        const float* restrict nl = neg_slots + l * width;
        for (int64_t j = 0; j < width; ++j) { pt[j] = pl[j] + pt[j]; nt[j] = nl[j] + nt[j]; }
    }
}

/* v = g + (last - recon(last)): the residual of the previous quantization, folded in. */
#define FOLD(v, k)                                                                  \
    if (has_r) {                                                                    \
        const float last = sv[j + (k) * stride], lp = lpm[j], ln = lnm[j];         \
        v += last - (last >= 0.0f ? lp : ln);                                       \
        sv[j + (k) * stride] = v;                                                   \
    }

/* Rows i..i+3 (i % 4 == 0) of columns [b0, b1): bits into w, counts, and each column's
   two-level subtree into ps / ns. Inlined with a constant has_r: branch-free, vectorizable. */
static inline __attribute__((always_inline)) void rows4(
        const float* restrict g, float* restrict sv, const float* restrict lnm,
        const float* restrict lpm, const int has_r, int64_t stride, int64_t b0, int64_t b1,
        uint32_t shift, uint32_t* restrict w, float* restrict ps, float* restrict ns,
        int32_t* restrict pos_count) {
    const uint32_t keep = shift ? ~0u : 0u;  /* the first rows of a word overwrite it */
    for (int64_t j = b0; j < b1; ++j) {
        float v0 = g[j], v1 = g[j + stride], v2 = g[j + 2 * stride], v3 = g[j + 3 * stride];
        FOLD(v0, 0) FOLD(v1, 1) FOLD(v2, 2) FOLD(v3, 3)
        const int k0 = v0 >= 0.0f, k1 = v1 >= 0.0f, k2 = v2 >= 0.0f, k3 = v3 >= 0.0f;
        const uint32_t bits = ((uint32_t)k0 | (uint32_t)k1 << 1 | (uint32_t)k2 << 2 | (uint32_t)k3 << 3) << shift;
        w[j - b0] = (w[j - b0] & keep) | bits;
        pos_count[j] += k0 + k1 + k2 + k3;
        ps[j] = ((k0 ? v0 : 0.0f) + (k1 ? v1 : 0.0f)) + ((k2 ? v2 : 0.0f) + (k3 ? v3 : 0.0f));
        ns[j] = ((k0 ? 0.0f : v0) + (k1 ? 0.0f : v1)) + ((k2 ? 0.0f : v2) + (k3 ? 0.0f : v3));
    }
}

/* One row (the last rows % 4): a level-0 subtree. */
static inline __attribute__((always_inline)) void row1(
        const float* restrict g, float* restrict sv, const float* restrict lnm,
        const float* restrict lpm, const int has_r, int64_t stride, int64_t b0, int64_t b1,
        uint32_t shift, uint32_t* restrict w, float* restrict ps, float* restrict ns,
        int32_t* restrict pos_count) {
    const uint32_t keep = shift ? ~0u : 0u;
    for (int64_t j = b0; j < b1; ++j) {
        float v = g[j];
        FOLD(v, 0)
        const int k = v >= 0.0f;
        w[j - b0] = (w[j - b0] & keep) | ((uint32_t)k << shift);
        pos_count[j] += k;
        ps[j] = k ? v : 0.0f;
        ns[j] = k ? 0.0f : v;
    }
}

/* One row of one segment: o[j] (+)= bit (shift) of wi[j] ? pm[j] : nm[j]. */
static inline __attribute__((always_inline)) void dequant_row(
        const uint32_t* restrict wi, const float* restrict nm, const float* restrict pm,
        uint32_t shift, float* restrict o, int64_t width, const int accumulate) {
    for (int64_t j = 0; j < width; ++j) {
        const float p = pm[j], n = nm[j];
        const float value = ((wi[j] >> shift) & 1u) ? p : n;
        o[j] = accumulate ? o[j] + value : value;
    }
}

/* Rows i..i+nr-1 of the mean of nsrc reconstructions of one [rows, width] block into tmp
   (nr x width): summed in source order, divided by nsrc, as onebit_dequantize_mean does. */
static void mean_rows(const uint32_t* const* words, const float* const* recon, int nsrc,
                      int64_t i, int nr, int64_t width, float* restrict tmp) {
    const float count = (float)nsrc;
    for (int r = 0; r < nr; ++r) {
        float* restrict o = tmp + r * width;
        const int64_t row = i + r;
        for (int s = 0; s < nsrc; ++s) {
            const uint32_t* wi = words[s] + (row >> 5) * width;
            if (s) dequant_row(wi, recon[s], recon[s] + width, (uint32_t)(row & 31), o, width, 1);
            else dequant_row(wi, recon[s], recon[s] + width, (uint32_t)(row & 31), o, width, 0);
        }
        for (int64_t j = 0; j < width; ++j) o[j] = o[j] / count;
    }
}

/* Quantize columns [bounds[0], bounds[nseg]) of g (rows x stride, row-major) in one sweep.
   Error feedback (if last != NULL): `last` (same layout as g) holds the previous step's values
   and `means` (2 x stride: negative row, non-negative row) their reconstruction; the residual
   last - recon(last) is added to g, then `last` and `means` are overwritten with this step's
   values and means. Segment s = columns [bounds[s], bounds[s+1]) goes to words[s]
   (ceil(rows/32) x width_s) and recon[s] (2 x width_s). Returns 0, or -1 if out of memory. */
static int quantize_impl(const float* g, const uint32_t* const* src_words, const float* const* src_recon,
                         int nsrc, float* last, float* means, int64_t rows, int64_t stride, int nseg,
                         const int64_t* bounds, uint32_t* const* words, float* const* recon) {
    const int64_t c0 = bounds[0], width = bounds[nseg] - c0;
    const int levels = num_levels(rows);
    /* With sources (nsrc > 0), g is their mean, made four rows at a time in `tmp`. */
    float* scratch = (float*)malloc(sizeof(float) * (2 * levels + 2 + (nsrc ? 4 : 0)) * width
                                    + sizeof(int32_t) * width);
    if (!scratch) return -1;
    float* pos_slots = scratch;
    float* neg_slots = scratch + levels * width;
    float* pos_mean = scratch + 2 * levels * width;
    float* neg_mean = pos_mean + width;
    int32_t* pos_count = (int32_t*)(neg_mean + width);
    float* tmp = (float*)(pos_count + width);
    memset(pos_count, 0, sizeof(int32_t) * width);
    const float* gc = nsrc ? tmp : g + c0;
    float* lc = last ? last + c0 : 0;
    const float* lnm = means ? means + c0 : 0;
    const float* lpm = means ? means + stride + c0 : 0;
    int64_t i = 0;
    for (; i < rows; ) {
        const int four = i + 4 <= rows;
        const int t = trailing_ones(four ? i + 3 : i);
        const uint32_t shift = (uint32_t)(i & 31);
        if (nsrc) mean_rows(src_words, src_recon, nsrc, i, four ? 4 : 1, width, tmp);
        for (int s = 0; s < nseg; ++s) {
            const int64_t b0 = bounds[s] - c0, b1 = bounds[s + 1] - c0;
            uint32_t* w = words[s] + (i >> 5) * (b1 - b0);
            float* ps = pos_slots + t * width;
            float* ns = neg_slots + t * width;
            const float* gi = nsrc ? tmp : gc + i * stride;
            float* li = lc ? lc + i * stride : 0;
            if (four && lc) rows4(gi, li, lnm, lpm, 1, stride, b0, b1, shift, w, ps, ns, pos_count);
            else if (four) rows4(gi, li, lnm, lpm, 0, stride, b0, b1, shift, w, ps, ns, pos_count);
            else if (lc) row1(gi, li, lnm, lpm, 1, stride, b0, b1, shift, w, ps, ns, pos_count);
            else row1(gi, li, lnm, lpm, 0, stride, b0, b1, shift, w, ps, ns, pos_count);
        }
        carry(pos_slots, neg_slots, four ? 2 : 0, t, width);
        i += four ? 4 : 1;
    }
    /* The complete subtrees left at the levels set in `rows`, combined from low to high. */
    int have = 0;
    for (int l = 0; l < levels; ++l) {
        if (!((rows >> l) & 1)) continue;
        const float* pl = pos_slots + l * width;
        const float* nl = neg_slots + l * width;
        for (int64_t j = 0; j < width; ++j) {
            pos_mean[j] = have ? pl[j] + pos_mean[j] : pl[j];
            neg_mean[j] = have ? nl[j] + neg_mean[j] : nl[j];
        }
        have = 1;
    }
    for (int64_t j = 0; j < width; ++j) {
        const int32_t pc = pos_count[j];
        const int64_t nc = rows - pc;
        const float ps = pos_mean[j], ns = neg_mean[j];
        pos_mean[j] = pc > 0 ? ps / (float)pc : 0.0f;
        neg_mean[j] = nc > 0 ? ns / (float)nc : 0.0f;
    }
    for (int s = 0; s < nseg; ++s) {
        const int64_t b0 = bounds[s] - c0, ws = bounds[s + 1] - bounds[s];
        memcpy(recon[s], neg_mean + b0, sizeof(float) * ws);
        memcpy(recon[s] + ws, pos_mean + b0, sizeof(float) * ws);
    }
    if (means) {
        memcpy(means + c0, neg_mean, sizeof(float) * width);
        memcpy(means + stride + c0, pos_mean, sizeof(float) * width);
    }
    free(scratch);
    return 0;
}

static int onebit_quantize(const float* g, float* last, float* means, int64_t rows, int64_t stride,
                    int nseg, const int64_t* bounds, uint32_t* const* words, float* const* recon) {
    return quantize_impl(g, 0, 0, 0, last, means, rows, stride, nseg, bounds, words, recon);
}

/* The stripe owner's reduce in one sweep: quantize (with error feedback as onebit_quantize,
   last/means being rows x width) the mean of nsrc reconstructions of a [rows, width] block,
   without writing the mean to memory. Same arithmetic as onebit_dequantize_mean followed by
   onebit_quantize. */
static int onebit_reduce_quantize(const uint32_t* const* src_words, const float* const* src_recon, int nsrc,
                           float* last, float* means, int64_t rows, int64_t width,
                           uint32_t* words, float* recon) {
    const int64_t bounds[2] = {0, width};
    return quantize_impl(0, src_words, src_recon, nsrc, last, means, rows, width, 1, bounds, &words, &recon);
}

/* Write (or add) the reconstruction of segments s = columns [bounds[s], bounds[s+1]) of out
   (rows x out_stride, row-major) from words[s] / recon[s]. */
static void onebit_dequantize(const uint32_t* const* words, const float* const* recon, int64_t rows,
                       int nseg, const int64_t* bounds, float* out, int64_t out_stride, int accumulate) {
    for (int64_t i = 0; i < rows; ++i) {
        for (int s = 0; s < nseg; ++s) {
            const int64_t ws = bounds[s + 1] - bounds[s];
            const uint32_t* wi = words[s] + (i >> 5) * ws;
            float* o = out + i * out_stride + bounds[s];
            if (accumulate) dequant_row(wi, recon[s], recon[s] + ws, (uint32_t)(i & 31), o, ws, 1);
            else dequant_row(wi, recon[s], recon[s] + ws, (uint32_t)(i & 31), o, ws, 0);
        }
    }
}

/* out (rows x width, contiguous) = the mean of nsrc reconstructions of one block, summed in
   source order and divided by nsrc: the stripe owner's reduce, one write per value. */
static void onebit_dequantize_mean(const uint32_t* const* words, const float* const* recon, int nsrc,
                            int64_t rows, int64_t width, float* out) {
    const float count = (float)nsrc;
    for (int64_t i = 0; i < rows; ++i) {
        float* restrict o = out + i * width;
        for (int s = 0; s < nsrc; ++s) {
            const uint32_t* wi = words[s] + (i >> 5) * width;
            if (s) dequant_row(wi, recon[s], recon[s] + width, (uint32_t)(i & 31), o, width, 1);
            else dequant_row(wi, recon[s], recon[s] + width, (uint32_t)(i & 31), o, width, 0);
        }
        for (int64_t j = 0; j < width; ++j) o[j] = o[j] / count;
    }
}

/* ------------------------------------------------------------------------------- binding */
/* Pointers arrive as Python ints (tensor.data_ptr(), 0 for none) and tuples of them; the
   Python side (FusedQuantizer) has checked every shape, dtype and layout. */

namespace {

/* A tuple of ints as a C array (pointers or int64). */
template <typename T>
struct IntArray {
    T* items = nullptr;
    Py_ssize_t size = 0;
    ~IntArray() { std::free(items); }
    bool parse(PyObject* seq) {
        if (!PyTuple_Check(seq)) { PyErr_SetString(PyExc_TypeError, "expected a tuple of ints"); return false; }
        size = PyTuple_GET_SIZE(seq);
        items = static_cast<T*>(std::malloc(sizeof(T) * (size ? size : 1)));
        if (!items) { PyErr_NoMemory(); return false; }
        for (Py_ssize_t k = 0; k < size; ++k) {
            const unsigned long long v = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(seq, k));
            if (PyErr_Occurred()) return false;
            items[k] = (T)(uintptr_t)v;
        }
        return true;
    }
};

void* pointer(unsigned long long p) { return (void*)(uintptr_t)p; }

PyObject* quantize(PyObject*, PyObject* args) {
    unsigned long long g, last, means;
    long long rows, stride;
    PyObject *bounds_t, *words_t, *recon_t;
    if (!PyArg_ParseTuple(args, "KKKLLO!O!O!", &g, &last, &means, &rows, &stride, &PyTuple_Type, &bounds_t,
                          &PyTuple_Type, &words_t, &PyTuple_Type, &recon_t)) return nullptr;
    IntArray<int64_t> bounds;
    IntArray<uint32_t*> words;
    IntArray<float*> recon;
    if (!bounds.parse(bounds_t) || !words.parse(words_t) || !recon.parse(recon_t)) return nullptr;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = onebit_quantize((const float*)pointer(g), (float*)pointer(last), (float*)pointer(means), rows, stride,
                             (int)(bounds.size - 1), bounds.items, words.items, recon.items);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

PyObject* reduce_quantize(PyObject*, PyObject* args) {
    PyObject *words_t, *recon_t;
    unsigned long long last, means, out_words, out_recon;
    long long rows, width;
    if (!PyArg_ParseTuple(args, "O!O!KKLLKK", &PyTuple_Type, &words_t, &PyTuple_Type, &recon_t, &last, &means,
                          &rows, &width, &out_words, &out_recon)) return nullptr;
    IntArray<const uint32_t*> words;
    IntArray<const float*> recon;
    if (!words.parse(words_t) || !recon.parse(recon_t)) return nullptr;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = onebit_reduce_quantize(words.items, recon.items, (int)words.size, (float*)pointer(last),
                                    (float*)pointer(means), rows, width, (uint32_t*)pointer(out_words),
                                    (float*)pointer(out_recon));
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

PyObject* dequantize(PyObject*, PyObject* args) {
    PyObject *words_t, *recon_t, *bounds_t;
    long long rows, out_stride;
    unsigned long long out;
    int accumulate;
    if (!PyArg_ParseTuple(args, "O!O!LO!KLp", &PyTuple_Type, &words_t, &PyTuple_Type, &recon_t, &rows,
                          &PyTuple_Type, &bounds_t, &out, &out_stride, &accumulate)) return nullptr;
    IntArray<const uint32_t*> words;
    IntArray<const float*> recon;
    IntArray<int64_t> bounds;
    if (!words.parse(words_t) || !recon.parse(recon_t) || !bounds.parse(bounds_t)) return nullptr;
    Py_BEGIN_ALLOW_THREADS
    onebit_dequantize(words.items, recon.items, rows, (int)(bounds.size - 1), bounds.items, (float*)pointer(out),
                      out_stride, accumulate);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyObject* dequantize_mean(PyObject*, PyObject* args) {
    PyObject *words_t, *recon_t;
    long long rows, width;
    unsigned long long out;
    if (!PyArg_ParseTuple(args, "O!O!LLK", &PyTuple_Type, &words_t, &PyTuple_Type, &recon_t, &rows, &width, &out))
        return nullptr;
    IntArray<const uint32_t*> words;
    IntArray<const float*> recon;
    if (!words.parse(words_t) || !recon.parse(recon_t)) return nullptr;
    Py_BEGIN_ALLOW_THREADS
    onebit_dequantize_mean(words.items, recon.items, (int)words.size, rows, width, (float*)pointer(out));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"quantize", quantize, METH_VARARGS,
     "quantize(g, last, means, rows, stride, bounds, words, recon) -> 0, or -1 when out of memory"},
    {"reduce_quantize", reduce_quantize, METH_VARARGS,
     "reduce_quantize(words, recon, last, means, rows, width, out_words, out_recon) -> 0 or -1"},
    {"dequantize", dequantize, METH_VARARGS, "dequantize(words, recon, rows, bounds, out, out_stride, accumulate)"},
    {"dequantize_mean", dequantize_mean, METH_VARARGS, "dequantize_mean(words, recon, rows, width, out)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "onebit_kernel", "asrdist's fused 1-bit kernels", -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace

#define ASRDIST_CONCAT2(a, b) a##b
#define ASRDIST_CONCAT(a, b) ASRDIST_CONCAT2(a, b)
PyMODINIT_FUNC ASRDIST_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module); }
