/* Hot loops of core.id_index: a linear-probing hash index from int64 ids to int32 row
 * positions, and the pull's gather with its access counting.
 *
 * The index holds only row positions (int32, -1 empty, a power-of-two count); an id lives once,
 * in ``keys[row]`` (the table's ids in row order), so a slot costs 4 bytes. Work runs in blocks
 * of BLOCK ids, stage by stage, each stage prefetching what the next one reads: the misses of a
 * block overlap instead of following one another.
 *
 * Loaded with ctypes (core.id_probe); a pure-numpy twin gives the same rows without a compiler.
 */
#include <stdint.h>
#include <string.h>

#define BLOCK 64
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

/* The row of ``id`` or EMPTY, probing from ``pos``. */
static inline int32_t probe(const int32_t *slots, uint64_t mask, const int64_t *keys, int64_t id,
                            uint64_t pos) {
    for (;;) {
        int32_t row = slots[pos];
        if (row == EMPTY || keys[row] == id) return row;
        pos = (pos + 1) & mask;
    }
}

/* Rows of ids[0:n) into out (EMPTY where absent); returns how many are absent. */
int64_t rover_find(const int32_t *slots, uint64_t mask, const int64_t *keys, const int64_t *ids,
                   int64_t n, int32_t *out) {
    int64_t absent = 0;
    uint64_t pos[BLOCK];
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t m = n - b < BLOCK ? n - b : BLOCK;
        for (int64_t i = 0; i < m; i++) {
            pos[i] = mix(ids[b + i]) & mask;
            __builtin_prefetch(&slots[pos[i]]);
        }
        for (int64_t i = 0; i < m; i++) {
            int32_t row = slots[pos[i]];
            if (row != EMPTY) __builtin_prefetch(&keys[row]);
        }
        for (int64_t i = 0; i < m; i++) {
            int32_t row = probe(slots, mask, keys, ids[b + i], pos[i]);
            out[b + i] = row;
            absent += row == EMPTY;
        }
    }
    return absent;
}

/* Rows of ids[0:n) into out, an absent id taking row ``next`` (then next + 1, ...) with its id
 * written to keys[row]; returns the next free row. The caller leaves room for every id: slots
 * below the load limit after n more, keys long enough. A repeated id gets its first row. */
int64_t rover_insert(int32_t *slots, uint64_t mask, int64_t *keys, const int64_t *ids, int64_t n,
                     int32_t *out, int64_t next) {
    for (int64_t i = 0; i < n; i++) {
        int64_t id = ids[i];
        uint64_t pos = mix(id) & mask;
        for (;;) {
            int32_t row = slots[pos];
            if (row == EMPTY) {
                slots[pos] = (int32_t)next;
                keys[next] = id;
                out[i] = (int32_t)next++;
                break;
            }
            if (keys[row] == id) {
                out[i] = row;
                break;
            }
            pos = (pos + 1) & mask;
        }
    }
    return next;
}

/* Empty ``slots`` and index keys[0:n) as rows 0..n-1 (ids known distinct). */
void rover_rebuild(int32_t *slots, uint64_t mask, const int64_t *keys, int64_t n) {
    memset(slots, 0xff, (mask + 1) * sizeof(int32_t));
    for (int64_t r = 0; r < n; r++) {
        uint64_t pos = mix(keys[r]) & mask;
        while (slots[pos] != EMPTY) pos = (pos + 1) & mask;
        slots[pos] = (int32_t)r;
    }
}

/* 1 if ids[0:n) strictly increase (np.unique's output: no repeats), else 0. */
int32_t rover_increasing(const int64_t *ids, int64_t n) {
    int32_t ok = 1;
    for (int64_t i = 1; i < n; i++) ok &= ids[i] > ids[i - 1];
    return ok;
}

/* out[i] = src[rows[i]] (rows of ``dim`` floats); counts[rows[i]] += 1, seen[rows[i]] = day. */
void rover_gather_count(const float *src, int64_t dim, const int32_t *rows, int64_t n,
                        float *out, uint32_t *counts, int32_t *seen, int32_t day) {
    size_t width = (size_t)dim * sizeof(float);
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t m = n - b < BLOCK ? n - b : BLOCK;
        for (int64_t i = 0; i < m; i++) {
            int64_t r = rows[b + i];
            const char *p = (const char *)(src + r * dim);
            for (size_t off = 0; off < width; off += 64) __builtin_prefetch(p + off);
            __builtin_prefetch(&counts[r], 1);
            __builtin_prefetch(&seen[r], 1);
        }
        for (int64_t i = 0; i < m; i++) {
            int64_t r = rows[b + i];
            memcpy(out + (b + i) * dim, src + r * dim, width);
            counts[r] += 1;
            seen[r] = day;
        }
    }
}

/* out[i] = src[rows[i]] (rows of ``dim`` floats), for the push's reads. */
void rover_gather(const float *src, int64_t dim, const int32_t *rows, int64_t n, float *out) {
    size_t width = (size_t)dim * sizeof(float);
    for (int64_t b = 0; b < n; b += BLOCK) {
        int64_t m = n - b < BLOCK ? n - b : BLOCK;
        for (int64_t i = 0; i < m; i++) {
            const char *p = (const char *)(src + (int64_t)rows[b + i] * dim);
            for (size_t off = 0; off < width; off += 64) __builtin_prefetch(p + off);
        }
        for (int64_t i = 0; i < m; i++)
            memcpy(out + (b + i) * dim, src + (int64_t)rows[b + i] * dim, width);
    }
}
