/*
 * X25519 (RFC 7748) for many points under one scalar, eight at a time in AVX-512 IFMA lanes.
 *
 * PSI blinds a whole list of points with one secret scalar, so every lane follows the same ladder: the
 * conditional swap is one broadcast mask per step, with no branch on the scalar's bits. A field element is
 * five 52-bit limbs per lane (radix 2^52, the width IFMA multiplies); 2^255 = 19 and 2^260 = 608 (mod p)
 * fold the high limbs back. Every operation leaves limbs below 2^52 and the top limb below 2^48, what the
 * next multiplication needs (IFMA reads only an input's low 52 bits).
 *
 * blind(key, points) -> bytes equals OpenSSL's X25519 on each point (the tests check it against
 * `cryptography`); available() says whether this CPU has the instructions. The caller falls back to OpenSSL
 * where it has not, or where this module was not built (it is an optional extension).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define IFMA __attribute__((target("avx512f,avx512ifma")))
#define LANES 8

typedef struct { __m512i l[5]; } fe;

static const uint64_t M52 = (1ULL << 52) - 1, M47 = (1ULL << 47) - 1;

/* Limbs below 2^52, the top one below 2^48; input limbs may be up to about 2^62. */
IFMA static inline void normalize(fe *r, __m512i c0, __m512i c1, __m512i c2, __m512i c3, __m512i c4) {
    const __m512i m52 = _mm512_set1_epi64((long long)M52), m47 = _mm512_set1_epi64((long long)M47);
    __m512i t = _mm512_srli_epi64(c4, 47);
    c4 = _mm512_and_si512(c4, m47);
    c0 = _mm512_madd52lo_epu64(c0, t, _mm512_set1_epi64(19));  /* bits at 2^255 and up count 19 times */
    c1 = _mm512_add_epi64(c1, _mm512_srli_epi64(c0, 52)); c0 = _mm512_and_si512(c0, m52);
    c2 = _mm512_add_epi64(c2, _mm512_srli_epi64(c1, 52)); c1 = _mm512_and_si512(c1, m52);
    c3 = _mm512_add_epi64(c3, _mm512_srli_epi64(c2, 52)); c2 = _mm512_and_si512(c2, m52);
    c4 = _mm512_add_epi64(c4, _mm512_srli_epi64(c3, 52)); c3 = _mm512_and_si512(c3, m52);
    r->l[0] = c0; r->l[1] = c1; r->l[2] = c2; r->l[3] = c3; r->l[4] = c4;
}

IFMA static inline void fe_add(fe *r, const fe *a, const fe *b) {
    normalize(r, _mm512_add_epi64(a->l[0], b->l[0]), _mm512_add_epi64(a->l[1], b->l[1]),
              _mm512_add_epi64(a->l[2], b->l[2]), _mm512_add_epi64(a->l[3], b->l[3]),
              _mm512_add_epi64(a->l[4], b->l[4]));
}

/* a - b + 64p: 64p written with every limb at least 2^52, above any limb of b. */
IFMA static inline void fe_sub(fe *r, const fe *a, const fe *b) {
    const __m512i p0 = _mm512_set1_epi64((long long)((1ULL << 58) - 1216));
    const __m512i p1 = _mm512_set1_epi64((long long)((1ULL << 58) - 64));
    const __m512i p4 = _mm512_set1_epi64((long long)((1ULL << 53) - 64));
    normalize(r, _mm512_sub_epi64(_mm512_add_epi64(a->l[0], p0), b->l[0]),
              _mm512_sub_epi64(_mm512_add_epi64(a->l[1], p1), b->l[1]),
              _mm512_sub_epi64(_mm512_add_epi64(a->l[2], p1), b->l[2]),
              _mm512_sub_epi64(_mm512_add_epi64(a->l[3], p1), b->l[3]),
              _mm512_sub_epi64(_mm512_add_epi64(a->l[4], p4), b->l[4]));
}

/* Ten product columns c[k] (weight 2^(52k), each below 2^56) reduced to five limbs. */
IFMA static inline void reduce(fe *r, __m512i *c) {
    const __m512i m52 = _mm512_set1_epi64((long long)M52), k608 = _mm512_set1_epi64(608);
    const __m512i zero = _mm512_setzero_si512();
    /* Columns 5..9 below 2^52 first: IFMA multiplies them by 608 into columns 0..4. */
    for (int k = 5; k < 9; k++) {
        c[k + 1] = _mm512_add_epi64(c[k + 1], _mm512_srli_epi64(c[k], 52));
        c[k] = _mm512_and_si512(c[k], m52);
    }
    __m512i c10 = _mm512_srli_epi64(c[9], 52); /* weight 2^520 = 608^2 (mod p) */
    c[9] = _mm512_and_si512(c[9], m52);
    for (int k = 5; k < 9; k++) {
        c[k - 5] = _mm512_madd52lo_epu64(c[k - 5], c[k], k608);
        c[k - 4] = _mm512_madd52hi_epu64(c[k - 4], c[k], k608);
    }
    c[4] = _mm512_madd52lo_epu64(c[4], c[9], k608);
    __m512i h9 = _mm512_madd52hi_epu64(zero, c[9], k608); /* weight 2^260 */
    c[0] = _mm512_madd52lo_epu64(c[0], h9, k608);
    c[0] = _mm512_madd52lo_epu64(c[0], c10, _mm512_set1_epi64(608 * 608));
    normalize(r, c[0], c[1], c[2], c[3], c[4]);
}

IFMA static inline void fe_mul(fe *r, const fe *a, const fe *b) {
    __m512i c[10];
    for (int k = 0; k < 10; k++) c[k] = _mm512_setzero_si512();
    for (int i = 0; i < 5; i++) {
        for (int j = 0; j < 5; j++) {
            c[i + j] = _mm512_madd52lo_epu64(c[i + j], a->l[i], b->l[j]);
            c[i + j + 1] = _mm512_madd52hi_epu64(c[i + j + 1], a->l[i], b->l[j]);
        }
    }
    reduce(r, c);
}

/* a^2: each cross product a_i a_j (i < j) once, its column doubled by a shift (columns stay below 2^57). */
IFMA static inline void fe_sqr(fe *r, const fe *a) {
    __m512i c[10];
    for (int k = 0; k < 10; k++) c[k] = _mm512_setzero_si512();
    for (int i = 0; i < 5; i++) {
        c[2 * i] = _mm512_madd52lo_epu64(c[2 * i], a->l[i], a->l[i]);
        c[2 * i + 1] = _mm512_madd52hi_epu64(c[2 * i + 1], a->l[i], a->l[i]);
    }
    __m512i d[10];
    for (int k = 0; k < 10; k++) d[k] = _mm512_setzero_si512();
    for (int i = 0; i < 5; i++) {
        for (int j = i + 1; j < 5; j++) {
            d[i + j] = _mm512_madd52lo_epu64(d[i + j], a->l[i], a->l[j]);
            d[i + j + 1] = _mm512_madd52hi_epu64(d[i + j + 1], a->l[i], a->l[j]);
        }
    }
    for (int k = 0; k < 10; k++) c[k] = _mm512_add_epi64(c[k], _mm512_slli_epi64(d[k], 1));
    reduce(r, c);
}

/* a * k for a small constant k (below 2^20). */
IFMA static inline void fe_mul_small(fe *r, const fe *a, uint64_t k) {
    const __m512i kv = _mm512_set1_epi64((long long)k), zero = _mm512_setzero_si512();
    __m512i c[6];
    for (int i = 0; i < 6; i++) c[i] = zero;
    for (int i = 0; i < 5; i++) {
        c[i] = _mm512_madd52lo_epu64(c[i], a->l[i], kv);
        c[i + 1] = _mm512_madd52hi_epu64(c[i + 1], a->l[i], kv);
    }
    c[0] = _mm512_madd52lo_epu64(c[0], c[5], _mm512_set1_epi64(608)); /* c[5] below 2^16 */
    normalize(r, c[0], c[1], c[2], c[3], c[4]);
}

IFMA static inline void fe_cswap(fe *a, fe *b, __m512i mask) {
    for (int i = 0; i < 5; i++) {
        __m512i t = _mm512_and_si512(_mm512_xor_si512(a->l[i], b->l[i]), mask);
        a->l[i] = _mm512_xor_si512(a->l[i], t);
        b->l[i] = _mm512_xor_si512(b->l[i], t);
    }
}

IFMA static inline void fe_sqr_n(fe *r, const fe *a, int n) {
    fe_sqr(r, a);
    for (int i = 1; i < n; i++) fe_sqr(r, r);
}

/* z^(p-2) = 1/z, by the usual chain through z^(2^k - 1). */
IFMA static void fe_invert(fe *out, const fe *z) {
    fe z2, z9, z11, t, z5, z10, z20, z50, z100;
    fe_sqr(&z2, z);
    fe_sqr_n(&t, &z2, 2);
    fe_mul(&z9, &t, z);
    fe_mul(&z11, &z9, &z2);
    fe_sqr(&t, &z11);
    fe_mul(&z5, &t, &z9);         /* 2^5 - 1 */
    fe_sqr_n(&t, &z5, 5);
    fe_mul(&z10, &t, &z5);        /* 2^10 - 1 */
    fe_sqr_n(&t, &z10, 10);
    fe_mul(&z20, &t, &z10);       /* 2^20 - 1 */
    fe_sqr_n(&t, &z20, 20);
    fe_mul(&t, &t, &z20);         /* 2^40 - 1 */
    fe_sqr_n(&t, &t, 10);
    fe_mul(&z50, &t, &z10);       /* 2^50 - 1 */
    fe_sqr_n(&t, &z50, 50);
    fe_mul(&z100, &t, &z50);      /* 2^100 - 1 */
    fe_sqr_n(&t, &z100, 100);
    fe_mul(&t, &t, &z100);        /* 2^200 - 1 */
    fe_sqr_n(&t, &t, 50);
    fe_mul(&t, &t, &z50);         /* 2^250 - 1 */
    fe_sqr_n(&t, &t, 5);
    fe_mul(out, &t, &z11);        /* 2^255 - 21 = p - 2 */
}

/* u-coordinates of LANES points (32 bytes each) into limbs; the top bit is ignored (RFC 7748). */
IFMA static void load(fe *r, const unsigned char *pts) {
    uint64_t limb[5][LANES];
    for (int j = 0; j < LANES; j++) {
        uint64_t w[4];
        memcpy(w, pts + 32 * j, 32);
        w[3] &= 0x7fffffffffffffffULL;
        limb[0][j] = w[0] & M52;
        limb[1][j] = ((w[0] >> 52) | (w[1] << 12)) & M52;
        limb[2][j] = ((w[1] >> 40) | (w[2] << 24)) & M52;
        limb[3][j] = ((w[2] >> 28) | (w[3] << 36)) & M52;
        limb[4][j] = w[3] >> 16;
    }
    for (int i = 0; i < 5; i++) r->l[i] = _mm512_loadu_si512((const void *)limb[i]);
}

/* The canonical value (below p) of each lane, little-endian; returns whether any lane is zero. */
IFMA static int store(unsigned char *out, const fe *a) {
    uint64_t limb[5][LANES];
    int any_zero = 0;
    for (int i = 0; i < 5; i++) _mm512_storeu_si512((void *)limb[i], a->l[i]);
    for (int j = 0; j < LANES; j++) {
        uint64_t l[5] = {limb[0][j], limb[1][j], limb[2][j], limb[3][j], limb[4][j]};
        for (int pass = 0; pass < 2; pass++) { /* below 2^255 after two folds */
            uint64_t t = l[4] >> 47;
            l[4] &= M47;
            l[0] += 19 * t;
            for (int i = 0; i < 4; i++) { l[i + 1] += l[i] >> 52; l[i] &= M52; }
        }
        /* Subtract p when the value is at least p, that is when value + 19 reaches 2^255. */
        uint64_t s[5] = {l[0] + 19, l[1], l[2], l[3], l[4]};
        for (int i = 0; i < 4; i++) { s[i + 1] += s[i] >> 52; s[i] &= M52; }
        uint64_t ge = 0 - (s[4] >> 47);
        s[4] &= M47;
        for (int i = 0; i < 5; i++) l[i] = (s[i] & ge) | (l[i] & ~ge);
        uint64_t w[4] = {l[0] | (l[1] << 52), (l[1] >> 12) | (l[2] << 40), (l[2] >> 24) | (l[3] << 28),
                         (l[3] >> 36) | (l[4] << 16)};
        memcpy(out + 32 * j, w, 32);
        any_zero |= (w[0] | w[1] | w[2] | w[3]) == 0;
    }
    return any_zero;
}

/* RFC 7748's Montgomery ladder on LANES points under one clamped scalar. */
IFMA static int ladder(unsigned char *out, const unsigned char *scalar, const unsigned char *pts) {
    fe x1, x2, z2, x3, z3, A, AA, B, BB, E, C, D, DA, CB, t;
    const __m512i zero = _mm512_setzero_si512();
    load(&x1, pts);
    for (int i = 0; i < 5; i++) { x2.l[i] = zero; z2.l[i] = zero; z3.l[i] = zero; }
    x2.l[0] = _mm512_set1_epi64(1);
    z3.l[0] = _mm512_set1_epi64(1);
    x3 = x1;
    uint64_t swap = 0;
    for (int bit = 254; bit >= 0; bit--) {
        uint64_t k = (uint64_t)(scalar[bit >> 3] >> (bit & 7)) & 1;
        swap ^= k;
        __m512i mask = _mm512_set1_epi64((long long)(0 - swap));
        fe_cswap(&x2, &x3, mask);
        fe_cswap(&z2, &z3, mask);
        swap = k;
        fe_add(&A, &x2, &z2);
        fe_sqr(&AA, &A);
        fe_sub(&B, &x2, &z2);
        fe_sqr(&BB, &B);
        fe_sub(&E, &AA, &BB);
        fe_add(&C, &x3, &z3);
        fe_sub(&D, &x3, &z3);
        fe_mul(&DA, &D, &A);
        fe_mul(&CB, &C, &B);
        fe_add(&t, &DA, &CB);
        fe_sqr(&x3, &t);
        fe_sub(&t, &DA, &CB);
        fe_sqr(&t, &t);
        fe_mul(&z3, &x1, &t);
        fe_mul(&x2, &AA, &BB);
        fe_mul_small(&t, &E, 121665);
        fe_add(&t, &AA, &t);
        fe_mul(&z2, &E, &t);
    }
    __m512i mask = _mm512_set1_epi64((long long)(0 - swap));
    fe_cswap(&x2, &x3, mask);
    fe_cswap(&z2, &z3, mask);
    fe_invert(&t, &z2);
    fe_mul(&x2, &x2, &t);
    return store(out, &x2);
}

IFMA static int blind_all(unsigned char *out, const unsigned char *scalar, const unsigned char *pts, Py_ssize_t n) {
    int any_zero = 0;
    Py_ssize_t full = n - n % LANES;
    for (Py_ssize_t i = 0; i < full; i += LANES) any_zero |= ladder(out + 32 * i, scalar, pts + 32 * i);
    if (full < n) { /* the last few points padded with copies of the first of them */
        unsigned char in[32 * LANES], res[32 * LANES];
        Py_ssize_t rest = n - full;
        for (int j = 0; j < LANES; j++) memcpy(in + 32 * j, pts + 32 * (full + (j < rest ? j : 0)), 32);
        any_zero |= ladder(res, scalar, in);
        memcpy(out + 32 * full, res, (size_t)(32 * rest));
    }
    return any_zero;
}

static int cpu_ok(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512ifma");
}

static PyObject *py_available(PyObject *self, PyObject *args) {
    (void)self; (void)args;
    return PyBool_FromLong(cpu_ok());
}

static PyObject *py_blind(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer key, pts;
    if (!PyArg_ParseTuple(args, "y*y*", &key, &pts)) return NULL;
    PyObject *result = NULL;
    if (!cpu_ok()) {
        PyErr_SetString(PyExc_RuntimeError, "this CPU lacks AVX-512 IFMA; use OpenSSL's X25519");
    } else if (key.len != 32) {
        PyErr_SetString(PyExc_ValueError, "the scalar must be 32 bytes");
    } else if (pts.len % 32 != 0) {
        PyErr_SetString(PyExc_ValueError, "points must be a whole number of 32-byte values");
    } else {
        unsigned char scalar[32];
        memcpy(scalar, key.buf, 32);
        scalar[0] &= 248; scalar[31] &= 127; scalar[31] |= 64;
        result = PyBytes_FromStringAndSize(NULL, pts.len);
        if (result != NULL) {
            int any_zero;
            unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
            Py_BEGIN_ALLOW_THREADS
            any_zero = blind_all(out, scalar, (const unsigned char *)pts.buf, pts.len / 32);
            Py_END_ALLOW_THREADS
            if (any_zero) { /* a low-order point, as OpenSSL refuses it */
                Py_CLEAR(result);
                PyErr_SetString(PyExc_ValueError, "a point of small order gives the all-zero value");
            }
        }
        memset(scalar, 0, sizeof scalar);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&pts);
    return result;
}

static PyMethodDef methods[] = {
    {"available", py_available, METH_NOARGS, "Whether this CPU runs the eight-lane X25519 (AVX-512 IFMA)."},
    {"blind", py_blind, METH_VARARGS, "blind(key, points): X25519 of each 32-byte point under the 32-byte key."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_x25519", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__x25519(void) { return PyModule_Create(&module); }
