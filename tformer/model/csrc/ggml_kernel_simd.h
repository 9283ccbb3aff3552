/* The SIMD rows of ggml_kernel.c, included once per instruction set with SIMD_TARGET (the target attribute),
 * SIMD_NAME (a suffix for every function) and SIMD_VNNI (1: the 4-wide u8 x s8 sum is AVX-512 VNNI's dpbusd;
 * 0: AVX2's maddubs then madd, equal while no 16-bit pair sum saturates: the largest here is 2 x 128 x 127).
 *
 * A block of 32 weights becomes one 256-bit vector u of 32 unsigned bytes (Q8_0: the weights' magnitudes, the
 * activations taking their signs), dotted with the 32 activation bytes into 8 int32 lanes (lane i: bytes 4i..4i+3,
 * so lanes 0-3 are the first 16 values: Q6_K's two sub-blocks get their own scale by lane). */

#define ALWAYS_INLINE static inline __attribute__((always_inline)) SIMD_TARGET
#ifndef UNROLL
#if defined(__clang__)
#define UNROLL _Pragma("unroll")
#else
#define UNROLL _Pragma("GCC unroll 4")
#endif
#endif

ALWAYS_INLINE __m256i SIMD_NAME(dot4)(__m256i u, __m256i q) {
#if SIMD_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, q);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1));
#endif
}

ALWAYS_INLINE float SIMD_NAME(hsum)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

ALWAYS_INLINE float SIMD_NAME(half)(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of nibbles -> 32 values: the low nibbles, then the high ones (Q4_0, Q4_1, Q5_0's low bits). */
ALWAYS_INLINE __m256i SIMD_NAME(nibbles16)(const uint8_t *qs) {
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

/* Q5_0's 32 fifth bits (a little-endian u32) -> 32 bytes, 0x10 where the bit is set. */
ALWAYS_INLINE __m256i SIMD_NAME(fifth_bits)(const uint8_t *qh) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    const __m256i byte_of = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                              0x0101010101010101LL, 0x0000000000000000LL);
    const __m256i bit_of = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), byte_of), bit_of);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit_of), _mm256_set1_epi8(0x10));
}

/* One activation block of row r: acc += (scale * d) * dot(u, q); offsets += offset * (d * sum q), into the
 * accumulators of parity PAR (a constant): two chains per row, as one would wait on the previous add every block.
 * `signs` (Q8_0 only): the weights themselves, whose signs move onto the activations. */
#define ONE_BLOCK(PAR, chunk_index, u_vec, scale, offset, has_offset, signs, w_signs)                         \
    UNROLL for (int r = 0; r < R; r++) {                                                                       \
        int64_t ab = (m0 + r) * KB + (chunk_index);                                                            \
        __m256i q = _mm256_loadu_si256((const __m256i *)(a->q + ab * 32));                                     \
        if (signs) q = _mm256_sign_epi8(q, w_signs);                                                           \
        __m256 dot = _mm256_cvtepi32_ps(SIMD_NAME(dot4)(u_vec, q));                                            \
        acc##PAR[r * C + c] = _mm256_fmadd_ps(_mm256_set1_ps((scale) * a->d[ab]), dot, acc##PAR[r * C + c]);   \
        if (has_offset) off##PAR[r * C + c] += (offset) * a->ds[ab];                                           \
    }

/* Q6_K's block of 32: two sub-blocks of 16, each its own scale (lanes 0-3 and 4-7 of the dot). */
#define Q6_BLOCK(PAR, chunk_index, u_vec, s_lo, s_hi)                                                         \
    UNROLL for (int r = 0; r < R; r++) {                                                                       \
        int64_t ab = (m0 + r) * KB + (chunk_index);                                                            \
        __m256i q = _mm256_loadu_si256((const __m256i *)(a->q + ab * 32));                                     \
        float da = a->d[ab];                                                                                   \
        __m256 scale = _mm256_set_m128(_mm_set1_ps((s_hi) * da), _mm_set1_ps((s_lo) * da));                   \
        acc##PAR[r * C + c] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(SIMD_NAME(dot4)(u_vec, q)),             \
                                              acc##PAR[r * C + c]);                                            \
        off##PAR[r * C + c] += (-32.0f * (s_lo)) * a->ds16[2 * ab] + (-32.0f * (s_hi)) * a->ds16[2 * ab + 1];  \
    }

/* The K-quants (Q4_K, Q6_K) in the file's layout: a tile of R activation rows x C weight rows (R C <= 4, both
 * constants; C is 1 today): each output's accumulators take the same instructions in the same order whatever the
 * tile, so a row's result does not depend on its batch. */
ALWAYS_INLINE void SIMD_NAME(tile_body)(int fmt, const uint8_t *w, int64_t row_bytes, const acts_t *a, int64_t m0,
                                         int64_t ld, float *out, const int R, const int C) {
    __m256 acc0[ROWS_AT_ONCE], acc1[ROWS_AT_ONCE];
    float off0[ROWS_AT_ONCE], off1[ROWS_AT_ONCE];
    for (int t = 0; t < R * C; t++) {
        acc0[t] = acc1[t] = _mm256_setzero_ps();
        off0[t] = off1[t] = 0.0f;
    }
    const int64_t KB = a->KB;
    switch (fmt) {
    default: break;  // the 32-weight formats: packed_body
    case FMT_Q4_K:
        for (int64_t b = 0; b < KB / 8; b++)
        UNROLL for (int c = 0; c < C; c++) {
            const uint8_t *blk = w + c * row_bytes + b * 144;
            float d = SIMD_NAME(half)(blk), dmin = SIMD_NAME(half)(blk + 2), scale[8], offset[8];
            const uint8_t *s6 = blk + 4;
            for (int j = 0; j < 4; j++) {  // ggml's get_scale_min_k4, all eight at once
                scale[j] = d * (float)(s6[j] & 63);
                offset[j] = -(dmin * (float)(s6[j + 4] & 63));
                scale[j + 4] = d * (float)((s6[j + 8] & 0x0F) | ((s6[j] >> 6) << 4));
                offset[j + 4] = -(dmin * (float)((s6[j + 8] >> 4) | ((s6[j + 4] >> 6) << 4)));
            }
            for (int pair = 0; pair < 4; pair++) {  // qs bytes 32 pair..: low nibbles sub-block 2 pair, high 2 pair + 1
                __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * pair));
                __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
                ONE_BLOCK(0, 8 * b + 2 * pair, lo, scale[2 * pair], offset[2 * pair], 1, 0, lo)
                ONE_BLOCK(1, 8 * b + 2 * pair + 1, hi, scale[2 * pair + 1], offset[2 * pair + 1], 1, 0, hi)
            }
        }
        break;
    case FMT_Q6_K:
        for (int64_t b = 0; b < KB / 8; b++)
        UNROLL for (int c = 0; c < C; c++) {
            const uint8_t *blk = w + c * row_bytes + b * 210;
            float d = SIMD_NAME(half)(blk + 208);
            const int8_t *sc = (const int8_t *)(blk + 192);
            for (int pair = 0; pair < 4; pair++) {  // blocks c = 2 pair, 2 pair + 1: half c/4, quarters c%4
                int h = pair / 2;
                __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
                __m256i u[2];
                for (int j = 0; j < 2; j++) {
                    int quarter = (2 * pair + j) % 4;
                    __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (quarter & 1)));
                    __m256i low = _mm256_and_si256(quarter >= 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0F));
                    __m256i top = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * quarter)),
                                                   _mm256_set1_epi8(0x03));
                    u[j] = _mm256_or_si256(low, _mm256_slli_epi16(top, 4));
                }
                int k = 2 * pair;
                Q6_BLOCK(0, 8 * b + k, u[0], d * (float)sc[2 * k], d * (float)sc[2 * k + 1])
                Q6_BLOCK(1, 8 * b + k + 1, u[1], d * (float)sc[2 * k + 2], d * (float)sc[2 * k + 3])
            }
        }
        break;
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            out[r * ld + c] = SIMD_NAME(hsum)(_mm256_add_ps(acc0[r * C + c], acc1[r * C + c])) +
                              (off0[r * C + c] + off1[r * C + c]);
}


/* Block i of a packed 32-weight row (ggml_kernel.c: is_packed32): its 32 unsigned values (Q8_0: magnitudes). */
ALWAYS_INLINE __m256i SIMD_NAME(packed_u)(int fmt, const uint8_t *row, int64_t KB, int64_t i) {
    const uint8_t *qs = row + qs_offset(fmt, KB);
    switch (fmt) {
    case FMT_Q4_0:
    case FMT_Q4_1:
        return SIMD_NAME(nibbles16)(qs + 16 * i);
    case FMT_Q5_0:
        return _mm256_or_si256(SIMD_NAME(nibbles16)(qs + 16 * i), SIMD_NAME(fifth_bits)(row + 2 * KB + 4 * i));
    default: {
        __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 32 * i));
        return _mm256_sign_epi8(w, w);
    }
    }
}

/* One block of a packed row for R activation rows: acc += scale8[lane] * dot, scale8 holding 8 blocks' (weight
 * scale * d) (a permute picks this block's lane: no scalar widening per block). */
#define PACKED_BLOCK(PAR, i, lane)                                                                             \
    {                                                                                                          \
        __m256i u = SIMD_NAME(packed_u)(FMT, w, KB, (i));                                                       \
        __m256i w_signs = FMT == FMT_Q8_0 ? _mm256_loadu_si256((const __m256i *)(w + qs_offset(FMT, KB) + 32 * (i))) : u; \
        const __m256i pick = _mm256_set1_epi32(lane);                                                          \
        UNROLL for (int r = 0; r < R; r++) {                                                                   \
            __m256i q = _mm256_loadu_si256((const __m256i *)(a->q + ((m0 + r) * KB + (i)) * 32));              \
            if (FMT == FMT_Q8_0) q = _mm256_sign_epi8(q, w_signs);                                             \
            __m256 dot = _mm256_cvtepi32_ps(SIMD_NAME(dot4)(u, q));                                            \
            acc##PAR[r] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(scale8[r], pick), dot, acc##PAR[r]);        \
        }                                                                                                      \
    }

/* The 32-weight formats on their packed rows: per 8 blocks, the 8 weight scales widened at once and multiplied by
 * the 8 activation scales; the offsets (Q4_0's -8 d, Q4_1's m, Q5_0's -16 d) as a vector fmadd with d * sum(q).
 * The last KB % 8 blocks one at a time, scalars.  Per output: acc0/acc1 by block parity, one offset vector, one
 * offset scalar, whatever the tile. */
ALWAYS_INLINE void SIMD_NAME(packed_body)(const int FMT, const uint8_t *w, const acts_t *a, int64_t m0, int64_t ld,
                                           float *out, const int R) {
    const int64_t KB = a->KB;
    __m256 acc0[ROWS_AT_ONCE], acc1[ROWS_AT_ONCE], offv[ROWS_AT_ONCE], scale8[ROWS_AT_ONCE];
    float offs[ROWS_AT_ONCE];
    for (int r = 0; r < R; r++) {
        acc0[r] = acc1[r] = offv[r] = _mm256_setzero_ps();
        offs[r] = 0.0f;
    }
    int64_t g = 0;
    for (; g + 8 <= KB; g += 8) {
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * g)));
        __m256 mw = FMT == FMT_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * KB + 2 * g)))
                  : _mm256_mul_ps(dw, _mm256_set1_ps(FMT == FMT_Q4_0 ? -8.0f : -16.0f));
        UNROLL for (int r = 0; r < R; r++) {
            int64_t ab = (m0 + r) * KB + g;
            scale8[r] = _mm256_mul_ps(dw, _mm256_loadu_ps(a->d + ab));
            if (FMT != FMT_Q8_0) offv[r] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(a->ds + ab), offv[r]);
        }
        PACKED_BLOCK(0, g + 0, 0) PACKED_BLOCK(1, g + 1, 1) PACKED_BLOCK(0, g + 2, 2) PACKED_BLOCK(1, g + 3, 3)
        PACKED_BLOCK(0, g + 4, 4) PACKED_BLOCK(1, g + 5, 5) PACKED_BLOCK(0, g + 6, 6) PACKED_BLOCK(1, g + 7, 7)
    }
    for (; g < KB; g++) {  // the tail: one block at a time
        float dw = SIMD_NAME(half)(w + 2 * g);
        float mw = FMT == FMT_Q4_1 ? SIMD_NAME(half)(w + 2 * KB + 2 * g) : dw * (FMT == FMT_Q4_0 ? -8.0f : -16.0f);
        __m256i u = SIMD_NAME(packed_u)(FMT, w, KB, g);
        __m256i w_signs = FMT == FMT_Q8_0 ? _mm256_loadu_si256((const __m256i *)(w + qs_offset(FMT, KB) + 32 * g)) : u;
        UNROLL for (int r = 0; r < R; r++) {
            int64_t ab = (m0 + r) * KB + g;
            __m256i q = _mm256_loadu_si256((const __m256i *)(a->q + ab * 32));
            if (FMT == FMT_Q8_0) q = _mm256_sign_epi8(q, w_signs);
            __m256 dot = _mm256_cvtepi32_ps(SIMD_NAME(dot4)(u, q));
            acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a->d[ab]), dot, acc0[r]);
            if (FMT != FMT_Q8_0) offs[r] += mw * a->ds[ab];
        }
    }
    for (int r = 0; r < R; r++)
        out[r * ld] = SIMD_NAME(hsum)(_mm256_add_ps(acc0[r], acc1[r])) + (SIMD_NAME(hsum)(offv[r]) + offs[r]);
}

#define DISPATCH(R)                                                                                            \
    switch (fmt) {                                                                                             \
    case FMT_Q4_0: SIMD_NAME(packed_body)(FMT_Q4_0, w, a, m0, ld, out, R); break;                             \
    case FMT_Q4_1: SIMD_NAME(packed_body)(FMT_Q4_1, w, a, m0, ld, out, R); break;                             \
    case FMT_Q5_0: SIMD_NAME(packed_body)(FMT_Q5_0, w, a, m0, ld, out, R); break;                             \
    case FMT_Q8_0: SIMD_NAME(packed_body)(FMT_Q8_0, w, a, m0, ld, out, R); break;                             \
    default: SIMD_NAME(tile_body)(fmt, w, row_bytes, a, m0, ld, out, R, 1);                                    \
    }

static SIMD_TARGET void SIMD_NAME(rows4)(int fmt, const uint8_t *w, int64_t row_bytes, const acts_t *a,
                                         int64_t m0, int64_t ld, float *out) {
    DISPATCH(ROWS_AT_ONCE)
}

/* The last 3 or 2 rows of a product (a serving step of 2 or 3 requests, a bucket's passenger): as one tile, each
 * weight block unpacked once for them, instead of one row at a time (measured on SmolLM2's gate-and-up rows, a
 * 2-core EPYC: 2 rows cost 1.9x one row that way). */
static SIMD_TARGET void SIMD_NAME(rows3)(int fmt, const uint8_t *w, int64_t row_bytes, const acts_t *a,
                                         int64_t m0, int64_t ld, float *out) {
    DISPATCH(3)
}

static SIMD_TARGET void SIMD_NAME(rows2)(int fmt, const uint8_t *w, int64_t row_bytes, const acts_t *a,
                                         int64_t m0, int64_t ld, float *out) {
    DISPATCH(2)
}

static SIMD_TARGET void SIMD_NAME(one)(int fmt, const uint8_t *w, int64_t row_bytes, const acts_t *a,
                                       int64_t m0, int64_t ld, float *out) {
    DISPATCH(1)
}

#undef ONE_BLOCK
#undef Q6_BLOCK
#undef PACKED_BLOCK
#undef DISPATCH
#undef ALWAYS_INLINE
