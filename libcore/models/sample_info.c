/* A1111's infotext: the `parameters` text its PNGs carry, as
 * create_infotext writes it for one image (sd-sample's and sd-train's
 * samples). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "txt2img.h"

/* A1111's quote(): values holding ',', ':' or a newline become JSON
 * strings (json.dumps with ensure_ascii off), others stay as they are. */
static void put_value(sd_buf *b, const char *v)
{
    if (strpbrk(v, ",:\n")) sd_buf_json_cstr(b, v);
    else sd_buf_puts(b, v);
}

/* The sampler as A1111 names it (and its schedule type, Karras). */
static const char *a1111_sampler(sd_sampler_kind k, const char **schedule)
{
    *schedule = NULL;
    switch (k) {
    case SD_SAMPLER_DDIM: return "DDIM";
    case SD_SAMPLER_EULER: return "Euler";
    case SD_SAMPLER_EULER_A: return "Euler a";
    case SD_SAMPLER_DPMPP_2M: return "DPM++ 2M";
    case SD_SAMPLER_DPMPP_2M_KARRAS: *schedule = "Karras"; return "DPM++ 2M";
    }
    return "?";
}

/* Whether c is whitespace as Python's str.strip() sees it (ASCII part). */
static int py_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* A1111's create_infotext for one image: the prompt, "Negative prompt:"
 * when there is one, then "Key: value" pairs joined by ", ", the whole
 * stripped of surrounding whitespace. CFG scale is written as Python's
 * str of the number would be for a whole or short value (7, 7.5). */
void sd_sample_infotext(const sd_sample_job *j, int width, int height, const char *model_name, sd_buf *b)
{
    sd_buf t;
    sd_buf_init(&t);
    const char *sched;
    const char *sampler = a1111_sampler(j->sampler, &sched);
    sd_buf_puts(&t, j->prompt);
    if (j->negative[0]) sd_buf_printf(&t, "\nNegative prompt: %s", j->negative);
    sd_buf_printf(&t, "\nSteps: %d, Sampler: ", j->steps);
    put_value(&t, sampler);
    if (sched) sd_buf_printf(&t, ", Schedule type: %s", sched);
    sd_buf_printf(&t, ", CFG scale: %.15g, Seed: %llu, Size: %dx%d", j->cfg, (unsigned long long)j->seed, width, height);
    if (model_name && model_name[0]) {
        sd_buf_puts(&t, ", Model: ");
        put_value(&t, model_name);
    }
    sd_buf_printf(&t, ", Version: sdtk %s", sd_version());
    size_t s = 0, e = t.len;
    while (s < e && py_space(t.data[s])) s++;
    while (e > s && py_space(t.data[e - 1])) e--;
    sd_buf_put(b, t.data + s, e - s);
    sd_buf_free(&t);
}

