// Harness for `attention_backward_f32.py`: the f32 attention backward kernels
// and the f32 forward (attention.cu), one pair per (batch, head), contiguous rows.
#include <cuda_runtime.h>
#if FAB_PART < 0
#define FA_HALF 0
#define FA_F16 0
#define FA_MASK 0
#include "../crates/tessel-cuda/src/attention.cu"
extern "C" int fa_launch(const void* q, const void* k, const void* v, void* out, int pairs,
                         int l, int s, float scale_log2, void* stream) {
    long long row = FA_D, qhead = (long long)l * FA_D, khead = (long long)s * FA_D;
    int blocks = pairs * ((l + FA_BM - 1) / FA_BM);
    int shared = 4 * FA_BN * FA_LEN * (int)sizeof(fa_t);
    cudaFuncSetAttribute(tessel_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, shared);
    tessel_attention<<<blocks, FA_THREADS, shared, (cudaStream_t)stream>>>(
        (const fa_t*)q, (const fa_t*)k, (const fa_t*)v, (fa_t*)out, l, s, scale_log2,
        pairs * qhead, qhead, row, pairs * khead, khead, row, pairs * khead, khead, row,
        pairs * qhead, qhead, row, pairs, 1, nullptr, 0, 0, 0, 0, 1);
    return (int)cudaGetLastError();
}
#else
#define FA_HALF 0
#define FA_F16 0
#define FA_MASK 0
#define FA_HELPERS_ONLY
#include "../crates/tessel-cuda/src/attention.cu"
#include "../crates/tessel-cuda/src/attention_backward.cu"
extern "C" int fab_launch(const float* q, const float* k, const float* v, const float* dout,
                          const float* lse, const float* delta, float* dq, float* dk, float* dv,
                          int pairs, int l, int s, float scale, void* stream) {
    cudaStream_t st = (cudaStream_t)stream;
    float scale_log2 = scale * 1.4426950408889634f;
    long long qs = (long long)l * FA_D, ks = (long long)s * FA_D;
#if FAB_PART == 0
    int blocks = pairs * ((l + FA_THREADS - 1) / FA_THREADS);
    int shared = 2 * FAB_KEYS * FA_D * 4;
    tessel_attention_backward<<<blocks, FA_THREADS, shared, st>>>(
        q, k, v, dout, lse, delta, dq, l, s, scale_log2, scale, qs, ks, ks, 1);
#else
    int blocks = pairs * ((s + FAB_BN - 1) / FAB_BN);
    int shared = (2 * FAB_STEP + FAB_BN * FA_D + FAB_BN * FAB_DS) * 4;
    cudaFuncSetAttribute(tessel_attention_backward, cudaFuncAttributeMaxDynamicSharedMemorySize, shared);
    cudaMemsetAsync(dq, 0, (size_t)pairs * l * FA_D * 4, st);
    tessel_attention_backward<<<blocks, FA_THREADS, shared, st>>>(
        q, k, v, dout, lse, delta, dq, dk, dv, l, s, scale_log2, scale, qs, ks, ks, 1);
#endif
    return (int)cudaGetLastError();
}
#endif
