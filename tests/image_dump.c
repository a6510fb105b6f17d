/* Test driver for the image pipeline: one job per stdin line,
 * "path offset size rw rh l t r b flip fmt out" (tab-separated; size -1 = whole
 * file; fmt rgb8 or chw), writes the raw pixels to `out` and prints "ok" or
 * "err CODE MESSAGE" per line, so one process serves a whole test run.
 * usage: image_dump [--portable]   (--portable: never the AVX2 loops, so a
 * test can check that both give the same bytes) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "image_int.h"

/* Run one job line; the answer goes to stdout. */
static void job(char *line)
{
    char path[4096], fmt[8], out[4096];
    long long off, size;
    sd_image_plan p = {0};
    if (sscanf(line, "%4095[^\t]\t%lld\t%lld\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%7[^\t]\t%4095[^\t\n]", path, &off, &size,
               &p.resize_w, &p.resize_h, &p.crop_l, &p.crop_t, &p.crop_r, &p.crop_b, &p.flip, fmt, out) != 12) {
        printf("err bad-job %s", line);
        return;
    }
    sd_image_src src = {path, NULL, (uint64_t)off, size < 0 ? SD_IMAGE_WHOLE_FILE : (uint64_t)size};
    if (off > 0) src.member = "member";
    int chw = strcmp(fmt, "chw") == 0;
    size_t n = (size_t)(p.crop_r > p.crop_l ? p.crop_r - p.crop_l : 1) * (size_t)(p.crop_b > p.crop_t ? p.crop_b - p.crop_t : 1) * 3;
    void *buf = malloc(n * (chw ? sizeof(float) : 1));
    sd_error err = {0};
    sd_status st = !buf ? SD_ENOMEM
                   : chw ? sd_image_load_chw(&src, &p, buf, &err)
                         : sd_image_load_rgb8(&src, &p, buf, &err);
    if (st) {
        printf("err %s %s\n", sd_strerror(st), err.msg);
    } else {
        FILE *f = fopen(out, "wb");
        int ok = f && fwrite(buf, chw ? sizeof(float) : 1, n, f) == n;
        if (f && fclose(f)) ok = 0;
        printf(ok ? "ok\n" : "err write %s\n", out);
    }
    free(buf);
}

int main(int argc, char **argv)
{
    sd_error err = {0};
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "--portable") != 0)) {
        fprintf(stderr, "usage: image_dump [--portable] < jobs\n");
        return 2;
    }
    if (argc == 2) sd_image_portable_only(1);
    if (sd_image_init(&err)) {
        fprintf(stderr, "image_dump: %s\n", err.msg);
        return 3;
    }
    char line[9000];
    while (fgets(line, sizeof line, stdin)) {
        job(line);
        fflush(stdout);
    }
    sd_image_shutdown();
    return 0;
}
