/* A block-quantized matrix product on the CPU: y (M, N) = x (M, K) W^T, W the rows of a GGUF tensor kept as the
 * file's blocks (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), x fp32.  The subject taught: how llama.cpp-style engines reach
 * the memory floor on a decode step.  Read this file beside tformer/model/ggml_blocks.py, which decodes the same
 * blocks with torch (the layouts are documented there).
 *
 * The arithmetic (tformer.model.ggml_kernel states it; tests/model/test_ggml_kernel.py checks it):
 *   1. each row of x is cut into blocks of 32 and quantized to 8 bits, as ggml's Q8_0 reference quantizer does:
 *      d = amax / 127 (fp32), q = roundf(x / d) in -127..127; the block's integer sum is kept beside it;
 *   2. per block of 32 weights, an integer dot product of the weight's small unsigned integers u with q, exact
 *      in int32; then fp32: acc += (weight scale * d) * dot, and the weight's offset (the -8 of Q4_0, Q4_1's min,
 *      a K-quant's sub-block min, Q6_K's -32) as offset * (d * sum(q)), kept in a separate fp32 sum;
 *   3. y = the horizontal sum of acc + the offset sum.
 *   Every output (m, n) goes through the same instructions whatever M, the rows grouped with it and the thread
 *   that computes it, so a row's result does not depend on the batch it was served in (served equals generated).
 *
 * Layout of the work: output rows n are split across a small pool of threads (the caller is thread 0); each
 * thread streams its weight rows once and, for M > 1, dots each weight block with 4 activation rows at a time so
 * the block is unpacked once per 4 rows.  SIMD: AVX2 (maddubs), the same code with AVX-512 VNNI's dpbusd when the
 * CPU has it (one instruction for the 4-wide u8 x s8 sum), chosen at run time; a portable C path otherwise.
 * No torch headers: the Python wrapper hands over data pointers (tformer/model/ggml_kernel.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TF_X86 1
#include <immintrin.h>
#else
#define TF_X86 0
#endif

enum { FMT_Q4_0 = 0, FMT_Q4_1 = 1, FMT_Q5_0 = 2, FMT_Q8_0 = 3, FMT_Q4_K = 4, FMT_Q6_K = 5, FMT_COUNT = 6 };
static const int PER_BLOCK[FMT_COUNT] = {32, 32, 32, 32, 256, 256};
static const int BLOCK_BYTES[FMT_COUNT] = {18, 20, 22, 34, 144, 210};
enum { ROWS_AT_ONCE = 4 };

/* The quantized activations: for row m and block b of 32, q[m*K + 32b ..], d[m*KB + b], and d times the
 * integer sum of the block, ds[m*KB + b], and of each of its halves of 16 (Q6_K's sub-blocks),
 * ds16[2*(m*KB + b) + 0/1]: what a weight's offset multiplies. */
typedef struct {
    const int8_t *q;
    const float *d, *ds, *ds16;
    int64_t K, KB;
} acts_t;

static float fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t read_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static float read_fp16(const uint8_t *p) { return fp16_to_fp32(read_u16(p)); }

/* Q4_K's 6-bit sub-block scale and min j (ggml's get_scale_min_k4). */
static void k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The 32-weight formats are repacked once at load (repack(): the same bytes, regrouped) so that 8 blocks' scales
 * sit side by side and widen in one instruction: a row of KB blocks becomes
 *     d fp16 [KB] | (Q4_1) m fp16 [KB] | (Q5_0) qh u32 [KB] | qs [KB][16] (Q8_0: [KB][32])
 * The K-quants keep the file's layout (their scales are already per super-block). */
static int is_packed32(int fmt) { return fmt <= FMT_Q8_0; }

static int64_t qs_offset(int fmt, int64_t KB) {
    return fmt == FMT_Q4_1 ? 4 * KB : fmt == FMT_Q5_0 ? 6 * KB : 2 * KB;
}

/* Block i of a packed row back in the file's layout (the portable path reads that). */
static void file_block(int fmt, const uint8_t *row, int64_t KB, int64_t i, uint8_t *blk) {
    const uint8_t *qs = row + qs_offset(fmt, KB);
    memcpy(blk, row + 2 * i, 2);
    switch (fmt) {
    case FMT_Q4_0: memcpy(blk + 2, qs + 16 * i, 16); break;
    case FMT_Q4_1: memcpy(blk + 2, row + 2 * KB + 2 * i, 2); memcpy(blk + 4, qs + 16 * i, 16); break;
    case FMT_Q5_0: memcpy(blk + 2, row + 2 * KB + 4 * i, 4); memcpy(blk + 6, qs + 16 * i, 16); break;
    default: memcpy(blk + 2, qs + 32 * i, 32); break;
    }
}

static void repack_rows(int fmt, const uint8_t *src, uint8_t *dst, int64_t N, int64_t KB) {
    int64_t bb = BLOCK_BYTES[fmt], row_bytes = KB * bb, at = qs_offset(fmt, KB);
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *s = src + n * row_bytes;
        uint8_t *d = dst + n * row_bytes;
        for (int64_t i = 0; i < KB; i++) {
            const uint8_t *blk = s + i * bb;
            memcpy(d + 2 * i, blk, 2);
            switch (fmt) {
            case FMT_Q4_0: memcpy(d + at + 16 * i, blk + 2, 16); break;
            case FMT_Q4_1: memcpy(d + 2 * KB + 2 * i, blk + 2, 2); memcpy(d + at + 16 * i, blk + 4, 16); break;
            case FMT_Q5_0: memcpy(d + 2 * KB + 4 * i, blk + 2, 4); memcpy(d + at + 16 * i, blk + 6, 16); break;
            default: memcpy(d + at + 32 * i, blk + 2, 32); break;
            }
        }
    }
}

/* Step 1: x (M, K) fp32 -> 8-bit blocks of 32.  roundf rounds halves away from zero, as ggml does. */
static void quantize_rows(const float *x, int64_t M, int64_t K, int8_t *q, float *d, float *ds, float *ds16) {
    int64_t KB = K / 32;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t b = 0; b < KB; b++) {
            const float *xb = x + m * K + 32 * b;
            float amax = 0.0f;
            for (int j = 0; j < 32; j++) {
                float a = fabsf(xb[j]);
                amax = a > amax ? a : amax;
            }
            float db = amax / 127.0f, inv = db != 0.0f ? 1.0f / db : 0.0f;
            int8_t *qb = q + m * K + 32 * b;
            int32_t lo = 0, hi = 0;
            for (int j = 0; j < 32; j++) {
                qb[j] = (int8_t)roundf(xb[j] * inv);
                if (j < 16) lo += qb[j]; else hi += qb[j];
            }
            d[m * KB + b] = db;
            ds[m * KB + b] = db * (float)(lo + hi);
            ds16[2 * (m * KB + b)] = db * (float)lo;
            ds16[2 * (m * KB + b) + 1] = db * (float)hi;
        }
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * The portable path: one output at a time, the arithmetic of the header comment in plain C.
 * u[32] are a block's weights as small unsigned integers (Q8_0: signed), scale/offset per 32 as fp32. */
static void unpack_portable(int fmt, const uint8_t *blk, int chunk, int16_t u[32], float *scale, float *offset,
                            float *scale_hi, float *offset_hi) {
    *scale_hi = NAN;  // only Q6_K has two scales per 32 (its sub-blocks are 16)
    *scale = *offset = *offset_hi = 0.0f;
    memset(u, 0, 32 * sizeof(int16_t));
    switch (fmt) {
    case FMT_Q4_0:
    case FMT_Q4_1: {
        const uint8_t *qs = blk + (fmt == FMT_Q4_0 ? 2 : 4);
        for (int j = 0; j < 16; j++) { u[j] = qs[j] & 0x0F; u[j + 16] = qs[j] >> 4; }
        *scale = read_fp16(blk);
        *offset = fmt == FMT_Q4_0 ? -8.0f * *scale : read_fp16(blk + 2);
        break;
    }
    case FMT_Q5_0: {
        uint32_t qh;
        memcpy(&qh, blk + 2, 4);
        for (int j = 0; j < 16; j++) {
            u[j] = (blk[6 + j] & 0x0F) | (((qh >> j) & 1) << 4);
            u[j + 16] = (blk[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        }
        *scale = read_fp16(blk);
        *offset = -16.0f * *scale;
        break;
    }
    case FMT_Q8_0:
        for (int j = 0; j < 32; j++) u[j] = (int8_t)blk[2 + j];
        *scale = read_fp16(blk);
        *offset = 0.0f;
        break;
    case FMT_Q4_K: {  // chunk 0..7 of the 256: qs chunk c = chunk/2, low nibbles for even chunks
        const uint8_t *qs = blk + 16 + 32 * (chunk / 2);
        for (int j = 0; j < 32; j++) u[j] = chunk % 2 ? qs[j] >> 4 : qs[j] & 0x0F;
        int sc, mn;
        k4_scale_min(blk + 4, chunk, &sc, &mn);
        *scale = read_fp16(blk) * (float)sc;
        *offset = -(read_fp16(blk + 2) * (float)mn);
        break;
    }
    case FMT_Q6_K: {  // chunk 0..7: half h = chunk/4 of 128 values, c = chunk%4 its quarter
        int h = chunk / 4, c = chunk % 4;
        const uint8_t *ql = blk + 64 * h + 32 * (c & 1), *qh = blk + 128 + 32 * h;
        for (int j = 0; j < 32; j++)
            u[j] = (c >= 2 ? ql[j] >> 4 : ql[j] & 0x0F) | (((qh[j] >> (2 * c)) & 3) << 4);
        float d = read_fp16(blk + 208);
        const int8_t *sc = (const int8_t *)(blk + 192);
        *scale = d * (float)sc[2 * chunk];
        *scale_hi = d * (float)sc[2 * chunk + 1];
        *offset = -32.0f * *scale;
        *offset_hi = -32.0f * *scale_hi;
        break;
    }
    }
}

static void rows_portable(int fmt, const uint8_t *wrow, const acts_t *a, int64_t m, float *out) {
    int chunks = PER_BLOCK[fmt] / 32;
    int64_t blocks = a->K / PER_BLOCK[fmt];
    float acc[2] = {0.0f, 0.0f}, offsets[2] = {0.0f, 0.0f};  // by the parity of the block of 32, as the SIMD rows
    for (int64_t b = 0; b < blocks; b++) {
        uint8_t unpacked[34];
        const uint8_t *blk = wrow + b * BLOCK_BYTES[fmt];
        if (is_packed32(fmt)) {
            file_block(fmt, wrow, a->KB, b, unpacked);
            blk = unpacked;
        }
        for (int c = 0; c < chunks; c++) {
            int64_t ab = m * a->KB + b * chunks + c;  // the activation block
            const int8_t *q = a->q + ab * 32;
            int16_t u[32];
            float scale, offset, scale_hi, offset_hi;
            unpack_portable(fmt, blk, c, u, &scale, &offset, &scale_hi, &offset_hi);
            float d = a->d[ab];
            int32_t lo = 0, hi = 0;
            for (int j = 0; j < 16; j++) lo += u[j] * q[j];
            for (int j = 16; j < 32; j++) hi += u[j] * q[j];
            int par = (int)((b * chunks + c) & 1);
            if (isnan(scale_hi)) {
                acc[par] += (scale * d) * (float)(lo + hi);
                offsets[par] += offset * a->ds[ab];
            } else {
                acc[par] += (scale * d) * (float)lo + (scale_hi * d) * (float)hi;
                offsets[par] += offset * a->ds16[2 * ab] + offset_hi * a->ds16[2 * ab + 1];
            }
        }
    }
    *out = (acc[0] + acc[1]) + (offsets[0] + offsets[1]);
}

/* ------------------------------------------------------------------------------------------------------------
 * The SIMD paths: ggml_kernel_simd.h compiled twice, once per instruction set. */
#if TF_X86
#define SIMD_TARGET __attribute__((target("avx2,fma,f16c")))
#define SIMD_NAME(x) x##_avx2
#define SIMD_VNNI 0
#include "ggml_kernel_simd.h"
#undef SIMD_TARGET
#undef SIMD_NAME
#undef SIMD_VNNI
#define SIMD_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#define SIMD_NAME(x) x##_vnni
#define SIMD_VNNI 1
#include "ggml_kernel_simd.h"
#undef SIMD_TARGET
#undef SIMD_NAME
#undef SIMD_VNNI
#endif

typedef void (*tile_fn)(int fmt, const uint8_t *w, int64_t row_bytes, const acts_t *a, int64_t m0, int64_t ld,
                        float *out);

static int simd_level = -1;  // 0 portable, 1 AVX2, 2 AVX-512 VNNI
static const char *SIMD_NAMES[] = {"portable C", "AVX2", "AVX-512 VNNI"};

static int detect_simd(void) {
    const char *forced = getenv("TFORMER_KERNEL_SIMD");  // "portable", "avx2": to compare paths on one machine
#if TF_X86
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    int vnni = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
    int level = vnni ? 2 : avx2 ? 1 : 0;
    if (forced && strcmp(forced, "portable") == 0) level = 0;
    if (forced && strcmp(forced, "avx2") == 0 && level > 1) level = 1;
    return level;
#else
    (void)forced;
    return 0;
#endif
}

/* ------------------------------------------------------------------------------------------------------------
 * The thread pool: workers wait for a new generation of work, spinning briefly (the next product of a decode step
 * comes within tens of microseconds) and then sleeping on a condition variable (nothing burns a core between
 * steps).  The caller runs part 0 itself and waits for the others. */
typedef struct {
    void (*run)(const void *ctx, int part, int parts);  // the work: a product's rows, attention's queries
    const void *ctx;
    int parts;
} job_t;

enum { MAX_THREADS = 256 };
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;  // one product at a time through the pool
static int pool_size = 0;  // workers started (the caller is not counted)
static atomic_uint pool_generation;
static atomic_int pool_pending;
static job_t pool_job;
static long spin_ns = 200000;
static unsigned worker_start_generation[MAX_THREADS + 1];

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if TF_X86
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg) {
    int index = (int)(intptr_t)arg;  // 1.. pool_size
    // The generation when this worker was made (read by its maker, under call_lock): a worker that reads it only
    // once it runs could take the first job's generation for its starting point and never answer it.
    unsigned seen = worker_start_generation[index];
    for (;;) {
        unsigned gen = atomic_load_explicit(&pool_generation, memory_order_acquire);
        if (gen == seen) {
            int64_t until = now_ns() + spin_ns;
            int spins = 0;
            while ((gen = atomic_load_explicit(&pool_generation, memory_order_acquire)) == seen) {
                cpu_relax();
                if (++spins % 64 == 0 && now_ns() > until) {
                    pthread_mutex_lock(&pool_lock);
                    while ((gen = atomic_load_explicit(&pool_generation, memory_order_acquire)) == seen)
                        pthread_cond_wait(&pool_wake, &pool_lock);
                    pthread_mutex_unlock(&pool_lock);
                    break;
                }
            }
        }
        seen = gen;
        job_t job = pool_job;  // published before the generation moved (release/acquire)
        if (index < job.parts) job.run(job.ctx, index, job.parts);
        atomic_fetch_sub_explicit(&pool_pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

static void pool_after_fork(void) {  // a forked child has none of the parent's threads
    pool_size = 0;
    pthread_mutex_init(&pool_lock, NULL);
    pthread_mutex_init(&call_lock, NULL);
    pthread_cond_init(&pool_wake, NULL);
}

static int pool_grow(int workers) {
    static int fork_hook = 0;
    if (!fork_hook) {
        pthread_atfork(NULL, NULL, pool_after_fork);
        fork_hook = 1;
    }
    while (pool_size < workers) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        worker_start_generation[pool_size + 1] = atomic_load(&pool_generation);
        int rc = pthread_create(&t, &attr, worker_main, (void *)(intptr_t)(pool_size + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) return -1;
        pool_size++;
    }
    return 0;
}

static void run_parallel(const job_t *job) {
    if (job->parts <= 1) {
        job->run(job->ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool_lock);
    pool_job = *job;
    atomic_store(&pool_pending, pool_size);  // every worker answers each generation; those beyond parts do nothing
    atomic_fetch_add_explicit(&pool_generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool_wake);
    pthread_mutex_unlock(&pool_lock);
    job->run(job->ctx, 0, job->parts);
    while (atomic_load_explicit(&pool_pending, memory_order_acquire) > 0) cpu_relax();
}

/* Part p of `parts` computes output rows [N p / parts, N (p+1) / parts) for every activation row: tiles of 4
 * activation rows x 1 weight row while 4 rows are left (each weight block unpacked once for 4 rows), then the 1 to 3
 * rows left as one tile (one row: a decode step).  Whatever the tile, each output's accumulators take the same
 * instructions in the same order, so a row's result does not depend on the rows beside it.  (Tiles of 1 x 4 weight rows measured 2.5x slower at one row on a Zen 4: the
 * compiler spilled their sixteen sums.) */
typedef struct {
    int fmt;
    const uint8_t *w;
    int64_t row_bytes, N, M;
    const acts_t *a;
    float *y;
} product_t;

static void product_part(const void *ctx, int part, int parts) {
    const product_t *job = ctx;
    int64_t n0 = job->N * part / parts, n1 = job->N * (part + 1) / parts, N = job->N, rb = job->row_bytes;
    const acts_t *a = job->a;
#if TF_X86
    if (simd_level > 0) {
        int vnni = simd_level == 2;
        tile_fn rows4 = vnni ? rows4_vnni : rows4_avx2;
        tile_fn rest = NULL;  // the M % 4 rows left after the tiles of 4, as one tile
        switch (job->M % ROWS_AT_ONCE) {
        case 3: rest = vnni ? rows3_vnni : rows3_avx2; break;
        case 2: rest = vnni ? rows2_vnni : rows2_avx2; break;
        case 1: rest = vnni ? one_vnni : one_avx2; break;
        }
        int64_t tiled = job->M - job->M % ROWS_AT_ONCE;
        for (int64_t n = n0; n < n1; n++) {
            for (int64_t m = 0; m < tiled; m += ROWS_AT_ONCE) rows4(job->fmt, job->w + n * rb, rb, a, m, N, job->y + m * N + n);
            if (rest) rest(job->fmt, job->w + n * rb, rb, a, tiled, N, job->y + tiled * N + n);
        }
        return;
    }
#endif
    for (int64_t n = n0; n < n1; n++)
        for (int64_t m = 0; m < job->M; m++) rows_portable(job->fmt, job->w + n * rb, a, m, job->y + m * N + n);
}

/* ------------------------------------------------------------------------------------------------------------
 * Row-exact attention (the decode step's other half on the kernel path): attend_rows.h. */
#include "attend_rows.h"

/* ------------------------------------------------------------------------------------------------------------
 * Python's side: every argument is an integer (a data pointer, a size, a format id). */
static int int_args(PyObject *const *args, Py_ssize_t nargs, int count, long long *v, const char *usage) {
    if (nargs != count) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    for (int i = 0; i < count; i++) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* matmul(x_ptr, M, K, w_ptr, N, row_bytes, fmt, y_ptr, threads) -> None.  The wrapper has checked the
 * shapes, dtypes and contiguity; here only the arithmetic facts are checked again. */
static PyObject *py_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long long v[9];
    if (int_args(args, nargs, 9, v, "matmul(x_ptr, M, K, w_ptr, N, row_bytes, fmt, y_ptr, threads)") != 0)
        return NULL;
    const float *x = (const float *)(intptr_t)v[0];
    int64_t M = v[1], K = v[2], N = v[4], row_bytes = v[5];
    const uint8_t *w = (const uint8_t *)(intptr_t)v[3];
    int fmt = (int)v[6];
    float *y = (float *)(intptr_t)v[7];
    long long threads = v[8];
    if (fmt < 0 || fmt >= FMT_COUNT || M < 0 || N < 0 || K <= 0 || K % PER_BLOCK[fmt] != 0 ||
        row_bytes != K / PER_BLOCK[fmt] * BLOCK_BYTES[fmt] || threads < 1 || threads > MAX_THREADS) {
        PyErr_SetString(PyExc_ValueError, "ggml_kernel.matmul: format, shape or thread count out of range");
        return NULL;
    }
    if (M == 0 || N == 0) Py_RETURN_NONE;
    int64_t KB = K / 32;
    int8_t *q = malloc((size_t)(M * K));
    float *d = malloc(sizeof(float) * (size_t)(4 * M * KB));  // d, then ds (M KB), then ds16 (2 M KB)
    if (!q || !d) {
        free(q); free(d);
        return PyErr_NoMemory();
    }
    float *ds = d + M * KB, *ds16 = d + 2 * M * KB;
    Py_BEGIN_ALLOW_THREADS
    quantize_rows(x, M, K, q, d, ds, ds16);
    acts_t a = {q, d, ds, ds16, K, KB};
    int parts = (int)(threads < N ? threads : N);
    pthread_mutex_lock(&call_lock);
    if (pool_grow(parts - 1) != 0) parts = pool_size + 1;
    product_t product = {fmt, w, row_bytes, N, M, &a, y};
    job_t job = {product_part, &product, parts};
    run_parallel(&job);
    pthread_mutex_unlock(&call_lock);
    Py_END_ALLOW_THREADS
    free(q); free(d);
    Py_RETURN_NONE;
}

/* repack(src_ptr, dst_ptr, N, row_bytes, fmt): a tensor's file blocks into the kernel's layout (see is_packed32);
 * the K-quants are copied as they are. */
static PyObject *py_repack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long long v[5];
    if (int_args(args, nargs, 5, v, "repack(src_ptr, dst_ptr, N, row_bytes, fmt)") != 0) return NULL;
    int fmt = (int)v[4];
    if (fmt < 0 || fmt >= FMT_COUNT || v[2] < 0 || v[3] <= 0 || v[3] % BLOCK_BYTES[fmt] != 0) {
        PyErr_SetString(PyExc_ValueError, "ggml_kernel.repack: format or shape out of range");
        return NULL;
    }
    const uint8_t *src = (const uint8_t *)(intptr_t)v[0];
    uint8_t *dst = (uint8_t *)(intptr_t)v[1];
    Py_BEGIN_ALLOW_THREADS
    if (is_packed32(fmt))
        repack_rows(fmt, src, dst, v[2], v[3] / BLOCK_BYTES[fmt]);
    else
        memcpy(dst, src, (size_t)(v[2] * v[3]));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* attend(q, k, v, bias (0: none), out, B, H, Hkv, Tq, Tk, D, q strides x3, k strides x3, v strides x3,
 * bias strides x3, causal, threads, scale): row-exact attention (attend_rows.h); the wrapper has checked the
 * tensors (fp32, last dimension contiguous, out contiguous). */
static PyObject *py_attend(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    const char *usage = "attend(q, k, v, bias, out, B, H, Hkv, Tq, Tk, D, 12 strides, causal, threads, scale)";
    long long v[25];
    if (nargs != 26) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    if (int_args(args, 25, 25, v, usage) != 0) return NULL;
    double scale = PyFloat_AsDouble(args[25]);
    if (scale == -1.0 && PyErr_Occurred()) return NULL;
    attend_t a = {(const float *)(intptr_t)v[0], (const float *)(intptr_t)v[1], (const float *)(intptr_t)v[2],
                  (const float *)(intptr_t)v[3], (float *)(intptr_t)v[4], v[5], v[6], v[7], v[8], v[9], v[10],
                  {v[11], v[12], v[13]}, {v[14], v[15], v[16]}, {v[17], v[18], v[19]}, {v[20], v[21], v[22]},
                  v[23], (float)scale, 0};
    long long threads = v[24];
    if (a.B < 0 || a.H < 1 || a.Hkv < 1 || a.H % a.Hkv != 0 || a.Tq < 0 || a.Tk < 0 || a.D < 1 || threads < 1 ||
        threads > MAX_THREADS) {
        PyErr_SetString(PyExc_ValueError, "ggml_kernel.attend: shape or thread count out of range");
        return NULL;
    }
    int64_t items = a.B * a.H * a.Tq;
    if (items == 0) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    int parts = (int)(threads < items ? threads : items);
    pthread_mutex_lock(&call_lock);
    if (pool_grow(parts - 1) != 0) parts = pool_size + 1;
    job_t job = {attend_part, &a, parts};
    run_parallel(&job);
    pthread_mutex_unlock(&call_lock);
    Py_END_ALLOW_THREADS
    if (atomic_load(&a.failed)) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_simd(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    return PyUnicode_FromString(SIMD_NAMES[simd_level]);
}

static PyObject *py_set_spin(PyObject *self, PyObject *arg) {
    (void)self;
    long us = PyLong_AsLong(arg);
    if (us == -1 && PyErr_Occurred()) return NULL;
    if (us < 0) us = 0;
    spin_ns = us * 1000;
    Py_RETURN_NONE;
}

static PyMethodDef METHODS[] = {
    {"matmul", (PyCFunction)(void (*)(void))py_matmul, METH_FASTCALL,
     "matmul(x_ptr, M, K, w_ptr, N, row_bytes, fmt, y_ptr, threads): y = x W^T over GGUF blocks"},
    {"repack", (PyCFunction)(void (*)(void))py_repack, METH_FASTCALL,
     "repack(src_ptr, dst_ptr, N, row_bytes, fmt): file blocks -> the kernel's layout"},
    {"attend", (PyCFunction)(void (*)(void))py_attend, METH_FASTCALL,
     "attend(q, k, v, bias, out, B, H, Hkv, Tq, Tk, D, 12 strides, causal, threads, scale): row-exact attention"},
    {"simd", py_simd, METH_NOARGS, "the instruction set chosen on this CPU"},
    {"set_spin_us", py_set_spin, METH_O, "how long a waiting worker spins before it sleeps (microseconds)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_ggml_kernel", NULL, -1, METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ggml_kernel(void) {
    simd_level = detect_simd();
    return PyModule_Create(&MODULE);
}
