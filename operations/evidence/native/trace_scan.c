/*
 * trace_scan.c: one pass over a PyTorch Profiler Chrome trace, in compiled code.
 *
 * The Python parser (operations/evidence/torch_trace.py) builds a Python object for every event
 * and so tops out near 600k events/s on one core. This scanner validates the whole document as
 * strict JSON (RFC 8259, UTF-8 per Unicode table 3-7) and keeps only what the facts need:
 * per-category counts, per (category, name) count/total/min/max of durations, the GPU events
 * (joined with the runtime call that launched them and the CPU op they ran under), the window,
 * and the byte spans of the top-level values and of each GPU event's args, which Python decodes.
 * No Python object is built per event, and the library does not link against Python at all: it is
 * loaded with ctypes, so one build serves every CPython.
 *
 * It is a fast path that never refuses. On anything it cannot vouch for (not JSON, an escape
 * sequence in a string it reads, a duplicate key it reads, a value of a type it does not model,
 * an integer past int64, nesting deeper than MAX_DEPTH, ...) it returns CKO_BAIL and the Python
 * parser takes the same bytes on its own paths, which decide and word every refusal. So this
 * code only has to be right on what it accepts; the tests hold its results equal to the
 * reference path's on the real fixture, on hand-made variants and on random mutations.
 *
 * Conversions follow what the Python paths compute: an integer `ts`/`dur` is multiplied by 1000
 * exactly; a number with a fraction or exponent is the correctly rounded double (Clinger's exact
 * fast path, else strtod_l in the C locale), times 1000.0 in double, rounded half to even as
 * Python's round() does.
 */

#define _GNU_SOURCE
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the string scan reads eight bytes as one little-endian word"
#endif

#define CKO_OK 0
#define CKO_BAIL 1
#define CKO_NOMEM 2

#define MAX_DEPTH 64 /* real traces nest 4-5 deep; deeper goes to the Python paths */
#define MAX_CATS 256 /* distinct categories; more goes to the Python paths */
#define MAX_NUMBER_TEXT 128

#define EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------------------------------ */
/* Output: laid out for ctypes (see trace_native.py); every field 8 bytes wide.                */

typedef struct {
    int64_t off, len; /* the category's bytes in the input; len -1: null or absent */
    int64_t kind;     /* index into the kinds the caller gave; -1: not modelled */
    int64_t count;    /* complete events of this category */
} cko_cat;

typedef struct {
    int64_t cat; /* index into cats */
    int64_t off, len;
    int64_t n, total, min, max; /* durations in ns */
} cko_name;

typedef struct {
    int64_t start, dur;  /* ns */
    int64_t cat, name;   /* indexes into cats and names */
    int64_t corr, ext;   /* args.correlation, args["External id"] (see flags) */
    int64_t args_off, args_len; /* the args object's bytes (see flags) */
    int64_t op;          /* name index of the cpu_op with the same External id, or -1 */
    int64_t launch;      /* name index of the runtime/driver call with the same correlation, or -1 */
    int64_t launch_start;
    int64_t index;       /* order in the file: the tie-break of the stable sort by start */
    int64_t flags;
} cko_gpu;

#define F_CORR 1
#define F_EXT 2
#define F_ARGS 4

#define TOP_KEYS 6
static const char *const top_keys[TOP_KEYS] = {
    "schemaVersion", "deviceProperties", "cuda_runtime_version",
    "cuda_driver_version", "cupti_version", "baseTimeNanoseconds",
};

typedef struct {
    int64_t status;     /* CKO_OK, CKO_BAIL, CKO_NOMEM */
    int64_t fail_at;    /* byte offset where it bailed (diagnostics only) */
    int64_t events;     /* elements of traceEvents */
    int64_t has_window, lo, hi;
    int64_t gpu_total, correlated;
    int64_t top_off[TOP_KEYS], top_len[TOP_KEYS]; /* len -1: absent */
    cko_cat *cats;
    int64_t ncats;
    cko_name *names;
    int64_t nnames;
    cko_gpu *gpu; /* sorted by (start, index), at most max_gpu of them */
    int64_t ngpu;
} cko_result;

/* ------------------------------------------------------------------------------------------ */
/* Growable arrays and open-addressing maps.                                                   */

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const uint8_t *s, int64_t n, uint64_t seed) {
    uint64_t h = seed ^ ((uint64_t)n * 0x9e3779b97f4a7c15ULL);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ mix64(w)) * 0x9e3779b97f4a7c15ULL;
    }
    uint64_t w = 0;
    memcpy(&w, s + i, (size_t)(n - i));
    h = (h ^ mix64(w)) * 0x9e3779b97f4a7c15ULL;
    return mix64(h);
}

/*
 * int64 key -> (name index, start); the first insert wins. One slot holds key, values and the
 * used mark, so an insert touches one cache line rather than three.
 * A probe longer than MAX_PROBE (keys chosen to collide) bails rather than going quadratic.
 */
#define MAX_PROBE 1024
typedef struct {
    int64_t key, name, start;
    int64_t used;
} islot;

typedef struct {
    islot *slots;
    int64_t cap, n;
} imap;

/* ids are counters: 16 neighbours share a run of slots (one prefetched stretch of memory), and
   the runs are scattered by a hash of the rest of the key */
static inline uint64_t islot_of(int64_t key, int64_t cap) {
    uint64_t k = (uint64_t)key;
    return ((mix64(k >> 4) << 4) | (k & 15)) & (uint64_t)(cap - 1);
}

/* 0 done, -1 no memory, -2 too many collisions */
static int imap_rehash(imap *m, int64_t cap) {
    islot *t = calloc((size_t)cap, sizeof(islot));
    if (!t) return -1;
    for (int64_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].used) continue;
        uint64_t j = islot_of(m->slots[i].key, cap);
        int probes = 0;
        while (t[j].used) {
            if (++probes > MAX_PROBE) {
                free(t);
                return -2;
            }
            j = (j + 1) & (uint64_t)(cap - 1);
        }
        t[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = t, m->cap = cap;
    return 0;
}

/* inserts key unless present: 0 done, -1 no memory, -2 too many collisions */
static int imap_setdefault(imap *m, int64_t key, int64_t name, int64_t start) {
    if ((m->n + 1) * 2 > m->cap) {
        int rc = imap_rehash(m, m->cap ? m->cap * 2 : 1024);
        if (rc) return rc;
    }
    uint64_t j = islot_of(key, m->cap);
    int probes = 0;
    while (m->slots[j].used) {
        if (m->slots[j].key == key) return 0;
        if (++probes > MAX_PROBE) return -2;
        j = (j + 1) & (uint64_t)(m->cap - 1);
    }
    islot *e = &m->slots[j];
    e->used = 1, e->key = key, e->name = name, e->start = start;
    m->n++;
    return 0;
}

static const islot *imap_get(const imap *m, int64_t key) {
    if (!m->cap) return NULL;
    uint64_t j = islot_of(key, m->cap);
    while (m->slots[j].used) {
        if (m->slots[j].key == key) return &m->slots[j];
        j = (j + 1) & (uint64_t)(m->cap - 1);
    }
    return NULL;
}

static void imap_free(imap *m) { free(m->slots); }

/* ------------------------------------------------------------------------------------------ */
/* The scanner's state.                                                                        */

typedef struct {
    const uint8_t *base, *p, *end;
    /* category kinds the caller gave: names and kinds */
    const char *const *kind_names;
    const int64_t *kind_values;
    int64_t nkinds;
    cko_result *r;
    int64_t cats_cap, names_cap, gpu_cap, ngpu_all;
    cko_gpu *gpu_all;
    int64_t *slots; /* (category, name) table: index into names + 1, 0 empty */
    uint64_t *slot_hash;
    int64_t slots_cap;
    imap launches, ops;
    locale_t c_locale;
    int nomem;
} scan;

typedef struct {
    int64_t off, len;
} span;

/* value types as the fields of one event were seen */
enum { T_ABSENT = 0, T_NULL, T_STR, T_INT, T_FLOAT, T_BIG, T_OBJ, T_OTHER };

typedef struct {
    int type;
    int64_t i; /* T_INT */
    double d;  /* T_FLOAT */
} num;

/* ------------------------------------------------------------------------------------------ */
/* JSON lexing. Each returns 0 or -1 (bail).                                                    */

static inline __attribute__((always_inline)) void ws(scan *s) {
    while (s->p < s->end) {
        uint8_t c = *s->p;
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
        s->p++;
    }
}

static inline int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* one UTF-8 sequence starting at p (a byte >= 0x80); returns its length or -1 (table 3-7) */
static inline int utf8_seq(const uint8_t *p, const uint8_t *end) {
    uint8_t c = p[0];
    int n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no encoded surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return -1;
    if (end - p < n) return -1;
    if (p[1] < lo || p[1] > hi) return -1;
    for (int k = 2; k < n; k++)
        if (p[k] < 0x80 || p[k] > 0xBF) return -1;
    return n;
}

/* the bytes a string's fast loop stops at: the quote, the backslash, controls, non-ASCII */
static inline int stop_byte(uint8_t c) { return c < 0x20 || c >= 0x80 || c == '"' || c == '\\'; }

/* a string at s->p (the opening quote); out: span of its raw content; *esc: had an escape */
static inline __attribute__((always_inline)) int lex_string(scan *s, span *out, int *esc) {
    const uint8_t *p = s->p + 1, *end = s->end;
    int e = 0;
    for (;;) {
        /* the common case: printable ASCII other than the quote and the backslash */
        /* eight bytes at a time (SWAR): `stop` marks the bytes below 0x20, the quote, the
           backslash and those with the high bit set. A borrow can mark a byte after a marked one
           but never before, so the lowest mark is the first byte that stops the scan. */
        while (end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
            uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
            uint64_t stop = (((w - ones * 0x20) & ~w) | ((q - ones) & ~q) | ((b - ones) & ~b) | w) & high;
            if (stop) {
                p += __builtin_ctzll(stop) >> 3; /* little-endian: the lowest byte comes first */
                goto stopped;
            }
            p += 8;
        }
        while (p < end && !stop_byte(*p)) p++;
    stopped:
        if (p >= end) return -1;
        uint8_t c = *p;
        if (c == '"') break;
        if (c < 0x20) return -1;
        if (c == '\\') {
            e = 1;
            if (end - p < 2) return -1;
            uint8_t k = p[1];
            if (k == 'u') {
                if (end - p < 6) return -1;
                int v = 0;
                for (int j = 2; j < 6; j++) {
                    int h = hexval(p[j]);
                    if (h < 0) return -1;
                    v = v * 16 + h;
                }
                if (v >= 0xD800 && v <= 0xDFFF) return -1; /* surrogates: the Python paths decide */
                p += 6;
            } else if (k == '"' || k == '\\' || k == '/' || k == 'b' || k == 'f' || k == 'n' || k == 'r' ||
                       k == 't') {
                p += 2;
            } else
                return -1;
            continue;
        }
        int n = utf8_seq(p, end);
        if (n < 0) return -1;
        p += n;
    }
    out->off = (s->p + 1) - s->base;
    out->len = p - (s->p + 1);
    *esc = e;
    s->p = p + 1;
    return 0;
}

static const double pow10s[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                  1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* a number at s->p, validated and not read */
static inline __attribute__((always_inline)) int skip_number(scan *s) {
    const uint8_t *p = s->p, *end = s->end;
    if (p < end && *p == '-') p++;
    if (p >= end) return -1;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9')
        while (p < end && *p >= '0' && *p <= '9') p++;
    else
        return -1;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    s->p = p;
    return 0;
}

/* a number at s->p; validates the grammar and, when `want`, computes its value into *v */
static int lex_number(scan *s, num *v, int want) {
    const uint8_t *p = s->p, *end = s->end, *start = p;
    int neg = 0;
    if (p < end && *p == '-') neg = 1, p++;
    if (p >= end) return -1;
    /* m: the first 19 significant digits; dropped: a significant digit did not fit */
    uint64_t m = 0;
    int taken = 0, dropped = 0, is_float = 0;
    int64_t frac_digits = 0;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') {
            if (taken < 19) m = m * 10 + (uint64_t)(*p - '0'), taken++;
            else dropped = 1;
            p++;
        }
    } else
        return -1;
    if (p < end && *p == '.') {
        is_float = 1;
        p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') {
            if (taken < 19) {
                m = m * 10 + (uint64_t)(*p - '0');
                if (m) taken++; /* zeros before the first non-zero digit only shift the scale */
                frac_digits++;
            } else
                dropped = 1;
            p++;
        }
    }
    int64_t exp = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_float = 1;
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) eneg = (*p == '-'), p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') {
            if (exp < 100000) exp = exp * 10 + (*p - '0');
            p++;
        }
        if (eneg) exp = -exp;
    }
    s->p = p;
    if (!want) return 0;
    if (!is_float) {
        /* an integer: exact in int64, else T_BIG */
        if (dropped || m > (uint64_t)INT64_MAX + (uint64_t)neg) {
            v->type = T_BIG;
            return 0;
        }
        v->type = T_INT;
        v->i = neg ? (int64_t)(0 - m) : (int64_t)m;
        return 0;
    }
    v->type = T_FLOAT;
    int64_t e10 = exp - frac_digits;
    if (!dropped && m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        /* Clinger: m and 10^|e10| are exact doubles, so one IEEE operation rounds correctly */
        double d = (double)m;
        d = e10 < 0 ? d / pow10s[-e10] : d * pow10s[e10];
        v->d = neg ? -d : d;
        return 0;
    }
    size_t len = (size_t)(p - start);
    if (len >= MAX_NUMBER_TEXT) return -1;
    char buf[MAX_NUMBER_TEXT];
    memcpy(buf, start, len);
    buf[len] = 0;
    v->d = strtod_l(buf, NULL, s->c_locale); /* correctly rounded (glibc) and locale-independent */
    return 0;
}

static int lex_literal(scan *s, const char *word, size_t n) {
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n)) return -1;
    s->p += n;
    return 0;
}

/* skips one value of any kind, validating it; *type gets what it was */
static int skip_value(scan *s, int *type) {
    uint8_t stack[MAX_DEPTH];
    int d = 0;
    for (;;) {
        ws(s);
        if (s->p >= s->end) return -1;
        uint8_t c = *s->p;
        int t;
        if (c == '{' || c == '[') {
            s->p++;
            ws(s);
            if (s->p < s->end && *s->p == (c == '{' ? '}' : ']')) {
                s->p++;
                t = c == '{' ? T_OBJ : T_OTHER;
            } else {
                if (d >= MAX_DEPTH) return -1;
                stack[d++] = c;
                if (c == '{') {
                    span k;
                    int e;
                    if (s->p >= s->end || *s->p != '"' || lex_string(s, &k, &e)) return -1;
                    ws(s);
                    if (s->p >= s->end || *s->p != ':') return -1;
                    s->p++;
                }
                continue;
            }
        } else if (c == '"') {
            span x;
            int e;
            if (lex_string(s, &x, &e)) return -1;
            t = T_STR;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if (skip_number(s)) return -1;
            t = T_INT; /* not read: the type only says "a number" */
        } else if (c == 't') {
            if (lex_literal(s, "true", 4)) return -1;
            t = T_OTHER;
        } else if (c == 'f') {
            if (lex_literal(s, "false", 5)) return -1;
            t = T_OTHER;
        } else if (c == 'n') {
            if (lex_literal(s, "null", 4)) return -1;
            t = T_NULL;
        } else
            return -1;
        /* after a value: close containers or go on to the next element */
        for (;;) {
            if (d == 0) {
                if (type) *type = t;
                return 0;
            }
            ws(s);
            if (s->p >= s->end) return -1;
            uint8_t top = stack[d - 1];
            if (*s->p == ',') {
                s->p++;
                if (top == '{') {
                    span k;
                    int e;
                    ws(s);
                    if (s->p >= s->end || *s->p != '"' || lex_string(s, &k, &e)) return -1;
                    ws(s);
                    if (s->p >= s->end || *s->p != ':') return -1;
                    s->p++;
                }
                break;
            }
            if (*s->p != (top == '{' ? '}' : ']')) return -1;
            s->p++;
            d--;
            t = top == '{' ? T_OBJ : T_OTHER;
        }
    }
}

/* a value read as a number or null when it is one, else skipped with its type */
static int read_scalar(scan *s, num *v) {
    ws(s);
    if (s->p >= s->end) return -1;
    uint8_t c = *s->p;
    if (c == '-' || (c >= '0' && c <= '9')) return lex_number(s, v, 1);
    int t;
    if (skip_value(s, &t)) return -1;
    v->type = t == T_NULL ? T_NULL : T_OTHER;
    return 0;
}

/* the key of an object member at s->p (after '{' or ','), then the colon; bails on escapes */
static int read_key(scan *s, span *k) {
    int e;
    ws(s);
    if (s->p >= s->end || *s->p != '"' || lex_string(s, k, &e) || e) return -1;
    ws(s);
    if (s->p >= s->end || *s->p != ':') return -1;
    s->p++;
    return 0;
}

/* after a member or an element: 1 at a comma (another follows), 0 at `close` (consumed), -1 else */
static inline int next_item(scan *s, uint8_t close) {
    ws(s);
    if (s->p >= s->end) return -1;
    uint8_t c = *s->p++;
    return c == ',' ? 1 : c == close ? 0 : -1;
}

static inline int key_is(const scan *s, span k, const char *name, size_t n) {
    return (size_t)k.len == n && !memcmp(s->base + k.off, name, n);
}

/* ------------------------------------------------------------------------------------------ */
/* Conversions and tables.                                                                     */

/* ns from a number in us, as the Python paths compute it: -1 where they would not */
static int to_ns(const num *v, int64_t *out) {
    if (v->type == T_INT) {
        if (v->i > INT64_MAX / 1000 || v->i < INT64_MIN / 1000) return -1;
        *out = v->i * 1000;
        return 0;
    }
    if (v->type != T_FLOAT) return -1;
    double x = v->d * 1000.0;
    if (!isfinite(x)) return -1;
    /* Python's float.__round__(): round half away, then fix exact halves to even */
    double r = round(x);
    if (fabs(x - r) == 0.5) r = 2.0 * round(x / 2.0);
    if (!(r >= -9223372036854775808.0 && r < 9223372036854775808.0)) return -1;
    *out = (int64_t)r;
    return 0;
}

/* index of the category (null: k.len < 0), added in order of first appearance */
static int64_t cat_index(scan *s, span k) {
    cko_result *r = s->r;
    for (int64_t i = 0; i < r->ncats; i++) {
        cko_cat *c = &r->cats[i];
        if (c->len == k.len && (k.len < 0 || !memcmp(s->base + c->off, s->base + k.off, (size_t)k.len)))
            return i;
    }
    if (r->ncats >= MAX_CATS) return -1;
    if (grow((void **)&r->cats, &s->cats_cap, r->ncats + 1, sizeof(cko_cat))) {
        s->nomem = 1;
        return -1;
    }
    cko_cat *c = &r->cats[r->ncats];
    c->off = k.off, c->len = k.len, c->kind = -1, c->count = 0;
    if (k.len >= 0)
        for (int64_t j = 0; j < s->nkinds; j++)
            if (strlen(s->kind_names[j]) == (size_t)k.len && !memcmp(s->kind_names[j], s->base + k.off, (size_t)k.len)) {
                c->kind = s->kind_values[j];
                break;
            }
    return r->ncats++;
}

static int slots_grow(scan *s) {
    int64_t cap = s->slots_cap ? s->slots_cap * 2 : 4096;
    int64_t *slots = calloc((size_t)cap, sizeof(int64_t));
    uint64_t *hashes = malloc((size_t)cap * sizeof(uint64_t));
    if (!slots || !hashes) {
        free(slots), free(hashes);
        return -1;
    }
    for (int64_t i = 0; i < s->slots_cap; i++) {
        if (!s->slots[i]) continue;
        uint64_t j = s->slot_hash[i] & (uint64_t)(cap - 1);
        while (slots[j]) j = (j + 1) & (uint64_t)(cap - 1);
        slots[j] = s->slots[i], hashes[j] = s->slot_hash[i];
    }
    free(s->slots), free(s->slot_hash);
    s->slots = slots, s->slot_hash = hashes, s->slots_cap = cap;
    return 0;
}

/* index of the (category, name) entry, added in order of first appearance */
static int64_t name_index(scan *s, int64_t cat, span k) {
    cko_result *r = s->r;
    if ((r->nnames + 1) * 2 > s->slots_cap && slots_grow(s)) {
        s->nomem = 1;
        return -1;
    }
    const uint8_t *text = s->base + k.off;
    uint64_t h = hash_bytes(text, k.len, (uint64_t)cat);
    uint64_t j = h & (uint64_t)(s->slots_cap - 1);
    while (s->slots[j]) {
        if (s->slot_hash[j] == h) {
            cko_name *n = &r->names[s->slots[j] - 1];
            if (n->cat == cat && n->len == k.len && !memcmp(s->base + n->off, text, (size_t)k.len))
                return s->slots[j] - 1;
        }
        j = (j + 1) & (uint64_t)(s->slots_cap - 1);
    }
    if (grow((void **)&r->names, &s->names_cap, r->nnames + 1, sizeof(cko_name))) {
        s->nomem = 1;
        return -1;
    }
    cko_name *n = &r->names[r->nnames];
    n->cat = cat, n->off = k.off, n->len = k.len, n->n = 0, n->total = 0, n->min = INT64_MAX, n->max = INT64_MIN;
    s->slots[j] = r->nnames + 1, s->slot_hash[j] = h;
    return r->nnames++;
}

/* ------------------------------------------------------------------------------------------ */
/* Events.                                                                                     */

#define PHASES "BEXiICbneSTpFstfPNODMVvRc()"

typedef struct {
    uint32_t seen; /* bit per field, for duplicates */
    int ph;
    int cat_t, name_t;
    span cat, name;
    num ts, dur, corr, ext;
    int args_t;
    span args;
} event;

enum { K_PH = 1, K_CAT = 2, K_NAME = 4, K_TS = 8, K_DUR = 16, K_ARGS = 32, K_CORR = 64, K_EXT = 128 };

/* the args object at s->p: correlation and External id read, the rest skipped */
static int read_args(scan *s, event *e) {
    const uint8_t *open = s->p;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
    } else {
        for (;;) {
            span k;
            if (read_key(s, &k)) return -1;
            if (key_is(s, k, "correlation", 11)) {
                if (e->seen & K_CORR) return -1;
                e->seen |= K_CORR;
                if (read_scalar(s, &e->corr)) return -1;
            } else if (key_is(s, k, "External id", 11)) {
                if (e->seen & K_EXT) return -1;
                e->seen |= K_EXT;
                if (read_scalar(s, &e->ext)) return -1;
            } else if (skip_value(s, NULL))
                return -1;
            int more = next_item(s, '}');
            if (more < 0) return -1;
            if (!more) break;
        }
    }
    e->args.off = open - s->base;
    e->args.len = s->p - open;
    return 0;
}

/* a string or null field of an event: its type and span */
static int read_text(scan *s, int *type, span *out) {
    ws(s);
    if (s->p >= s->end) return -1;
    if (*s->p == '"') {
        int esc;
        if (lex_string(s, out, &esc)) return -1;
        *type = esc ? T_OTHER : T_STR; /* an escaped name would need decoding: bail when read */
        return 0;
    }
    int t;
    if (skip_value(s, &t)) return -1;
    *type = t == T_NULL ? T_NULL : T_OTHER;
    return 0;
}

static int parse_event(scan *s, event *e) {
    memset(e, 0, sizeof *e);
    if (s->p >= s->end || *s->p != '{') return -1;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    for (;;) {
        span k;
        if (read_key(s, &k)) return -1;
        int bit = 0;
        if (key_is(s, k, "ph", 2)) bit = K_PH;
        else if (key_is(s, k, "cat", 3)) bit = K_CAT;
        else if (key_is(s, k, "name", 4)) bit = K_NAME;
        else if (key_is(s, k, "ts", 2)) bit = K_TS;
        else if (key_is(s, k, "dur", 3)) bit = K_DUR;
        else if (key_is(s, k, "args", 4)) bit = K_ARGS;
        if (bit) {
            if (e->seen & bit) return -1; /* a duplicate key: which one counts is the decoder's call */
            e->seen |= bit;
        }
        switch (bit) {
        case K_PH: {
            int t;
            span v;
            if (read_text(s, &t, &v)) return -1;
            if (t != T_STR || v.len != 1 || !memchr(PHASES, s->base[v.off], sizeof PHASES - 1)) return -1;
            e->ph = s->base[v.off];
            break;
        }
        case K_CAT:
            if (read_text(s, &e->cat_t, &e->cat)) return -1;
            break;
        case K_NAME:
            if (read_text(s, &e->name_t, &e->name)) return -1;
            break;
        case K_TS:
            if (read_scalar(s, &e->ts)) return -1;
            break;
        case K_DUR:
            if (read_scalar(s, &e->dur)) return -1;
            break;
        case K_ARGS:
            ws(s);
            if (s->p < s->end && *s->p == '{') {
                e->args_t = T_OBJ;
                if (read_args(s, e)) return -1;
            } else {
                int t;
                if (skip_value(s, &t)) return -1;
                e->args_t = t == T_NULL ? T_NULL : T_OTHER;
            }
            break;
        default:
            if (skip_value(s, NULL)) return -1;
        }
        int more = next_item(s, '}');
        if (more <= 0) return more;
    }
}

static inline int is_num(int t) { return t == T_INT || t == T_FLOAT; }

/* an id the Python paths use as a dict key: an int64 or none; anything else bails */
static int id_of(const event *e, const num *v, int64_t *out, int64_t *flags, int64_t flag) {
    if (e->args_t != T_OBJ || v->type == T_ABSENT || v->type == T_NULL) return 0;
    if (v->type != T_INT) return -1;
    *out = v->i;
    *flags |= flag;
    return 0;
}

static int take_event(scan *s, const event *e) {
    if (!e->ph) return -1; /* no phase: not an event the Python paths read */
    if (e->ph != 'X') return 0;
    /* the fast Python path's types for a complete event; anything else is its (or the reference's) call */
    if (e->cat_t == T_OTHER || e->name_t == T_OTHER || e->args_t == T_OTHER) return -1;
    if (!(e->ts.type == T_ABSENT || e->ts.type == T_NULL || is_num(e->ts.type))) return -1;
    if (!(e->dur.type == T_ABSENT || e->dur.type == T_NULL || is_num(e->dur.type))) return -1;
    span ck = e->cat;
    if (e->cat_t != T_STR) ck.off = 0, ck.len = -1;
    int64_t ci = cat_index(s, ck);
    if (ci < 0) return -1;
    cko_result *r = s->r;
    r->cats[ci].count++;
    int64_t kind = r->cats[ci].kind;
    if (kind < 0) return 0;
    if (e->name_t != T_STR || !is_num(e->ts.type) || !is_num(e->dur.type)) return -1;
    if ((e->dur.type == T_INT && e->dur.i < 0) || (e->dur.type == T_FLOAT && e->dur.d < 0)) return -1;
    int64_t start, d, end;
    if (to_ns(&e->ts, &start) || to_ns(&e->dur, &d)) return -1;
    if (__builtin_add_overflow(start, d, &end)) return -1;
    int64_t ni = name_index(s, ci, e->name);
    if (ni < 0) return -1;
    cko_name *n = &r->names[ni];
    if (__builtin_add_overflow(n->total, d, &n->total)) return -1;
    n->n++;
    if (d < n->min) n->min = d;
    if (d > n->max) n->max = d;
    if (!r->has_window) r->has_window = 1, r->lo = start, r->hi = end;
    if (start < r->lo) r->lo = start;
    if (end > r->hi) r->hi = end;
    int64_t corr = 0, ext = 0, flags = 0;
    if (kind == 0) {
        if (id_of(e, &e->corr, &corr, &flags, F_CORR) || id_of(e, &e->ext, &ext, &flags, F_EXT)) return -1;
        if (grow((void **)&s->gpu_all, &s->gpu_cap, s->ngpu_all + 1, sizeof(cko_gpu))) {
            s->nomem = 1;
            return -1;
        }
        cko_gpu *g = &s->gpu_all[s->ngpu_all];
        memset(g, 0, sizeof *g);
        g->start = start, g->dur = d, g->cat = ci, g->name = ni, g->corr = corr, g->ext = ext;
        if (e->args_t == T_OBJ) flags |= F_ARGS, g->args_off = e->args.off, g->args_len = e->args.len;
        g->flags = flags, g->index = s->ngpu_all, g->op = -1, g->launch = -1;
        s->ngpu_all++;
    } else if (kind == 1) {
        if (id_of(e, &e->corr, &corr, &flags, F_CORR)) return -1;
        if (flags & F_CORR) {
            int rc = imap_setdefault(&s->launches, corr, ni, start);
            if (rc) {
                s->nomem = rc == -1;
                return -1;
            }
        }
    } else if (kind == 2) {
        if (id_of(e, &e->ext, &ext, &flags, F_EXT)) return -1;
        if (flags & F_EXT) {
            int rc = imap_setdefault(&s->ops, ext, ni, 0);
            if (rc) {
                s->nomem = rc == -1;
                return -1;
            }
        }
    }
    return 0;
}

static int top_level(scan *s) {
    cko_result *r = s->r;
    int have_events = 0;
    uint32_t seen = 0;
    ws(s);
    if (s->p >= s->end || *s->p != '{') return -1;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') return -1; /* no traceEvents */
    for (;;) {
        span k;
        if (read_key(s, &k)) return -1;
        if (key_is(s, k, "traceEvents", 11)) {
            if (have_events) return -1;
            have_events = 1;
            ws(s);
            if (s->p >= s->end || *s->p != '[') return -1;
            s->p++;
            ws(s);
            if (s->p < s->end && *s->p == ']') {
                s->p++;
            } else {
                event e;
                for (;;) {
                    ws(s);
                    if (parse_event(s, &e) || take_event(s, &e)) return -1;
                    r->events++;
                    int more = next_item(s, ']');
                    if (more < 0) return -1;
                    if (!more) break;
                }
            }
        } else {
            int which = -1;
            for (int i = 0; i < TOP_KEYS; i++)
                if (key_is(s, k, top_keys[i], strlen(top_keys[i]))) which = i;
            ws(s);
            const uint8_t *v = s->p;
            if (skip_value(s, NULL)) return -1;
            if (which >= 0) {
                if (seen & (1u << which)) return -1;
                seen |= 1u << which;
                r->top_off[which] = v - s->base;
                r->top_len[which] = s->p - v;
            }
        }
        int more = next_item(s, '}');
        if (more < 0) return -1;
        if (!more) break;
    }
    ws(s);
    if (s->p != s->end || !have_events) return -1;
    return 0;
}

static int by_start(const void *a, const void *b) {
    const cko_gpu *x = a, *y = b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points.                                                                               */

#ifndef CKO_SOURCE_SHA256
#define CKO_SOURCE_SHA256 "unknown"
#endif

EXPORT int64_t cko_trace_abi(void) { return 1; }

/* the sha256 of this file as it was compiled (runner/native.py passes it): the loader uses the
   library only when it matches the source beside it, so a stale build never decides facts */
EXPORT const char *cko_trace_source(void) { return CKO_SOURCE_SHA256; }

EXPORT int64_t cko_trace_result_size(void) { return (int64_t)sizeof(cko_result); }

EXPORT void cko_trace_free(cko_result *r) {
    if (!r) return;
    free(r->cats), free(r->names), free(r->gpu);
    r->cats = NULL, r->names = NULL, r->gpu = NULL;
}

/*
 * Scans buf[0:len]. kind_names/kind_values: the modelled categories (0 GPU activity, 1 runtime or
 * driver call, 2 cpu_op, 3 other CPU). At most max_gpu GPU events come back, the first by start.
 * Fills *r; the caller frees it with cko_trace_free whatever the status.
 */
EXPORT int64_t cko_trace_scan(const uint8_t *buf, int64_t len, const char *const *kind_names,
                              const int64_t *kind_values, int64_t nkinds, int64_t max_gpu, cko_result *r) {
    memset(r, 0, sizeof *r);
    for (int i = 0; i < TOP_KEYS; i++) r->top_len[i] = -1;
    scan s;
    memset(&s, 0, sizeof s);
    s.base = s.p = buf, s.end = buf + len;
    s.kind_names = kind_names, s.kind_values = kind_values, s.nkinds = nkinds;
    s.r = r;
    s.c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    int rc = s.c_locale ? top_level(&s) : -1;
    if (!s.c_locale) s.nomem = 1;
    if (rc == 0 && max_gpu >= 0) {
        int64_t correlated = 0;
        for (int64_t i = 0; i < s.ngpu_all; i++) {
            cko_gpu *g = &s.gpu_all[i];
            const islot *hit;
            if ((g->flags & F_CORR) && (hit = imap_get(&s.launches, g->corr))) {
                correlated++;
                g->launch = hit->name, g->launch_start = hit->start;
            }
            if ((g->flags & F_EXT) && (hit = imap_get(&s.ops, g->ext))) g->op = hit->name;
        }
        qsort(s.gpu_all, (size_t)s.ngpu_all, sizeof(cko_gpu), by_start);
        r->gpu_total = s.ngpu_all;
        r->correlated = correlated;
        r->ngpu = s.ngpu_all < max_gpu ? s.ngpu_all : max_gpu;
        r->gpu = s.gpu_all;
        s.gpu_all = NULL;
    } else if (rc == 0) {
        rc = -1;
    }
    free(s.gpu_all), free(s.slots), free(s.slot_hash);
    imap_free(&s.launches), imap_free(&s.ops);
    if (s.c_locale) freelocale(s.c_locale);
    r->status = rc == 0 ? CKO_OK : s.nomem ? CKO_NOMEM : CKO_BAIL;
    r->fail_at = rc == 0 ? -1 : s.p - s.base;
    return r->status;
}
