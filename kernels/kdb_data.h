/* kdb_data.h: the element type of a primitive's tensors, chosen at compile time.
 *
 *   (no option)      float tensors
 *   -DKDB_TYPE_FP16  fp16 tensors, held as their 16 bits (unsigned short)
 *   -DKDB_TYPE_BF16  bfloat16 tensors, held as their 16 bits
 *
 * Kernels compute in float whatever the storage: KDB_LOAD(p, i) reads element i as a float,
 * KDB_STORE(p, i, v) writes a float rounded to the storage type (to nearest even).
 *
 * Sixteen bytes at a time (the widest single access on every backend): KDB_VEC elements per
 * kdb_vec4u, kdb_unpack(q, v) spreads one into float v[KDB_VEC], kdb_pack(v) rounds them back.
 * Element e of a vector is element e of memory (little-endian words, low half first).
 */
#ifndef KDB_DATA_H
#define KDB_DATA_H
#include "kdb_compat.h"

#if defined(KDB_TYPE_FP16) && defined(KDB_TYPE_BF16)
#error "kdb_data.h: choose one of KDB_TYPE_FP16 and KDB_TYPE_BF16"
#elif defined(KDB_TYPE_FP16)
typedef unsigned short kdb_data_t;
#define KDB_LOAD(p, i) KDB_HALF_TO_FLOAT((p)[i])
#define KDB_STORE(p, i, v) ((p)[i] = KDB_FLOAT_TO_HALF(v))
#define KDB_BITS_TO_ELEMENT(b) KDB_HALF_TO_FLOAT(b)
#define KDB_ELEMENT_TO_BITS(f) KDB_FLOAT_TO_HALF(f)
#elif defined(KDB_TYPE_BF16)
typedef unsigned short kdb_data_t;
#define KDB_LOAD(p, i) KDB_BF16_TO_FLOAT((p)[i])
#define KDB_STORE(p, i, v) ((p)[i] = KDB_FLOAT_TO_BF16(v))
#define KDB_BITS_TO_ELEMENT(b) KDB_BF16_TO_FLOAT(b)
#define KDB_ELEMENT_TO_BITS(f) KDB_FLOAT_TO_BF16(f)
#else
typedef float kdb_data_t;
#define KDB_LOAD(p, i) ((p)[i])
#define KDB_STORE(p, i, v) ((p)[i] = (v))
#endif

#if defined(KDB_TYPE_FP16) || defined(KDB_TYPE_BF16)
#define KDB_VEC 8
/* Two floats become one word in one packing conversion on NVIDIA GPUs (sm_80 and later). */
#define kdb_word_to_float(b) KDB_BITS_TO_ELEMENT((unsigned short)(b))
KDB_DEVICE_FN void kdb_unpack_word(unsigned int u, float* v)
{
    v[0] = kdb_word_to_float(u & 0xffffu);
    v[1] = kdb_word_to_float(u >> 16);
}
KDB_DEVICE_FN unsigned int kdb_pack_word(const float* v)
{
#if defined(KDB_BACKEND_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned int u; /* the first operand goes to the upper half */
#if defined(KDB_TYPE_FP16)
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(v[1]), "f"(v[0]));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(v[1]), "f"(v[0]));
#endif
    return u;
#else
    return (unsigned int)KDB_ELEMENT_TO_BITS(v[0]) | ((unsigned int)KDB_ELEMENT_TO_BITS(v[1]) << 16);
#endif
}
#else
#define KDB_VEC 4
KDB_DEVICE_FN void kdb_unpack_word(unsigned int u, float* v) { v[0] = KDB_BITS_FLOAT(u); }
KDB_DEVICE_FN unsigned int kdb_pack_word(const float* v) { return KDB_FLOAT_BITS(v[0]); }
#endif
#define KDB_PER_WORD (KDB_VEC / 4)

KDB_DEVICE_FN void kdb_unpack(kdb_vec4u q, float* v)
{
    kdb_unpack_word(q.x, v);
    kdb_unpack_word(q.y, v + KDB_PER_WORD);
    kdb_unpack_word(q.z, v + 2 * KDB_PER_WORD);
    kdb_unpack_word(q.w, v + 3 * KDB_PER_WORD);
}

KDB_DEVICE_FN kdb_vec4u kdb_pack(const float* v)
{
    kdb_vec4u q;
    q.x = kdb_pack_word(v);
    q.y = kdb_pack_word(v + KDB_PER_WORD);
    q.z = kdb_pack_word(v + 2 * KDB_PER_WORD);
    q.w = kdb_pack_word(v + 3 * KDB_PER_WORD);
    return q;
}

#endif /* KDB_DATA_H */
