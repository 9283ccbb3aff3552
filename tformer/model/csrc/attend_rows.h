/* Row-exact attention, included by ggml_kernel.c (it shares the thread pool): softmax(q K^T * scale + bias) V for
 * each query on its own, over the keys it may see, in key order.
 *
 * Why it exists: a served request's rows share a forward with other requests, padding columns and prompt chunks;
 * a fused attention kernel (torch's flash path, a GEMM) sums in an order that depends on those shapes, so the same
 * query comes out an fp32 ulp apart in generate and in serving, and on the block kernel, whose activations are
 * rounded to 8 bits, an ulp now and then crosses a rounding step and flips a near-tie token.  Here the result of a
 * query is a function of its own vector and the keys and values it sees, nothing else:
 *   1. the keys it may see, in column order: j <= t + causal (when causal >= 0) and bias[j] != -inf;
 *   2. s_i = dot(q, k_i) * scale (+ bias[j]), each dot the same instruction sequence whatever the batch;
 *   3. m = max s_i; p_i = expf(s_i - m); l = p_0 + p_1 + ... in key order;
 *   4. out = (sum_i p_i v_i, accumulated in key order) / l; a query that sees no key gets zeros.
 * A query is computed by one thread from start to end, so the split over threads changes nothing either.
 *
 *   q (B, H, Tq, D), k and v (B, H_kv, Tk, D), bias (B, H, Tq, Tk) or none, strides in floats for the first three
 *   dimensions (the last is contiguous); out (B, H, Tq, D) contiguous.  Query head h reads key head h / (H / H_kv).
 */

typedef struct {
    const float *q, *k, *v, *bias;
    float *out;
    int64_t B, H, Hkv, Tq, Tk, D;
    int64_t qs[3], ks[3], vs[3], bs[3];
    int64_t causal;  // < 0: no causal limit; else query t sees keys j <= t + causal
    float scale;
    atomic_int failed;  // a part could not get its scratch memory: the call raises MemoryError
} attend_t;

/* The dot product of D floats, and y += p x.  Every call for a given D runs the same instructions. */
static float dot_portable(const float *a, const float *b, int64_t D) {
    float s = 0.0f;
    for (int64_t i = 0; i < D; i++) s += a[i] * b[i];
    return s;
}

static void axpy_portable(float p, const float *x, float *y, int64_t D) {
    for (int64_t i = 0; i < D; i++) y[i] += p * x[i];
}

#if TF_X86
__attribute__((target("avx2,fma"))) static inline float qk_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Four keys' dots with one query, each in its own accumulator (the four chains run side by side); qk_avx2 is the
 * same sequence for one key, so a key's score does not depend on which group it fell in. */
__attribute__((target("avx2,fma"))) static void qk4_avx2(const float *q, const float *k0, const float *k1,
                                                           const float *k2, const float *k3, int64_t D, float *s) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) {
        __m256 x = _mm256_loadu_ps(q + i);
        a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k0 + i), a0);
        a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k1 + i), a1);
        a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k2 + i), a2);
        a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(k3 + i), a3);
    }
    s[0] = qk_hsum8(a0), s[1] = qk_hsum8(a1), s[2] = qk_hsum8(a2), s[3] = qk_hsum8(a3);
    for (; i < D; i++) s[0] += q[i] * k0[i], s[1] += q[i] * k1[i], s[2] += q[i] * k2[i], s[3] += q[i] * k3[i];
}

__attribute__((target("avx2,fma"))) static float qk_avx2(const float *q, const float *k, int64_t D) {
    __m256 a = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), a);
    float s = qk_hsum8(a);
    for (; i < D; i++) s += q[i] * k[i];
    return s;
}

__attribute__((target("avx2,fma"))) static void axpy_avx2(float p, const float *x, float *y, int64_t D) {
    __m256 pv = _mm256_set1_ps(p);
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < D; i++) y[i] += p * x[i];
}
#endif

static void attend_part(const void *ctx, int part, int parts) {
    const attend_t *a = ctx;
    int64_t items = a->B * a->H * a->Tq, first = items * part / parts, end = items * (part + 1) / parts;
    int64_t D = a->D, group = a->H / a->Hkv;
    float *s = malloc(sizeof(float) * (size_t)(a->Tk + D));  // scores then weights, and the output's sum
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)a->Tk);   // the keys this query sees
    if (!s || !idx) {
        atomic_store(&((attend_t *)a)->failed, 1);
        free(s); free(idx);
        return;
    }
    float *acc = s + a->Tk;
    int simd = TF_X86 && simd_level > 0;
    (void)simd;
    for (int64_t it = first; it < end; it++) {
        int64_t t = it % a->Tq, h = (it / a->Tq) % a->H, b = it / (a->Tq * a->H), g = h / group;
        const float *q = a->q + b * a->qs[0] + h * a->qs[1] + t * a->qs[2];
        const float *k = a->k + b * a->ks[0] + g * a->ks[1];
        const float *v = a->v + b * a->vs[0] + g * a->vs[1];
        const float *bias = a->bias ? a->bias + b * a->bs[0] + h * a->bs[1] + t * a->bs[2] : NULL;
        float *out = a->out + it * D;
        int64_t last = a->causal < 0 ? a->Tk - 1 : (t + a->causal < a->Tk - 1 ? t + a->causal : a->Tk - 1);
        int64_t n = 0;
        for (int64_t j = 0; j <= last; j++)
            if (!bias || !(isinf(bias[j]) && bias[j] < 0)) idx[n++] = j;
        if (n == 0) {
            memset(out, 0, sizeof(float) * (size_t)D);
            continue;
        }
        int64_t i = 0;
#if TF_X86
        if (simd) {
            const int64_t kt = a->ks[2];
            for (; i + 4 <= n; i += 4)
                qk4_avx2(q, k + idx[i] * kt, k + idx[i + 1] * kt, k + idx[i + 2] * kt, k + idx[i + 3] * kt, D, s + i);
            for (; i < n; i++) s[i] = qk_avx2(q, k + idx[i] * kt, D);
        }
#endif
        for (; i < n; i++) s[i] = dot_portable(q, k + idx[i] * a->ks[2], D);
        float m = -INFINITY;
        for (i = 0; i < n; i++) {
            s[i] *= a->scale;
            if (bias) s[i] += bias[idx[i]];
            if (s[i] > m) m = s[i];
        }
        float l = 0.0f;
        for (i = 0; i < n; i++) {
            s[i] = expf(s[i] - m);
            l += s[i];
        }
        memset(acc, 0, sizeof(float) * (size_t)D);
#if TF_X86
        if (simd)
            for (i = 0; i < n; i++) axpy_avx2(s[i], v + idx[i] * a->vs[2], acc, D);
        else
#endif
            for (i = 0; i < n; i++) axpy_portable(s[i], v + idx[i] * a->vs[2], acc, D);
        for (int64_t d = 0; d < D; d++) out[d] = acc[d] / l;
    }
    free(s); free(idx);
}
