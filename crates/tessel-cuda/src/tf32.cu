// f32 products on TF32 tensor cores, three per product (3xTF32): the helpers the kernels
// that compute so share (`mma.cu`, `attention.cu`), prepended to their text by `mma.rs` and
// `attention.rs` (`TF32_HELPERS`).

// `x` rounded to TF32 (10 mantissa bits; to nearest, ties away from zero), as the bits
// `mma.sync` reads. In integer operations rather than `cvt.rna.tf32.f32`, a conversion,
// which the SM issues at a fraction of the integer rate: a 3xTF32 product splits every
// fragment element it reads, and on the H100 the integer form made the products and the
// 3xTF32 attention 1.15–1.27× faster. Adding half a TF32 unit to the magnitude bits and
// clearing the 13 bits below rounds the same way; an infinity stays one, and a NaN whose
// payload lies in those bits becomes an infinity, its small part `x - big` then a NaN.
__device__ __forceinline__ unsigned int tf32_round(float x) {
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}

// `x` as big + small, both TF32: together within 2^-22 of `x`'s size.
__device__ __forceinline__ void tf32_split(float x, unsigned int& big, unsigned int& small) {
    big = tf32_round(x);
    small = tf32_round(x - __uint_as_float(big));
}

// c += a·b on one 16 x 8 x 8 tile: `a` the four A fragment registers, `b0`, `b1` the B ones.
__device__ __forceinline__ void tf32_mma8(
    float* c, const unsigned int* a, unsigned int b0, unsigned int b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
