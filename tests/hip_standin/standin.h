/* standin.h: what the stand-in HIP runtime and stand-in hiprtc share.
 *
 * The stand-in is a test double with real checks, not a mock: it is loaded by the real
 * hip-python through the library path, allocates host memory for device memory, reads each
 * code object's ELF symbols and AMDGPU metadata note the way ROCm's loader does, checks every
 * launch's packed argument buffer against the kernel's argument offsets and sizes, and writes
 * one JSON line per call to $KDB_STANDIN_LOG. Misuse it detects is logged as a "problem" and
 * answered with the error code ROCm would return; it never crashes the caller.
 */
#ifndef KDB_STANDIN_H
#define KDB_STANDIN_H

#include <stddef.h>
#include <stdint.h>

#define STANDIN_API __attribute__((visibility("default")))

/* ---- the call log (log.c) ---- */

/* Append {"call": call, "result": result, <fields>} to $KDB_STANDIN_LOG; fields is a printf
 * format for the rest of the object's members (without the leading comma), may be "". */
void standin_log(const char *call, int result, const char *fields, ...)
    __attribute__((format(printf, 3, 4)));
/* Log misuse: {"call": call, "problem": message}. */
void standin_problem(const char *call, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Write s as a JSON string (quotes included) into out; returns out. */
const char *standin_json(const char *s, char *out, size_t out_size);
/* 1 when $KDB_STANDIN_FAIL names this call: the test asks for it to fail. */
int standin_should_fail(const char *call);

/* ---- AMD code objects (code_object.c) ---- */

#define STANDIN_MAX_ARGS 64
#define STANDIN_NAME_MAX 256

typedef struct {
    uint64_t offset, size;
    char value_kind[48];
} standin_arg;

typedef struct {
    char name[STANDIN_NAME_MAX];
    char symbol[STANDIN_NAME_MAX];
    int nargs;
    standin_arg args[STANDIN_MAX_ARGS];
    uint64_t kernarg_segment_size;
    uint64_t group_segment_fixed_size;
    uint64_t max_flat_workgroup_size;
    int descriptor_defined; /* the .kd symbol is in the symbol table */
} standin_kernel;

typedef struct {
    char target[128]; /* amdhsa.target, e.g. amdgcn-amd-amdhsa--gfx942 */
    uint64_t version_major, version_minor; /* amdhsa.version */
    size_t image_size; /* bytes the ELF spans, read from its headers */
    int nkernels;
    standin_kernel *kernels; /* malloc'ed */
} standin_code_object;

/* Parse an ELF code object whose size is only known from its own headers (as
 * hipModuleLoadData receives it). Returns 0, or -1 with a message in err. */
int standin_read_code_object(const unsigned char *image, standin_code_object *out, char *err, size_t err_size);
void standin_free_code_object(standin_code_object *co);

#endif
