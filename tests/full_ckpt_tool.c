/* The full single-file checkpoint (libcore/models/full_ckpt.h) for the
 * tests and the golden script:
 *   full_ckpt_tool write OUT UNET BASE fp32|fp16|bf16 [CONFIGS]
 *     writes OUT from the UNet at UNET and the VAE and text encoders of BASE;
 *   full_ckpt_tool compare FILE UNET BASE [CONFIGS]
 *     reads FILE back with sdtk's single-file loaders (UNet, VAE encoder and
 *     decoder, each text encoder) and compares every parameter with the same
 *     model loaded from its source (rounded to FILE's dtype first): exit 0
 *     when all are equal, 1 naming the first difference;
 *   CONFIGS (default BASE) is a model folder whose vae/ and text_encoder(_2)/
 *   config.json describe a single file's parts (tiny models' norm groups
 *   and heads are not what inference assumes);
 *   full_ckpt_tool names FILE
 *     prints each tensor's name, dtype and shape, one a line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "f16.h"
#include "full_ckpt.h"
#include "model_dir.h"

/* src rounded through the file's dtype, as the writer stored it. */
static float as_stored(float x, int dtype)
{
    if (dtype == SD_ST_F16) return sd_f16_to_f32(sd_f32_to_f16(x));
    if (dtype == SD_ST_BF16) return sd_bf16_to_f32(sd_f32_to_bf16(x));
    return x;
}

/* Two loads of one model: same slots, and every value of b is a's as the
 * file stores it. Prints the verdict; nonzero on a difference. */
static int same(const char *what, const sd_weights *a, const sd_weights *b, int dtype)
{
    if (a->nslots != b->nslots || a->total != b->total) {
        printf("%s: %zu slots / %zu floats from the source, %zu / %zu from the file\n", what, a->nslots, a->total,
               b->nslots, b->total);
        return 1;
    }
    for (size_t i = 0; i < a->nslots; i++) {
        const sd_weight_slot *s = &a->slots[i];
        for (size_t k = 0; k < s->n; k++) {
            float want = as_stored(a->data[s->off + k], dtype), got = b->data[b->slots[i].off + k];
            if (memcmp(&want, &got, sizeof want) != 0) {
                printf("%s: %s [%zu]: %.9g from the source, %.9g from the file\n", what, s->name, k, want, got);
                return 1;
            }
        }
    }
    printf("%s: %zu tensors equal\n", what, a->nslots);
    return 0;
}

/* DIR/SUB/config.json when BASE is a folder holding it, else NULL: the
 * single file carries no VAE or encoder config, and tiny models differ
 * from what inference assumes (norm groups, heads). */
static const char *config_of(char *buf, size_t cap, const char *base, const char *sub)
{
    snprintf(buf, cap, "%s/%s/config.json", base, sub);
    return sd_is_file(buf) ? buf : NULL;
}

/* The dtype of FILE's first tensor (every tensor but position_ids has it). */
static int file_dtype(const char *path, sd_error *err)
{
    sd_safetensors *st = NULL;
    if (sd_st_open(&st, path, err)) return -1;
    int d = sd_st_count(st) ? (int)sd_st_tensor_at(st, 0)->dtype : SD_ST_F32;
    sd_st_close(st);
    return d;
}

/* compare: every part loaded from FILE and from its source (configs from
 * the folder cfgs for both, where it has them). */
static int compare(const char *file, const char *unet, const char *base, const char *cfgs)
{
    sd_error e = {0};
    int dtype = file_dtype(file, &e), bad = 0;
    sd_unet ua, ub;
    if (dtype < 0 || sd_unet_load(&ua, unet, NULL, &e)) goto fail;
    if (sd_unet_load(&ub, file, NULL, &e)) {
        sd_unet_free(&ua);
        goto fail;
    }
    bad |= same("unet", &ua.w, &ub.w, dtype);
    int sdxl = ua.cfg.text_time;
    sd_unet_free(&ua);
    sd_unet_free(&ub);
    char cfg[4096];
    sd_vae_opts vo = {.config_path = config_of(cfg, sizeof cfg, cfgs, "vae")};
    sd_vae va, vb;
    if (sd_vae_load(&va, base, &vo, &e)) goto fail;
    if (sd_vae_load(&vb, file, &vo, &e)) {
        sd_vae_free(&va);
        goto fail;
    }
    bad |= same("vae encoder", &va.w, &vb.w, dtype);
    sd_vae_free(&va);
    sd_vae_free(&vb);
    sd_vae_decoder da, db;
    if (sd_vae_decoder_load(&da, base, &vo, &e)) goto fail;
    if (sd_vae_decoder_load(&db, file, &vo, &e)) {
        sd_vae_decoder_free(&da);
        goto fail;
    }
    bad |= same("vae decoder", &da.w, &db.w, dtype);
    sd_vae_decoder_free(&da);
    sd_vae_decoder_free(&db);
    for (int i = 0; i < (sdxl ? 2 : 1); i++) {
        sd_clip_text ta, tb;
        const char *tc = config_of(cfg, sizeof cfg, cfgs, i ? "text_encoder_2" : "text_encoder");
        sd_clip_text_opts oa = {.which = i, .config_path = tc}, ob = oa;
        if (sd_clip_text_load(&ta, base, &oa, &e)) goto fail;
        if (sd_clip_text_load(&tb, file, &ob, &e)) {
            sd_clip_text_free(&ta);
            goto fail;
        }
        printf("text encoder %d read as %s\n", i, tb.layout);
        bad |= same(i ? "text encoder 2" : "text encoder", &ta.w, &tb.w, dtype);
        sd_clip_text_free(&ta);
        sd_clip_text_free(&tb);
    }
    return bad;
fail:
    fprintf(stderr, "full_ckpt_tool: %s\n", e.msg);
    return 2;
}

/* write: the UNet at unet, the rest from base (configs from the folder
 * cfgs, where it has them), into out. */
static int write_file(const char *out, const char *unet, const char *base, const char *dt, const char *cfgs)
{
    int dtype = strcmp(dt, "fp16") == 0 ? SD_ST_F16 : strcmp(dt, "bf16") == 0 ? SD_ST_BF16 : SD_ST_F32;
    sd_error e = {0};
    sd_unet u;
    if (sd_unet_load(&u, unet, NULL, &e)) {
        fprintf(stderr, "full_ckpt_tool: %s\n", e.msg);
        return 2;
    }
    char c0[4096], c1[4096], c2[4096];
    sd_full_opts fo = {.vae_config = config_of(c0, sizeof c0, cfgs, "vae"),
                       .text_config = {config_of(c1, sizeof c1, cfgs, "text_encoder"),
                                       config_of(c2, sizeof c2, cfgs, "text_encoder_2")}};
    sd_full_parts p;
    sd_status rc = sd_full_parts_load(&p, base, &u.cfg, &fo, &e);
    if (!rc) {
        rc = sd_full_ckpt_write(out, &u, u.w.data, &p, dtype, &e);
        printf("%s: %s\n", out, sd_full_family_name(p.family));
        sd_full_parts_free(&p);
    }
    sd_unet_free(&u);
    if (rc) fprintf(stderr, "full_ckpt_tool: %s\n", e.msg);
    return rc ? 2 : 0;
}

/* names: the file's tensors, for the golden name list. */
static int names(const char *file)
{
    sd_error e = {0};
    sd_safetensors *st = NULL;
    if (sd_st_open(&st, file, &e)) {
        fprintf(stderr, "full_ckpt_tool: %s\n", e.msg);
        return 2;
    }
    for (size_t i = 0; i < sd_st_count(st); i++) {
        const sd_st_tensor *t = sd_st_tensor_at(st, i);
        printf("%s %s", t->name, sd_st_dtype_name(t->dtype));
        for (int k = 0; k < t->ndim; k++) printf("%s%llu", k ? "," : " ", (unsigned long long)t->shape[k]);
        printf("\n");
    }
    sd_st_close(st);
    return 0;
}

int main(int argc, char **argv)
{
    if ((argc == 6 || argc == 7) && strcmp(argv[1], "write") == 0)
        return write_file(argv[2], argv[3], argv[4], argv[5], argc == 7 ? argv[6] : argv[4]);
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "compare") == 0)
        return compare(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : argv[4]);
    if (argc == 3 && strcmp(argv[1], "names") == 0) return names(argv[2]);
    fprintf(stderr, "usage: full_ckpt_tool write OUT UNET BASE fp32|fp16|bf16 [CONFIGS] | compare FILE UNET BASE "
                    "[CONFIGS] | names FILE\n");
    return 2;
}
