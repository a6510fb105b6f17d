/* What a resumed run changes: the checkpoint's train_config.json against
 * this run's options. The state file already refuses what would make the
 * continuation meaningless (seed, batch, accumulation, prediction, noise
 * schedule, data); the options here may change on purpose (a lower lr, a
 * longer run), so they are named in one warning instead of refused. */
#include <string.h>

#include "arena.h"
#include "buf.h"
#include "json.h"
#include "log.h"
#include "slurp.h"
#include "train.h"

/* The options that change the steps a resumed run takes. */
static const char *const tracked[] = {
    "steps", "epochs", "lr", "lr-schedule", "warmup", "beta1", "beta2", "adam-eps", "weight-decay",
    "max-grad-norm", "ema-decay", "ema-every", "snr-gamma", "noise-offset", "input-perturbation",
    "min-timestep", "max-timestep", "dropout", "no-flip", "adam-moments", "masked-loss",
    "fused-backward", "clip-per-tensor", "grad-dtype", "adafactor-beta1"};

/* A member's JSON text (both files are written by sd_cli_values_json, so
 * equal values have equal text); "(none)" when absent. */
static void value_text(const sd_json *obj, const char *key, const char *pristine, sd_buf *out)
{
    const sd_json *v = sd_json_get(obj, key);
    if (!v) sd_buf_puts(out, "(none)");
    else sd_buf_put(out, pristine + v->raw_off, v->raw_len);
}

/* Does the LR schedule ignore the run's length (constant, with or without
 * warmup)? Then --steps / --epochs change nothing in the steps taken. */
static int schedule_is_fixed(const sd_json *cfg)
{
    const sd_json *v = sd_json_get(cfg, "lr-schedule");
    const char *s = v ? sd_json_str(v) : NULL;
    return !s || strcmp(s, "constant") == 0 || strcmp(s, "constant_with_warmup") == 0;
}

/* Warn once, naming each tracked option whose value differs (old -> new).
 * Silent when either side has no configuration to compare. */
void sd_train_resume_diff(const char *ckpt_config_path, const char *run_config_json)
{
    if (!run_config_json) return;
    sd_buf was_text, now_text, was_copy, now_copy, list, a, b;
    sd_buf_init(&was_text);
    sd_buf_init(&now_text);
    sd_buf_init(&was_copy);
    sd_buf_init(&now_copy);
    sd_buf_init(&list);
    sd_buf_init(&a);
    sd_buf_init(&b);
    sd_arena ar;
    sd_arena_init(&ar, 1 << 14);
    sd_error err = {0};
    sd_json *was = NULL, *now = NULL;
    if (sd_read_file(ckpt_config_path, &was_text, &err) == SD_OK && was_text.len > 0) {
        sd_buf_put(&was_copy, was_text.data, was_text.len); /* parsing unescapes in place */
        sd_buf_put(&now_text, run_config_json, strlen(run_config_json));
        sd_buf_put(&now_copy, run_config_json, strlen(run_config_json));
        if (sd_json_parse(&ar, was_text.data, was_text.len, &was, &err) != SD_OK ||
            sd_json_parse(&ar, now_text.data, now_text.len, &now, &err) != SD_OK)
            was = now = NULL;
    }
    int n = 0, fixed = was && now && schedule_is_fixed(was) && schedule_is_fixed(now);
    for (size_t i = 0; was && now && i < sizeof tracked / sizeof *tracked; i++) {
        /* a longer run under a schedule that ignores its length is the usual resume: no word */
        if (fixed && (strcmp(tracked[i], "steps") == 0 || strcmp(tracked[i], "epochs") == 0)) continue;
        a.len = b.len = 0;
        value_text(was, tracked[i], was_copy.data, &a);
        value_text(now, tracked[i], now_copy.data, &b);
        if (a.len == b.len && memcmp(a.data, b.data, a.len) == 0) continue;
        sd_buf_puts(&list, n++ ? ", " : "");
        sd_buf_puts(&list, tracked[i]);
        sd_buf_puts(&list, " ");
        sd_buf_put(&list, a.data, a.len);
        sd_buf_puts(&list, " -> ");
        sd_buf_put(&list, b.data, b.len);
    }
    if (n && !list.oom)
        sd_log(SD_LOG_WARN, "resuming with other options than %s: %.*s (the steps from here differ from the "
               "original run's)", ckpt_config_path, (int)list.len, list.data);
    sd_arena_free(&ar);
    sd_buf_free(&was_text);
    sd_buf_free(&now_text);
    sd_buf_free(&was_copy);
    sd_buf_free(&now_copy);
    sd_buf_free(&list);
    sd_buf_free(&a);
    sd_buf_free(&b);
}
