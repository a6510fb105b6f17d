/* Fuzz target for the prompt lines of sd-sample and sd-train
 * (libcore/models/sample_prompts.c)
 * and what is made of them: any bytes are either refused with a reason or
 * give a job whose fields are in range; the job's A1111 infotext goes into
 * a PNG text chunk (tEXt or iTXt) of a 2x2 image, which must be
 * well-formed: every chunk's length and CRC consistent. */
#include <libdeflate.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "png_write.h"
#include "txt2img.h"

/* Walk the PNG's chunks; abort on any inconsistency. */
static void check_png(const sd_buf *png)
{
    const unsigned char *p = (const unsigned char *)png->data;
    size_t at = 8, n = png->len;
    int ended = 0;
    if (n < 8 || memcmp(p, "\x89PNG\r\n\x1a\n", 8)) abort();
    while (at < n) {
        if (n - at < 12) abort();
        size_t len = (size_t)p[at] << 24 | (size_t)p[at + 1] << 16 | (size_t)p[at + 2] << 8 | p[at + 3];
        if (len > n - at - 12) abort();
        uint32_t crc = (uint32_t)libdeflate_crc32(0, p + at + 4, len + 4);
        const unsigned char *c = p + at + 8 + len;
        if (crc != ((uint32_t)c[0] << 24 | (uint32_t)c[1] << 16 | (uint32_t)c[2] << 8 | c[3])) abort();
        ended = !memcmp(p + at + 4, "IEND", 4);
        at += 12 + len;
    }
    if (!ended) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    sd_sample_job def = {.prompt = "default", .negative = "", .steps = 20, .cfg = 7, .sampler = SD_SAMPLER_DPMPP_2M};
    sd_sample_job j;
    char why[256];
    const char *r = sd_sample_parse_line(text, size, &def, &j, why, sizeof why);
    if (r) {
        if (!why[0]) abort(); /* a reason always comes with its details */
    } else {
        if (j.steps < 1 || j.steps > 1000 || !(j.cfg >= 0 && j.cfg <= 100)) abort();
        if ((j.width && !sd_sample_size_ok(j.width)) || (j.height && !sd_sample_size_ok(j.height))) abort();
        if ((double)j.seed > SD_SAMPLE_SEED_MAX || !j.prompt || !j.negative) abort();
        sd_buf info, png;
        sd_buf_init(&info);
        sd_buf_init(&png);
        sd_sample_infotext(&j, 64, 64, "model, v1", &info);
        static const uint8_t rgb[12] = {0, 1, 2, 3, 4, 5, 250, 251, 252, 253, 254, 255};
        sd_error e = {0};
        if (!info.oom && sd_png_encode(rgb, 2, 2, "parameters", sd_buf_cstr(&info), &png, &e) == SD_OK)
            check_png(&png);
        sd_buf_free(&info);
        sd_buf_free(&png);
        free(j.prompt);
        free(j.negative);
    }
    free(text);
    return 0;
}
