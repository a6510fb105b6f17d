/* Fuzz target for the WebDataset reader: the input is a tar shard. It is
 * written to a temporary file (libarchive and the offset check read a real
 * file) and read by sd_read_wds through a 1-thread sd-meta run whose output
 * goes to /dev/null, so the records built from .txt/.json members are also
 * serialised. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "log.h"
#include "sources.h"

static sd_pool *pool;
static FILE *devnull;
static sd_rules rules;
static sd_arena cls_arena;
static sd_json *cls_map;
static char cls_text[] = "{\"0\": \"a photo of a cat\", \"1\": \"a dog\", \"7\": \"\"}";
static char tmpl[4096];

/* Make the pool, output sink, rules and cls map once; they outlive inputs. */
static void setup(void)
{
    sd_log_setup("fuzz_tar", SD_LOG_ERROR);
    pool = sd_pool_create(1);
    devnull = fopen("/dev/null", "w");
    sd_rules_init(&rules);
    sd_arena_init(&cls_arena, 1 << 12);
    sd_error err;
    if (!pool || !devnull || sd_json_parse(&cls_arena, cls_text, strlen(cls_text), &cls_map, &err)) abort();
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    snprintf(tmpl, sizeof tmpl, "%s/sdtk-fuzz-tar-XXXXXX", dir && *dir ? dir : "/tmp");
}

/* Write the input to a fresh temporary file; returns its fd, path in path. */
static int write_temp(const uint8_t *data, size_t size, char *path, size_t cap)
{
    snprintf(path, cap, "%s", tmpl);
    int fd = mkstemp(path);
    if (fd < 0) abort();
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) abort();
        done += (size_t)w;
    }
    return fd;
}

/* libFuzzer entry: read the bytes as one shard. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!pool) setup();
    char path[sizeof tmpl];
    int fd = write_temp(data, size, path, sizeof path);
    sd_build_opts o = {NULL, NULL, 0, cls_map, -1};
    sd_meta_run m;
    sd_error err;
    if (sd_meta_run_init(&m, &rules, &o, pool, devnull, SD_OUT_JSONL, 0, 0, &err)) abort();
    sd_read_wds(&m, path, &err);
    sd_meta_finish(&m, &err);
    sd_meta_run_free(&m);
    unlink(path);
    close(fd);
    return 0;
}
