/* code_object.c: read an AMD code object as ROCm's loader does, with no ROCm.
 *
 * ELF64 section headers -> the symbol table (each kernel needs its "<name>.kd" descriptor)
 * and the NT_AMDGPU_METADATA note (owner "AMDGPU", type 32), a MessagePack map whose
 * "amdhsa.kernels" list gives each kernel's name, symbol and ".args" (offset, size,
 * value_kind). This reader is written apart from kdbkit's own Python one on purpose: the two
 * must agree for the stand-in tests to pass.
 */
#include "standin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ MessagePack */

typedef struct {
    const unsigned char *p, *end;
    int bad;
} mp_cursor;

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

static int need(mp_cursor *c, size_t n)
{
    if (c->bad || (size_t)(c->end - c->p) < n) {
        c->bad = 1;
        return 0;
    }
    return 1;
}

/* Read a container or scalar header. kind: 'm' map, 'a' array, 's' string/bin, 'u' unsigned,
 * 'i' negative int, 'o' other (bool, nil, float, ext). n: element count, string length or value. */
static char mp_header(mp_cursor *c, uint64_t *n)
{
    if (!need(c, 1))
        return 0;
    unsigned char t = *c->p++;
    static const int width[] = {1, 2, 4, 8};
    if (t <= 0x7f) { *n = t; return 'u'; }
    if (t >= 0xe0) { *n = t; return 'i'; }
    if ((t & 0xf0) == 0x80) { *n = t & 0x0f; return 'm'; }
    if ((t & 0xf0) == 0x90) { *n = t & 0x0f; return 'a'; }
    if ((t & 0xe0) == 0xa0) { *n = t & 0x1f; return 's'; }
    switch (t) {
    case 0xc0: case 0xc2: case 0xc3: *n = 0; return 'o';
    case 0xcc: case 0xcd: case 0xce: case 0xcf: {
        int w = width[t - 0xcc];
        if (!need(c, (size_t)w)) return 0;
        *n = be(c->p, w); c->p += w; return 'u';
    }
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        int w = width[t - 0xd0];
        if (!need(c, (size_t)w)) return 0;
        *n = be(c->p, w); c->p += w; return 'i';
    }
    case 0xca: if (!need(c, 4)) return 0; c->p += 4; *n = 0; return 'o';
    case 0xcb: if (!need(c, 8)) return 0; c->p += 8; *n = 0; return 'o';
    case 0xd9: case 0xc4: if (!need(c, 1)) return 0; *n = be(c->p, 1); c->p += 1; return 's';
    case 0xda: case 0xc5: if (!need(c, 2)) return 0; *n = be(c->p, 2); c->p += 2; return 's';
    case 0xdb: case 0xc6: if (!need(c, 4)) return 0; *n = be(c->p, 4); c->p += 4; return 's';
    case 0xdc: if (!need(c, 2)) return 0; *n = be(c->p, 2); c->p += 2; return 'a';
    case 0xdd: if (!need(c, 4)) return 0; *n = be(c->p, 4); c->p += 4; return 'a';
    case 0xde: if (!need(c, 2)) return 0; *n = be(c->p, 2); c->p += 2; return 'm';
    case 0xdf: if (!need(c, 4)) return 0; *n = be(c->p, 4); c->p += 4; return 'm';
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: { /* fixext: type byte + 1..16 */
        size_t len = (size_t)1 << (t - 0xd4);
        if (!need(c, len + 1)) return 0;
        c->p += len + 1; *n = 0; return 'o';
    }
    default: c->bad = 1; return 0;
    }
}

static void mp_skip(mp_cursor *c, int depth)
{
    uint64_t n;
    char k = mp_header(c, &n);
    if (depth > 32) { c->bad = 1; return; }
    if (k == 's') { if (need(c, n)) c->p += n; }
    else if (k == 'a') { for (uint64_t i = 0; i < n && !c->bad; i++) mp_skip(c, depth + 1); }
    else if (k == 'm') { for (uint64_t i = 0; i < 2 * n && !c->bad; i++) mp_skip(c, depth + 1); }
}

/* Read a string into out (NUL-terminated, cut to out_size - 1); 0 if the value is not one. */
static int mp_str(mp_cursor *c, char *out, size_t out_size)
{
    uint64_t n;
    if (mp_header(c, &n) != 's' || !need(c, n))
        return 0;
    size_t k = n < out_size - 1 ? (size_t)n : out_size - 1;
    memcpy(out, c->p, k);
    out[k] = 0;
    c->p += n;
    return 1;
}

static int mp_uint(mp_cursor *c, uint64_t *v)
{
    char k = mp_header(c, v);
    return k == 'u';
}

static void read_arg(mp_cursor *c, uint64_t fields, standin_arg *arg)
{
    char key[64];
    for (uint64_t f = 0; f < fields && !c->bad; f++) {
        if (!mp_str(c, key, sizeof key)) { c->bad = 1; return; }
        if (!strcmp(key, ".offset")) mp_uint(c, &arg->offset);
        else if (!strcmp(key, ".size")) mp_uint(c, &arg->size);
        else if (!strcmp(key, ".value_kind")) mp_str(c, arg->value_kind, sizeof arg->value_kind);
        else mp_skip(c, 0);
    }
}

static void read_kernel(mp_cursor *c, uint64_t fields, standin_kernel *k)
{
    char key[64];
    uint64_t n;
    k->max_flat_workgroup_size = 1024; /* what ROCm assumes when the field is absent */
    for (uint64_t f = 0; f < fields && !c->bad; f++) {
        if (!mp_str(c, key, sizeof key)) { c->bad = 1; return; }
        if (!strcmp(key, ".name")) mp_str(c, k->name, sizeof k->name);
        else if (!strcmp(key, ".symbol")) mp_str(c, k->symbol, sizeof k->symbol);
        else if (!strcmp(key, ".kernarg_segment_size")) mp_uint(c, &k->kernarg_segment_size);
        else if (!strcmp(key, ".group_segment_fixed_size")) mp_uint(c, &k->group_segment_fixed_size);
        else if (!strcmp(key, ".max_flat_workgroup_size")) mp_uint(c, &k->max_flat_workgroup_size);
        else if (!strcmp(key, ".args")) {
            if (mp_header(c, &n) != 'a') { c->bad = 1; return; }
            for (uint64_t i = 0; i < n && !c->bad; i++) {
                uint64_t arg_fields;
                if (mp_header(c, &arg_fields) != 'm') { c->bad = 1; return; }
                if (k->nargs < STANDIN_MAX_ARGS)
                    read_arg(c, arg_fields, &k->args[k->nargs++]);
                else
                    for (uint64_t j = 0; j < 2 * arg_fields; j++) mp_skip(c, 0);
            }
        } else mp_skip(c, 0);
    }
}

static int read_metadata(const unsigned char *p, size_t n, standin_code_object *co, char *err, size_t err_size)
{
    mp_cursor c = {p, p + n, 0};
    uint64_t fields, count;
    char key[64];
    if (mp_header(&c, &fields) != 'm') {
        snprintf(err, err_size, "the AMDGPU metadata note is not a MessagePack map");
        return -1;
    }
    for (uint64_t f = 0; f < fields && !c.bad; f++) {
        if (!mp_str(&c, key, sizeof key)) { c.bad = 1; break; }
        if (!strcmp(key, "amdhsa.target")) {
            mp_str(&c, co->target, sizeof co->target);
        } else if (!strcmp(key, "amdhsa.version")) {
            if (mp_header(&c, &count) == 'a' && count == 2) {
                mp_uint(&c, &co->version_major);
                mp_uint(&c, &co->version_minor);
            } else c.bad = 1;
        } else if (!strcmp(key, "amdhsa.kernels")) {
            if (mp_header(&c, &count) != 'a' || count > 4096) { c.bad = 1; break; }
            co->kernels = calloc(count ? count : 1, sizeof *co->kernels);
            for (uint64_t i = 0; i < count && !c.bad; i++) {
                uint64_t kernel_fields;
                if (mp_header(&c, &kernel_fields) != 'm') { c.bad = 1; break; }
                read_kernel(&c, kernel_fields, &co->kernels[co->nkernels++]);
            }
        } else mp_skip(&c, 0);
    }
    if (c.bad) {
        snprintf(err, err_size, "the AMDGPU metadata note is malformed MessagePack");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ ELF64 */

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

enum { SHT_SYMTAB = 2, SHT_NOTE = 7, SHT_NOBITS = 8, SHT_DYNSYM = 11, NT_AMDGPU_METADATA = 32 };

int standin_read_code_object(const unsigned char *img, standin_code_object *co, char *err, size_t err_size)
{
    memset(co, 0, sizeof *co);
    if (!img || memcmp(img, "\x7f" "ELF", 4) != 0) {
        snprintf(err, err_size, "not an ELF image");
        return -1;
    }
    if (img[4] != 2 || img[5] != 1 || le(img + 18, 2) != 224) {
        snprintf(err, err_size, "not a little-endian ELF64 for EM_AMDGPU (class %d, machine %d)", img[4],
                 (int)le(img + 18, 2));
        return -1;
    }
    uint64_t shoff = le(img + 0x28, 8);
    uint64_t shentsize = le(img + 0x3a, 2), shnum = le(img + 0x3c, 2);
    if (shentsize != 64 || shnum == 0 || shnum > 4096 || shoff > (1u << 30)) {
        snprintf(err, err_size, "unreadable section table (shoff %llu, %llu entries of %llu bytes)",
                 (unsigned long long)shoff, (unsigned long long)shnum, (unsigned long long)shentsize);
        return -1;
    }
    size_t size = (size_t)(shoff + shnum * shentsize);
    for (uint64_t i = 0; i < shnum; i++) {
        const unsigned char *sh = img + shoff + i * 64;
        uint64_t type = le(sh + 4, 4), off = le(sh + 24, 8), sz = le(sh + 32, 8);
        if (type != SHT_NOBITS && off + sz > size)
            size = (size_t)(off + sz);
    }
    co->image_size = size;

    int found_note = 0;
    for (uint64_t i = 0; i < shnum && !found_note; i++) {
        const unsigned char *sh = img + shoff + i * 64;
        if (le(sh + 4, 4) != SHT_NOTE)
            continue;
        const unsigned char *p = img + le(sh + 24, 8), *end = p + le(sh + 32, 8);
        while (p + 12 <= end) {
            uint64_t namesz = le(p, 4), descsz = le(p + 4, 4), type = le(p + 8, 4);
            const unsigned char *name = p + 12, *desc = name + ((namesz + 3) & ~3ull);
            if (desc + descsz > end)
                break;
            if (type == NT_AMDGPU_METADATA && namesz >= 6 && !memcmp(name, "AMDGPU", 6)) {
                if (read_metadata(desc, descsz, co, err, err_size) != 0)
                    return -1;
                found_note = 1;
                break;
            }
            p = desc + ((descsz + 3) & ~3ull);
        }
    }
    if (!found_note) {
        snprintf(err, err_size, "no NT_AMDGPU_METADATA note (code object v3 or newer expected)");
        return -1;
    }

    /* Mark each kernel whose "<name>.kd" descriptor symbol is defined. */
    for (uint64_t i = 0; i < shnum; i++) {
        const unsigned char *sh = img + shoff + i * 64;
        uint64_t type = le(sh + 4, 4);
        if (type != SHT_SYMTAB && type != SHT_DYNSYM)
            continue;
        uint64_t link = le(sh + 40, 4);
        if (link >= shnum)
            continue;
        const unsigned char *strsh = img + shoff + link * 64;
        const char *strtab = (const char *)img + le(strsh + 24, 8);
        uint64_t strsize = le(strsh + 32, 8);
        const unsigned char *symbols = img + le(sh + 24, 8);
        uint64_t count = le(sh + 32, 8) / 24;
        for (uint64_t s = 1; s < count; s++) { /* entry 0 is the null symbol */
            const unsigned char *entry = symbols + s * 24;
            uint64_t name_at = le(entry, 4), shndx = le(entry + 6, 2);
            if (name_at >= strsize || shndx == 0)
                continue;
            for (int k = 0; k < co->nkernels; k++)
                if (!strcmp(strtab + name_at, co->kernels[k].symbol))
                    co->kernels[k].descriptor_defined = 1;
        }
    }
    return 0;
}

void standin_free_code_object(standin_code_object *co)
{
    free(co->kernels);
    co->kernels = NULL;
    co->nkernels = 0;
}
