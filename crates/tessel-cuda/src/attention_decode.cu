// Tessel's fused attention for a few query rows against many keys (decoding with a KV
// cache): the keys are split into ranges, each (query row, range) a block of its own, and
// the ranges' partial softmaxes are joined afterwards (flash decoding). `attention.rs`
// writes, before `attention.cu` (with FA_HELPERS_ONLY) and this text, the forward's
// configuration macros and:
//
//   FD_PART     0: the split kernel; 1: the kernel joining its ranges
//
// The split kernel: a block of FD_THREADS threads owns query row `i` of pair `p`
// (blockIdx.x = p·l + i) and keys [y·split_keys, (y + 1)·split_keys) of the row's visible
// ones (blockIdx.y = y). FD_G lanes hold one key row, a 16-byte chunk each, and a warp
// takes 32 / FD_G keys a step, FD_U steps of loads in flight: each key and value element is
// read once, straight from global memory. Each lane group keeps an online softmax (running
// max, sum, and its chunk of the output) in f32; the groups join through shuffles, the
// warps through shared memory. With one range (gridDim.y == 1) the block writes the
// output row; with more, its max, sum and unnormalized output go to `partial`:
// `[rows · ranges]` records of 4 floats (max, sum, two unused), then `[rows · ranges, FA_D]`
// floats; the join kernel reads them back in order.

#define FD_THREADS 128
#define FD_G (FA_D / FA_CHUNK)
#ifndef FD_U
#define FD_U 4
#endif
static_assert(32 % FD_G == 0, "a warp holds whole key rows");

// 2^(m - top), 0 where `top` is -inf (nothing seen yet: every weight is 0).
__device__ __forceinline__ float fd_weight(float m, float top) {
    return top == FA_NEG_INF ? 0.0f : exp2f(m - top);
}

#if FD_PART == 0

// The 16-byte chunk `c` as FA_CHUNK floats.
__device__ __forceinline__ void fd_unpack(uint4 c, float* f) {
    const fa_u32 w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
#if !FA_HALF
        f[i] = __uint_as_float(w[i]);
#elif FA_F16
        asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %2; cvt.f32.f16 %0, lo; cvt.f32.f16 %1, hi; }"
            : "=f"(f[2 * i]), "=f"(f[2 * i + 1]) : "r"(w[i]));
#else
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
#endif
    }
}

// Joins a part's (max, sum, output chunk) `(m2, sum2, acc2)` into `(m, sum, acc)`.
__device__ __forceinline__ void fd_join(float& m, float& sum, float* acc, float m2, float sum2,
                                        const float* acc2) {
    const float top = fmaxf(m, m2);
    const float a = fd_weight(m, top), b = fd_weight(m2, top);
    m = top;
    sum = sum * a + sum2 * b;
#pragma unroll
    for (int c = 0; c < FA_CHUNK; c++) acc[c] = acc[c] * a + acc2[c] * b;
}

extern "C" __global__ void __launch_bounds__(FD_THREADS) tessel_attention_decode(
    const fa_t* __restrict__ q, const fa_t* __restrict__ k, const fa_t* __restrict__ v,
    fa_t* __restrict__ out, int l, int s, float scale_log2, long long q_outer,
    long long q_head, long long q_row, long long k_outer, long long k_head, long long k_row,
    long long v_outer, long long v_head, long long v_row, long long o_outer, long long o_head,
    long long o_row, int heads, int group, const void* __restrict__ mask, long long mo,
    long long mh, long long mi, long long mj, int mask_heads, int split_keys,
    float* __restrict__ partial) {
    __shared__ float warp_stats[FD_THREADS / 32][2];
    __shared__ __align__(16) float warp_acc[FD_THREADS / 32][FA_D];
    const long long pair = blockIdx.x / l;
    const int i = blockIdx.x % l;
    FA_PAIR_ROWS(pair);
    const long long mask_pair = (pair / mask_heads) * mo + (pair % mask_heads) * mh;
    const int kv_end = FA_CAUSAL ? min(s, i + 1) : s;
    const int first = blockIdx.y * split_keys, end = min(first + split_keys, kv_end);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int part = lane % FD_G;                  // this lane's chunk of a row
    const int slot = threadIdx.x / FD_G;           // its key within a step
    const int slots = FD_THREADS / FD_G;           // keys a step

    float qf[FA_CHUNK], acc[FA_CHUNK];
    fd_unpack(((const uint4*)(q + (long long)i * q_row))[part], qf);
#pragma unroll
    for (int c = 0; c < FA_CHUNK; c++) {
        qf[c] *= scale_log2;
        acc[c] = 0.0f;
    }
    float m = FA_NEG_INF, sum = 0.0f;
    // The loop's bounds are the block's, so every lane of a warp shuffles together.
    for (int j0 = first; j0 < end; j0 += slots * FD_U) {
        uint4 kc[FD_U], vc[FD_U];
        const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < FD_U; u++) {
            const int j = j0 + u * slots + slot;
            const bool ok = j < end;
            kc[u] = ok ? ((const uint4*)(k + (long long)j * k_row))[part] : zero;
            vc[u] = ok ? ((const uint4*)(v + (long long)j * v_row))[part] : zero;
        }
        float x[FD_U];
        float top = m;
#pragma unroll
        for (int u = 0; u < FD_U; u++) {
            float kf[FA_CHUNK];
            fd_unpack(kc[u], kf);
            float dot = 0.0f;
#pragma unroll
            for (int c = 0; c < FA_CHUNK; c++) dot = fmaf(qf[c], kf[c], dot);
#pragma unroll
            for (int o = 1; o < FD_G; o *= 2) dot += __shfl_xor_sync(0xffffffff, dot, o);
            const int j = j0 + u * slots + slot;
#if FA_MASK
            if (j < end) dot = fa_masked(dot, fa_mask_at(mask, mask_pair + i * mi + j * mj));
#endif
            x[u] = j < end ? dot : FA_NEG_INF;
            top = fmaxf(top, x[u]);
        }
        // A group that has seen only hidden keys keeps zeros (2^-inf = 0).
        const float base = top == FA_NEG_INF ? 0.0f : top;
        const float alpha = fa_exp2(m - base);
        m = top;
        sum *= alpha;
#pragma unroll
        for (int c = 0; c < FA_CHUNK; c++) acc[c] *= alpha;
#pragma unroll
        for (int u = 0; u < FD_U; u++) {
            const float p = fa_exp2(x[u] - base);
            float vf[FA_CHUNK];
            fd_unpack(vc[u], vf);
            sum += p;
#pragma unroll
            for (int c = 0; c < FA_CHUNK; c++) acc[c] = fmaf(p, vf[c], acc[c]);
        }
    }
    // The warp's groups, then the block's warps, join into lanes 0..FD_G of warp 0.
#pragma unroll
    for (int o = FD_G; o < 32; o *= 2) {
        float acc2[FA_CHUNK];
#pragma unroll
        for (int c = 0; c < FA_CHUNK; c++) acc2[c] = __shfl_xor_sync(0xffffffff, acc[c], o);
        const float m2 = __shfl_xor_sync(0xffffffff, m, o);
        const float sum2 = __shfl_xor_sync(0xffffffff, sum, o);
        fd_join(m, sum, acc, m2, sum2, acc2);
    }
    if (lane < FD_G) {
        if (lane == 0) {
            warp_stats[warp][0] = m;
            warp_stats[warp][1] = sum;
        }
#pragma unroll
        for (int c = 0; c < FA_CHUNK; c++) warp_acc[warp][part * FA_CHUNK + c] = acc[c];
    }
    __syncthreads();
    if (warp != 0 || lane >= FD_G) return;
#pragma unroll
    for (int w = 1; w < FD_THREADS / 32; w++)
        fd_join(m, sum, acc, warp_stats[w][0], warp_stats[w][1], &warp_acc[w][part * FA_CHUNK]);
    if (gridDim.y == 1) {
        fa_t* row = out + (long long)i * o_row + part * FA_CHUNK;
#if FA_HALF
        uint4 packed;
        packed.x = fa_pack(acc[0] / sum, acc[1] / sum);
        packed.y = fa_pack(acc[2] / sum, acc[3] / sum);
        packed.z = fa_pack(acc[4] / sum, acc[5] / sum);
        packed.w = fa_pack(acc[6] / sum, acc[7] / sum);
        *(uint4*)row = packed;
#else
        *(float4*)row = make_float4(acc[0] / sum, acc[1] / sum, acc[2] / sum, acc[3] / sum);
#endif
        return;
    }
    const long long record = (long long)blockIdx.x * gridDim.y + blockIdx.y;
    if (lane == 0) {
        partial[record * 4] = m;
        partial[record * 4 + 1] = sum;
    }
    float* chunk = partial + (long long)gridDim.x * gridDim.y * 4 + record * FA_D + part * FA_CHUNK;
#pragma unroll
    for (int c = 0; c < FA_CHUNK; c++) chunk[c] = acc[c];
}

#else  // FD_PART == 1: the join

// Thread `t` of the grid writes element t % FA_D of query row instance t / FA_D (of
// `rows`, numbered as the split kernel's blocks), joining its `ranges` partial results.
extern "C" __global__ void __launch_bounds__(FD_THREADS) tessel_attention_decode(
    const float* __restrict__ partial, fa_t* __restrict__ out, int l, int rows, int ranges,
    long long o_outer, long long o_head, long long o_row, int heads) {
    const long long t = (long long)blockIdx.x * FD_THREADS + threadIdx.x;
    const long long r = t / FA_D;
    const int d = t % FA_D;
    if (r >= rows) return;
    const float* stats = partial + r * ranges * 4;
    const float* acc = partial + (long long)rows * ranges * 4 + r * ranges * FA_D + d;
    float top = FA_NEG_INF;
    for (int y = 0; y < ranges; y++) top = fmaxf(top, stats[y * 4]);
    float sum = 0.0f, o = 0.0f;
    for (int y = 0; y < ranges; y++) {
        const float w = fd_weight(stats[y * 4], top);
        sum = fmaf(w, stats[y * 4 + 1], sum);
        o = fmaf(w, acc[y * FA_D], o);
    }
    const long long pair = r / l, i = r % l;
    const long long at = (pair / heads) * o_outer + (pair % heads) * o_head + i * o_row + d;
    const float y = o / sum;
#if !FA_HALF
    out[at] = y;
#elif FA_F16
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out[at]) : "f"(y));
#else
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(out[at]) : "f"(y));
#endif
}

#endif
