// Tessel's fused attention forward (flash attention): `out = softmax(scale q kᵀ) v` per
// (batch, head) pair, the scores never stored. `attention.rs` defines before this text:
//
//   FA_D        the head dim of q, k and v (a multiple of 16 for half, of 4 for f32)
//   FA_HALF     1: f16/bf16 operands on tensor cores (`mma.sync.m16n8k16`, f32 sums);
//               0: f32 operands (on the CUDA cores unless FA_TF32)
//   FA_TF32     with FA_HALF 0: 1 runs both f32 products on tensor cores, each as three
//               TF32 products (`mma.sync.m16n8k8`, the 3xTF32 of PyTorch's f32 attention)
//   FA_F16      with FA_HALF: 1 f16, 0 bf16
//   FA_CAUSAL   1: key j > query i is hidden
//   FA_MASK     an additive mask read with strides: 0 none, 1 f32, 2 bf16, 3 f16
//   FA_WM       half: 16-row query tiles per warp (1 or 2; blocks of 64 FA_WM rows);
//               f32: query rows per thread (1, or 2: two threads split two rows' head dim)
//   FA_FAST_EXP 1: 2^x by `ex2.approx.ftz` (half, as flash attention)
//   FA_FOLD     1: raw scores, the scale applied inside the exponent's fma (half, no mask,
//               a positive scale)
//   FA_HELPERS_ONLY  defined: the helpers without the forward kernels (the backward and
//               decode sources that follow this text use them)
//
// A block owns FA_BM queries of one pair and walks the keys in tiles of FA_BN, two tiles in
// flight through `cp.async` (16-byte copies, zero-filled past `s`: rows of FA_D elements
// start 16-byte aligned, which `attention.rs` checks). The softmax is online: each row
// keeps its running max and sum in f32, rescaling its accumulators when the max grows
// (base-2 exponentials of `scale·log2(e)`-scaled scores). The grid holds one block per
// query tile of every pair, numbered so the tiles with the most keys (causal) start first.
// Pair `p` is (outer, head) = (p / heads, p % heads): every operand's rows and the output's
// are read and written with strides (views of wider buffers, as heads split out of a
// projection are), and `k`/`v` count heads by `head / group` (grouped-query heads).

typedef unsigned short fa_u16;
typedef unsigned int fa_u32;

__device__ __forceinline__ fa_u32 fa_shared(const void* p) {
    fa_u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void fa_copy16(fa_u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// NVRTC has no math.h: the infinity by its bits.
#define FA_NEG_INF __int_as_float(0xff800000)

#define FA_NEG_MAX __int_as_float(0xff7fffff)
#define FA_LOG2E 1.4426950408889634f

// The mask's element `i` as a float.
__device__ __forceinline__ float fa_mask_at(const void* mask, long long i) {
#if FA_MASK == 1
    return ((const float*)mask)[i];
#elif FA_MASK == 2
    return __uint_as_float(((fa_u32)((const fa_u16*)mask)[i]) << 16);
#elif FA_MASK == 3
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(((const fa_u16*)mask)[i]));
    return f;
#else
    return 0.0f;
#endif
}

// A base-2 score `x` plus the mask value `m` (natural units). A finite mask keeps the
// score finite, so a row masked everywhere by the dtype's lowest value averages its
// values as the composition does, instead of giving NaN.
__device__ __forceinline__ float fa_masked(float x, float m) {
    float y = x + m * FA_LOG2E;
    return (y == FA_NEG_INF && m != FA_NEG_INF) ? FA_NEG_MAX : y;
}

#define FA_COMMIT() asm volatile("cp.async.commit_group;\n" ::)
#define FA_WAIT(n) asm volatile("cp.async.wait_group %0;\n" :: "n"(n))

#ifndef FA_WM
#define FA_WM 1
#endif
#ifndef FA_MIN_BLOCKS
#define FA_MIN_BLOCKS 1
#endif
#ifndef FA_FAST_EXP
#define FA_FAST_EXP 0
#endif
// 1: the half kernel keeps raw scores and scales them inside the exponent (a positive
// scale and no mask, which `attention.rs` checks).
#ifndef FA_FOLD
#define FA_FOLD 0
#endif
#if FA_FOLD && FA_MASK
#error "FA_FOLD needs FA_MASK 0"
#endif
// 2^x: the hardware's approximation (2 ulp), subnormal results flushed to 0 with
// FA_FAST_EXP (a weight below 2^-126 of the row's largest adds nothing a half output
// can hold).
__device__ __forceinline__ float fa_exp2(float x) {
#if FA_FAST_EXP
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);
#endif
}
#if FA_HALF
typedef fa_u16 fa_t;
#define FA_BM (64 * FA_WM)
#ifndef FA_BN
#define FA_BN 64
#endif
#define FA_THREADS 128
#define FA_PAD 8
#elif FA_TF32
typedef float fa_t;
#define FA_BM 64
#define FA_BN 64
#define FA_THREADS 128
// Rows 4 elements apart in banks: each fragment's 32 reads hit 32 banks.
#define FA_PAD 4
#else
typedef float fa_t;
#define FA_BM 64
#define FA_BN 32
// The backward's f32 kernels (`attention_backward.cu`) copy with blocks of their own size.
#ifndef FA_THREADS
#define FA_THREADS 64
#endif
#define FA_PAD 0
#endif
// Elements per 16-byte chunk, and per stored (padded) shared row.
#define FA_CHUNK (16 / (int)sizeof(fa_t))
#define FA_LEN (FA_D + FA_PAD)
static_assert(FA_D % FA_CHUNK == 0, "rows are whole 16-byte chunks");

// Queues the copy of `rows` rows of FA_D elements, `stride` elements apart, from `src` (row
// `first` on) into `dst`, zero-filling rows at or past `limit`.
__device__ __forceinline__ void fa_load_rows(
    fa_t* dst, const fa_t* src, int rows, int first, int limit, long long stride) {
    const int chunks = FA_D / FA_CHUNK;
    const fa_u32 base = fa_shared(dst);
    const int pass = FA_THREADS / chunks;  // rows one pass of the block copies
    if (FA_THREADS % chunks == 0 && rows % pass == 0) {
        // Each thread copies one chunk column of every pass-th row: with `rows` a constant
        // at the call the loop unrolls, and the row pointer steps instead of multiplying.
        const int r0 = threadIdx.x / chunks, col = (threadIdx.x % chunks) * FA_CHUNK;
        const fa_t* from = src + (long long)(first + r0) * stride + col;
        const long long step = (long long)pass * stride;
        fa_u32 to = base + (r0 * FA_LEN + col) * (int)sizeof(fa_t);
#pragma unroll
        for (int i = 0; i < rows; i += pass) {
            const bool ok = first + r0 + i < limit;
            fa_copy16(to, ok ? from : src, ok);
            from += step;
            to += pass * FA_LEN * (int)sizeof(fa_t);
        }
        return;
    }
    for (int c = threadIdx.x; c < rows * chunks; c += FA_THREADS) {
        int row = c / chunks, col = (c % chunks) * FA_CHUNK;
        bool ok = first + row < limit;
        const fa_t* from = ok ? src + (long long)(first + row) * stride + col : src;
        fa_copy16(base + (row * FA_LEN + col) * (int)sizeof(fa_t), from, ok);
    }
}

// `fa_load_rows` of contiguous rows.
__device__ __forceinline__ void fa_load(
    fa_t* dst, const fa_t* src, int rows, int first, int limit) {
    fa_load_rows(dst, src, rows, first, limit, FA_D);
}

// Moves `q`, `k`, `v` and `out` to row 0 of pair `pair` by the kernel's outer and head
// strides: pair p is (outer, head) = (p / heads, p % heads), and `k`, `v` count heads by
// `head / group`.
#define FA_PAIR_ROWS(pair)                                                     \
    {                                                                          \
        const long long outer = (pair) / heads, head = (pair) % heads;        \
        const long long kv_head = head / group;                               \
        q += outer * q_outer + head * q_head;                                  \
        k += outer * k_outer + kv_head * k_head;                               \
        v += outer * v_outer + kv_head * v_head;                               \
        out += outer * o_outer + head * o_head;                                \
    }

// Queues key and value tile `t` (rows t·FA_BN on) into stage t % 2 of `kv` (each stage a
// tile of keys, then one of values).
__device__ __forceinline__ void fa_load_stage(
    fa_t* kv, const fa_t* k, const fa_t* v, int t, int s, long long k_row, long long v_row) {
    fa_t* stage = kv + (t % 2) * 2 * FA_BN * FA_LEN;
    fa_load_rows(stage, k, FA_BN, t * FA_BN, s, k_row);
    fa_load_rows(stage + FA_BN * FA_LEN, v, FA_BN, t * FA_BN, s, v_row);
}

// Waits for tile `t`'s stage (queuing tile t + 1's first, while there is one), then for the
// whole block; returns the stage (its keys; the values follow).
__device__ __forceinline__ const fa_t* fa_next_stage(
    fa_t* kv, const fa_t* k, const fa_t* v, int t, int tiles, int s, long long k_row,
    long long v_row) {
    if (t + 1 < tiles) {
        fa_load_stage(kv, k, v, t + 1, s, k_row, v_row);
        FA_COMMIT();
        FA_WAIT(1);
    } else {
        FA_WAIT(0);
    }
    __syncthreads();
    return kv + (t % 2) * 2 * FA_BN * FA_LEN;
}

// Every forward kernel's signature: operands, lengths, strides, heads, the mask, and where
// each query's log-sum-exp goes (`lse[pair·l + row]`, natural log; null: nowhere).
#define FA_FORWARD_KERNEL                                                                   \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, FA_MIN_BLOCKS) tessel_attention(\
        const fa_t* __restrict__ q, const fa_t* __restrict__ k, const fa_t* __restrict__ v, \
        fa_t* __restrict__ out, int l, int s, float scale_log2, long long q_outer,          \
        long long q_head, long long q_row, long long k_outer, long long k_head,             \
        long long k_row, long long v_outer, long long v_head, long long v_row,              \
        long long o_outer, long long o_head, long long o_row, int heads, int group,         \
        const void* __restrict__ mask, long long mo, long long mh, long long mi,            \
        long long mj, int mask_heads, float* __restrict__ lse)

#define FA_LN2 0.6931471805599453f

// The log-sum-exp of a row from its running max (of base-2 scaled scores) and sum.
__device__ __forceinline__ float fa_lse(float row_max, float row_sum) {
    return row_max == FA_NEG_INF ? FA_NEG_INF : (row_max + log2f(row_sum)) * FA_LN2;
}

// The block's query tile (those with the most keys first) and its pair, the operands moved
// to the pair's rows, and the key tiles the tile sees.
#define FA_BLOCK_TILE                                                                \
    const int tiles_q = (l + FA_BM - 1) / FA_BM;                                     \
    const int pairs = gridDim.x / tiles_q;                                           \
    const long long pair = blockIdx.x % pairs;                                       \
    const int m0 = (tiles_q - 1 - (int)(blockIdx.x / pairs)) * FA_BM;                \
    FA_PAIR_ROWS(pair);                                                              \
    const long long mask_pair = (pair / mask_heads) * mo + (pair % mask_heads) * mh; \
    const int kv_end = FA_CAUSAL ? min(s, m0 + FA_BM) : s;                           \
    const int tiles = (kv_end + FA_BN - 1) / FA_BN

#if FA_HALF

__device__ __forceinline__ void fa_ldmatrix(fa_u32* r, fa_u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void fa_ldmatrix_t(fa_u32* r, fa_u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// Byte offsets, within a shared tile of rows of FA_LEN elements, of the row this lane
// addresses for `fa_ldmatrix` of B fragments (rows are the product's n: keys of q·kᵀ) and
// for `fa_ldmatrix_t` (rows are its k: values of p·v); a fragment at (row r, column c) of
// the tile is then this plus the constant (r·FA_LEN + c)·2.
__device__ __forceinline__ fa_u32 fa_b_lane(int lane) {
    return ((lane % 8 + (lane / 16) * 8) * FA_LEN + ((lane / 8) % 2) * 8) * 2;
}
__device__ __forceinline__ fa_u32 fa_bt_lane(int lane) {
    return ((lane % 8 + ((lane / 8) % 2) * 8) * FA_LEN + (lane / 16) * 8) * 2;
}

__device__ __forceinline__ void fa_mma(float* c, const fa_u32* a, fa_u32 b0, fa_u32 b1) {
#if FA_F16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#endif
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to nearest even, `lo` in the low half.
__device__ __forceinline__ fa_u32 fa_pack(float lo, float hi) {
    fa_u32 r;
#if FA_F16
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

#define FA_KT (FA_D / 16)
#define FA_NT (FA_D / 8)
#define FA_SN (FA_BN / 8)

// Each of the 4 warps owns FA_WM tiles of 16 query rows: their q fragments stay in
// registers, their scores for a key tile are FA_WM x 8 mma tiles of 16 x 8, and every k and
// v fragment read from shared memory feeds FA_WM products (two halve the shared-memory
// reads per product, at twice the registers). The probabilities go from the scores'
// accumulator layout straight into the A fragments of the product with v (the layouts
// agree), rounded to the operand dtype. A thread holds two rows of each of its tiles
// (lane / 4 and + 8).
#ifndef FA_HELPERS_ONLY
FA_FORWARD_KERNEL {
    extern __shared__ __align__(16) fa_t smem[];
    fa_t* qs = smem;
    fa_t* kv = smem + FA_BM * FA_LEN;  // stage t: K at kv + t * 2 * FA_BN * FA_LEN, V after
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    FA_BLOCK_TILE;

    fa_load_rows(qs, q, FA_BM, m0, l, q_row);
    if (tiles > 0) fa_load_stage(kv, k, v, 0, s, k_row, v_row);
    FA_COMMIT();
    FA_WAIT(0);
    __syncthreads();

    // The warp's first query row, and the row of (tile w, half h) of this thread.
    const int warp_row = m0 + warp * FA_WM * 16;
    const int row0 = warp_row + lane / 4;
    fa_u32 qf[FA_WM][FA_KT][4];
#pragma unroll
    for (int w = 0; w < FA_WM; w++)
#pragma unroll
        for (int kk = 0; kk < FA_KT; kk++) {
            int row = warp_row - m0 + w * 16 + lane % 16, col = kk * 16 + (lane / 16) * 8;
            fa_ldmatrix(qf[w][kk], fa_shared(qs + row * FA_LEN + col));
        }
    float o[FA_WM][FA_NT][4];
#pragma unroll
    for (int w = 0; w < FA_WM; w++)
#pragma unroll
        for (int j = 0; j < FA_NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[w][j][e] = 0.0f;
    float row_max[FA_WM][2], row_sum[FA_WM][2];
#pragma unroll
    for (int w = 0; w < FA_WM; w++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            row_max[w][h] = FA_NEG_INF;
            row_sum[w][h] = 0.0f;
        }
    // Shared-memory byte addresses: the stages' base, and where this lane's ldmatrix rows
    // start within a key and a value tile, so each fragment below is a constant offset.
    const fa_u32 kv_addr = fa_shared(kv);
    const fa_u32 k_lane = fa_b_lane(lane), v_lane = fa_bt_lane(lane);

    for (int t = 0; t < tiles; t++) {
        fa_next_stage(kv, k, v, t, tiles, s, k_row, v_row);
        const fa_u32 stage = kv_addr + (t % 2) * (2 * FA_BN * FA_LEN * 2);
        const fa_u32 ks = stage + k_lane, vs = stage + FA_BN * FA_LEN * 2 + v_lane;
        const int n0 = t * FA_BN;
        // Causal: a warp whose rows all precede the tile's first key adds nothing (the
        // branch is uniform across the warp, as ldmatrix and mma.sync need).
        if (!FA_CAUSAL || n0 <= warp_row + FA_WM * 16 - 1) {
            float sc[FA_WM][FA_SN][4];
#pragma unroll
            for (int w = 0; w < FA_WM; w++)
#pragma unroll
                for (int j = 0; j < FA_SN; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) sc[w][j][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < FA_KT; kk++) {
#pragma unroll
                for (int j = 0; j < FA_SN; j += 2) {
                    fa_u32 r[4];
                    fa_ldmatrix(r, ks + (j * 8 * FA_LEN + kk * 16) * 2);
#pragma unroll
                    for (int w = 0; w < FA_WM; w++) {
                        fa_mma(sc[w][j], qf[w][kk], r[0], r[1]);
                        fa_mma(sc[w][j + 1], qf[w][kk], r[2], r[3]);
                    }
                }
            }
#if !FA_FOLD || FA_MASK
#pragma unroll
            for (int w = 0; w < FA_WM; w++)
#pragma unroll
                for (int j = 0; j < FA_SN; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
#if FA_FOLD
                        float x = sc[w][j][e];
#else
                        float x = sc[w][j][e] * scale_log2;
#endif
#if FA_MASK
                        int col = n0 + j * 8 + (lane % 4) * 2 + (e & 1);
                        int row = row0 + w * 16 + (e / 2) * 8;
                        if (col < s && row < l)
                            x = fa_masked(x, fa_mask_at(mask, mask_pair + row * mi + col * mj));
#endif
                        sc[w][j][e] = x;
                    }
#endif
            // Keys past `s`, or (causal) past a row, are hidden: only tiles holding such keys
            // for a row of the warp mask (a branch the whole warp takes), each element by
            // one comparison with the last key its row sees.
            if (n0 + FA_BN > s || (FA_CAUSAL && n0 + FA_BN - 1 > warp_row)) {
#pragma unroll
                for (int w = 0; w < FA_WM; w++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int row = row0 + w * 16 + h * 8;
                        const int last = (FA_CAUSAL ? min(s - 1, row) : s - 1) - n0 - (lane % 4) * 2;
#pragma unroll
                        for (int j = 0; j < FA_SN; j++)
#pragma unroll
                            for (int c = 0; c < 2; c++)
                                if (j * 8 + c > last) sc[w][j][2 * h + c] = FA_NEG_INF;
                    }
            }
#pragma unroll
            for (int w = 0; w < FA_WM; w++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float mx = FA_NEG_INF;
#pragma unroll
                    for (int j = 0; j < FA_SN; j++)
                        mx = fmaxf(mx, fmaxf(sc[w][j][2 * h], sc[w][j][2 * h + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
                    float grown = fmaxf(row_max[w][h], mx);
                    // A row that has seen only hidden keys keeps zeros (exp2(-inf) = 0).
#if FA_FOLD
                    // Raw scores: the scale joins the subtraction of the max, one fma.
                    float base = grown == FA_NEG_INF ? 0.0f : grown * scale_log2;
                    float alpha = fa_exp2(fmaf(row_max[w][h], scale_log2, -base));
#define FA_SHIFTED(x) fmaf(x, scale_log2, -base)
#else
                    float base = grown == FA_NEG_INF ? 0.0f : grown;
                    float alpha = fa_exp2(row_max[w][h] - base);
#define FA_SHIFTED(x) ((x) - base)
#endif
                    row_max[w][h] = grown;
                    float sum = 0.0f;
#pragma unroll
                    for (int j = 0; j < FA_SN; j++) {
                        sc[w][j][2 * h] = fa_exp2(FA_SHIFTED(sc[w][j][2 * h]));
                        sc[w][j][2 * h + 1] = fa_exp2(FA_SHIFTED(sc[w][j][2 * h + 1]));
                        sum += sc[w][j][2 * h] + sc[w][j][2 * h + 1];
                    }
#undef FA_SHIFTED
                    row_sum[w][h] = row_sum[w][h] * alpha + sum;
#pragma unroll
                    for (int j = 0; j < FA_NT; j++) {
                        o[w][j][2 * h] *= alpha;
                        o[w][j][2 * h + 1] *= alpha;
                    }
                }
#pragma unroll
            for (int kk = 0; kk < FA_BN / 16; kk++) {
                fa_u32 a[FA_WM][4];
#pragma unroll
                for (int w = 0; w < FA_WM; w++) {
                    a[w][0] = fa_pack(sc[w][2 * kk][0], sc[w][2 * kk][1]);
                    a[w][1] = fa_pack(sc[w][2 * kk][2], sc[w][2 * kk][3]);
                    a[w][2] = fa_pack(sc[w][2 * kk + 1][0], sc[w][2 * kk + 1][1]);
                    a[w][3] = fa_pack(sc[w][2 * kk + 1][2], sc[w][2 * kk + 1][3]);
                }
#pragma unroll
                for (int j = 0; j < FA_NT; j += 2) {
                    fa_u32 r[4];
                    fa_ldmatrix_t(r, vs + (kk * 16 * FA_LEN + j * 8) * 2);
#pragma unroll
                    for (int w = 0; w < FA_WM; w++) {
                        fa_mma(o[w][j], a[w], r[0], r[1]);
                        fa_mma(o[w][j + 1], a[w], r[2], r[3]);
                    }
                }
            }
        }
        // Every warp is done with this stage before the next iteration refills it.
        __syncthreads();
    }
#pragma unroll
    for (int w = 0; w < FA_WM; w++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float sum = row_sum[w][h];
            sum += __shfl_xor_sync(0xffffffff, sum, 1);
            sum += __shfl_xor_sync(0xffffffff, sum, 2);
            int row = row0 + w * 16 + h * 8;
            if (row >= l) continue;
#pragma unroll
            for (int j = 0; j < FA_NT; j++) {
                int col = j * 8 + (lane % 4) * 2;
                *(fa_u32*)(out + (long long)row * o_row + col) =
                    fa_pack(o[w][j][2 * h] / sum, o[w][j][2 * h + 1] / sum);
            }
            if (lse && lane % 4 == 0) {
#if FA_FOLD
                // Raw scores: the max in the exponent's units.
                const float top = row_max[w][h] * scale_log2;
#else
                const float top = row_max[w][h];
#endif
                lse[pair * l + row] = fa_lse(top, sum);
            }
        }
}
#endif  // FA_HELPERS_ONLY

#elif FA_TF32  // f32 on tensor cores, three TF32 products per product

// The TF32 helpers (`tf32_split`, `tf32_mma8`) are `tf32.cu`'s, prepended to this text.

// c += a·b in near-f32 precision (3xTF32): `a` given split (`big`, `small`), the B
// fragment as its two f32 values. The small products go first, so the big one adds to
// sums that already hold them; small·small (at most 2^-22 of the product) is left out.
__device__ __forceinline__ void fa_mma3(
    float* c, const fa_u32* big, const fa_u32* small, float b0, float b1) {
    fa_u32 b0_big, b0_small, b1_big, b1_small;
    tf32_split(b0, b0_big, b0_small);
    tf32_split(b1, b1_big, b1_small);
    tf32_mma8(c, small, b0_big, b1_big);
    tf32_mma8(c, big, b0_small, b1_small);
    tf32_mma8(c, big, b0_big, b1_big);
}

#define FA_KT (FA_D / 8)  // 8-wide slices of the head dim
#define FA_SN (FA_BN / 8)  // 8-key slices of a tile

// Each of the 4 warps owns 16 query rows; a thread holds rows lane / 4 and + 8 of each
// 16 x 8 accumulator tile, columns 2·(lane % 4) and + 1. q's A fragments (scaled to base
// 2, split) stay in registers; k and v fragments are read from shared memory and split as
// they are used. The product with v takes the probabilities straight from the scores'
// accumulators: an A fragment's column c and c + 4 hold keys 2c and 2c + 1 of its slice,
// and the v rows are read in that order, so the sum over keys is unchanged.
#ifndef FA_HELPERS_ONLY
FA_FORWARD_KERNEL {
    extern __shared__ __align__(16) float smem[];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, c = lane % 4;
    FA_BLOCK_TILE;

    if (tiles > 0) fa_load_stage(smem, k, v, 0, s, k_row, v_row);
    FA_COMMIT();

    const int warp_row = m0 + warp * 16;
    const int row0 = warp_row + g;
    fa_u32 q_big[FA_KT][4], q_small[FA_KT][4];
    {
        const float* r0 = q + (long long)min(row0, l - 1) * q_row;
        const float* r1 = q + (long long)min(row0 + 8, l - 1) * q_row;
#pragma unroll
        for (int kk = 0; kk < FA_KT; kk++) {
            tf32_split(r0[kk * 8 + c] * scale_log2, q_big[kk][0], q_small[kk][0]);
            tf32_split(r1[kk * 8 + c] * scale_log2, q_big[kk][1], q_small[kk][1]);
            tf32_split(r0[kk * 8 + c + 4] * scale_log2, q_big[kk][2], q_small[kk][2]);
            tf32_split(r1[kk * 8 + c + 4] * scale_log2, q_big[kk][3], q_small[kk][3]);
        }
    }
    float o[FA_KT][4];
#pragma unroll
    for (int j = 0; j < FA_KT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.0f;
    float row_max[2] = {FA_NEG_INF, FA_NEG_INF}, row_sum[2] = {0.0f, 0.0f};

    for (int t = 0; t < tiles; t++) {
        const float* ks = fa_next_stage(smem, k, v, t, tiles, s, k_row, v_row);
        const float* vs = ks + FA_BN * FA_LEN;
        const int n0 = t * FA_BN;
        // Causal: a warp whose rows all precede the tile's first key adds nothing (uniform
        // across the warp, as mma.sync needs).
        if (!FA_CAUSAL || n0 <= warp_row + 15) {
            float sc[FA_SN][4];
#pragma unroll
            for (int j = 0; j < FA_SN; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) sc[j][e] = 0.0f;
            // B fragment of keys j·8 + g, dims kk·8 + c and + 4.
            const float* kb = ks + g * FA_LEN + c;
#pragma unroll
            for (int kk = 0; kk < FA_KT; kk++)
#pragma unroll
                for (int j = 0; j < FA_SN; j++) {
                    const float* kr = kb + j * 8 * FA_LEN + kk * 8;
                    fa_mma3(sc[j], q_big[kk], q_small[kk], kr[0], kr[4]);
                }
#if FA_MASK
#pragma unroll
            for (int j = 0; j < FA_SN; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int col = n0 + j * 8 + c * 2 + (e & 1);
                    int row = row0 + (e / 2) * 8;
                    if (col < s && row < l)
                        sc[j][e] = fa_masked(sc[j][e], fa_mask_at(mask, mask_pair + row * mi + col * mj));
                }
#endif
            // Keys past `s`, or (causal) past a row, are hidden (see the half kernel).
            if (n0 + FA_BN > s || (FA_CAUSAL && n0 + FA_BN - 1 > warp_row)) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = row0 + h * 8;
                    const int last = (FA_CAUSAL ? min(s - 1, row) : s - 1) - n0 - c * 2;
#pragma unroll
                    for (int j = 0; j < FA_SN; j++)
#pragma unroll
                        for (int cc = 0; cc < 2; cc++)
                            if (j * 8 + cc > last) sc[j][2 * h + cc] = FA_NEG_INF;
                }
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float mx = FA_NEG_INF;
#pragma unroll
                for (int j = 0; j < FA_SN; j++)
                    mx = fmaxf(mx, fmaxf(sc[j][2 * h], sc[j][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
                const float grown = fmaxf(row_max[h], mx);
                // A row that has seen only hidden keys keeps zeros (exp2(-inf) = 0).
                const float base = grown == FA_NEG_INF ? 0.0f : grown;
                const float alpha = fa_exp2(row_max[h] - base);
                row_max[h] = grown;
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < FA_SN; j++) {
                    sc[j][2 * h] = fa_exp2(sc[j][2 * h] - base);
                    sc[j][2 * h + 1] = fa_exp2(sc[j][2 * h + 1] - base);
                    sum += sc[j][2 * h] + sc[j][2 * h + 1];
                }
                row_sum[h] = row_sum[h] * alpha + sum;
#pragma unroll
                for (int j = 0; j < FA_KT; j++) {
                    o[j][2 * h] *= alpha;
                    o[j][2 * h + 1] *= alpha;
                }
            }
            // B fragment of value rows kk·8 + 2c and + 1, dims j·8 + g.
            const float* vb = vs + 2 * c * FA_LEN + g;
#pragma unroll
            for (int kk = 0; kk < FA_SN; kk++) {
                fa_u32 p_big[4], p_small[4];
                tf32_split(sc[kk][0], p_big[0], p_small[0]);
                tf32_split(sc[kk][2], p_big[1], p_small[1]);
                tf32_split(sc[kk][1], p_big[2], p_small[2]);
                tf32_split(sc[kk][3], p_big[3], p_small[3]);
                const float* vr = vb + kk * 8 * FA_LEN;
#pragma unroll
                for (int j = 0; j < FA_KT; j++)
                    fa_mma3(o[j], p_big, p_small, vr[j * 8], vr[FA_LEN + j * 8]);
            }
        }
        // Every warp is done with this stage before the next iteration refills it.
        __syncthreads();
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float sum = row_sum[h];
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        sum += __shfl_xor_sync(0xffffffff, sum, 2);
        const int row = row0 + h * 8;
        if (row >= l) continue;
#pragma unroll
        for (int j = 0; j < FA_KT; j++)
            *(float2*)(out + (long long)row * o_row + j * 8 + 2 * c) =
                make_float2(o[j][2 * h] / sum, o[j][2 * h + 1] / sum);
        if (lse && c == 0) lse[pair * l + row] = fa_lse(row_max[h], sum);
    }
}
#endif  // FA_HELPERS_ONLY

#elif FA_WM == 2  // f32 on the CUDA cores, two threads per two rows

// Two threads share two neighbouring query rows, each holding both rows' q and output
// accumulators for half of the head dim (the 16-byte chunks of its parity, so the pair's
// shared-memory reads fall in different banks): every key and value chunk read feeds two
// rows, half the shared-memory reads per multiply-add of one row per thread, and a
// score's two halves meet through one shuffle.
#define FA_DH (FA_D / 8)  // chunks of 4 per thread
#ifndef FA_HELPERS_ONLY
FA_FORWARD_KERNEL {
    extern __shared__ __align__(16) float smem[];
    FA_BLOCK_TILE;
    const int half = threadIdx.x & 1;
    const int row = m0 + (threadIdx.x & ~1);  // and row + 1

    if (tiles > 0) fa_load_stage(smem, k, v, 0, s, k_row, v_row);
    FA_COMMIT();

    float qr[2][4 * FA_DH], o[2][4 * FA_DH];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float4* q4 = (const float4*)(q + (long long)min(row + r, l - 1) * q_row);
#pragma unroll
        for (int d = 0; d < FA_DH; d++) {
            float4 x = q4[2 * d + half];
            qr[r][4 * d] = x.x * scale_log2;
            qr[r][4 * d + 1] = x.y * scale_log2;
            qr[r][4 * d + 2] = x.z * scale_log2;
            qr[r][4 * d + 3] = x.w * scale_log2;
        }
#pragma unroll
        for (int d = 0; d < 4 * FA_DH; d++) o[r][d] = 0.0f;
    }
    float row_max[2] = {FA_NEG_INF, FA_NEG_INF}, row_sum[2] = {0.0f, 0.0f};

    for (int t = 0; t < tiles; t++) {
        const float* ks = fa_next_stage(smem, k, v, t, tiles, s, k_row, v_row);
        const float* vs = ks + FA_BN * FA_LEN;
        const int n0 = t * FA_BN;
        // Keys row `r` sees in this tile (causal: up to itself). The whole warp walks its
        // last row's (the shuffles need every lane); keys past a row's weigh 0.
        int keys[2];
#pragma unroll
        for (int r = 0; r < 2; r++)
            keys[r] = min(FA_BN, (FA_CAUSAL ? min(kv_end, row + r + 1) : s) - n0);
        const int warp_keys =
            min(FA_BN, (FA_CAUSAL ? min(kv_end, m0 + (int)(threadIdx.x | 31) + 1) : s) - n0);
        for (int j = 0; j < warp_keys; j += 4) {
            float dot[2][4];
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int u = 0; u < 4; u++) dot[r][u] = 0.0f;
#pragma unroll
            for (int d = 0; d < FA_DH; d++) {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float4 y = ((const float4*)(ks + (j + u) * FA_LEN))[2 * d + half];
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        dot[r][u] = fmaf(qr[r][4 * d], y.x, dot[r][u]);
                        dot[r][u] = fmaf(qr[r][4 * d + 1], y.y, dot[r][u]);
                        dot[r][u] = fmaf(qr[r][4 * d + 2], y.z, dot[r][u]);
                        dot[r][u] = fmaf(qr[r][4 * d + 3], y.w, dot[r][u]);
                    }
                }
            }
            float p[2][4];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = FA_NEG_INF;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float x = dot[r][u] + __shfl_xor_sync(0xffffffff, dot[r][u], 1);
#if FA_MASK
                    if (row + r < l && j + u < keys[r])
                        x = fa_masked(x, fa_mask_at(mask, mask_pair + (row + r) * mi + (n0 + j + u) * mj));
#endif
                    if (j + u >= keys[r]) x = FA_NEG_INF;
                    dot[r][u] = x;
                    mx = fmaxf(mx, x);
                }
                if (mx > row_max[r]) {
                    float alpha = exp2f(row_max[r] - mx);
                    row_max[r] = mx;
                    row_sum[r] *= alpha;
#pragma unroll
                    for (int d = 0; d < 4 * FA_DH; d++) o[r][d] *= alpha;
                }
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    p[r][u] = exp2f(dot[r][u] - row_max[r]);
                    row_sum[r] += p[r][u];
                }
            }
#pragma unroll
            for (int d = 0; d < FA_DH; d++) {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float4 y = ((const float4*)(vs + (j + u) * FA_LEN))[2 * d + half];
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        o[r][4 * d] = fmaf(p[r][u], y.x, o[r][4 * d]);
                        o[r][4 * d + 1] = fmaf(p[r][u], y.y, o[r][4 * d + 1]);
                        o[r][4 * d + 2] = fmaf(p[r][u], y.z, o[r][4 * d + 2]);
                        o[r][4 * d + 3] = fmaf(p[r][u], y.w, o[r][4 * d + 3]);
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (row + r >= l) continue;
        float4* out4 = (float4*)(out + (long long)(row + r) * o_row);
        const float sum = row_sum[r];
#pragma unroll
        for (int d = 0; d < FA_DH; d++)
            out4[2 * d + half] = make_float4(o[r][4 * d] / sum, o[r][4 * d + 1] / sum,
                                             o[r][4 * d + 2] / sum, o[r][4 * d + 3] / sum);
        if (lse && half == 0) lse[pair * l + row + r] = fa_lse(row_max[r], sum);
    }
}
#endif  // FA_HELPERS_ONLY

#else  // f32 on the CUDA cores, one thread per row

// One thread per query row: its q and its output accumulators stay in registers, every
// thread of the block reads the same key (and value) row at once (a shared-memory
// broadcast).
#ifndef FA_HELPERS_ONLY
FA_FORWARD_KERNEL {
    extern __shared__ __align__(16) float smem[];
    FA_BLOCK_TILE;
    const int row = m0 + threadIdx.x;

    if (tiles > 0) fa_load_stage(smem, k, v, 0, s, k_row, v_row);
    FA_COMMIT();

    float qr[FA_D], o[FA_D];
    const float4* q4 = (const float4*)(q + (long long)min(row, l - 1) * q_row);
#pragma unroll
    for (int d = 0; d < FA_D / 4; d++) {
        float4 x = q4[d];
        qr[4 * d] = x.x * scale_log2;
        qr[4 * d + 1] = x.y * scale_log2;
        qr[4 * d + 2] = x.z * scale_log2;
        qr[4 * d + 3] = x.w * scale_log2;
    }
#pragma unroll
    for (int d = 0; d < FA_D; d++) o[d] = 0.0f;
    float row_max = FA_NEG_INF, row_sum = 0.0f;

    for (int t = 0; t < tiles; t++) {
        const float* ks = fa_next_stage(smem, k, v, t, tiles, s, k_row, v_row);
        const float* vs = ks + FA_BN * FA_LEN;
        const int n0 = t * FA_BN;
        // Keys four at a time (independent dot products for the pipelines, a rolled loop
        // over the groups for a short compile), the running max raised (and the sums
        // rescaled) only when a score exceeds it. Keys past `keys` weigh 0.
        const int keys = min(FA_BN, (FA_CAUSAL ? min(kv_end, row + 1) : s) - n0);
        for (int j = 0; j < keys; j += 4) {
            float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int d = 0; d < FA_D / 4; d++) {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float4 y = ((const float4*)(ks + (j + u) * FA_LEN))[d];
                    dot[u] = fmaf(qr[4 * d], y.x, dot[u]);
                    dot[u] = fmaf(qr[4 * d + 1], y.y, dot[u]);
                    dot[u] = fmaf(qr[4 * d + 2], y.z, dot[u]);
                    dot[u] = fmaf(qr[4 * d + 3], y.w, dot[u]);
                }
            }
            float mx = FA_NEG_INF;
#pragma unroll
            for (int u = 0; u < 4; u++) {
#if FA_MASK
                if (row < l && j + u < keys)
                    dot[u] = fa_masked(dot[u], fa_mask_at(mask, mask_pair + row * mi + (n0 + j + u) * mj));
#endif
                if (j + u >= keys) dot[u] = FA_NEG_INF;
                mx = fmaxf(mx, dot[u]);
            }
            if (mx > row_max) {
                float alpha = exp2f(row_max - mx);
                row_max = mx;
                row_sum *= alpha;
#pragma unroll
                for (int d = 0; d < FA_D; d++) o[d] *= alpha;
            }
            float p[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                p[u] = exp2f(dot[u] - row_max);
                row_sum += p[u];
            }
#pragma unroll
            for (int d = 0; d < FA_D / 4; d++) {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float4 y = ((const float4*)(vs + (j + u) * FA_LEN))[d];
                    o[4 * d] = fmaf(p[u], y.x, o[4 * d]);
                    o[4 * d + 1] = fmaf(p[u], y.y, o[4 * d + 1]);
                    o[4 * d + 2] = fmaf(p[u], y.z, o[4 * d + 2]);
                    o[4 * d + 3] = fmaf(p[u], y.w, o[4 * d + 3]);
                }
            }
        }
        __syncthreads();
    }
    if (row < l) {
        float4* out4 = (float4*)(out + (long long)row * o_row);
#pragma unroll
        for (int d = 0; d < FA_D / 4; d++)
            out4[d] = make_float4(o[4 * d] / row_sum, o[4 * d + 1] / row_sum,
                                  o[4 * d + 2] / row_sum, o[4 * d + 3] / row_sum);
        if (lse) lse[pair * l + row] = fa_lse(row_max, row_sum);
    }
}
#endif  // FA_HELPERS_ONLY

#endif
