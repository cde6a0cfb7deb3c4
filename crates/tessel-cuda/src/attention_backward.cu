// Tessel's fused attention backward (flash attention 2): the pieces of an attention's
// gradient, the probabilities recomputed from the scores and each query's log-sum-exp, so
// no [l, s] matrix is stored. `attention_backward.rs` puts `attention.cu` (whose macros,
// copies and mma helpers these use) and its configuration before this text, with
//
//   FAB_PART    0: the log-sum-exps; 1: dq; 2: dk (stored transposed); 3: dv
//
// and FA_HALF 1, FA_MASK 0 (half operands on tensor cores, no mask, no dropout). In base 2:
// x_ij = scale·log2(e)·(q_i · k_j), p_ij = exp2(x_ij − lse_i·log2(e)) (0 where key j is
// hidden), dp_ij = dO_i · v_j, ds_ij = p_ij (dp_ij − delta_i); then dq_i = scale Σ_j ds_ij k_j,
// dk_j = scale Σ_i ds_ij q_i, dv_j = Σ_i p_ij dO_i. Sums are f32; the probabilities and
// ds are rounded to the operand dtype before the products, as flash attention does.

#if FA_HALF

#define FAB_LN2 0.6931471805599453f

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
            ((float*)out)[pair * l + row] =
                row_max[h] == FA_NEG_INF ? FA_NEG_INF : (row_max[h] + log2f(sum)) * FAB_LN2;
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
#if FAB_PART == 2
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
#endif
