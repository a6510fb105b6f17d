/* sd-latents against an existing shard's meta: the record-shaping options
 * a rerun must share with the shard (a shard of fp16 and fp32, flipped and
 * unflipped records would have a meta that names only one kind), and the
 * --shard parts whose runs wrote it (meta "parts"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "json.h"
#include "latents.h"
#include "log.h"

/* One meta entry parsed as JSON into a (its text in *raw, freed by the
 * caller); NULL when absent or not JSON. */
static const sd_json *meta_json(sd_shard *s, const char *key, sd_arena *a, char **raw)
{
    sd_error e = {0};
    sd_json *root = NULL;
    *raw = NULL;
    if (sd_shard_meta_get(s, key, raw, &e)) return NULL;
    if (sd_json_parse(a, *raw, strlen(*raw), &root, &e)) return NULL;
    return root;
}

/* A string member of obj, or NULL. */
static const char *json_str(const sd_json *obj, const char *key)
{
    const sd_json *m = obj ? sd_json_get(obj, key) : NULL;
    return m && m->type == SD_JSON_STRING ? m->str : NULL;
}

/* One recorded setting against this run's, as text: a difference is
 * appended to was and now ("dtype fp16" / "dtype fp32"). */
static void compare(sd_buf *was, sd_buf *now, const char *what, const char *recorded, const char *wanted)
{
    if (!recorded || !strcmp(recorded, wanted)) return;
    sd_buf_printf(was, "%s%s %s", was->len ? ", " : "", what, recorded);
    sd_buf_printf(now, "%s%s %s", now->len ? ", " : "", what, wanted);
}

/* See latents.h. */
sd_status latents_check_options(sd_shard *s, const latents_opts *o, int dtype, sd_error *err)
{
    sd_arena a;
    sd_arena_init(&a, 1 << 12);
    char *raw_dt = NULL, *raw_opt = NULL, seed_was[32] = "", seed_now[32];
    const sd_json *dt = meta_json(s, SD_SHARD_META_DTYPES, &a, &raw_dt);
    const sd_json *opt = meta_json(s, SD_SHARD_META_OPTIONS, &a, &raw_opt);
    const sd_json *flip = opt ? sd_json_get(opt, "flip") : NULL, *seed = opt ? sd_json_get(opt, "seed") : NULL;
    const char *mode = json_str(opt, "mode"), *act = json_str(opt, "vae_activations");
    /* the seed draws only --sample's noise; compared as its JSON text, exactly (a double loses seeds over 2^53) */
    if (mode && !strcmp(mode, "sample") && o->sample && seed && seed->type == SD_JSON_NUMBER && seed->str)
        snprintf(seed_was, sizeof seed_was, "%.*s", (int)seed->len, seed->str);
    snprintf(seed_now, sizeof seed_now, "%llu", (unsigned long long)o->seed);
    sd_buf was, now;
    sd_buf_init(&was);
    sd_buf_init(&now);
    compare(&was, &now, "dtype", json_str(dt, "latent"), sd_dtype_name(dtype));
    compare(&was, &now, "mode", mode, o->sample ? "sample" : "mean_std");
    if (flip && (flip->type == SD_JSON_TRUE || flip->type == SD_JSON_FALSE))
        compare(&was, &now, "flip", flip->type == SD_JSON_TRUE ? "true" : "false", o->flip ? "true" : "false");
    compare(&was, &now, "seed", seed_was[0] ? seed_was : NULL, seed_now);
    compare(&was, &now, "vae_activations", act, sd_dtype_name(o->vae_act ? o->vae_act : SD_DT_F32));
    sd_status st = SD_OK;
    if (was.len) { /* said in full here: an sd_error holds 256 bytes */
        sd_log(SD_LOG_ERROR, "%s holds records made with %s (its meta); this run's would have %s: the shard would "
               "mix both kinds under a meta naming one. Rerun with the shard's --dtype, --flip, --sample, --seed and "
               "--vae-activations, or write to a new shard (-o)", sd_shard_path(s), sd_buf_cstr(&was),
               sd_buf_cstr(&now));
        st = sd_err_set(err, SD_EINVAL, "%s: nothing written (other record options than the shard's)",
                        sd_shard_path(s));
    }
    sd_buf_free(&was);
    sd_buf_free(&now);
    free(raw_dt);
    free(raw_opt);
    sd_arena_free(&a);
    return st;
}

/* The parts recorded in the shard's meta: "parts", or from shards written
 * before it the options' "shard" (the last writing run's part: all that is
 * known of them). Calls fn on each "I/N". */
static void each_part(sd_shard *s, void (*fn)(void *ctx, const char *part), void *ctx)
{
    sd_arena a;
    sd_arena_init(&a, 1 << 12);
    char *raw = NULL;
    const sd_json *parts = meta_json(s, SD_SHARD_META_PARTS, &a, &raw);
    if (parts && parts->type == SD_JSON_ARRAY) {
        for (const sd_json *p = parts->child; p; p = p->next)
            if (p->type == SD_JSON_STRING) fn(ctx, p->str);
    } else {
        free(raw);
        const char *legacy = json_str(meta_json(s, SD_SHARD_META_OPTIONS, &a, &raw), "shard");
        if (legacy) fn(ctx, legacy);
    }
    free(raw);
    sd_arena_free(&a);
}

/* each_part's collector for latents_parts_json. */
typedef struct {
    sd_buf *out;
    const char *mine;
    int have_mine;
} parts_ctx;

/* Append one part to the JSON list, noting whether it is this run's. */
static void add_part(void *vctx, const char *part)
{
    parts_ctx *c = vctx;
    sd_buf_puts(c->out, c->out->len > 1 ? ", " : "");
    sd_buf_json_cstr(c->out, part);
    c->have_mine |= !strcmp(part, c->mine);
}

/* See latents.h. */
void latents_parts_json(sd_shard *s, const latents_opts *o, sd_buf *out)
{
    char mine[32];
    snprintf(mine, sizeof mine, "%d/%d", o->shard_index, o->shard_count);
    parts_ctx c = {out, mine, 0};
    sd_buf_putc(out, '[');
    each_part(s, add_part, &c);
    if (!c.have_mine) add_part(&c, mine);
    sd_buf_putc(out, ']');
}

/* each_part's finder of another part of this run's split. */
typedef struct {
    const latents_opts *o;
    char other[32];
} other_ctx;

/* Note part when it is another I of this run's N. */
static void find_other(void *vctx, const char *part)
{
    other_ctx *c = vctx;
    int i, n;
    char tail;
    if (!c->other[0] && sscanf(part, "%d/%d%c", &i, &n, &tail) == 2 && n == c->o->shard_count &&
        i != c->o->shard_index)
        snprintf(c->other, sizeof c->other, "%s", part);
}

/* Whether the shard's producer is sd-pack (a merge of parts), not one
 * sd-latents run. */
static int merged(sd_shard *s)
{
    char *p = NULL;
    sd_error e = {0};
    if (sd_shard_meta_get(s, SD_SHARD_META_PRODUCER, &p, &e)) return 0;
    int yes = strncmp(p, "sd-pack", 7) == 0;
    free(p);
    return yes;
}

/* See latents.h. */
void latents_warn_other_part(sd_shard *s, const latents_opts *o)
{
    /* another I of the same N only: a whole-input run (0/1) into a part, or a
     * part rerun into a merged file (whose meta is its first input's), is no
     * mistake */
    if (o->shard_count <= 1 || merged(s)) return;
    other_ctx c = {o, ""};
    each_part(s, find_other, &c);
    if (c.other[0])
        sd_log(SD_LOG_WARN, "%s was written by --shard %s; this run is --shard %d/%d: the shard will hold the "
               "records of both parts (give each part its own -o)", sd_shard_path(s), c.other, o->shard_index,
               o->shard_count);
}
