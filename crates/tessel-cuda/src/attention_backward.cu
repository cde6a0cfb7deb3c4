// Tessel's fused attention backward (flash attention 2): the pieces of an attention's
// gradient, the probabilities recomputed from the scores and each query's log-sum-exp, so
// no [l, s] matrix is stored. `attention_backward.rs` puts `attention.cu` (whose macros,
// copies and mma helpers these use) and its configuration before this text, with
//
//   FAB_PART    0: the log-sum-exps; 1: dq; 2: dk (stored transposed); 3: dv;
//               4 (f32): dq, dk and dv at once
//   FAB_KEY_ROWS 1: dk stored as rows (pair, key, d) instead of transposed
//   FAB_SPLIT   f32 gradients: threads sharing a key (FA_THREADS / FAB_SPLIT keys a block)
//
// and FA_MASK 0 (no mask, no dropout); FA_HALF 1 runs half operands on tensor cores,
// FA_HALF 0 f32 on the CUDA cores. In base 2:
// x_ij = scale·log2(e)·(q_i · k_j), p_ij = exp2(x_ij − lse_i·log2(e)) (0 where key j is
// hidden), dp_ij = dO_i · v_j, ds_ij = p_ij (dp_ij − delta_i); then dq_i = scale Σ_j ds_ij k_j,
// dk_j = scale Σ_i ds_ij q_i, dv_j = Σ_i p_ij dO_i. Sums are f32; the probabilities and
// ds are rounded to the operand dtype before the products, as flash attention does.

#if FA_HALF

// `acc` (FA_SN tiles of 16 x 8) += the rows `a` (A fragments, FA_KT of them) times the
// rows of `tile` (FA_BN rows of FA_D, shared): the scores layout of `attention.cu`.
__device__ __forceinline__ void fab_rows_times_rows(
    float (*acc)[4], const fa_u32 (*a)[4], const fa_t* tile, int lane) {
#pragma unroll
    for (int j = 0; j < FA_SN; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
    // This lane's first row in shared memory (bytes); each fragment is a constant offset.
    const fa_u32 base = fa_shared(tile) + fa_b_lane(lane);
#pragma unroll
    for (int kk = 0; kk < FA_KT; kk++) {
#pragma unroll
        for (int j = 0; j < FA_SN; j += 2) {
            fa_u32 r[4];
            fa_ldmatrix(r, base + (j * 8 * FA_LEN + kk * 16) * 2);
            fa_mma(acc[j], a[kk], r[0], r[1]);
            fa_mma(acc[j + 1], a[kk], r[2], r[3]);
        }
    }
}

// `acc` (FA_NT tiles of 16 x 8) += `w` (16 x FA_BN, in the accumulator layout of
// `fab_rows_times_rows`, rounded here) times `tile` (FA_BN rows of FA_D, shared).
__device__ __forceinline__ void fab_weights_times_tile(
    float (*acc)[4], float (*w)[4], const fa_t* tile, int lane) {
    const fa_u32 base = fa_shared(tile) + fa_bt_lane(lane);
#pragma unroll
    for (int kk = 0; kk < FA_BN / 16; kk++) {
        fa_u32 a[4] = {
            fa_pack(w[2 * kk][0], w[2 * kk][1]), fa_pack(w[2 * kk][2], w[2 * kk][3]),
            fa_pack(w[2 * kk + 1][0], w[2 * kk + 1][1]),
            fa_pack(w[2 * kk + 1][2], w[2 * kk + 1][3])};
#pragma unroll
        for (int j = 0; j < FA_NT; j += 2) {
            fa_u32 r[4];
            fa_ldmatrix_t(r, base + (kk * 16 * FA_LEN + j * 8) * 2);
            fa_mma(acc[j], a, r[0], r[1]);
            fa_mma(acc[j + 1], a, r[2], r[3]);
        }
    }
}

// The A fragments of a warp's 16 rows of `tile` (rows of FA_D, shared).
__device__ __forceinline__ void fab_fragments(fa_u32 (*f)[4], const fa_t* tile, int warp, int lane) {
#pragma unroll
    for (int kk = 0; kk < FA_KT; kk++) {
        int row = warp * 16 + lane % 16, col = kk * 16 + (lane / 16) * 8;
        fa_ldmatrix(f[kk], fa_shared(tile + row * FA_LEN + col));
    }
}

// One element of a float rounded to the operand dtype, as its bits.
__device__ __forceinline__ fa_u16 fab_round(float x) {
    return (fa_u16)(fa_pack(x, 0.0f) & 0xffff);
}

#if FAB_PART <= 1

// A block per query tile of a pair (4 warps of 16 rows), walking the key tiles the rows
// see: the log-sum-exps (FAB_PART 0, `out` f32) or dq (FAB_PART 1).
extern "C" __global__ void __launch_bounds__(FA_THREADS) tessel_attention_backward(
    const fa_t* __restrict__ q, const fa_t* __restrict__ k, const fa_t* __restrict__ v,
    const fa_t* __restrict__ dout, const float* __restrict__ lse,
    const float* __restrict__ delta, void* __restrict__ out, int l, int s, float scale_log2,
    float scale, long long q_stride, long long k_stride, long long v_stride, int group) {
    extern __shared__ __align__(16) fa_t smem[];
    fa_t* qs = smem;
    fa_t* ks = qs + FA_BM * FA_LEN;
    fa_t* vs = ks + FA_BN * FA_LEN;
    fa_t* dos = vs + FA_BN * FA_LEN;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int tiles_q = (l + FA_BM - 1) / FA_BM;
    const int pairs = gridDim.x / tiles_q;
    const long long pair = blockIdx.x % pairs;
    const int m0 = (tiles_q - 1 - (int)(blockIdx.x / pairs)) * FA_BM;
    q += pair * q_stride;
    k += pair / group * k_stride;
    v += pair / group * v_stride;
    const int kv_end = FA_CAUSAL ? min(s, m0 + FA_BM) : s;
    const int tiles = (kv_end + FA_BN - 1) / FA_BN;
    const int row0 = m0 + warp * 16 + lane / 4;

    fa_load(qs, q, FA_BM, m0, l);
#if FAB_PART == 1
    fa_load(dos, dout + pair * l * FA_D, FA_BM, m0, l);
#endif
    FA_COMMIT();
    FA_WAIT(0);
    __syncthreads();
    fa_u32 qf[FA_KT][4];
    fab_fragments(qf, qs, warp, lane);
#if FAB_PART == 1
    fa_u32 df[FA_KT][4];
    fab_fragments(df, dos, warp, lane);
    float lse2[2], dl[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int row = min(row0 + h * 8, l - 1);
        lse2[h] = lse[pair * l + row] * FA_LOG2E;
        dl[h] = delta[pair * l + row];
    }
    float acc[FA_NT][4];
#pragma unroll
    for (int j = 0; j < FA_NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
#else
    float row_max[2] = {FA_NEG_INF, FA_NEG_INF}, row_sum[2] = {0.0f, 0.0f};
#endif

    for (int t = 0; t < tiles; t++) {
        const int n0 = t * FA_BN;
        fa_load(ks, k, FA_BN, n0, s);
#if FAB_PART == 1
        fa_load(vs, v, FA_BN, n0, s);
#endif
        FA_COMMIT();
        FA_WAIT(0);
        __syncthreads();
        float sc[FA_SN][4];
        fab_rows_times_rows(sc, qf, ks, lane);
#if FAB_PART == 1
        float dp[FA_SN][4];
        fab_rows_times_rows(dp, df, vs, lane);
#endif
#pragma unroll
        for (int j = 0; j < FA_SN; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = sc[j][e] * scale_log2;
#if FAB_PART == 1
                sc[j][e] = exp2f(x - lse2[e / 2]) * (dp[j][e] - dl[e / 2]);
#else
                sc[j][e] = x;
#endif
            }
        // Keys past `s`, or (causal) past a row, are hidden (weight 0): only tiles holding
        // such keys for a row of the warp mask, by one comparison per element with the last
        // key its row sees (the warp takes the branch together).
        if (n0 + FA_BN > s || (FA_CAUSAL && n0 + FA_BN - 1 > m0 + warp * 16)) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = row0 + h * 8;
                const int last = (FA_CAUSAL ? min(s - 1, row) : s - 1) - n0 - (lane % 4) * 2;
#pragma unroll
                for (int j = 0; j < FA_SN; j++)
#pragma unroll
                    for (int c = 0; c < 2; c++)
                        if (j * 8 + c > last) sc[j][2 * h + c] = FAB_PART == 1 ? 0.0f : FA_NEG_INF;
            }
        }
#if FAB_PART == 1
        fab_weights_times_tile(acc, sc, ks, lane);
#else
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = FA_NEG_INF;
#pragma unroll
            for (int j = 0; j < FA_SN; j++) mx = fmaxf(mx, fmaxf(sc[j][2 * h], sc[j][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            float grown = fmaxf(row_max[h], mx);
            float base = grown == FA_NEG_INF ? 0.0f : grown;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < FA_SN; j++)
                sum += exp2f(sc[j][2 * h] - base) + exp2f(sc[j][2 * h + 1] - base);
            row_sum[h] = row_sum[h] * exp2f(row_max[h] - base) + sum;
            row_max[h] = grown;
        }
#endif
        // Every warp is done with the tiles before the next iteration refills them.
        __syncthreads();
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int row = row0 + h * 8;
#if FAB_PART == 1
        if (row >= l) continue;
#pragma unroll
        for (int j = 0; j < FA_NT; j++) {
            int col = j * 8 + (lane % 4) * 2;
            *(fa_u32*)((fa_t*)out + (pair * l + row) * FA_D + col) =
                fa_pack(acc[j][2 * h] * scale, acc[j][2 * h + 1] * scale);
        }
#else
        float sum = row_sum[h];
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        sum += __shfl_xor_sync(0xffffffff, sum, 2);
        if (row < l && lane % 4 == 0)
            ((float*)out)[pair * l + row] = fa_lse(row_max[h], sum);
#endif
    }
}

#else  // FAB_PART 2 or 3

// A block per key tile of a pair (4 warps of 16 keys), walking the query tiles that see
// it: the transposed scores x_ji come out with keys as rows, so p and ds are already the
// A operands of dv = pᵀ dO and dk = dsᵀ q.
extern "C" __global__ void __launch_bounds__(FA_THREADS) tessel_attention_backward(
    const fa_t* __restrict__ q, const fa_t* __restrict__ k, const fa_t* __restrict__ v,
    const fa_t* __restrict__ dout, const float* __restrict__ lse,
    const float* __restrict__ delta, void* __restrict__ out, int l, int s, float scale_log2,
    float scale, long long q_stride, long long k_stride, long long v_stride, int group) {
    extern __shared__ __align__(16) fa_t smem[];
    fa_t* ks = smem;
    fa_t* vs = ks + FA_BN * FA_LEN;
    fa_t* qs = vs + FA_BN * FA_LEN;
    fa_t* dos = qs + FA_BM * FA_LEN;
    float* stats = (float*)(dos + FA_BM * FA_LEN);  // lse·log2(e), then delta
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int tiles_k = (s + FA_BN - 1) / FA_BN;
    const int pairs = gridDim.x / tiles_k;
    const long long pair = blockIdx.x % pairs;
    const int n0 = (int)(blockIdx.x / pairs) * FA_BN;
    q += pair * q_stride;
    k += pair / group * k_stride;
    v += pair / group * v_stride;
    dout += pair * l * FA_D;
    lse += pair * l;
    delta += pair * l;
    const int key0 = n0 + warp * 16 + lane / 4;

    fa_load(ks, k, FA_BN, n0, s);
    fa_load(vs, v, FA_BN, n0, s);
    FA_COMMIT();
    FA_WAIT(0);
    __syncthreads();
    fa_u32 kf[FA_KT][4];
    fab_fragments(kf, ks, warp, lane);
#if FAB_PART == 2
    fa_u32 vf[FA_KT][4];
    fab_fragments(vf, vs, warp, lane);
#endif
    float acc[FA_NT][4];
#pragma unroll
    for (int j = 0; j < FA_NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;

    // Causal: queries before the tile's first key see none of it.
    for (int m0 = FA_CAUSAL ? n0 / FA_BM * FA_BM : 0; m0 < l; m0 += FA_BM) {
        // Every warp is done with the last tiles before they are refilled.
        __syncthreads();
        fa_load(qs, q, FA_BM, m0, l);
        fa_load(dos, dout, FA_BM, m0, l);
        FA_COMMIT();
        for (int i = threadIdx.x; i < FA_BM; i += FA_THREADS) {
            bool in = m0 + i < l;
            stats[i] = in ? lse[m0 + i] * FA_LOG2E : 0.0f;
            stats[FA_BM + i] = in ? delta[m0 + i] : 0.0f;
        }
        FA_WAIT(0);
        __syncthreads();
        float sc[FA_SN][4];
        fab_rows_times_rows(sc, kf, qs, lane);
#if FAB_PART == 2
        float dp[FA_SN][4];
        fab_rows_times_rows(dp, vf, dos, lane);
#endif
#pragma unroll
        for (int j = 0; j < FA_SN; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = j * 8 + (lane % 4) * 2 + (e & 1);
                float p = exp2f(sc[j][e] * scale_log2 - stats[i]);
#if FAB_PART == 2
                sc[j][e] = p * (dp[j][e] - stats[FA_BM + i]);
#else
                sc[j][e] = p;
#endif
            }
        // Queries past `l`, or (causal) before a key, are hidden (weight 0): only tiles
        // holding such pairs for a key of the warp mask, each element by comparing its
        // query with the first and last its key's row sees.
        if (m0 + FA_BM > l || (FA_CAUSAL && n0 + warp * 16 + 15 > m0)) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int key = key0 + h * 8, skip = (lane % 4) * 2;
                const int first = (FA_CAUSAL ? key - m0 : 0) - skip, last = l - 1 - m0 - skip;
#pragma unroll
                for (int j = 0; j < FA_SN; j++)
#pragma unroll
                    for (int c = 0; c < 2; c++)
                        if (j * 8 + c < first || j * 8 + c > last) sc[j][2 * h + c] = 0.0f;
            }
        }
#if FAB_PART == 2
        fab_weights_times_tile(acc, sc, qs, lane);
#else
        fab_weights_times_tile(acc, sc, dos, lane);
#endif
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int key = key0 + h * 8;
        if (key >= s) continue;
#pragma unroll
        for (int j = 0; j < FA_NT; j++) {
            int col = j * 8 + (lane % 4) * 2;
#if FAB_PART == 2 && FAB_KEY_ROWS
            // Stored as rows: element (pair, key, d) at (pair·s + key)·FA_D + d.
            *(fa_u32*)((fa_t*)out + (pair * s + key) * FA_D + col) =
                fa_pack(acc[j][2 * h] * scale, acc[j][2 * h + 1] * scale);
#elif FAB_PART == 2
            // Stored transposed: element (pair, d, key) at (pair·FA_D + d)·s + key.
            fa_u16* dk = (fa_u16*)out + pair * FA_D * s + key;
            dk[(long long)col * s] = fab_round(acc[j][2 * h] * scale);
            dk[(long long)(col + 1) * s] = fab_round(acc[j][2 * h + 1] * scale);
#else
            *(fa_u32*)((fa_t*)out + (pair * s + key) * FA_D + col) =
                fa_pack(acc[j][2 * h], acc[j][2 * h + 1]);
#endif
        }
    }
}

#endif

#else  // f32 on the CUDA cores

// FAB_PART 0: the log-sum-exps, as the forward's one-row-per-thread kernel without the
// values; FAB_PART 4: dq, dkᵀ and dv in one pass per key tile, dq summed atomically.

#if FAB_PART == 0

// Key rows per tile, two tiles in flight.
#define FAB_KEYS 32

// A thread per query row (FA_THREADS rows per block), walking the key tiles its rows see
// with the forward's online max and sum (base 2).
extern "C" __global__ void __launch_bounds__(FA_THREADS) tessel_attention_backward(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ dout, const float* __restrict__ lse_in,
    const float* __restrict__ delta, float* __restrict__ lse, int l, int s, float scale_log2,
    float scale, long long q_stride, long long k_stride, long long v_stride, int group) {
    extern __shared__ __align__(16) float smem[];
    const int tiles_q = (l + FA_THREADS - 1) / FA_THREADS;
    const int pairs = gridDim.x / tiles_q;
    const long long pair = blockIdx.x % pairs;
    const int m0 = (tiles_q - 1 - (int)(blockIdx.x / pairs)) * FA_THREADS;
    const int row = m0 + threadIdx.x;
    q += pair * q_stride;
    k += pair / group * k_stride;
    const int kv_end = FA_CAUSAL ? min(s, m0 + FA_THREADS) : s;
    const int tiles = (kv_end + FAB_KEYS - 1) / FAB_KEYS;
    if (tiles > 0) fa_load(smem, k, FAB_KEYS, 0, s);
    FA_COMMIT();

    float qr[FA_D];
    const float4* q4 = (const float4*)(q + (long long)min(row, l - 1) * FA_D);
#pragma unroll
    for (int d = 0; d < FA_D / 4; d++) {
        float4 x = q4[d];
        qr[4 * d] = x.x * scale_log2;
        qr[4 * d + 1] = x.y * scale_log2;
        qr[4 * d + 2] = x.z * scale_log2;
        qr[4 * d + 3] = x.w * scale_log2;
    }
    float row_max = FA_NEG_INF, row_sum = 0.0f;
    for (int t = 0; t < tiles; t++) {
        if (t + 1 < tiles) {
            fa_load(smem + ((t + 1) % 2) * FAB_KEYS * FA_D, k, FAB_KEYS, (t + 1) * FAB_KEYS, s);
            FA_COMMIT();
            FA_WAIT(1);
        } else {
            FA_WAIT(0);
        }
        __syncthreads();
        const float* ks = smem + (t % 2) * FAB_KEYS * FA_D;
        const int n0 = t * FAB_KEYS;
        // Keys past `keys` (past `s`, or causal: past the row) are hidden.
        const int keys = min(FAB_KEYS, (FA_CAUSAL ? min(kv_end, row + 1) : s) - n0);
        for (int j = 0; j < keys; j += 4) {
            float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int d = 0; d < FA_D / 4; d++) {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float4 y = ((const float4*)(ks + (j + u) * FA_D))[d];
                    dot[u] = fmaf(qr[4 * d], y.x, dot[u]);
                    dot[u] = fmaf(qr[4 * d + 1], y.y, dot[u]);
                    dot[u] = fmaf(qr[4 * d + 2], y.z, dot[u]);
                    dot[u] = fmaf(qr[4 * d + 3], y.w, dot[u]);
                }
            }
            float mx = FA_NEG_INF;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (j + u >= keys) dot[u] = FA_NEG_INF;
                mx = fmaxf(mx, dot[u]);
            }
            if (mx > row_max) {
                row_sum *= exp2f(row_max - mx);
                row_max = mx;
            }
#pragma unroll
            for (int u = 0; u < 4; u++) row_sum += exp2f(dot[u] - row_max);
        }
        // Every thread is done with the tile before the next iteration refills it.
        __syncthreads();
    }
    if (row < l)
        lse[pair * l + row] = fa_lse(row_max, row_sum);
}

#else  // FAB_PART 4

// FAB_SPLIT threads share a key, each holding the 16-byte chunks c ≡ its part (mod
// FAB_SPLIT) of the key's k, v and gradient rows; a step is FAB_BM queries.
#define FAB_BN (FA_THREADS / FAB_SPLIT)
#define FAB_BM 32
#define FAB_DH (FA_D / FAB_SPLIT)  // head-dim elements per thread
#define FAB_DS (FAB_BM + 1)        // floats per row of the dsᵀ tile (odd: no bank conflicts)
#define FAB_STEP (2 * FAB_BM * FA_D + 2 * FAB_BM)  // a step's q, dO, lse·log2(e), delta
static_assert(FA_D % (4 * FAB_SPLIT) == 0, "whole 16-byte chunks per thread");
static_assert(FA_THREADS % FAB_BM == 0, "whole queries per thread group of dq");

// Queues the copy of the step's q and dO rows from `m0` on (zeros past `l`) and writes its
// statistics (0 past `l`).
__device__ __forceinline__ void fab_load_step(
    float* stage, const float* q, const float* dout, const float* lse, const float* delta,
    int m0, int l) {
    fa_load(stage, q, FAB_BM, m0, l);
    fa_load(stage + FAB_BM * FA_D, dout, FAB_BM, m0, l);
    float* stats = stage + 2 * FAB_BM * FA_D;
    for (int i = threadIdx.x; i < FAB_BM; i += FA_THREADS) {
        const bool in = m0 + i < l;
        stats[i] = in ? lse[m0 + i] * FA_LOG2E : 0.0f;
        stats[FAB_BM + i] = in ? delta[m0 + i] : 0.0f;
    }
}

// A block per key tile of a pair (FAB_BN keys), walking the steps of queries that see it
// (causal: from the tile's first key on), two in flight. For each query a thread pair
// computes the score and dO·v of its key (halves met by shuffles), the probability from
// the query's log-sum-exp and ds; dv and dk accumulate in registers, ds goes to shared
// memory transposed, and after the step the block turns to dq: FA_THREADS / FAB_BM threads
// per query sum ds times the key tile's rows and add them to dq atomically (other key
// tiles add theirs). dq must hold zeros before the launch.
extern "C" __global__ void __launch_bounds__(FA_THREADS, 2) tessel_attention_backward(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ dout, const float* __restrict__ lse,
    const float* __restrict__ delta, float* __restrict__ dq, float* __restrict__ dk,
    float* __restrict__ dv, int l, int s, float scale_log2, float scale, long long q_stride,
    long long k_stride, long long v_stride, int group) {
    extern __shared__ __align__(16) float smem[];
    float* ks = smem + 2 * FAB_STEP;  // the key tile, for dq
    float* dst = ks + FAB_BN * FA_D;  // dsᵀ: FAB_BN rows of FAB_DS
    const int part = threadIdx.x % FAB_SPLIT, key_local = threadIdx.x / FAB_SPLIT;
    const int tiles_k = (s + FAB_BN - 1) / FAB_BN;
    const int pairs = gridDim.x / tiles_k;
    const long long pair = blockIdx.x % pairs;
    const int n0 = (int)(blockIdx.x / pairs) * FAB_BN;
    const int key = n0 + key_local;
    q += pair * q_stride;
    k += pair / group * k_stride;
    v += pair / group * v_stride;
    dout += pair * l * FA_D;
    lse += pair * l;
    delta += pair * l;
    dq += pair * l * FA_D;

    fa_load(ks, k, FAB_BN, n0, s);
    const int first = FA_CAUSAL ? n0 / FAB_BM * FAB_BM : 0;
    const int steps = (l - first + FAB_BM - 1) / FAB_BM;
    if (steps > 0) fab_load_step(smem, q, dout, lse, delta, first, l);
    FA_COMMIT();

    float kr[FAB_DH], vr[FAB_DH], dkr[FAB_DH], dvr[FAB_DH];
    {
        const float4* k4 = (const float4*)(k + (long long)min(key, s - 1) * FA_D);
        const float4* v4 = (const float4*)(v + (long long)min(key, s - 1) * FA_D);
#pragma unroll
        for (int c = 0; c < FAB_DH / 4; c++) {
            const float4 a = k4[c * FAB_SPLIT + part], b = v4[c * FAB_SPLIT + part];
            kr[4 * c] = a.x;
            kr[4 * c + 1] = a.y;
            kr[4 * c + 2] = a.z;
            kr[4 * c + 3] = a.w;
            vr[4 * c] = b.x;
            vr[4 * c + 1] = b.y;
            vr[4 * c + 2] = b.z;
            vr[4 * c + 3] = b.w;
        }
#pragma unroll
        for (int d = 0; d < FAB_DH; d++) dkr[d] = dvr[d] = 0.0f;
    }
    // The first query the warp's keys can see (causal), and the last key a warp's queries
    // of the dq phase can see.
    const int warp_key = n0 + (threadIdx.x / 32) * (32 / FAB_SPLIT);
    const int per_query = FA_THREADS / FAB_BM, dq_query = threadIdx.x / per_query,
              dq_part = threadIdx.x % per_query;

    for (int t = 0; t < steps; t++) {
        const int m0 = first + t * FAB_BM;
        if (t + 1 < steps) {
            fab_load_step(smem + ((t + 1) % 2) * FAB_STEP, q, dout, lse, delta, m0 + FAB_BM, l);
            FA_COMMIT();
            FA_WAIT(1);
        } else {
            FA_WAIT(0);
        }
        __syncthreads();
        const float* qs = smem + (t % 2) * FAB_STEP;
        const float* dos = qs + FAB_BM * FA_D;
        const float* lse2 = dos + FAB_BM * FA_D;
        const float* dl = lse2 + FAB_BM;
        // Queries before `i0` see none of the warp's keys (a bound the warp shares).
        const int i0 = FA_CAUSAL ? min(FAB_BM, max(0, warp_key - m0)) : 0;
        const int i1 = min(FAB_BM, l - m0);
        for (int i = 0; i < i0; i++)
            if (part == 0) dst[key_local * FAB_DS + i] = 0.0f;
#pragma unroll 1
        for (int i = i0; i < i1; i++) {
            const float4* q4 = (const float4*)(qs + i * FA_D);
            const float4* d4 = (const float4*)(dos + i * FA_D);
            float qi[FAB_DH], di[FAB_DH];
            float sp[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int c = 0; c < FAB_DH / 4; c++) {
                const float4 a = q4[c * FAB_SPLIT + part], b = d4[c * FAB_SPLIT + part];
                qi[4 * c] = a.x;
                qi[4 * c + 1] = a.y;
                qi[4 * c + 2] = a.z;
                qi[4 * c + 3] = a.w;
                di[4 * c] = b.x;
                di[4 * c + 1] = b.y;
                di[4 * c + 2] = b.z;
                di[4 * c + 3] = b.w;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    sp[e] = fmaf(qi[4 * c + e], kr[4 * c + e], sp[e]);
                    dp[e] = fmaf(di[4 * c + e], vr[4 * c + e], dp[e]);
                }
            }
            float x = (sp[0] + sp[1]) + (sp[2] + sp[3]);
            float y = (dp[0] + dp[1]) + (dp[2] + dp[3]);
#pragma unroll
            for (int o = 1; o < FAB_SPLIT; o *= 2) {
                x += __shfl_xor_sync(0xffffffff, x, o);
                y += __shfl_xor_sync(0xffffffff, y, o);
            }
            const bool seen = key < s && (!FA_CAUSAL || key <= m0 + i);
            const float p = seen ? exp2f(x * scale_log2 - lse2[i]) : 0.0f;
            const float ds = p * (y - dl[i]);
#pragma unroll
            for (int d = 0; d < FAB_DH; d++) {
                dvr[d] = fmaf(p, di[d], dvr[d]);
                dkr[d] = fmaf(ds, qi[d], dkr[d]);
            }
            if (part == 0) dst[key_local * FAB_DS + i] = ds;
        }
        __syncthreads();
        // dq: `per_query` threads a query, each the chunks c ≡ dq_part (mod per_query).
        {
            const int row = m0 + dq_query;
            // Keys past `jn` are hidden from every query of the warp.
            const int warp_last = m0 + ((threadIdx.x / 32) * 32 + 31) / per_query;
            const int jn = min(FAB_BN, (FA_CAUSAL ? min(s, warp_last + 1) : s) - n0);
            constexpr int chunks = (FA_D / 4 + FA_THREADS / FAB_BM - 1) / (FA_THREADS / FAB_BM);
            float acc[chunks][4];
#pragma unroll
            for (int c = 0; c < chunks; c++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[c][e] = 0.0f;
            if (dq_query < i1) {
                for (int j = 0; j < jn; j++) {
                    const float w = dst[j * FAB_DS + dq_query];
                    const float4* k4 = (const float4*)(ks + j * FA_D);
#pragma unroll
                    for (int c = 0; c < chunks; c++) {
                        const int chunk = c * per_query + dq_part;
                        if (chunk < FA_D / 4) {
                            const float4 y = k4[chunk];
                            acc[c][0] = fmaf(w, y.x, acc[c][0]);
                            acc[c][1] = fmaf(w, y.y, acc[c][1]);
                            acc[c][2] = fmaf(w, y.z, acc[c][2]);
                            acc[c][3] = fmaf(w, y.w, acc[c][3]);
                        }
                    }
                }
                if (jn > 0) {
#pragma unroll
                    for (int c = 0; c < chunks; c++) {
                        const int chunk = c * per_query + dq_part;
                        if (chunk < FA_D / 4) {
                            float* to = dq + (long long)row * FA_D + chunk * 4;
#if __CUDA_ARCH__ >= 900
                            asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                                         :: "l"(to), "f"(acc[c][0] * scale),
                                            "f"(acc[c][1] * scale), "f"(acc[c][2] * scale),
                                            "f"(acc[c][3] * scale)
                                         : "memory");
#else
#pragma unroll
                            for (int e = 0; e < 4; e++) atomicAdd(to + e, acc[c][e] * scale);
#endif
                        }
                    }
                }
            }
        }
        // Every thread is done with the step's tiles and dsᵀ before they are refilled.
        __syncthreads();
    }
    if (key >= s) return;
    // dkᵀ: element (pair, d, key) at (pair·FA_D + d)·s + key (as rows with FAB_KEY_ROWS:
    // (pair·s + key)·FA_D + d); dv row-major.
#if FAB_KEY_ROWS
    float4* dk4 = (float4*)(dk + (pair * s + key) * FA_D);
#else
    float* dkt = dk + pair * FA_D * s + key;
#endif
    float4* dv4 = (float4*)(dv + (pair * s + key) * FA_D);
#pragma unroll
    for (int c = 0; c < FAB_DH / 4; c++) {
        const int chunk = c * FAB_SPLIT + part;
#if FAB_KEY_ROWS
        dk4[chunk] = make_float4(dkr[4 * c] * scale, dkr[4 * c + 1] * scale,
                                 dkr[4 * c + 2] * scale, dkr[4 * c + 3] * scale);
#else
#pragma unroll
        for (int e = 0; e < 4; e++) dkt[(long long)(chunk * 4 + e) * s] = dkr[4 * c + e] * scale;
#endif
        dv4[chunk] = make_float4(dvr[4 * c], dvr[4 * c + 1], dvr[4 * c + 2], dvr[4 * c + 3]);
    }
}

#endif
#endif
