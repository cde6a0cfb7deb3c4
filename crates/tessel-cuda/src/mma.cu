// Tessel's generated tensor-core GEMM: `mma.sync.m16n8k16` on f16/bf16 operands with f32
// accumulation, operand tiles staged in shared memory by a `cp.async` pipeline and read
// into fragments by `ldmatrix`; or, for f32, `mma.sync.m16n8k8` on TF32 three times per
// product (3xTF32: each operand split into a TF32 big and small part, big·big + big·small
// + small·big, near-f32 sums), the fragments read one element at a time and split as they
// are read. `mma.rs` defines the configuration before this text:
//
//   TC_BM, TC_BN, TC_BK    block tile (rows of out, columns of out, contracted length)
//   TC_WM, TC_WN           warp tile; (TC_BM / TC_WM) * (TC_BN / TC_WN) warps per block
//   TC_STAGES              tiles in flight (>= 2)
//   TC_GROUP               tile rows per group of consecutive blocks
//   TC_A_T                 1: lhs is stored k x m (transposed), 0: m x k
//   TC_B_T                 1: rhs is stored n x k (transposed), 0: k x n
//   TC_F16                 1: f16 operands and output, 0: bf16
//   TC_TF32                1: f32 operands and output, 3xTF32 (TC_F16 is then 0)
//   TC_BIAS                1: bias[n] is added to every row
//   tc_activation(x)       a device function applied last (defined before this text)
//
// Every operand row starts 16-byte aligned (the rows' lengths are multiples of 16 bytes:
// `mma.rs` offers this kernel only then), so every global read is a 16-byte `cp.async`,
// zero-filled past the edges of `m`, `n` and `k`. Shared rows along `m` or `n` are padded
// by 8 elements; rows along `k` by 8 half elements (the eight 16-byte rows an `ldmatrix`
// reads fall in distinct banks) or 4 floats (the 32 elements a TF32 fragment read takes
// fall in distinct banks, as they do with 8 along `m` or `n`). The output tile is staged in
// the (then idle) pipeline's shared memory, so it is stored in whole 16-byte row chunks.

typedef unsigned short tc_u16;
typedef unsigned int tc_u32;

#if TC_TF32
typedef float tc_t;
typedef float2 tc_pair;
#define TC_KSTEP 8   // k per mma
#define TC_AREGS 8   // A fragment registers: 4 big, 4 small
#define TC_BREGS 4   // B fragment registers: 2 big, 2 small
#define TC_PAD_K 4
#else
typedef tc_u16 tc_t;
typedef tc_u32 tc_pair;
#define TC_KSTEP 16
#define TC_AREGS 4
#define TC_BREGS 2
#define TC_PAD_K 8
#endif
#define TC_PAD_MN 8
#define TC_VEC (16 / (int)sizeof(tc_t))  // elements per 16-byte chunk
static_assert(TC_BK % (2 * TC_KSTEP) == 0, "fragments double-buffer over an even number of k-steps");
static_assert(TC_WN % 16 == 0 && TC_WM % 16 == 0, "warp tiles are whole pairs of mma tiles");
#define TC_WARPS ((TC_BM / TC_WM) * (TC_BN / TC_WN))
#define TC_THREADS (32 * TC_WARPS)
#define TC_MT (TC_WM / 16)
#define TC_NT (TC_WN / 8)

// Shared tile shapes: rows x row length (elements), as stored; TC_*_COLS of each row hold
// data.
#if TC_A_T
#define TC_A_ROWS TC_BK
#define TC_A_COLS TC_BM
#define TC_A_LEN (TC_BM + TC_PAD_MN)
#else
#define TC_A_ROWS TC_BM
#define TC_A_COLS TC_BK
#define TC_A_LEN (TC_BK + TC_PAD_K)
#endif
#if TC_B_T
#define TC_B_ROWS TC_BN
#define TC_B_COLS TC_BK
#define TC_B_LEN (TC_BK + TC_PAD_K)
#else
#define TC_B_ROWS TC_BK
#define TC_B_COLS TC_BN
#define TC_B_LEN (TC_BN + TC_PAD_MN)
#endif
#define TC_A_TILE (TC_A_ROWS * TC_A_LEN)
#define TC_B_TILE (TC_B_ROWS * TC_B_LEN)
#define TC_STAGE (TC_A_TILE + TC_B_TILE)

__device__ __forceinline__ tc_u32 tc_shared(const void* p) {
    tc_u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void tc_copy16(tc_u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

#if TC_TF32
// The TF32 helpers (`tf32_split`, `tf32_mma8`) are `tf32.cu`'s, prepended to this text.

// c += a·b in near-f32 precision: `a` as 4 big then 4 small registers, `b` as 2 big then 2
// small. The small products go first, so the big one adds to sums that already hold them;
// small·small (at most 2^-22 of the product) is left out.
__device__ __forceinline__ void tc_mma(float* c, const tc_u32* a, const tc_u32* b) {
    tf32_mma8(c, a + 4, b[0], b[1]);
    tf32_mma8(c, a, b[2], b[3]);
    tf32_mma8(c, a, b[0], b[1]);
}

__device__ __forceinline__ float tc_to_float(float x) { return x; }

__device__ __forceinline__ tc_pair tc_pack(float lo, float hi) { return make_float2(lo, hi); }
#else
__device__ __forceinline__ void tc_ldmatrix(tc_u32* r, tc_u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void tc_ldmatrix_t(tc_u32* r, tc_u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void tc_mma(float* c, const tc_u32* a, const tc_u32* b) {
#if TC_F16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#endif
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ float tc_to_float(tc_u16 bits) {
#if TC_F16
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
#else
    return __uint_as_float(((tc_u32)bits) << 16);
#endif
}

// Two floats rounded to nearest even, `lo` in the low half.
__device__ __forceinline__ tc_pair tc_pack(float lo, float hi) {
    tc_u32 r;
#if TC_F16
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}
#endif

// Queues the copy of the k-tile starting at `k0` into shared stage `s`.
__device__ __forceinline__ void tc_load(
    tc_t* smem, int s, const tc_t* lhs, const tc_t* rhs,
    int m, int n, int k, int m0, int n0, int k0) {
    tc_t* as = smem + s * TC_STAGE;
    tc_t* bs = as + TC_A_TILE;
    // 16-byte chunks per stored row of each tile.
    const int a_chunks = TC_A_COLS / TC_VEC;
    const int b_chunks = TC_B_COLS / TC_VEC;
#pragma unroll
    for (int i = 0; i < (TC_A_ROWS * a_chunks + TC_THREADS - 1) / TC_THREADS; i++) {
        int c = threadIdx.x + i * TC_THREADS;
        if (TC_A_ROWS * a_chunks % TC_THREADS != 0 && c >= TC_A_ROWS * a_chunks) break;
        int row = c / a_chunks, col = (c % a_chunks) * TC_VEC;
#if TC_A_T
        int gk = k0 + row, gm = m0 + col;
        bool ok = gk < k && gm < m;
        const tc_t* src = ok ? lhs + (long long)gk * m + gm : lhs;
#else
        int gm = m0 + row, gk = k0 + col;
        bool ok = gm < m && gk < k;
        const tc_t* src = ok ? lhs + (long long)gm * k + gk : lhs;
#endif
        tc_copy16(tc_shared(as + row * TC_A_LEN + col), src, ok);
    }
#pragma unroll
    for (int i = 0; i < (TC_B_ROWS * b_chunks + TC_THREADS - 1) / TC_THREADS; i++) {
        int c = threadIdx.x + i * TC_THREADS;
        if (TC_B_ROWS * b_chunks % TC_THREADS != 0 && c >= TC_B_ROWS * b_chunks) break;
        int row = c / b_chunks, col = (c % b_chunks) * TC_VEC;
#if TC_B_T
        int gn = n0 + row, gk = k0 + col;
        bool ok = gn < n && gk < k;
        const tc_t* src = ok ? rhs + (long long)gn * k + gk : rhs;
#else
        int gk = k0 + row, gn = n0 + col;
        bool ok = gk < k && gn < n;
        const tc_t* src = ok ? rhs + (long long)gk * n + gn : rhs;
#endif
        tc_copy16(tc_shared(bs + row * TC_B_LEN + col), src, ok);
    }
}

// Loads the fragments of k-step `kk` from shared stage `stage`.
#if TC_TF32
// A thread holds rows g and g + 8, columns t and t + 4 of each 16 x 8 A tile, and row
// (k) t and t + 4, column (n) g of each 8 x 8 B tile (g = lane / 4, t = lane % 4).
__device__ __forceinline__ void tc_fragments(
    tc_u32 (*a)[TC_AREGS], tc_u32 (*b)[TC_BREGS], const tc_t* stage, int kk, int wm, int wn,
    int lane) {
    const tc_t* as = stage;
    const tc_t* bs = stage + TC_A_TILE;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < TC_MT; i++) {
        const int r = wm + i * 16 + g, c = kk + t;
#if TC_A_T
        const float x[4] = {as[c * TC_A_LEN + r], as[c * TC_A_LEN + r + 8],
                            as[(c + 4) * TC_A_LEN + r], as[(c + 4) * TC_A_LEN + r + 8]};
#else
        const float x[4] = {as[r * TC_A_LEN + c], as[(r + 8) * TC_A_LEN + c],
                            as[r * TC_A_LEN + c + 4], as[(r + 8) * TC_A_LEN + c + 4]};
#endif
#pragma unroll
        for (int e = 0; e < 4; e++) tf32_split(x[e], a[i][e], a[i][4 + e]);
    }
#pragma unroll
    for (int j = 0; j < TC_NT; j++) {
        const int c = wn + j * 8 + g, r = kk + t;
#if TC_B_T
        const float y[2] = {bs[c * TC_B_LEN + r], bs[c * TC_B_LEN + r + 4]};
#else
        const float y[2] = {bs[r * TC_B_LEN + c], bs[(r + 4) * TC_B_LEN + c]};
#endif
        tf32_split(y[0], b[j][0], b[j][2]);
        tf32_split(y[1], b[j][1], b[j][3]);
    }
}
#else
__device__ __forceinline__ void tc_fragments(
    tc_u32 (*a)[TC_AREGS], tc_u32 (*b)[TC_BREGS], const tc_t* stage_ptr, int kk, int wm, int wn,
    int lane) {
    const tc_u32 stage = tc_shared(stage_ptr);
    const tc_u32 bs = stage + TC_A_TILE * 2;
#pragma unroll
    for (int i = 0; i < TC_MT; i++) {
#if TC_A_T
        int kr = kk + (lane % 8) + (lane / 16) * 8;
        int mc = wm + i * 16 + ((lane / 8) % 2) * 8;
        tc_ldmatrix_t(a[i], stage + (kr * TC_A_LEN + mc) * 2);
#else
        int mr = wm + i * 16 + lane % 16;
        int kc = kk + (lane / 16) * 8;
        tc_ldmatrix(a[i], stage + (mr * TC_A_LEN + kc) * 2);
#endif
    }
#pragma unroll
    for (int j = 0; j < TC_NT; j += 2) {
        tc_u32 r[4];
#if TC_B_T
        int nr = wn + j * 8 + (lane % 8) + (lane / 16) * 8;
        int kc = kk + ((lane / 8) % 2) * 8;
        tc_ldmatrix(r, bs + (nr * TC_B_LEN + kc) * 2);
#else
        int kr = kk + (lane % 8) + ((lane / 8) % 2) * 8;
        int nc = wn + j * 8 + (lane / 16) * 8;
        tc_ldmatrix_t(r, bs + (kr * TC_B_LEN + nc) * 2);
#endif
        b[j][0] = r[0];
        b[j][1] = r[1];
        b[j + 1][0] = r[2];
        b[j + 1][1] = r[3];
    }
}
#endif

// One block computes a TC_BM x TC_BN tile of `out[blockIdx.y]`; blocks are numbered along
// `blockIdx.x` in groups of TC_GROUP tile rows, so blocks running at once share operand
// tiles in L2.
extern "C" __global__ void __launch_bounds__(TC_THREADS) tessel_mma(
    const tc_t* __restrict__ lhs, const tc_t* __restrict__ rhs,
    const tc_t* __restrict__ bias, tc_t* __restrict__ out,
    int m, int n, int k, long long lhs_stride, long long rhs_stride) {
    extern __shared__ __align__(16) tc_t smem[];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wm = (warp / (TC_BN / TC_WN)) * TC_WM;
    const int wn = (warp % (TC_BN / TC_WN)) * TC_WN;
    const int tiles_m = (m + TC_BM - 1) / TC_BM, tiles_n = (n + TC_BN - 1) / TC_BN;
    const int per_group = TC_GROUP * tiles_n;
    const int group = blockIdx.x / per_group, first = group * TC_GROUP;
    const int rows = min(tiles_m - first, TC_GROUP);
    const int m0 = (first + (blockIdx.x % per_group) % rows) * TC_BM;
    const int n0 = ((blockIdx.x % per_group) / rows) * TC_BN;
    lhs += blockIdx.y * lhs_stride;
    rhs += blockIdx.y * rhs_stride;
    out += (long long)blockIdx.y * m * n;

    float acc[TC_MT][TC_NT][4];
#pragma unroll
    for (int i = 0; i < TC_MT; i++)
#pragma unroll
        for (int j = 0; j < TC_NT; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.0f;

    const int tiles = (k + TC_BK - 1) / TC_BK;
#pragma unroll
    for (int s = 0; s < TC_STAGES - 1; s++) {
        if (s < tiles) tc_load(smem, s, lhs, rhs, m, n, k, m0, n0, s * TC_BK);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    asm volatile("cp.async.wait_group %0;\n" :: "n"(TC_STAGES - 2));
    __syncthreads();

    // Fragments are double-buffered: those of the next k-step load while the mma of this
    // one run, across tile boundaries too.
    int read = 0, write = TC_STAGES - 1;
    tc_u32 a[2][TC_MT][TC_AREGS], b[2][TC_NT][TC_BREGS];
    tc_fragments(a[0], b[0], smem, 0, wm, wn, lane);
    constexpr int steps = TC_BK / TC_KSTEP;
    for (int t = 0; t < tiles; t++) {
#pragma unroll
        for (int kk = 0; kk < steps; kk++) {
            if (kk == steps - 1) {
                // The next tile has landed, and every warp is done reading the stage the
                // next copy overwrites.
                asm volatile("cp.async.wait_group %0;\n" :: "n"(TC_STAGES - 2));
                __syncthreads();
                read = (read + 1) % TC_STAGES;
            }
            tc_fragments(a[(kk + 1) % 2], b[(kk + 1) % 2], smem + read * TC_STAGE,
                         ((kk + 1) % steps) * TC_KSTEP, wm, wn, lane);
            if (kk == 0) {
                int next = t + TC_STAGES - 1;
                if (next < tiles) tc_load(smem, write, lhs, rhs, m, n, k, m0, n0, next * TC_BK);
                asm volatile("cp.async.commit_group;\n" ::);
                write = (write + 1) % TC_STAGES;
            }
#pragma unroll
            for (int i = 0; i < TC_MT; i++)
#pragma unroll
                for (int j = 0; j < TC_NT; j++) tc_mma(acc[i][j], a[kk % 2][i], b[kk % 2][j]);
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);

    // The epilogue goes through shared memory: each thread writes its accumulators' pairs
    // (c, c + 1) of rows r and r + 8 per 16 x 8 tile, after bias and activation, into a
    // TC_BM x TC_BN tile (rows padded by 8 elements); then whole 16-byte row chunks are
    // stored, coalesced. Rows of `n` not a multiple of a chunk are stored a pair at a time.
    __syncthreads();
    constexpr int out_len = TC_BN + TC_PAD_MN;
    static_assert(TC_BM * out_len <= TC_STAGES * TC_STAGE, "the output tile fits the stages");
#pragma unroll
    for (int j = 0; j < TC_NT; j++) {
        int c = wn + j * 8 + (lane % 4) * 2;
        float b0 = 0.0f, b1 = 0.0f;
#if TC_BIAS
        if (n0 + c < n) {
            b0 = tc_to_float(bias[n0 + c]);
            b1 = tc_to_float(bias[n0 + c + 1]);
        }
#endif
#pragma unroll
        for (int i = 0; i < TC_MT; i++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int r = wm + i * 16 + lane / 4 + h * 8;
                float v0 = tc_activation(acc[i][j][2 * h] + b0);
                float v1 = tc_activation(acc[i][j][2 * h + 1] + b1);
                *(tc_pair*)(smem + r * out_len + c) = tc_pack(v0, v1);
            }
        }
    }
    __syncthreads();
    constexpr int per_row = TC_BN / TC_VEC, step = TC_THREADS / per_row;
    static_assert(TC_THREADS % per_row == 0, "whole output rows per pass");
    const int row0 = threadIdx.x / per_row, c = (threadIdx.x % per_row) * TC_VEC;
    if (n % TC_VEC == 0) {
#pragma unroll 4
        for (int r = row0; r < TC_BM; r += step) {
            if (m0 + r < m && n0 + c < n)
                *(uint4*)(out + (long long)(m0 + r) * n + n0 + c) = *(const uint4*)(smem + r * out_len + c);
        }
    } else {
        for (int r = row0; r < TC_BM; r += step) {
            if (m0 + r >= m) continue;
#pragma unroll
            for (int e = 0; e < TC_VEC; e += 2)
                if (n0 + c + e < n)
                    *(tc_pair*)(out + (long long)(m0 + r) * n + n0 + c + e) = *(const tc_pair*)(smem + r * out_len + c + e);
        }
    }
}
