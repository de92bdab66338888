/* hip_runtime.c: the stand-in libamdhip64.so, the HIP entry points kdbkit calls.
 *
 * Devices come from $KDB_STANDIN_DEVICES ("gcnArchName,CUs,bytes,name;..."; default one
 * MI300X). Device memory is host memory; copies check that the device side lies inside a
 * live allocation. hipModuleLoadData keeps the caller's image pointer, as ROCm may, and each
 * launch re-checks the image's bytes, so an image freed by the caller shows up as a problem.
 * Launches run nothing: they check the kernel exists, the block fits, and the packed argument
 * buffer against the metadata (every explicit argument inside the buffer, every pointer
 * argument inside a live allocation), and log each argument's bytes for the test to decode.
 */
#include "standin.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int hipError_t;
enum {
    hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorOutOfMemory = 2, hipErrorInvalidDevicePointer = 17,
    hipErrorInvalidDevice = 101, hipErrorInvalidImage = 200, hipErrorInvalidHandle = 400,
    hipErrorNotFound = 500, hipErrorLaunchFailure = 719,
};

/* The R0600 layout of hipDeviceProp_t (ROCm 6.0 and later), field for field. */
typedef struct {
    char name[256];
    char uuid[16];
    char luid[8];
    unsigned int luidDeviceNodeMask;
    size_t totalGlobalMem, sharedMemPerBlock;
    int regsPerBlock, warpSize;
    size_t memPitch;
    int maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3], clockRate;
    size_t totalConstMem;
    int major, minor;
    size_t textureAlignment, texturePitchAlignment;
    int deviceOverlap, multiProcessorCount, kernelExecTimeoutEnabled, integrated, canMapHostMemory, computeMode;
    int maxTexture1D, maxTexture1DMipmap, maxTexture1DLinear, maxTexture2D[2], maxTexture2DMipmap[2];
    int maxTexture2DLinear[3], maxTexture2DGather[2], maxTexture3D[3], maxTexture3DAlt[3], maxTextureCubemap;
    int maxTexture1DLayered[2], maxTexture2DLayered[3], maxTextureCubemapLayered[2], maxSurface1D, maxSurface2D[2];
    int maxSurface3D[3], maxSurface1DLayered[2], maxSurface2DLayered[3], maxSurfaceCubemap,
        maxSurfaceCubemapLayered[2];
    size_t surfaceAlignment;
    int concurrentKernels, ECCEnabled, pciBusID, pciDeviceID, pciDomainID, tccDriver, asyncEngineCount;
    int unifiedAddressing, memoryClockRate, memoryBusWidth, l2CacheSize, persistingL2CacheMaxSize;
    int maxThreadsPerMultiProcessor, streamPrioritiesSupported, globalL1CacheSupported, localL1CacheSupported;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor, managedMemory, isMultiGpuBoard, multiGpuBoardGroupID, hostNativeAtomicSupported;
    int singleToDoublePrecisionPerfRatio, pageableMemoryAccess, concurrentManagedAccess,
        computePreemptionSupported;
    int canUseHostPointerForRegisteredMem, cooperativeLaunch, cooperativeMultiDeviceLaunch;
    size_t sharedMemPerBlockOptin;
    int pageableMemoryAccessUsesHostPageTables, directManagedMemAccessFromHost, maxBlocksPerMultiProcessor;
    int accessPolicyMaxWindowSize;
    size_t reservedSharedMemPerBlock;
    int hostRegisterSupported, sparseHipArraySupported, hostRegisterReadOnlySupported;
    int timelineSemaphoreInteropSupported, memoryPoolsSupported, gpuDirectRDMASupported;
    unsigned int gpuDirectRDMAFlushWritesOptions;
    int gpuDirectRDMAWritesOrdering;
    unsigned int memoryPoolSupportedHandleTypes;
    int deferredMappingHipArraySupported, ipcEventSupported, clusterLaunch, unifiedFunctionPointers;
    int reserved[63], hipReserved[32];
    char gcnArchName[256];
    size_t maxSharedMemoryPerMultiProcessor;
    int clockInstructionRate;
    unsigned int arch; /* hipDeviceArch_t: 17 one-bit fields in one word (hip-python lists them as ints) */
    unsigned int *hdpMemFlushCntl, *hdpRegFlushCntl;
    int cooperativeMultiDeviceUnmatchedFunc, cooperativeMultiDeviceUnmatchedGridDim;
    int cooperativeMultiDeviceUnmatchedBlockDim, cooperativeMultiDeviceUnmatchedSharedMem;
    int isLargeBar, asicRevision;
} hipDeviceProp_tR0600;
/* What hipDeviceProp_t().c_sizeof() gives in hip-python 6.2 to 10.0; the tests compare. */
_Static_assert(sizeof(hipDeviceProp_tR0600) == 1472, "hipDeviceProp_tR0600 must be 1472 bytes");

/* ------------------------------------------------------------------ state */

#define MAGIC_MODULE 0x4d4f44554c45ull /* "MODULE" */
#define MAGIC_FUNCTION 0x46554e4354ull /* "FUNCT" */
#define MAGIC_EVENT 0x4556454e54ull /* "EVENT" */

typedef struct {
    char arch[256], name[256];
    int cus;
    size_t bytes;
} device_t;

typedef struct module_s {
    uint64_t magic;
    const unsigned char *image;
    uint64_t checksum;
    standin_code_object co;
    struct function_s *functions; /* one per kernel, handed out by hipModuleGetFunction */
} module_t;

typedef struct function_s {
    uint64_t magic;
    module_t *module;
    int kernel;
} function_t;

typedef struct {
    uint64_t magic;
    int recorded;
    double ms;
} event_t;

typedef struct {
    void **items;
    size_t n, cap;
} registry_t; /* live handles and allocations: anything not in here is refused */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static device_t devices[16];
static int device_count = -1, current_device = 0;
static registry_t allocations, allocation_sizes, modules, events;

static void registry_add(registry_t *r, void *p)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->items = realloc(r->items, r->cap * sizeof *r->items);
    }
    r->items[r->n++] = p;
}

static long registry_find(const registry_t *r, const void *p)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->items[i] == p)
            return (long)i;
    return -1;
}

static void registry_remove(registry_t *r, size_t i)
{
    r->items[i] = r->items[--r->n];
}

/* Remove p; 0 when it was not there (released twice, or never handed out). */
static int registry_take(registry_t *r, const void *p)
{
    long i = registry_find(r, p);
    if (i >= 0)
        registry_remove(r, (size_t)i);
    return i >= 0;
}

/* The allocation [base, base+size) that holds [p, p+n), or -1. */
static long allocation_holding(const void *p, size_t n)
{
    const char *c = p;
    for (size_t i = 0; i < allocations.n; i++) {
        const char *base = allocations.items[i];
        size_t size = (size_t)allocation_sizes.items[i];
        if (c >= base && c + n <= base + size)
            return (long)i;
    }
    return -1;
}

static void load_devices(void)
{
    if (device_count >= 0)
        return;
    const char *spec = getenv("KDB_STANDIN_DEVICES");
    if (!spec || !*spec)
        spec = "gfx942:sramecc+:xnack-,304,206141652992,AMD Instinct MI300X";
    char *copy = strdup(spec), *save = NULL;
    device_count = 0;
    for (char *entry = strtok_r(copy, ";", &save); entry && device_count < 16; entry = strtok_r(NULL, ";", &save)) {
        device_t *d = &devices[device_count];
        char *fields = NULL, *arch = strtok_r(entry, ",", &fields);
        char *cus = strtok_r(NULL, ",", &fields), *bytes = strtok_r(NULL, ",", &fields);
        char *name = strtok_r(NULL, "", &fields);
        if (!arch || !cus || !bytes || !name)
            continue;
        snprintf(d->arch, sizeof d->arch, "%s", arch);
        snprintf(d->name, sizeof d->name, "%s", name);
        d->cus = atoi(cus);
        d->bytes = strtoull(bytes, NULL, 10);
        device_count++;
    }
    free(copy);
}

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#define FAIL_IF_ASKED(call, code)                                  \
    do {                                                           \
        if (standin_should_fail(call)) {                           \
            standin_log(call, code, "\"injected\": true");         \
            pthread_mutex_unlock(&lock);                           \
            return code;                                           \
        }                                                          \
    } while (0)

/* ------------------------------------------------------------------ devices */

STANDIN_API hipError_t hipGetDeviceCount(int *count)
{
    pthread_mutex_lock(&lock);
    load_devices();
    FAIL_IF_ASKED("hipGetDeviceCount", 100 /* hipErrorNoDevice */);
    if (!count) {
        standin_problem("hipGetDeviceCount", "null output pointer");
        pthread_mutex_unlock(&lock);
        return hipErrorInvalidValue;
    }
    *count = device_count;
    standin_log("hipGetDeviceCount", hipSuccess, "\"count\": %d", device_count);
    pthread_mutex_unlock(&lock);
    return hipSuccess;
}

STANDIN_API hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600 *prop, int device)
{
    pthread_mutex_lock(&lock);
    load_devices();
    if (!prop || device < 0 || device >= device_count) {
        standin_problem("hipGetDeviceProperties", "device %d of %d, props %p", device, device_count, (void *)prop);
        pthread_mutex_unlock(&lock);
        return prop ? hipErrorInvalidDevice : hipErrorInvalidValue;
    }
    memset(prop, 0, sizeof *prop);
    const device_t *d = &devices[device];
    snprintf(prop->name, sizeof prop->name, "%s", d->name);
    snprintf(prop->gcnArchName, sizeof prop->gcnArchName, "%s", d->arch);
    prop->multiProcessorCount = d->cus;
    prop->totalGlobalMem = d->bytes;
    prop->warpSize = strncmp(d->arch, "gfx9", 4) == 0 ? 64 : 32;
    prop->maxThreadsPerBlock = 1024;
    prop->sharedMemPerBlock = 65536;
    standin_log("hipGetDeviceProperties", hipSuccess, "\"device\": %d, \"struct_bytes\": %zu", device, sizeof *prop);
    pthread_mutex_unlock(&lock);
    return hipSuccess;
}

STANDIN_API hipError_t hipSetDevice(int device)
{
    pthread_mutex_lock(&lock);
    load_devices();
    hipError_t r = device >= 0 && device < device_count ? hipSuccess : hipErrorInvalidDevice;
    if (r == hipSuccess)
        current_device = device;
    standin_log("hipSetDevice", r, "\"device\": %d", device);
    pthread_mutex_unlock(&lock);
    return r;
}

STANDIN_API hipError_t hipGetDevice(int *device)
{
    if (!device)
        return hipErrorInvalidValue;
    *device = current_device;
    return hipSuccess;
}

STANDIN_API hipError_t hipDriverGetVersion(int *version)
{
    if (!version)
        return hipErrorInvalidValue;
    *version = 60443483;
    standin_log("hipDriverGetVersion", hipSuccess, "\"version\": %d", *version);
    return hipSuccess;
}

STANDIN_API hipError_t hipRuntimeGetVersion(int *version)
{
    if (!version)
        return hipErrorInvalidValue;
    *version = 60443483;
    return hipSuccess;
}

STANDIN_API hipError_t hipDeviceSynchronize(void)
{
    standin_log("hipDeviceSynchronize", hipSuccess, "");
    return hipSuccess;
}

STANDIN_API const char *hipGetErrorName(hipError_t e)
{
    return e == hipSuccess ? "hipSuccess" : "hipErrorStandIn";
}

STANDIN_API const char *hipGetErrorString(hipError_t e)
{
    return e == hipSuccess ? "no error" : "stand-in error";
}

/* ------------------------------------------------------------------ memory */

STANDIN_API hipError_t hipMalloc(void **ptr, size_t size)
{
    pthread_mutex_lock(&lock);
    FAIL_IF_ASKED("hipMalloc", hipErrorOutOfMemory);
    if (!ptr) {
        standin_problem("hipMalloc", "null output pointer");
        pthread_mutex_unlock(&lock);
        return hipErrorInvalidValue;
    }
    *ptr = size ? calloc(1, size) : NULL; /* hipMalloc(0) gives a null pointer, as ROCm's does */
    if (*ptr) {
        registry_add(&allocations, *ptr);
        registry_add(&allocation_sizes, (void *)size);
    }
    standin_log("hipMalloc", hipSuccess, "\"size\": %zu, \"ptr\": %lu", size, (unsigned long)*ptr);
    pthread_mutex_unlock(&lock);
    return hipSuccess;
}

STANDIN_API hipError_t hipFree(void *ptr)
{
    pthread_mutex_lock(&lock);
    hipError_t r = hipSuccess;
    if (ptr) {
        long i = registry_find(&allocations, ptr);
        if (i < 0) {
            standin_problem("hipFree", "%lu is not a live allocation (double free?)", (unsigned long)ptr);
            r = hipErrorInvalidValue;
        } else {
            free(ptr);
            registry_remove(&allocations, (size_t)i);
            registry_remove(&allocation_sizes, (size_t)i);
        }
    }
    standin_log("hipFree", r, "\"ptr\": %lu", (unsigned long)ptr);
    pthread_mutex_unlock(&lock);
    return r;
}

STANDIN_API hipError_t hipMemcpy(void *dst, const void *src, size_t n, int kind)
{
    pthread_mutex_lock(&lock);
    FAIL_IF_ASKED("hipMemcpy", hipErrorInvalidValue);
    hipError_t r = hipSuccess;
    int dst_device = kind == 1 || kind == 3, src_device = kind == 2 || kind == 3;
    if (kind < 0 || kind > 4) {
        standin_problem("hipMemcpy", "unknown hipMemcpyKind %d", kind);
        r = hipErrorInvalidValue;
    } else if (n && ((dst_device && allocation_holding(dst, n) < 0) || (src_device && allocation_holding(src, n) < 0))) {
        standin_problem("hipMemcpy", "kind %d: %zu bytes from %lu to %lu leave the live allocations", kind, n,
                        (unsigned long)src, (unsigned long)dst);
        r = hipErrorInvalidDevicePointer;
    } else if (n) {
        memmove(dst, src, n);
    }
    standin_log("hipMemcpy", r, "\"dst\": %lu, \"src\": %lu, \"bytes\": %zu, \"kind\": %d", (unsigned long)dst,
                (unsigned long)src, n, kind);
    pthread_mutex_unlock(&lock);
    return r;
}

/* ------------------------------------------------------------------ modules */

static module_t *live_module(const void *handle)
{
    return registry_find(&modules, handle) >= 0 ? (module_t *)handle : NULL;
}

STANDIN_API hipError_t hipModuleLoadData(module_t **module, const void *image)
{
    pthread_mutex_lock(&lock);
    load_devices();
    FAIL_IF_ASKED("hipModuleLoadData", hipErrorInvalidImage);
    char err[512];
    module_t *m = calloc(1, sizeof *m);
    if (!module || standin_read_code_object(image, &m->co, err, sizeof err) != 0) {
        standin_problem("hipModuleLoadData", "%s", module ? err : "null output pointer");
        standin_log("hipModuleLoadData", hipErrorInvalidImage, "\"image\": %lu", (unsigned long)image);
        free(m);
        pthread_mutex_unlock(&lock);
        return hipErrorInvalidImage;
    }
    /* The processor in amdhsa.target ("amdgcn-amd-amdhsa--gfx942:xnack-") must be the device's. */
    const char *arch = strstr(m->co.target, "--");
    arch = arch ? arch + 2 : m->co.target;
    size_t proc_len = strcspn(arch, ":"), dev_len = strcspn(devices[current_device].arch, ":");
    if (proc_len != dev_len || strncmp(arch, devices[current_device].arch, proc_len) != 0) {
        standin_problem("hipModuleLoadData", "code object for %s loaded on a %s", arch, devices[current_device].arch);
        standin_log("hipModuleLoadData", 209 /* hipErrorNoBinaryForGpu */, "\"target\": \"%s\"", m->co.target);
        standin_free_code_object(&m->co);
        free(m);
        pthread_mutex_unlock(&lock);
        return 209;
    }
    m->magic = MAGIC_MODULE;
    m->image = image;
    m->checksum = fnv1a(image, m->co.image_size);
    m->functions = calloc((size_t)m->co.nkernels + 1, sizeof *m->functions);
    registry_add(&modules, m);
    *module = m;
    char names[8192] = "";
    size_t at = 0;
    for (int k = 0; k < m->co.nkernels && at < sizeof names - 300; k++)
        at += (size_t)snprintf(names + at, sizeof names - at, "%s\"%s\"", k ? ", " : "", m->co.kernels[k].name);
    standin_log("hipModuleLoadData", hipSuccess,
                "\"module\": %lu, \"image\": %lu, \"bytes\": %zu, \"target\": \"%s\", \"version\": [%llu, %llu], "
                "\"kernels\": [%s]",
                (unsigned long)m, (unsigned long)image, m->co.image_size, m->co.target,
                (unsigned long long)m->co.version_major, (unsigned long long)m->co.version_minor, names);
    pthread_mutex_unlock(&lock);
    return hipSuccess;
}

STANDIN_API hipError_t hipModuleUnload(module_t *module)
{
    pthread_mutex_lock(&lock);
    hipError_t r = hipSuccess;
    if (!registry_take(&modules, module)) {
        standin_problem("hipModuleUnload", "%lu is not a loaded module (unloaded twice?)", (unsigned long)module);
        r = hipErrorInvalidHandle;
    } else {
        module->magic = 0;
        standin_free_code_object(&module->co);
        free(module->functions);
        free(module);
    }
    standin_log("hipModuleUnload", r, "\"module\": %lu", (unsigned long)module);
    pthread_mutex_unlock(&lock);
    return r;
}

STANDIN_API hipError_t hipModuleGetFunction(function_t **function, module_t *module, const char *name)
{
    pthread_mutex_lock(&lock);
    char quoted[600];
    hipError_t r = hipErrorNotFound;
    if (!function || !name || !live_module(module)) {
        standin_problem("hipModuleGetFunction", "module %lu is not loaded, or a null argument",
                        (unsigned long)module);
        r = hipErrorInvalidHandle;
    } else {
        for (int k = 0; k < module->co.nkernels; k++) {
            if (strcmp(module->co.kernels[k].name, name) != 0)
                continue;
            if (!module->co.kernels[k].descriptor_defined) {
                standin_problem("hipModuleGetFunction", "kernel %s has no defined descriptor symbol %s", name,
                                module->co.kernels[k].symbol);
                break;
            }
            function_t *f = &module->functions[k];
            f->magic = MAGIC_FUNCTION;
            f->module = module;
            f->kernel = k;
            *function = f;
            r = hipSuccess;
            break;
        }
    }
    standin_log("hipModuleGetFunction", r, "\"module\": %lu, \"name\": %s", (unsigned long)module,
                standin_json(name ? name : "", quoted, sizeof quoted));
    pthread_mutex_unlock(&lock);
    return r;
}

/* The explicit arguments of a launch, checked against the kernel's metadata and logged. */
static hipError_t check_arguments(const standin_kernel *k, void **extra, char *out, size_t out_size)
{
    size_t at = 0;
    out[0] = 0;
    if (!extra || extra[0] != (void *)0x01 || extra[2] != (void *)0x02 || extra[4] != (void *)0x03) {
        standin_problem("hipModuleLaunchKernel", "%s: extra is not {BUFFER_POINTER, buf, BUFFER_SIZE, &size, END}",
                        k->name);
        return hipErrorInvalidValue;
    }
    const unsigned char *buffer = extra[1];
    size_t size = *(const size_t *)extra[3];
    hipError_t r = hipSuccess;
    at += (size_t)snprintf(out + at, out_size - at, "\"buffer_bytes\": %zu, \"args\": [", size);
    int first = 1;
    for (int a = 0; a < k->nargs; a++) {
        const standin_arg *arg = &k->args[a];
        if (!strncmp(arg->value_kind, "hidden_", 7))
            continue; /* filled in by the runtime, not by the caller */
        if (arg->offset + arg->size > size) {
            standin_problem("hipModuleLaunchKernel",
                            "%s: argument %d (%s at offset %llu, %llu bytes) lies beyond the %zu-byte buffer", k->name,
                            a, arg->value_kind, (unsigned long long)arg->offset, (unsigned long long)arg->size, size);
            r = hipErrorInvalidValue;
            continue;
        }
        char hex[2 * 64 + 1] = "";
        for (uint64_t b = 0; b < arg->size && b < 64; b++)
            snprintf(hex + 2 * b, 3, "%02x", buffer[arg->offset + b]);
        if (!strcmp(arg->value_kind, "global_buffer") && arg->size == 8) {
            void *p;
            memcpy(&p, buffer + arg->offset, 8);
            if (p && allocation_holding(p, 1) < 0) {
                standin_problem("hipModuleLaunchKernel", "%s: argument %d = %lu is not inside a live allocation",
                                k->name, a, (unsigned long)p);
                r = hipErrorInvalidDevicePointer;
            }
        }
        if (at < out_size - 200)
            at += (size_t)snprintf(out + at, out_size - at, "%s{\"offset\": %llu, \"size\": %llu, \"kind\": \"%s\", "
                                   "\"hex\": \"%s\"}", first ? "" : ", ", (unsigned long long)arg->offset,
                                   (unsigned long long)arg->size, arg->value_kind, hex);
        first = 0;
    }
    snprintf(out + at, out_size - at, "]");
    return r;
}

STANDIN_API hipError_t hipModuleLaunchKernel(function_t *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                             unsigned by, unsigned bz, unsigned shared, void *stream,
                                             void **kernel_params, void **extra)
{
    pthread_mutex_lock(&lock);
    FAIL_IF_ASKED("hipModuleLaunchKernel", hipErrorLaunchFailure);
    char args[12000] = "";
    hipError_t r = hipSuccess;
    if (!f || f->magic != MAGIC_FUNCTION || !live_module(f->module)) {
        standin_problem("hipModuleLaunchKernel", "function %lu does not belong to a loaded module", (unsigned long)f);
        standin_log("hipModuleLaunchKernel", hipErrorInvalidHandle, "\"function\": %lu", (unsigned long)f);
        pthread_mutex_unlock(&lock);
        return hipErrorInvalidHandle;
    }
    module_t *m = f->module;
    const standin_kernel *k = &m->co.kernels[f->kernel];
    if (fnv1a(m->image, m->co.image_size) != m->checksum) {
        standin_problem("hipModuleLaunchKernel", "%s: the code object's bytes changed after hipModuleLoadData "
                        "(the caller freed the image the runtime may still read)", k->name);
        r = hipErrorInvalidImage;
    }
    if (kernel_params) {
        standin_problem("hipModuleLaunchKernel", "%s: kernelParams given; kdbkit passes arguments through extra",
                        k->name);
        r = hipErrorInvalidValue;
    }
    unsigned long threads = (unsigned long)bx * by * bz;
    if (!gx || !gy || !gz || !threads || threads > k->max_flat_workgroup_size) {
        standin_problem("hipModuleLaunchKernel", "%s: grid %ux%ux%u, block %ux%ux%u (at most %llu threads)", k->name,
                        gx, gy, gz, bx, by, bz, (unsigned long long)k->max_flat_workgroup_size);
        r = hipErrorInvalidValue;
    }
    if (k->group_segment_fixed_size + shared > 65536) {
        standin_problem("hipModuleLaunchKernel", "%s: %llu + %u bytes of LDS exceed 64 KiB", k->name,
                        (unsigned long long)k->group_segment_fixed_size, shared);
        r = hipErrorInvalidValue;
    }
    hipError_t arg_result = check_arguments(k, extra, args, sizeof args);
    if (r == hipSuccess)
        r = arg_result;
    char quoted[600];
    standin_log("hipModuleLaunchKernel", r,
                "\"kernel\": %s, \"grid\": [%u, %u, %u], \"block\": [%u, %u, %u], \"shared\": %u, \"stream\": %lu%s%s",
                standin_json(k->name, quoted, sizeof quoted), gx, gy, gz, bx, by, bz, shared, (unsigned long)stream,
                args[0] ? ", " : "", args);
    pthread_mutex_unlock(&lock);
    return r;
}

/* ------------------------------------------------------------------ events */

static event_t *live_event(const void *e)
{
    return registry_find(&events, e) >= 0 ? (event_t *)e : NULL;
}

STANDIN_API hipError_t hipEventCreate(event_t **event)
{
    pthread_mutex_lock(&lock);
    if (!event) {
        pthread_mutex_unlock(&lock);
        return hipErrorInvalidValue;
    }
    event_t *e = calloc(1, sizeof *e);
    e->magic = MAGIC_EVENT;
    registry_add(&events, e);
    *event = e;
    standin_log("hipEventCreate", hipSuccess, "\"event\": %lu", (unsigned long)e);
    pthread_mutex_unlock(&lock);
    return hipSuccess;
}

STANDIN_API hipError_t hipEventRecord(event_t *event, void *stream)
{
    pthread_mutex_lock(&lock);
    hipError_t r = hipSuccess;
    if (!live_event(event)) {
        standin_problem("hipEventRecord", "%lu is not a live event", (unsigned long)event);
        r = hipErrorInvalidHandle;
    } else {
        event->recorded = 1;
        event->ms = now_ms();
    }
    standin_log("hipEventRecord", r, "\"event\": %lu, \"stream\": %lu", (unsigned long)event, (unsigned long)stream);
    pthread_mutex_unlock(&lock);
    return r;
}

STANDIN_API hipError_t hipEventSynchronize(event_t *event)
{
    pthread_mutex_lock(&lock);
    hipError_t r = live_event(event) ? hipSuccess : hipErrorInvalidHandle;
    if (r != hipSuccess)
        standin_problem("hipEventSynchronize", "%lu is not a live event", (unsigned long)event);
    standin_log("hipEventSynchronize", r, "\"event\": %lu", (unsigned long)event);
    pthread_mutex_unlock(&lock);
    return r;
}

STANDIN_API hipError_t hipEventElapsedTime(float *ms, event_t *start, event_t *stop)
{
    pthread_mutex_lock(&lock);
    hipError_t r = hipSuccess;
    if (!ms || !live_event(start) || !live_event(stop) || !start->recorded || !stop->recorded) {
        standin_problem("hipEventElapsedTime", "events %lu and %lu must be live and recorded", (unsigned long)start,
                        (unsigned long)stop);
        r = hipErrorInvalidHandle;
    } else {
        *ms = (float)(stop->ms - start->ms);
    }
    standin_log("hipEventElapsedTime", r, "\"start\": %lu, \"stop\": %lu", (unsigned long)start, (unsigned long)stop);
    pthread_mutex_unlock(&lock);
    return r;
}

STANDIN_API hipError_t hipEventDestroy(event_t *event)
{
    pthread_mutex_lock(&lock);
    hipError_t r = hipSuccess;
    if (!registry_take(&events, event)) {
        standin_problem("hipEventDestroy", "%lu is not a live event (destroyed twice?)", (unsigned long)event);
        r = hipErrorInvalidHandle;
    } else {
        event->magic = 0;
        free(event);
    }
    standin_log("hipEventDestroy", r, "\"event\": %lu", (unsigned long)event);
    pthread_mutex_unlock(&lock);
    return r;
}

/* ------------------------------------------------------------------ for the tests */

/* How many allocations, modules or events are live: a test checks nothing leaks. */
STANDIN_API long kdb_standin_live(const char *what)
{
    pthread_mutex_lock(&lock);
    long n = -1;
    if (!strcmp(what, "allocations")) n = (long)allocations.n;
    else if (!strcmp(what, "modules")) n = (long)modules.n;
    else if (!strcmp(what, "events")) n = (long)events.n;
    pthread_mutex_unlock(&lock);
    return n;
}
