/* Hot loops of core.id_index: a linear-probing hash index from int64 ids to int32 row
 * positions, and the pull's gather with its access counting.
 *
 * The index holds only row positions (int32, -1 empty, a power-of-two count); an id lives once,
 * in ``keys[row]`` (the table's ids in row order), so a slot costs 4 bytes. A row needs the
 * low log2(slots) bits of its slot; the bits above, up to the sign, hold a tag: the top bits
 * of the id's hash. A probe passing another id's slot then reads that id's key only when the
 * tags agree, so a slot taken by another id seldom costs a cache miss. Loops are software-
 * pipelined, each stage prefetching what a later one reads: the misses of many ids overlap
 * instead of following one another.
 *
 * Loaded with ctypes (core.id_probe); a pure-numpy twin gives the same rows without a compiler.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 64
#define AHEAD 16 /* ids between a pipelined loop's stages */
#define RING 64  /* > 2 * AHEAD, a power of two */
#define EMPTY (-1)

/* Python's import machinery never loads this file; the symbol only satisfies build tools that
 * expect one in an extension module. */
void *PyInit__id_probe(void) { return 0; }

/* splitmix64's finaliser: every input bit moves every output bit (ids are often sequential). */
static inline uint64_t mix(int64_t id) {
    uint64_t x = (uint64_t)id;
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* A row's copy: fixed widths (the usual dims) become a few vector moves, not a memcpy call. */
static inline void copy_row(float *dst, const float *src, size_t width) {
    switch (width) {
    case 16: memcpy(dst, src, 16); break;
    case 32: memcpy(dst, src, 32); break;
    case 64: memcpy(dst, src, 64); break;
    case 128: memcpy(dst, src, 128); break;
    case 256: memcpy(dst, src, 256); break;
    default: memcpy(dst, src, width);
    }
}

static inline void prefetch_row(const float *row, size_t width, int write) {
    const char *p = (const char *)row;
    for (size_t off = 0; off < width; off += 64) {
        if (write) __builtin_prefetch(p + off, 1);
        else __builtin_prefetch(p + off);
    }
}

/* An access to a row: its counter (low 32 bits of ``meta``) + 1, its day (high 32 bits). One
 * 8-byte word, so counting costs no cache line beyond the one it already needs. */
static inline void count(uint64_t *meta, int64_t r, int32_t day) {
    uint32_t c = (uint32_t)meta[r] + 1;
    meta[r] = ((uint64_t)(uint32_t)day << 32) | c;
}

/* An id's slot value for row ``row``: the row in the bits of ``mask``, the top bits of the id's
 * hash ``h`` above them (none when the row takes all 31). */
static inline int32_t tagged(uint64_t h, uint64_t mask, int64_t row) {
    int bits = 64 - __builtin_clzll(mask); /* mask + 1 is a power of two above 1 */
    uint32_t tag = bits < 31 ? (uint32_t)(h >> (33 + bits)) << bits : 0;
    return (int32_t)(tag | (uint32_t)row);
}

/* The row a slot holds (slots other than EMPTY). */
static inline int64_t row_in(int32_t s, uint64_t mask) { return (int64_t)(s & (int32_t)mask); }

/* Whether slot ``s`` (not EMPTY) carries the tag ``want`` (``tagged(h, mask, 0)``). */
static inline int tag_agrees(int32_t s, uint64_t mask, int32_t want) {
    return (s & ~(int32_t)mask) == want;
}

/* The row of ``id`` (hash ``h``) or EMPTY, probing from its home slot. */
static inline int32_t probe(const int32_t *slots, uint64_t mask, const int64_t *keys, int64_t id,
                            uint64_t h) {
    int32_t want = tagged(h, mask, 0);
    for (uint64_t pos = h & mask;; pos = (pos + 1) & mask) {
        int32_t s = slots[pos];
        if (s == EMPTY) return EMPTY;
        int32_t row = (int32_t)row_in(s, mask);
        if (tag_agrees(s, mask, want) && keys[row] == id) return row;
    }
}

/* Stage two of a pipelined find: prefetch the key of the home slot's row if the tag agrees. */
static inline void prefetch_key(const int32_t *slots, uint64_t mask, const int64_t *keys,
                                uint64_t h) {
    int32_t s = slots[h & mask];
    if (s != EMPTY && tag_agrees(s, mask, tagged(h, mask, 0)))
        __builtin_prefetch(&keys[row_in(s, mask)]);
}

/* Rows of ids[0:n) into out, an absent id taking row ``next`` (then next + 1, ...) with its id
 * written to keys[row]; returns the next free row. The caller leaves room for every id: slots
 * below the load limit after n more, keys long enough. A repeated id gets its first row. */
int64_t rover_insert(int32_t *slots, uint64_t mask, int64_t *keys, const int64_t *ids, int64_t n,
                     int32_t *out, int64_t next) {
    for (int64_t i = 0; i < n; i++) {
        int64_t id = ids[i];
        uint64_t h = mix(id);
        int32_t want = tagged(h, mask, 0);
        for (uint64_t pos = h & mask;; pos = (pos + 1) & mask) {
            int32_t s = slots[pos];
            if (s == EMPTY) {
                slots[pos] = tagged(h, mask, next);
                keys[next] = id;
                out[i] = (int32_t)next++;
                break;
            }
            if (tag_agrees(s, mask, want) && keys[row_in(s, mask)] == id) {
                out[i] = (int32_t)row_in(s, mask);
                break;
            }
        }
    }
    return next;
}

/* Empty ``slots`` and index keys[0:n) as rows 0..n-1 (ids known distinct). */
void rover_rebuild(int32_t *slots, uint64_t mask, const int64_t *keys, int64_t n) {
    memset(slots, 0xff, (mask + 1) * sizeof(int32_t));
    for (int64_t r = 0; r < n; r++) {
        uint64_t h = mix(keys[r]), pos = h & mask;
        while (slots[pos] != EMPTY) pos = (pos + 1) & mask;
        slots[pos] = tagged(h, mask, r);
    }
}

/* 1 if ids[0:n) strictly increase (np.unique's output: no repeats), else 0. */
int32_t rover_increasing(const int64_t *ids, int64_t n) {
    int32_t ok = 1;
    for (int64_t i = 1; i < n; i++) ok &= ids[i] > ids[i - 1];
    return ok;
}

/* out[i] = src[rows[i]] (rows of ``dim`` floats) with an access counted on each row. */
void rover_gather_count(const float *src, int64_t dim, const int32_t *rows, int64_t n,
                        float *out, uint64_t *meta, int32_t day) {
    size_t width = (size_t)dim * sizeof(float);
    for (int64_t i = 0; i < n + AHEAD; i++) {
        if (i < n) {
            prefetch_row(src + (int64_t)rows[i] * dim, width, 0);
            __builtin_prefetch(&meta[rows[i]], 1);
        }
        int64_t k = i - AHEAD;
        if (k >= 0) {
            copy_row(out + k * dim, src + (int64_t)rows[k] * dim, width);
            count(meta, rows[k], day);
        }
    }
}

/* The pull: rows of ids[0:n) into rows_out (EMPTY where absent) and, for each id present, its
 * row copied to out[i] and its access counted; with src NULL only the rows are found. Returns
 * how many are absent (the caller creates, copies and counts those). One pipelined pass: id
 * i's slot is prefetched, id i-AHEAD's key, id i-2*AHEAD is probed and its row and record
 * prefetched, id i-3*AHEAD's row copied and counted. */
static inline int64_t pull_pass(const int32_t *slots, uint64_t mask, const int64_t *keys,
                                const int64_t *ids, int64_t n, int32_t *rows_out,
                                const float *src, int64_t dim, float *out, uint64_t *meta,
                                int32_t day) {
    size_t width = (size_t)dim * sizeof(float);
    int64_t absent = 0;
    uint64_t hash[RING];
    for (int64_t i = 0; i < n + 3 * AHEAD; i++) {
        if (i < n) {
            hash[i & (RING - 1)] = mix(ids[i]);
            __builtin_prefetch(&slots[hash[i & (RING - 1)] & mask]);
        }
        int64_t j = i - AHEAD;
        if (j >= 0 && j < n) prefetch_key(slots, mask, keys, hash[j & (RING - 1)]);
        int64_t k = i - 2 * AHEAD;
        if (k >= 0 && k < n) {
            int32_t r = probe(slots, mask, keys, ids[k], hash[k & (RING - 1)]);
            rows_out[k] = r;
            if (r == EMPTY) {
                absent++;
            } else if (src) {
                prefetch_row(src + (int64_t)r * dim, width, 0);
                __builtin_prefetch(&meta[r], 1);
            }
        }
        int64_t l = i - 3 * AHEAD;
        if (src && l >= 0 && rows_out[l] != EMPTY) {
            int64_t r = rows_out[l];
            copy_row(out + l * dim, src + r * dim, width);
            count(meta, r, day);
        }
    }
    return absent;
}

int64_t rover_pull(const int32_t *slots, uint64_t mask, const int64_t *keys, const int64_t *ids,
                   int64_t n, int32_t *rows_out, const float *src, int64_t dim, float *out,
                   uint64_t *meta, int32_t day) {
    return pull_pass(slots, mask, keys, ids, n, rows_out, src, dim, out, meta, day);
}

/* Rows of ids[0:n) into out (EMPTY where absent); returns how many are absent. */
int64_t rover_find(const int32_t *slots, uint64_t mask, const int64_t *keys, const int64_t *ids,
                   int64_t n, int32_t *out) {
    return pull_pass(slots, mask, keys, ids, n, out, 0, 0, 0, 0, 0);
}

/* rover_pull for ids that index ``row_of`` directly (a hashed vocabulary: row_of[id], EMPTY
 * where the id has no row yet). One pipelined pass: id i's entry is prefetched, id i-AHEAD's
 * row and record, id i-2*AHEAD is copied and counted. */
int64_t rover_pull_direct(const int32_t *row_of, const int64_t *ids, int64_t n, int32_t *rows_out,
                          const float *src, int64_t dim, float *out, uint64_t *meta, int32_t day) {
    size_t width = (size_t)dim * sizeof(float);
    int64_t absent = 0;
    for (int64_t i = 0; i < n + 2 * AHEAD; i++) {
        if (i < n) __builtin_prefetch(&row_of[ids[i]]);
        int64_t j = i - AHEAD;
        if (j >= 0 && j < n) {
            int32_t r = row_of[ids[j]];
            rows_out[j] = r;
            if (r != EMPTY) {
                prefetch_row(src + (int64_t)r * dim, width, 0);
                __builtin_prefetch(&meta[r], 1);
            }
        }
        int64_t k = i - 2 * AHEAD;
        if (k >= 0 && k < n) {
            int32_t r = rows_out[k];
            if (r == EMPTY) {
                absent++;
            } else {
                copy_row(out + k * dim, src + (int64_t)r * dim, width);
                count(meta, r, day);
            }
        }
    }
    return absent;
}

/* out[i] = src[rows[i]] (rows of ``dim`` floats), for the push's reads. */
void rover_gather(const float *src, int64_t dim, const int32_t *rows, int64_t n, float *out) {
    size_t width = (size_t)dim * sizeof(float);
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t m = n - b < BLOCK ? n - b : BLOCK;
        for (int64_t i = 0; i < m; i++) prefetch_row(src + (int64_t)rows[b + i] * dim, width, 0);
        for (int64_t i = 0; i < m; i++)
            copy_row(out + (b + i) * dim, src + (int64_t)rows[b + i] * dim, width);
    }
}

/* dst[rows[i]] = src[i] (rows of ``dim`` floats), for the push's writes. */
void rover_scatter(float *dst, int64_t dim, const int32_t *rows, int64_t n, const float *src) {
    size_t width = (size_t)dim * sizeof(float);
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t m = n - b < BLOCK ? n - b : BLOCK;
        for (int64_t i = 0; i < m; i++) prefetch_row(dst + (int64_t)rows[b + i] * dim, width, 1);
        for (int64_t i = 0; i < m; i++)
            copy_row(dst + (int64_t)rows[b + i] * dim, src + (b + i) * dim, width);
    }
}

/* One Adagrad step on the rows ``rows[i]`` of ``param`` and ``accum`` (rows of ``dim`` floats,
 * distinct), in place: accum += g*g; param -= lr*g / sqrt(accum + eps). Every operation is one
 * float rounding, in the order core.training_optimizers applies them, so the result is the
 * same bits (built with -std=c99: no contraction into fused multiply-adds). */
static inline void adagrad_span(float *p, float *a, const float *g, int64_t n, float lr,
                                float eps) {
    for (int64_t d = 0; d < n; d++) {
        float sq = g[d] * g[d];
        float acc = a[d] + sq;
        a[d] = acc;
        float denom = sqrtf(acc + eps);
        float update = lr * g[d];
        update = update / denom;
        p[d] = p[d] - update;
    }
}

void rover_adagrad(float *param, float *accum, int64_t dim, const int32_t *rows, int64_t n,
                   const float *grads, float lr, float eps) {
    for (int64_t i = 0; i < n + AHEAD; i++) {
        if (i < n) {
            prefetch_row(param + (int64_t)rows[i] * dim, (size_t)dim * sizeof(float), 1);
            prefetch_row(accum + (int64_t)rows[i] * dim, (size_t)dim * sizeof(float), 1);
        }
        int64_t k = i - AHEAD;
        if (k >= 0)
            adagrad_span(param + (int64_t)rows[k] * dim, accum + (int64_t)rows[k] * dim,
                         grads + k * dim, dim, lr, eps);
    }
}

/* The same Adagrad step on n contiguous values (a dense variable, whole). */
void rover_adagrad_flat(float *param, float *accum, const float *grads, int64_t n, float lr,
                        float eps) {
    adagrad_span(param, accum, grads, n, lr, eps);
}

/* 1 if no value of x[0:n) is inf or nan (exponent bits all set), else 0. */
int32_t rover_all_finite(const float *x, int64_t n) {
    const uint32_t *bits = (const uint32_t *)x;
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= (bits[i] & 0x7f800000u) == 0x7f800000u;
    return !bad;
}
