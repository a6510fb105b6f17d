/* kohya-ss/sd-scripts cache files: latents npz per image (legacy <stem>.npz
 * and <stem>_WWWWxHHHH_sd.npz / _sdxl.npz), SDXL text-encoder outputs
 * <stem>_te_outputs.npz, and meta_lat.json / meta_cap_dd.json. Loaders
 * validate keys, dtypes and shapes as sd-scripts writes them (reference:
 * docs/FORMATS.md "kohya cache interop"); writers produce the same layout. */
#ifndef SDTK_KOHYA_CACHE_H
#define SDTK_KOHYA_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "buf.h"
#include "err.h"
#include "json.h"
#include "npz.h"
#include "strmap.h"

typedef enum {
    SD_KOHYA_NONE = 0,  /* not a kohya cache name */
    SD_KOHYA_LEGACY,    /* <stem>.npz */
    SD_KOHYA_SD,        /* <stem>_WWWWxHHHH_sd.npz */
    SD_KOHYA_SDXL,      /* <stem>_WWWWxHHHH_sdxl.npz */
    SD_KOHYA_TE         /* <stem>_te_outputs.npz */
} sd_kohya_kind;

sd_kohya_kind sd_kohya_classify(const char *base, size_t *stem_len, uint32_t *w, uint32_t *h);
const char *sd_kohya_kind_name(sd_kohya_kind k);
int sd_kohya_kind_parse(const char *name, sd_kohya_kind *out);
void sd_kohya_file_name(sd_buf *out, const char *stem, sd_kohya_kind k, uint32_t w, uint32_t h);

/* A loaded latents npz; the members point into z. */
typedef struct {
    sd_npz z;
    const sd_npz_member *latents, *flipped, *alpha;
    uint32_t c, h, w;  /* latent shape (channels, height/8, width/8) */
    int64_t orig_w, orig_h;
    double crop[4];    /* crop_ltrb as stored: sd-scripts' letterbox offsets (get_crop_ltrb) */
} sd_kohya_latents;

/* A loaded SDXL text-encoder-outputs npz. */
typedef struct {
    sd_npz z;
    const sd_npz_member *h1, *h2, *pool; /* (T,768), (T,1280), (1280,) */
    uint32_t tokens;                     /* T: 77, 152 or 227 */
} sd_kohya_te;

sd_status sd_kohya_latents_load(const char *path, sd_kohya_latents *out, const char **reason, sd_error *err);
sd_status sd_kohya_latents_check(sd_kohya_latents *out, const char **reason, sd_error *err);
void sd_kohya_latents_free(sd_kohya_latents *l);
sd_status sd_kohya_te_load(const char *path, sd_kohya_te *out, const char **reason, sd_error *err);
sd_status sd_kohya_te_check(sd_kohya_te *out, const char **reason, sd_error *err);
void sd_kohya_te_free(sd_kohya_te *t);

/* What the latents writer needs: float32 data as kohya writes it. */
typedef struct {
    uint32_t c, h, w;
    const float *latents, *flipped; /* flipped may be NULL */
    const float *alpha_mask;        /* (h * 8, w * 8), 0..1, or NULL */
    int64_t orig_w, orig_h;
    double crop_ltrb[4]; /* sd-scripts' convention: sd_kohya_crop_ltrb(bucket, original size) */
} sd_kohya_latents_out;

sd_status sd_kohya_latents_encode(const sd_kohya_latents_out *l, sd_buf *out, sd_error *err);

/* crop_ltrb and sdtk's crop box are two conventions (docs/FORMATS.md): the
 * first is the image fitted inside the bucket (libcore's sd_kohya_crop_ltrb),
 * the second the box cut from the resized image. Both follow from the
 * original size and the bucket under sd-scripts' default bucketing. */
void sd_kohya_cut_box(uint32_t orig_w, uint32_t orig_h, uint32_t bucket_w, uint32_t bucket_h, double box[4]);
int sd_kohya_crop_is_ltrb(const double crop[4], uint32_t orig_w, uint32_t orig_h, uint32_t bucket_w,
                          uint32_t bucket_h);
sd_status sd_kohya_te_encode(int npy_dtype, uint32_t tokens, const void *h1, const void *h2, const void *pool,
                             sd_buf *out, sd_error *err);

/* meta_lat.json / meta_cap_dd.json: key -> caption, tags, train_resolution.
 * Keys are image stems ("001") or, with sd-scripts' --full_path, image
 * paths ("/data/km/cats/001.png"). */
typedef struct {
    const char *key;            /* the JSON key, NUL-terminated */
    const char *caption, *tags; /* NULL when absent */
    uint32_t train_w, train_h;  /* 0 when absent */
} sd_kohya_meta_entry;

typedef struct {
    sd_buf text;
    sd_arena arena;
    sd_kohya_meta_entry *e;
    size_t *next_same_base; /* per entry: index+1 of the next entry with its base stem, 0 = none */
    size_t n;
    sd_strmap by_key;  /* exact key -> index+1 */
    sd_strmap by_base; /* base stem (no directories, no image extension) -> index+1 of the first */
} sd_kohya_meta;

/* The entry for a record name, found by the longest run of trailing path
 * components the name and a key share (the key's image extension removed).
 * A match on the base name alone counts only when no other entry has that
 * base name; equally good candidates are ambiguous and give no entry. */
typedef struct {
    const sd_kohya_meta_entry *entry;   /* NULL: none matches, or several do */
    const sd_kohya_meta_entry *cand[2]; /* with ambiguous: two of the candidates */
    int depth;                          /* components matched (1: the base name only) */
    int ambiguous;
} sd_kohya_meta_match;

sd_status sd_kohya_meta_load(sd_kohya_meta *m, const char *path, sd_error *err);
sd_status sd_kohya_meta_index_keys(sd_kohya_meta *m, const char *const *keys, size_t n, sd_error *err);
void sd_kohya_meta_find(const sd_kohya_meta *m, const char *name, sd_kohya_meta_match *out);
void sd_kohya_meta_free(sd_kohya_meta *m);

#endif
