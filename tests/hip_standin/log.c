/* log.c: the stand-in's call log, one JSON object per line, appended to $KDB_STANDIN_LOG.
 *
 * Both stand-in libraries append to the same file with O_APPEND and one write() per line,
 * so lines from the two libraries (and from threads) never interleave.
 */
#include "standin.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void write_line(const char *line, size_t n)
{
    const char *path = getenv("KDB_STANDIN_LOG");
    if (!path || !*path)
        return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0)
        return;
    ssize_t ignored = write(fd, line, n);
    (void)ignored;
    close(fd);
}

const char *standin_json(const char *s, char *out, size_t out_size)
{
    size_t o = 0;
    if (out_size < 3) {
        if (out_size)
            out[0] = 0;
        return out;
    }
    out[o++] = '"';
    for (; s && *s && o + 8 < out_size; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c < 0x20) {
            o += (size_t)snprintf(out + o, out_size - o, "\\u%04x", c);
        } else {
            out[o++] = (char)c;
        }
    }
    out[o++] = '"';
    out[o] = 0;
    return out;
}

void standin_log(const char *call, int result, const char *fields, ...)
{
    char body[16384];
    va_list ap;
    va_start(ap, fields);
    vsnprintf(body, sizeof body, fields, ap);
    va_end(ap);
    char line[17000];
    int n = snprintf(line, sizeof line, "{\"call\": \"%s\", \"result\": %d%s%s}\n", call, result, body[0] ? ", " : "",
                     body);
    if (n >= (int)sizeof line) { /* never cut a line into invalid JSON */
        n = snprintf(line, sizeof line, "{\"call\": \"%s\", \"result\": %d, \"truncated\": true}\n", call, result);
    }
    write_line(line, (size_t)n);
}

void standin_problem(const char *call, const char *fmt, ...)
{
    char message[4096], quoted[8300], line[8400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    int n = snprintf(line, sizeof line, "{\"call\": \"%s\", \"problem\": %s}\n", call,
                     standin_json(message, quoted, sizeof quoted));
    write_line(line, (size_t)n);
}

int standin_should_fail(const char *call)
{
    const char *fail = getenv("KDB_STANDIN_FAIL");
    if (!fail || !*fail)
        return 0;
    size_t len = strlen(call);
    for (const char *p = fail; (p = strstr(p, call)) != NULL; p += len) {
        int starts = p == fail || p[-1] == ',';
        int ends = p[len] == 0 || p[len] == ',';
        if (starts && ends)
            return 1;
    }
    return 0;
}
