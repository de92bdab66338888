/* hiprtc.c: the stand-in libhiprtc.so, compiling with a real clang.
 *
 * hiprtcCompileProgram writes the source to a temporary folder and runs $KDB_STANDIN_CLANG
 * the way hiprtc drives its own clang: HIP, device only, __HIPCC_RTC__ defined, plus the
 * caller's options (--offload-arch=..., -O3, -D...). What clang prints is the program log and
 * the raw code object is the code, as with ROCm's hiprtc.
 *
 * hiprtcDestroyProgram takes a pointer to the handle, like the C API: a call that passes the
 * handle itself reaches here pointing at the program's first field (a magic number, not a
 * live handle) and is logged as a problem and refused instead of freeing a bogus pointer.
 */
#include "standin.h"

#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

typedef int hiprtcResult;
enum {
    HIPRTC_SUCCESS = 0, HIPRTC_ERROR_OUT_OF_MEMORY = 1, HIPRTC_ERROR_INVALID_INPUT = 3,
    HIPRTC_ERROR_INVALID_PROGRAM = 4, HIPRTC_ERROR_COMPILATION = 6, HIPRTC_ERROR_INTERNAL_ERROR = 11,
};

typedef struct {
    uint64_t magic; /* first, so a handle mistaken for a pointer to a handle reads this */
    char *source, *name, *log;
    unsigned char *code;
    size_t code_size;
} program_t;

#define MAGIC_PROGRAM 0x53544e44494e2150ull /* not a heap address */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static program_t *live[4096];
static int live_count;

static int find_live(const program_t *p)
{
    for (int i = 0; i < live_count; i++)
        if (live[i] == p)
            return i;
    return -1;
}

STANDIN_API hiprtcResult hiprtcVersion(int *major, int *minor)
{
    if (!major || !minor)
        return HIPRTC_ERROR_INVALID_INPUT;
    const char *v = getenv("KDB_STANDIN_HIPRTC_VERSION");
    if (!v || sscanf(v, "%d.%d", major, minor) != 2) {
        *major = 6;
        *minor = 4;
    }
    standin_log("hiprtcVersion", HIPRTC_SUCCESS, "\"major\": %d, \"minor\": %d", *major, *minor);
    return HIPRTC_SUCCESS;
}

STANDIN_API const char *hiprtcGetErrorString(hiprtcResult r)
{
    return r == HIPRTC_SUCCESS ? "HIPRTC_SUCCESS" : "HIPRTC_ERROR (stand-in)";
}

STANDIN_API hiprtcResult hiprtcCreateProgram(program_t **prog, const char *src, const char *name, int num_headers,
                                             const char **headers, const char **include_names)
{
    (void)headers;
    (void)include_names;
    pthread_mutex_lock(&lock);
    if (!prog || !src || num_headers < 0 || live_count == 4096) {
        standin_problem("hiprtcCreateProgram", "null program or source, or %d headers", num_headers);
        pthread_mutex_unlock(&lock);
        return HIPRTC_ERROR_INVALID_INPUT;
    }
    program_t *p = calloc(1, sizeof *p);
    p->magic = MAGIC_PROGRAM;
    p->source = strdup(src);
    p->name = strdup(name && *name ? name : "default_program");
    live[live_count++] = p;
    *prog = p;
    char quoted[600];
    standin_log("hiprtcCreateProgram", HIPRTC_SUCCESS, "\"program\": %lu, \"name\": %s, \"headers\": %d",
                (unsigned long)p, standin_json(p->name, quoted, sizeof quoted), num_headers);
    pthread_mutex_unlock(&lock);
    return HIPRTC_SUCCESS;
}

static char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)(n > 0 ? n : 0) + 1);
    size_t got = fread(data, 1, (size_t)(n > 0 ? n : 0), f);
    data[got] = 0;
    fclose(f);
    if (size)
        *size = got;
    return data;
}

/* Run clang on the program; fills p->log and, on success, p->code. */
static hiprtcResult run_clang(program_t *p, int num_options, const char **options)
{
    const char *clang = getenv("KDB_STANDIN_CLANG");
    if (!clang || !*clang) {
        p->log = strdup("stand-in hiprtc: set KDB_STANDIN_CLANG to a clang with the amdgcn target\n");
        return HIPRTC_ERROR_COMPILATION;
    }
    char dir[] = "/tmp/kdb-standin-hiprtc-XXXXXX";
    if (!mkdtemp(dir))
        return HIPRTC_ERROR_INTERNAL_ERROR;
    char src[4200], out[4200], log[4200];
    const char *base = strrchr(p->name, '/');
    snprintf(src, sizeof src, "%s/%s", dir, base ? base + 1 : p->name);
    snprintf(out, sizeof out, "%s/code.o", dir);
    snprintf(log, sizeof log, "%s/log.txt", dir);
    FILE *f = fopen(src, "w");
    if (!f)
        return HIPRTC_ERROR_INTERNAL_ERROR;
    fputs(p->source, f);
    fclose(f);

    const char *fixed[] = {"-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output", "-nogpulib", "-nogpuinc",
                           "-D__HIPCC_RTC__"};
    int nfixed = (int)(sizeof fixed / sizeof *fixed);
    const char **argv = calloc((size_t)(num_options + nfixed + 6), sizeof *argv);
    int argc = 0;
    argv[argc++] = clang;
    for (int i = 0; i < nfixed; i++)
        argv[argc++] = fixed[i];
    for (int i = 0; i < num_options; i++)
        argv[argc++] = options[i];
    argv[argc++] = "-o";
    argv[argc++] = out;
    argv[argc++] = src;
    argv[argc] = NULL;

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 2, 1);
    pid_t pid;
    int status = -1;
    if (posix_spawn(&pid, clang, &actions, NULL, (char *const *)argv, environ) == 0)
        waitpid(pid, &status, 0);
    posix_spawn_file_actions_destroy(&actions);
    free(argv);

    p->log = read_file(log, NULL);
    if (!p->log)
        p->log = strdup("");
    hiprtcResult r = HIPRTC_ERROR_COMPILATION;
    if (status == 0) {
        p->code = (unsigned char *)read_file(out, &p->code_size);
        r = p->code ? HIPRTC_SUCCESS : HIPRTC_ERROR_COMPILATION;
    }
    unlink(src);
    unlink(out);
    unlink(log);
    rmdir(dir);
    return r;
}

STANDIN_API hiprtcResult hiprtcCompileProgram(program_t *prog, int num_options, const char **options)
{
    pthread_mutex_lock(&lock);
    int ok = find_live(prog) >= 0;
    pthread_mutex_unlock(&lock);
    if (!ok || num_options < 0) {
        standin_problem("hiprtcCompileProgram", "%lu is not a live program", (unsigned long)prog);
        return HIPRTC_ERROR_INVALID_PROGRAM;
    }
    if (standin_should_fail("hiprtcCompileProgram")) {
        prog->log = strdup("injected.c:1:1: error: injected failure\n");
        standin_log("hiprtcCompileProgram", HIPRTC_ERROR_COMPILATION, "\"injected\": true");
        return HIPRTC_ERROR_COMPILATION;
    }
    free(prog->log);
    free(prog->code);
    prog->log = NULL;
    prog->code = NULL;
    hiprtcResult r = run_clang(prog, num_options, options);
    char opts[4096] = "", quoted[1100];
    size_t at = 0;
    for (int i = 0; i < num_options && at < sizeof opts - 1100; i++)
        at += (size_t)snprintf(opts + at, sizeof opts - at, "%s%s", i ? ", " : "",
                               standin_json(options[i], quoted, sizeof quoted));
    standin_log("hiprtcCompileProgram", r, "\"program\": %lu, \"options\": [%s], \"code_bytes\": %zu",
                (unsigned long)prog, opts, prog->code_size);
    return r;
}

static program_t *checked(const char *call, program_t *prog)
{
    pthread_mutex_lock(&lock);
    int ok = find_live(prog) >= 0;
    pthread_mutex_unlock(&lock);
    if (!ok)
        standin_problem(call, "%lu is not a live program", (unsigned long)prog);
    return ok ? prog : NULL;
}

STANDIN_API hiprtcResult hiprtcGetProgramLogSize(program_t *prog, size_t *size)
{
    if (!checked("hiprtcGetProgramLogSize", prog) || !size)
        return HIPRTC_ERROR_INVALID_INPUT;
    *size = (prog->log ? strlen(prog->log) : 0) + 1; /* counts the NUL, as hiprtc does */
    standin_log("hiprtcGetProgramLogSize", HIPRTC_SUCCESS, "\"size\": %zu", *size);
    return HIPRTC_SUCCESS;
}

STANDIN_API hiprtcResult hiprtcGetProgramLog(program_t *prog, char *log)
{
    if (!checked("hiprtcGetProgramLog", prog) || !log)
        return HIPRTC_ERROR_INVALID_INPUT;
    const char *text = prog->log ? prog->log : "";
    memcpy(log, text, strlen(text) + 1);
    standin_log("hiprtcGetProgramLog", HIPRTC_SUCCESS, "");
    return HIPRTC_SUCCESS;
}

STANDIN_API hiprtcResult hiprtcGetCodeSize(program_t *prog, size_t *size)
{
    if (!checked("hiprtcGetCodeSize", prog) || !size)
        return HIPRTC_ERROR_INVALID_INPUT;
    *size = prog->code_size;
    standin_log("hiprtcGetCodeSize", HIPRTC_SUCCESS, "\"size\": %zu", *size);
    return HIPRTC_SUCCESS;
}

STANDIN_API hiprtcResult hiprtcGetCode(program_t *prog, char *code)
{
    if (!checked("hiprtcGetCode", prog) || !code || !prog->code)
        return HIPRTC_ERROR_INVALID_INPUT;
    memcpy(code, prog->code, prog->code_size);
    standin_log("hiprtcGetCode", HIPRTC_SUCCESS, "\"size\": %zu", prog->code_size);
    return HIPRTC_SUCCESS;
}

STANDIN_API hiprtcResult hiprtcDestroyProgram(program_t **prog)
{
    pthread_mutex_lock(&lock);
    int i = prog ? find_live(*prog) : -1;
    if (i < 0) {
        /* Read *prog only to report it: it is the caller's memory either way. */
        standin_problem("hiprtcDestroyProgram",
                        "the argument must point to a live program handle; it points at %#lx (was the handle "
                        "itself passed instead of its address?)",
                        prog ? (unsigned long)*prog : 0ul);
        standin_log("hiprtcDestroyProgram", HIPRTC_ERROR_INVALID_INPUT, "\"argument\": %lu", (unsigned long)prog);
        pthread_mutex_unlock(&lock);
        return HIPRTC_ERROR_INVALID_INPUT;
    }
    program_t *p = *prog;
    unsigned long handle = (unsigned long)p;
    live[i] = live[--live_count];
    p->magic = 0;
    free(p->source);
    free(p->name);
    free(p->log);
    free(p->code);
    free(p);
    *prog = NULL; /* as hiprtc does */
    standin_log("hiprtcDestroyProgram", HIPRTC_SUCCESS, "\"program\": %lu", handle);
    pthread_mutex_unlock(&lock);
    return HIPRTC_SUCCESS;
}

/* How many programs are live: a test checks nothing leaks. */
STANDIN_API long kdb_standin_live_programs(void)
{
    pthread_mutex_lock(&lock);
    long n = live_count;
    pthread_mutex_unlock(&lock);
    return n;
}
