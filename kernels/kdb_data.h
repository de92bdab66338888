/* kdb_data.h: the element type of a primitive's tensors, chosen at compile time.
 *
 *   (no option)      float tensors
 *   -DKDB_TYPE_FP16  fp16 tensors, held as their 16 bits (unsigned short)
 *   -DKDB_TYPE_BF16  bfloat16 tensors, held as their 16 bits
 *
 * Kernels compute in float whatever the storage: KDB_LOAD(p, i) reads element i as a float,
 * KDB_STORE(p, i, v) writes a float rounded to the storage type (to nearest even).
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
#elif defined(KDB_TYPE_BF16)
typedef unsigned short kdb_data_t;
#define KDB_LOAD(p, i) KDB_BF16_TO_FLOAT((p)[i])
#define KDB_STORE(p, i, v) ((p)[i] = KDB_FLOAT_TO_BF16(v))
#else
typedef float kdb_data_t;
#define KDB_LOAD(p, i) ((p)[i])
#define KDB_STORE(p, i, v) ((p)[i] = (v))
#endif

#endif /* KDB_DATA_H */
