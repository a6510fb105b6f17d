/* sd-pack import-kohya: a directory of sd-scripts caches (latents npz per
 * image, SDXL <stem>_te_outputs.npz, optional meta_lat.json) becomes one
 * shard. Resumable: names already in the output are skipped. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bucket.h"
#include "cli.h"
#include "dtoa.h"
#include "half.h"
#include "json.h"
#include "keyset.h"
#include "kohya_cache.h"
#include "log.h"
#include "pack.h"

typedef struct {
    char *rel, *name; /* path under DIR; image stem with its directories */
    sd_kohya_kind kind;
} cache_file;

typedef struct {
    cache_file *v;
    size_t n, cap;
} file_list;

typedef struct {
    const char *dir, *meta_path, *dtype_name, *output;
    int npy_dtype; /* target element type, -1 = keep the file's */
    double scale;  /* --scale; 0 = by the cache names */
    int allow_mixed; /* --allow-mixed: import into a shard made otherwise */
    pack_common pc;
} options;

typedef struct {
    const options *o;
    pack_out out;
    sd_kohya_meta meta;
    int have_meta;
    sd_strmap bases; /* base name of each image -> how many images have it */
    file_list lat, te;
    sd_tally tally;
    sd_progress prog;
    uint64_t imported, present, texts_new;
    sd_buf rec, conv[4], path;
    int meta_done;
    int keep_meta; /* an existing shard: its producer, kohya_layout and options stay */
    char *dtypes[2]; /* stored dtype names of latents and text embeddings ("fp16"), NULL = none yet */
} run;

/* Add one file to a list (takes the strings). */
static int list_add(file_list *l, char *rel, char *name, sd_kohya_kind k)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 256;
        cache_file *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) return -1;
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = (cache_file){rel, name, k};
    return 0;
}

/* Free a list and its strings. */
static void list_free(file_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].rel);
        free(l->v[i].name);
    }
    free(l->v);
}

/* Order by name, then kind (legacy first: sd-scripts prefers it). */
static int file_cmp(const void *a, const void *b)
{
    const cache_file *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (int)x->kind - (int)y->kind;
}

/* A directory on the walk's current path (its device and inode, and its
 * path under DIR), linked to the one above it: a directory met again among
 * its own ancestors is a loop (a symbolic link such as "again -> .") that
 * would otherwise import its files under ever longer names. */
typedef struct dir_on_path {
    dev_t dev;
    ino_t ino;
    const char *rel;
    const struct dir_on_path *up;
} dir_on_path;

/* The ancestor of a walk that is the directory sb describes, or NULL. */
static const dir_on_path *ancestor_of(const dir_on_path *path, const struct stat *sb)
{
    for (; path; path = path->up)
        if (path->dev == sb->st_dev && path->ino == sb->st_ino) return path;
    return NULL;
}

/* Add one cache file found at rel (base name base) to its kind's list,
 * unless the record name it gives exceeds the shard's name limit (a skip
 * naming the file: reruns would meet it again). */
static sd_status add_file(run *r, const char *rel, const char *base, sd_error *err)
{
    size_t stem;
    uint32_t w, h;
    sd_kohya_kind k = sd_kohya_classify(base, &stem, &w, &h);
    if (k == SD_KOHYA_NONE) return SD_OK;
    size_t prefix = strlen(rel) - strlen(base);
    if (prefix + stem > SD_SHARD_MAX_KEY) {
        sd_skip(&r->tally, "record name too long", "%s/%s (record name %zu bytes, limit %d)", r->o->dir, rel,
                prefix + stem, SD_SHARD_MAX_KEY);
        return SD_OK;
    }
    char *name = malloc(prefix + stem + 1), *relc = strdup(rel);
    if (name && relc) {
        memcpy(name, rel, prefix + stem);
        name[prefix + stem] = 0;
        if (!list_add(k == SD_KOHYA_TE ? &r->te : &r->lat, relc, name, k)) return SD_OK;
    }
    free(name);
    free(relc);
    return sd_err_set(err, SD_ENOMEM, "out of memory");
}

/* Walk the directory here (DIR/here->rel) recursively, collecting cache
 * files by kind. Directory links are followed, except one leading back to
 * a directory on the current path (a "directory loop" skip naming the
 * link); paths too long and nesting past 32 levels are skips too. */
static sd_status walk(run *r, const dir_on_path *here, int depth, sd_error *err)
{
    const char *sub = here->rel;
    char path[4096];
    snprintf(path, sizeof path, "%s%s%s", r->o->dir, *sub ? "/" : "", sub);
    DIR *d = opendir(path);
    if (!d) return sd_err_set(err, SD_EIO, "%s: cannot open directory", path);
    struct dirent *e;
    sd_status st = SD_OK;
    while (!st && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char rel[4096], full[8192];
        if (snprintf(rel, sizeof rel, "%s%s%s", sub, *sub ? "/" : "", e->d_name) >= (int)sizeof rel) {
            sd_skip(&r->tally, "path too long", "%s/%s%s%.64s... (over %zu bytes)", r->o->dir, sub, *sub ? "/" : "",
                    e->d_name, sizeof rel - 1);
            continue;
        }
        snprintf(full, sizeof full, "%s/%s", r->o->dir, rel);
        struct stat sb;
        if (stat(full, &sb)) continue;
        if (S_ISDIR(sb.st_mode)) {
            const dir_on_path *loop = ancestor_of(here, &sb), next = {sb.st_dev, sb.st_ino, rel, here};
            if (loop)
                sd_skip(&r->tally, "directory loop", "%s (leads back to %s%s%s; not followed)", full, r->o->dir,
                        *loop->rel ? "/" : "", loop->rel);
            else if (depth >= 32)
                sd_skip(&r->tally, "directories nested too deep", "%s (over 32 levels; not followed)", full);
            else
                st = walk(r, &next, depth + 1, err);
            continue;
        }
        if (S_ISREG(sb.st_mode)) st = add_file(r, rel, e->d_name, err);
    }
    closedir(d);
    return st;
}

/* Walk DIR from its top (its own identity starts the path a loop is
 * detected on). */
static sd_status walk_top(run *r, sd_error *err)
{
    struct stat sb;
    if (stat(r->o->dir, &sb) || !S_ISDIR(sb.st_mode))
        return sd_err_set(err, SD_EIO, "%s: cannot open directory", r->o->dir);
    const dir_on_path top = {sb.st_dev, sb.st_ino, "", NULL};
    return walk(r, &top, 0, err);
}

/* The te_outputs file of an image name, or NULL. */
static const cache_file *find_te(const run *r, const char *name)
{
    cache_file key = {NULL, (char *)name, SD_KOHYA_TE};
    if (!r->te.n) return NULL;
    return bsearch(&key, r->te.v, r->te.n, sizeof key, file_cmp);
}

/* A 16-byte content key (XXH3-128 of the bytes). */
static void key16(const void *data, size_t n, uint8_t out[16])
{
    sd_key128 k = sd_key128_of(data, n);
    memcpy(out, &k.lo, 8);
    memcpy(out + 8, &k.hi, 8);
}

/* Convert one npz array into scratch buffer b as element type to. */
static sd_status convert(sd_buf *b, int to, const sd_npz_member *m, sd_error *err)
{
    size_t n = (size_t)m->info.count;
    sd_buf_clear(b);
    if (sd_buf_reserve(b, n * sd_npy_dtype_size((sd_npy_dtype)to) + 16)) return sd_err_set(err, SD_ENOMEM, "out of memory");
    b->len = n * sd_npy_dtype_size((sd_npy_dtype)to);
    return sd_convert((sd_npy_dtype)to, b->data, m->info.dtype, m->data, n, err);
}

/* The stored element type for an array of kind which (0 latents, 1 text
 * embeddings): --dtype, else the one the shard records for that kind (its
 * first record's, maybe an earlier run's), else the file's own (fp64 ->
 * fp32). One shard then holds one element type per kind. */
static int target_dtype(const run *r, int which, const sd_npz_member *m)
{
    if (r->o->npy_dtype >= 0) return r->o->npy_dtype;
    sd_npy_dtype kept;
    if (r->dtypes[which] && sd_npy_dtype_parse(r->dtypes[which], &kept) == 0 && sd_npy_is_float(kept) &&
        kept != SD_NPY_F64)
        return kept;
    return m->info.dtype == SD_NPY_F16 ? SD_NPY_F16 : SD_NPY_F32;
}

/* The members of the dtypes meta entry: latents, text embeddings. */
static const char *const dtype_keys[2] = {"latent", "text"};

/* A resumed or extended shard that records another element type than
 * --dtype asks for would end up holding both: refused, naming both. */
static sd_status check_dtypes(const run *r, sd_error *err)
{
    if (r->o->npy_dtype < 0) return SD_OK;
    const char *want = sd_dtype_name(pack_shard_dtype(r->o->npy_dtype));
    for (int i = 0; i < 2; i++)
        if (r->dtypes[i] && strcmp(r->dtypes[i], want))
            return sd_err_set(err, SD_EINVAL, "%s: holds %s %s from an earlier run; --dtype %s would mix element "
                              "types in one shard (rerun with --dtype %s, or import into a new shard)",
                              r->out.tmp ? r->out.tmp : r->out.final, r->dtypes[i], i ? "text embeddings" : "latents", r->o->dtype_name,
                              r->dtypes[i]);
    return SD_OK;
}

/* The dtypes meta entry already in the output (a resumed or extended
 * shard), so a run that stores no text embedding keeps the text dtype an
 * earlier run recorded. */
static sd_status load_dtypes(run *r, sd_error *err)
{
    char *v = NULL;
    sd_status st = sd_shard_meta_get(r->out.s, SD_SHARD_META_DTYPES, &v, err);
    if (st) return st == SD_ENOTFOUND ? SD_OK : st;
    sd_arena a;
    sd_arena_init(&a, 1 << 12);
    sd_json *root;
    sd_error e;
    if (sd_json_parse(&a, v, strlen(v), &root, &e) == SD_OK && root->type == SD_JSON_OBJECT)
        for (int i = 0; i < 2; i++) {
            const sd_json *d = sd_json_get(root, dtype_keys[i]);
            if (d && d->type == SD_JSON_STRING && !(r->dtypes[i] = strdup(d->str))) st = SD_ENOMEM;
        }
    sd_arena_free(&a);
    free(v);
    return st ? sd_err_set(err, st, "out of memory") : SD_OK;
}

/* Record the stored dtype of latents (which 0) or text embeddings (1) in
 * the dtypes meta entry when this kind has none yet (first one wins). */
static sd_status note_dtype(run *r, int which, int npy_dtype, sd_error *err)
{
    if (r->dtypes[which]) return SD_OK;
    if (!(r->dtypes[which] = strdup(sd_dtype_name(pack_shard_dtype(npy_dtype)))))
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_buf b;
    sd_buf_init(&b);
    int first = 1;
    sd_buf_putc(&b, '{');
    for (int i = 0; i < 2; i++) {
        if (!r->dtypes[i]) continue;
        sd_buf_json_key(&b, &first, dtype_keys[i]);
        sd_buf_json_cstr(&b, r->dtypes[i]);
    }
    sd_buf_putc(&b, '}');
    sd_status st = b.oom ? sd_err_set(err, SD_ENOMEM, "out of memory")
                         : sd_shard_meta_set(r->out.s, SD_SHARD_META_DTYPES, sd_buf_cstr(&b), err);
    sd_buf_free(&b);
    return st;
}

/* Build the text-embedding record of a te_outputs file and store it unless
 * present. The key hashes the caption when the metadata has one (same
 * caption, same embedding), else the converted tensors themselves. */
static sd_status put_text(run *r, const sd_kohya_te *te, const sd_kohya_meta_entry *me, uint8_t key[16], sd_error *err)
{
    int to = target_dtype(r, 1, te->h1);
    const sd_npz_member *m[3] = {te->h1, te->h2, te->pool};
    static const int roles[3] = {SD_ROLE_HIDDEN1, SD_ROLE_HIDDEN2, SD_ROLE_POOLED};
    sd_shard_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.kind = SD_REC_TEXT;
    rec.ntensors = 3;
    sd_buf *h = &r->path;
    sd_buf_clear(h);
    for (int i = 0; i < 3; i++) {
        sd_status st = convert(&r->conv[i], to, m[i], err);
        if (st) return st;
        sd_shard_tensor *t = &rec.t[i];
        t->dtype = (uint8_t)pack_shard_dtype(to);
        t->role = (uint8_t)roles[i];
        t->ndim = (uint8_t)m[i]->info.ndim;
        for (int d = 0; d < t->ndim; d++) t->shape[d] = (uint32_t)m[i]->info.shape[d];
        t->data = r->conv[i].data;
        sd_buf_printf(h, "%d:%u,%u;", t->dtype, t->shape[0], t->shape[1]);
    }
    if (me && (me->caption || me->tags)) {
        sd_buf_puts(h, "kohya-sdxl-te caption\n");
        sd_buf_puts(h, me->caption ? me->caption : "");
        sd_buf_putc(h, '\n');
        sd_buf_puts(h, me->tags ? me->tags : "");
    } else {
        sd_buf_puts(h, "kohya-sdxl-te content\n");
        for (int i = 0; i < 3; i++) sd_buf_put(h, r->conv[i].data, r->conv[i].len);
    }
    if (h->oom) return sd_err_set(err, SD_ENOMEM, "out of memory");
    key16(h->data, h->len, key);
    int found = 0;
    sd_status st = sd_shard_text_exists(r->out.s, key, &found, err);
    if (st || found) return st;
    st = sd_shard_rec_build(&rec, &r->rec, err);
    if (!st) st = pack_out_put_text(&r->out, key, r->rec.data, r->rec.len, err);
    if (!st) st = note_dtype(r, 1, to, err);
    if (!st) r->texts_new++;
    return st;
}

/* The VAE scaling factor the trainer multiplies the latents by: sd-scripts
 * caches them unscaled, and its file names say the model (_sd / _sdxl);
 * legacy <stem>.npz names do not, so text-encoder outputs (which
 * sd-scripts caches only for SDXL) decide, with a warning. */
static double names_scale(const run *r, const cache_file *f)
{
    if (f->kind == SD_KOHYA_SDXL) return 0.13025;
    if (f->kind == SD_KOHYA_SD) return 0.18215;
    return r->te.n ? 0.13025 : 0.18215;
}

/* The shard's scaling_factor, settled before anything is imported (also
 * when every record is already there, so an earlier import without one is
 * mended): written when missing; another one in the shard is replaced
 * only by --scale, with a warning, never silently by a guess from names
 * (the shard's records were made with it). */
static sd_status settle_scale(run *r, sd_error *err)
{
    if (!r->lat.n) return SD_OK;
    const cache_file *f = &r->lat.v[0], *sd = NULL, *xl = NULL;
    for (size_t i = 0; i < r->lat.n; i++) { /* the names that say the model, each kind's first */
        if (r->lat.v[i].kind == SD_KOHYA_SD && !sd) sd = &r->lat.v[i];
        if (r->lat.v[i].kind == SD_KOHYA_SDXL && !xl) xl = &r->lat.v[i];
    }
    if (sd && xl && r->o->scale <= 0)
        return sd_err_set(err, SD_EINVAL, "%s/%s is an SD 1.x/2.x cache, %s/%s an SDXL one: one shard has one "
                          "scaling_factor; import them separately (or give --scale)", r->o->dir, sd->rel, r->o->dir,
                          xl->rel);
    if (sd || xl) f = sd ? sd : xl;
    double want = r->o->scale > 0 ? r->o->scale : names_scale(r, f);
    char now[64], *old = NULL;
    sd_dtoa_shortest(want, now, sizeof now);
    sd_error e = {0};
    sd_status st = sd_shard_meta_get(r->out.s, SD_SHARD_META_SCALING, &old, &e);
    if (st && st != SD_ENOTFOUND) return sd_err_set(err, st, "%s", e.msg);
    char *end = NULL;
    double was = old ? strtod(old, &end) : 0;
    if (old && old[0] && !*end && was == want) {
        free(old);
        return SD_OK;
    }
    if (old && r->o->scale <= 0) {
        st = sd_err_set(err, SD_EINVAL, "%s records scaling_factor %s, the cache names give %s: pass --scale %s to keep "
                        "it or --scale %s to change it", r->o->output, old, now, old, now);
        free(old);
        return st;
    }
    if (old) sd_log(SD_LOG_WARN, "%s: scaling_factor %s in the meta becomes %s (--scale)", r->o->output, old, now);
    else if (r->o->scale <= 0 && f->kind == SD_KOHYA_LEGACY)
        sd_log(SD_LOG_WARN,
               "legacy cache names (<stem>.npz) do not say the model: scaling_factor %s (%s, %s text-encoder "
               "outputs) assumed; give --scale to set it",
               now, r->te.n ? "SDXL" : "SD 1.x/2.x", r->te.n ? "with" : "no");
    free(old);
    return sd_shard_meta_set(r->out.s, SD_SHARD_META_SCALING, now, err);
}

/* Meta entries describing the import, set once (on the first record) in a
 * new shard; an existing one keeps those describing how it was made. */
static sd_status set_meta(run *r, const cache_file *f, sd_error *err)
{
    if (r->meta_done || r->keep_meta) return SD_OK;
    r->meta_done = 1;
    char buf[1024];
    snprintf(buf, sizeof buf, "sd-pack import-kohya %s", sd_version());
    sd_status st = sd_shard_meta_set(r->out.s, SD_SHARD_META_PRODUCER, buf, err);
    if (!st) st = sd_shard_meta_set(r->out.s, "kohya_layout", sd_kohya_kind_name(f->kind), err);
    sd_buf b;
    sd_buf_init(&b);
    int first = 1;
    sd_buf_putc(&b, '{');
    sd_buf_json_key(&b, &first, "dir");
    sd_buf_json_cstr(&b, r->o->dir);
    sd_buf_json_key(&b, &first, "meta");
    if (r->o->meta_path) sd_buf_json_cstr(&b, r->o->meta_path);
    else sd_buf_puts(&b, "null");
    sd_buf_json_key(&b, &first, "dtype");
    sd_buf_json_cstr(&b, r->o->dtype_name ? r->o->dtype_name : "keep");
    sd_buf_putc(&b, '}');
    if (!st) st = sd_shard_meta_set(r->out.s, SD_SHARD_META_OPTIONS, sd_buf_cstr(&b), err);
    sd_buf_free(&b);
    return st;
}

/* The base name of a record name (after its last '/'). */
static const char *base_of(const char *name)
{
    const char *slash = strrchr(name, '/');
    return slash ? slash + 1 : name;
}

/* The metadata entry of an image, or a skip reason in *skip (detail in
 * *why) when the match is ambiguous: several keys match equally well, or
 * only the base name matched and other images share it. */
static const sd_kohya_meta_entry *find_meta(const run *r, const char *name, const char **skip, sd_error *why)
{
    *skip = NULL;
    if (!r->have_meta) return NULL;
    sd_kohya_meta_match m;
    sd_kohya_meta_find(&r->meta, name, &m);
    const char *base = base_of(name);
    const sd_strmap_slot *b = sd_strmap_get(&r->bases, base, strlen(base));
    if (m.ambiguous) {
        *skip = "ambiguous metadata key";
        sd_err_set(why, SD_EINVAL, "--meta keys '%.90s' and '%.90s' match it equally well", m.cand[0]->key,
                   m.cand[1]->key);
    } else if (m.entry && m.depth == 1 && b && b->nval > 1) {
        *skip = "ambiguous metadata key";
        sd_err_set(why, SD_EINVAL, "--meta key '%.90s' matches only the base name, which %.0f images share",
                   m.entry->key, b->nval);
    }
    return *skip ? NULL : m.entry;
}

/* Why a loaded latents file (and its metadata entry) cannot be imported,
 * or NULL: a train_resolution that says the cache is stale. */
static const char *latents_problem(const sd_kohya_latents *l, const sd_kohya_meta_entry *me, sd_error *why)
{
    if (me && me->train_w && (me->train_w != l->w * 8 || me->train_h != l->h * 8)) {
        sd_err_set(why, SD_ERANGE, "latents %ux%u px, meta %ux%u", l->w * 8, l->h * 8, me->train_w, me->train_h);
        return "latents size differs from meta train_resolution";
    }
    return NULL;
}

/* The crop box to store: the one sd-scripts cut (sdtk's convention) when
 * crop_ltrb is its get_crop_ltrb value for this size and bucket; else the
 * file's crop_ltrb as it is, flagged SD_REC_F_CROP_FLOAT (another bucketing,
 * e.g. bucket_no_upscale, or another sd-scripts version: the latents are
 * still good, and the trainer then conditions on kohya's values, as kohya
 * would), with a warning naming the file. Returns the flag. */
static uint16_t crop_box(const sd_kohya_latents *l, const char *path, uint32_t bw, uint32_t bh, double box[4])
{
    if (sd_kohya_crop_is_ltrb(l->crop, (uint32_t)l->orig_w, (uint32_t)l->orig_h, bw, bh)) {
        sd_kohya_cut_box((uint32_t)l->orig_w, (uint32_t)l->orig_h, bw, bh, box);
        return 0;
    }
    double want[4];
    unsigned mask;
    sd_kohya_crop_ltrb((int)bw, (int)bh, (int)l->orig_w, (int)l->orig_h, want, &mask);
    sd_log(SD_LOG_WARN, "%s: crop_ltrb [%g, %g, %g, %g] is not sd-scripts' [%g, %g, %g, %g] for %lldx%lld in %ux%u: "
           "stored as given (the box cut is unknown)", path, l->crop[0], l->crop[1], l->crop[2], l->crop[3], want[0],
           want[1], want[2], want[3], (long long)l->orig_w, (long long)l->orig_h, bw, bh);
    memcpy(box, l->crop, sizeof l->crop);
    return SD_REC_F_CROP_FLOAT;
}

/* Build the latents record of one loaded file into r->rec, named f->name
 * and referring to text_ref. The crop box stored is the one sd-scripts cut
 * (sd_kohya_cut_box), sdtk's convention, not crop_ltrb. An alpha_mask
 * becomes the loss mask as it is (fp32 at the image's size: an export
 * gives the same array back), a record version 2. */
static sd_status build_latents(run *r, const cache_file *f, const char *path, const sd_kohya_latents *l,
                               const uint8_t text_ref[16], sd_error *err)
{
    sd_shard_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.kind = SD_REC_LATENT;
    memcpy(rec.text_ref, text_ref, sizeof rec.text_ref);
    int to = target_dtype(r, 0, l->latents);
    const sd_npz_member *m[2] = {l->latents, l->flipped};
    rec.ntensors = l->flipped ? 2 : 1;
    sd_status st = SD_OK;
    for (int i = 0; !st && i < rec.ntensors; i++) {
        st = convert(&r->conv[i], to, m[i], err);
        sd_shard_tensor *t = &rec.t[i];
        t->dtype = (uint8_t)pack_shard_dtype(to);
        t->role = i ? SD_ROLE_SAMPLE_FLIP : SD_ROLE_SAMPLE;
        t->ndim = 3;
        t->shape[0] = l->c;
        t->shape[1] = l->h;
        t->shape[2] = l->w;
        t->data = r->conv[i].data;
    }
    rec.flags = (uint16_t)(l->flipped ? SD_REC_F_FLIPPED : 0);
    if (!st && l->alpha) {
        st = convert(&r->conv[2], SD_NPY_F32, l->alpha, err);
        rec.t[rec.ntensors++] = (sd_shard_tensor){SD_DT_F32, SD_ROLE_MASK, 2, {l->h * 8, l->w * 8, 0, 0}, 0, 0,
                                                  r->conv[2].data};
        rec.flags |= SD_REC_F_MASK;
    }
    rec.orig_w = (uint32_t)l->orig_w;
    rec.orig_h = (uint32_t)l->orig_h;
    rec.bucket_w = l->w * 8;
    rec.bucket_h = l->h * 8;
    rec.flags |= crop_box(l, path, rec.bucket_w, rec.bucket_h, rec.crop);
    rec.name = f->name;
    rec.name_len = strlen(f->name);
    if (!st) st = sd_shard_rec_build(&rec, &r->rec, err);
    return st;
}

/* The record key of an imported file: its name under a fixed prefix. */
static void latents_key(run *r, const cache_file *f, uint8_t key[16])
{
    sd_buf_clear(&r->path);
    sd_buf_puts(&r->path, "kohya-import\n");
    sd_buf_puts(&r->path, f->name);
    key16(r->path.data, r->path.len, key);
}

/* Store one loaded latents file (and its text embedding when te is not
 * NULL) as a record named f->name. */
static sd_status put_latents(run *r, const cache_file *f, const char *path, const sd_kohya_latents *l,
                             const sd_kohya_te *te, const sd_kohya_meta_entry *me, sd_error *err)
{
    uint8_t text_ref[16] = {0}, key[16];
    sd_status st = set_meta(r, f, err);
    if (!st && te) st = put_text(r, te, me, text_ref, err);
    if (!st) st = build_latents(r, f, path, l, text_ref, err);
    latents_key(r, f, key);
    if (!st) st = pack_out_put(&r->out, key, sizeof key, r->rec.data, r->rec.len, err);
    if (!st) st = note_dtype(r, 0, target_dtype(r, 0, l->latents), err);
    if (!st) r->imported++;
    return st;
}

/* A name already in the shard is this very file only when its stored
 * record holds the same latents (a resumed import, or the same directory
 * imported again): the same sizes, crop, flags and payload. Another image
 * with the same name (a second directory imported into the shard) is not
 * dropped as "already present": *same is 0 and the caller refuses it. */
static sd_status same_as_stored(run *r, const cache_file *f, const char *path, sd_error *err, int *same)
{
    *same = 0;
    sd_kohya_latents l;
    const char *reason = NULL;
    sd_error e;
    if (sd_kohya_latents_load(path, &l, &reason, &e)) return SD_OK; /* unreadable now: not the stored one */
    static const uint8_t no_text[16];
    uint8_t key[16];
    sd_status st = build_latents(r, f, path, &l, no_text, err);
    sd_kohya_latents_free(&l);
    if (st) return st;
    latents_key(r, f, key);
    sd_buf stored;
    sd_buf_init(&stored);
    int found = 0;
    st = sd_shard_peek(r->out.s, key, sizeof key, &stored, &found, err);
    sd_shard_rec a, b;
    if (!st && found && sd_shard_rec_parse(stored.data, stored.len, &a, &e) == SD_OK &&
        sd_shard_rec_parse(r->rec.data, r->rec.len, &b, &e) == SD_OK)
        *same = a.payload_hash == b.payload_hash && a.payload_len == b.payload_len && a.flags == b.flags &&
                a.orig_w == b.orig_w && a.orig_h == b.orig_h && a.bucket_w == b.bucket_w &&
                a.bucket_h == b.bucket_h && memcmp(a.crop, b.crop, sizeof a.crop) == 0;
    sd_buf_free(&stored);
    return st;
}

/* Import one latents file (and its te_outputs). Problems with the files
 * are skips (reported with file and reason); returns non-OK only for
 * errors that stop the run (shard writes, memory). */
static sd_status import_one(run *r, const cache_file *f, sd_error *err)
{
    int found = 0;
    sd_status st = sd_shard_name_exists(r->out.s, f->name, strlen(f->name), &found, err);
    if (st) return st;
    char full[8192];
    snprintf(full, sizeof full, "%s/%s", r->o->dir, f->rel);
    if (found) {
        int same = 0;
        st = same_as_stored(r, f, full, err, &same);
        if (st) return st;
        if (same) r->present++;
        else
            sd_skip(&r->tally, "name already in the shard for other latents",
                    "%s: the shard's record '%s' holds other latents (an import of another directory?): not "
                    "imported; import each directory into its own shard, or rename one", full, f->name);
        return SD_OK;
    }
    sd_kohya_latents l;
    const char *reason = NULL;
    sd_error e;
    if (sd_kohya_latents_load(full, &l, &reason, &e)) {
        sd_skip(&r->tally, reason, "%s (%s)", full, e.msg);
        return SD_OK;
    }
    const sd_kohya_meta_entry *me = find_meta(r, f->name, &reason, &e);
    if (!reason) reason = latents_problem(&l, me, &e);
    const cache_file *tf = reason ? NULL : find_te(r, f->name);
    sd_kohya_te te;
    memset(&te, 0, sizeof te);
    char tfull[8192] = "";
    if (tf) {
        snprintf(tfull, sizeof tfull, "%s/%s", r->o->dir, tf->rel);
        sd_status ts = sd_kohya_te_load(tfull, &te, &reason, &e);
        if (ts && !reason) { /* not the file's fault (out of memory, a read error): fatal */
            sd_kohya_te_free(&te);
            sd_kohya_latents_free(&l);
            *err = e;
            return ts;
        }
    }
    if (reason) sd_skip(&r->tally, reason, "%s (%s)", tf ? tfull : full, e.msg);
    else st = put_latents(r, f, full, &l, tf ? &te : NULL, me, err);
    sd_kohya_te_free(&te);
    sd_kohya_latents_free(&l);
    return st;
}

/* Count the images of every base name (a metadata key that matches only
 * the base name is trusted only when one image has it). */
static sd_status count_bases(run *r, sd_error *err)
{
    for (size_t i = 0; i < r->lat.n; i++) {
        if (i && !strcmp(r->lat.v[i].name, r->lat.v[i - 1].name)) continue; /* one image, two files */
        const char *base = base_of(r->lat.v[i].name);
        sd_strmap_slot *s = sd_strmap_put(&r->bases, base, strlen(base));
        if (!s) return sd_err_set(err, SD_ENOMEM, "out of memory");
        s->nval += 1;
    }
    return SD_OK;
}

/* Report duplicates and orphans, then import every latents file in name order. */
static sd_status import_all(run *r, sd_error *err)
{
    if (r->lat.n) qsort(r->lat.v, r->lat.n, sizeof *r->lat.v, file_cmp);
    if (r->te.n) qsort(r->te.v, r->te.n, sizeof *r->te.v, file_cmp);
    sd_status sst = settle_scale(r, err);
    if (sst) return sst;
    for (size_t i = 0; i < r->te.n; i++) {
        cache_file key = {NULL, r->te.v[i].name, SD_KOHYA_LEGACY};
        size_t lo = 0, hi = r->lat.n;
        while (lo < hi) { /* first latents file with this name */
            size_t mid = (lo + hi) / 2;
            if (strcmp(r->lat.v[mid].name, key.name) < 0) lo = mid + 1;
            else hi = mid;
        }
        if (lo == r->lat.n || strcmp(r->lat.v[lo].name, key.name))
            sd_skip(&r->tally, "te_outputs without latents", "%s/%s", r->o->dir, r->te.v[i].rel);
    }
    sd_status st = count_bases(r, err);
    if (!st) st = load_dtypes(r, err);
    if (!st) st = check_dtypes(r, err);
    sd_progress_init(&r->prog, "sd-pack import-kohya", "files", r->lat.n, !r->o->pc.quiet);
    for (size_t i = 0; !st && i < r->lat.n; i++) {
        if (i && !strcmp(r->lat.v[i].name, r->lat.v[i - 1].name)) {
            sd_skip(&r->tally, "second cache file for one image (the legacy name wins, as in sd-scripts)", "%s/%s",
                    r->o->dir, r->lat.v[i].rel);
            continue;
        }
        st = import_one(r, &r->lat.v[i], err);
        sd_progress_update(&r->prog, i + 1, r->tally.total);
    }
    pack_progress_finish(&r->prog, &r->tally);
    return st;
}

/* The model family the cache names say (the first _sd or _sdxl name's),
 * SD_KOHYA_LEGACY when only legacy names (which say none) were found. */
static sd_kohya_kind names_family(const run *r)
{
    for (size_t i = 0; i < r->lat.n; i++)
        if (r->lat.v[i].kind == SD_KOHYA_SD || r->lat.v[i].kind == SD_KOHYA_SDXL) return r->lat.v[i].kind;
    return SD_KOHYA_LEGACY;
}

/* Free everything of a run but the output. */
static void run_free(run *r)
{
    list_free(&r->lat);
    list_free(&r->te);
    if (r->have_meta) sd_kohya_meta_free(&r->meta);
    sd_strmap_free(&r->bases);
    free(r->dtypes[0]);
    free(r->dtypes[1]);
    sd_buf_free(&r->rec);
    sd_buf_free(&r->path);
    for (int i = 0; i < 4; i++) sd_buf_free(&r->conv[i]);
}

/* sd-pack import-kohya DIR -o SHARD */
int pack_import_kohya(int argc, char **argv)
{
    options o = {0};
    const sd_opt opts[] = {
        {"output", 'o', SD_OPT_STR, &o.output, "SHARD", "the shard to write or extend"},
        {"meta", 0, SD_OPT_STR, &o.meta_path, "FILE", "meta_lat.json / meta_cap_dd.json: captions and train_resolution"},
        {"dtype", 0, SD_OPT_STR, &o.dtype_name, "T", "store tensors as fp16, bf16 or fp32 (default: as the shard already holds them, else as in the first file)"},
        {"scale", 0, SD_OPT_DOUBLE, &o.scale, "X",
         "the VAE scaling factor sd-train applies, a finite number > 0 (default, or 0: 0.18215 for _sd names,\n"
         "                                 0.13025 for _sdxl; legacy names: 0.13025 with te_outputs, else 0.18215), as sd-latents --scale"},
        {"allow-mixed", 0, SD_OPT_FLAG, &o.allow_mixed, NULL,
         "import into an existing SHARD that is not a kohya import of the same model family"},
        {"strict", 0, SD_OPT_FLAG, &o.pc.strict, NULL, "exit 1 if any file was skipped"},
        {"quiet", 'q', SD_OPT_FLAG, &o.pc.quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &o.pc.verbose, NULL, "show every skipped file"},
        {NULL, 0, 0, NULL, NULL, NULL},
    };
    const sd_cli cli = {
        "sd-pack import-kohya", "DIR -o SHARD [--meta meta_lat.json] [--dtype fp16|bf16|fp32]",
        "Import a kohya-ss/sd-scripts cache directory (searched recursively): every latents npz\n"
        "(<stem>.npz, <stem>_WWWWxHHHH_sd.npz, <stem>_WWWWxHHHH_sdxl.npz) becomes one record named by\n"
        "its image stem (with subdirectories), with <stem>_te_outputs.npz as its text embedding.\n"
        "Text embeddings are stored once per caption (from --meta) or, without a caption, once per\n"
        "identical content. --meta keys are image stems or, with sd-scripts' --full_path, image\n"
        "paths: an image takes the key sharing the most trailing path components with its name\n"
        "(extension ignored); a key matching only the base name is used when no other key and no\n"
        "other image has that base name; anything less certain is skipped as ambiguous.\n"
        "The stored crop box is the one sd-scripts cut (cover resize, centre crop), sdtk's convention,\n"
        "when crop_ltrb is sd-scripts' value for original_size and the latents' size; any other\n"
        "crop_ltrb is stored as given (flagged, with a warning).\n"
        "Bad files are reported (file and reason), counted and skipped, among them files whose record\n"
        "name would exceed 511 bytes. Directory links are followed, except one leading back to a\n"
        "directory on its own path (a loop such as 'again -> .'): reported, not followed.\n"
        "A new shard is built as SHARD.partial and renamed at the end; rerun after a kill, the\n"
        "import continues, skipping names already present with the same latents (a name present with\n"
        "other latents, e.g. from an import of another directory, is refused: reported and skipped).\n"
        "An existing SHARD is extended in place\n"
        "when it is a kohya import (meta kohya_layout, no model_hash) of the same model family (_sd\n"
        "or _sdxl names; legacy names fit either); any other (a shard of sd-latents) is refused,\n"
        "exit 2 and untouched, unless --allow-mixed. Its producer, kohya_layout and options stay.\n"
        "Both survive a crash: every commit is written so that the shard stays consistent (an OS\n"
        "crash may undo the last one).",
        opts,
        "sd-scripts caches latents unscaled; the shard's scaling_factor (what sd-train multiplies\n"
        "them by) comes from the cache names or --scale. sd-train needs a text embedding per record:\n"
        "sd-scripts caches text-encoder outputs only for SDXL (_te_outputs.npz), so an SD 1.x/2.x\n"
        "cache imports latents that sd-train cannot use on their own: sd-latents --text MODEL\n"
        "--text-only -o SHARD attaches them (captions from sd-meta, e.g. of the --meta file).\n"
        "An alpha_mask becomes the record's loss mask as it is (fp32 at the image's size; sd-train\n"
        "--masked-loss); one of another size or with values outside 0..1 skips the file.\n"
        "Not imported: per-resolution keys (latents_HxW).\n"
        "Example:\n  sd-pack import-kohya train_data -o cache.lmdb --meta meta_lat.json --dtype fp16", NULL};
    sd_strlist pos = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &pos);
    if (rc >= 0) {
        sd_strlist_free(&pos);
        return rc;
    }
    sd_log_setup("sd-pack import-kohya", o.pc.quiet ? SD_LOG_WARN : o.pc.verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    sd_npy_dtype dt = SD_NPY_F32;
    o.npy_dtype = -1;
    rc = -1;
    if (pos.n != 1) rc = (sd_cli_usage_error(&cli, "give exactly one DIR"), SD_EXIT_USAGE);
    else if (!o.output) rc = (sd_cli_usage_error(&cli, "-o SHARD is required"), SD_EXIT_USAGE);
    else if (o.dtype_name && (sd_npy_dtype_parse(o.dtype_name, &dt) || !sd_npy_is_float(dt) || dt == SD_NPY_F64))
        rc = (sd_cli_usage_error(&cli, "--dtype must be fp16, bf16 or fp32, not '%s'", o.dtype_name), SD_EXIT_USAGE);
    else if (!(o.scale >= 0 && o.scale <= 1e6))
        rc = (sd_cli_usage_error(&cli, "--scale must be a finite number > 0, or 0 for the default (from the cache "
                                 "names), not %g", o.scale), SD_EXIT_USAGE);
    if (rc >= 0) {
        sd_strlist_free(&pos);
        return rc;
    }
    if (o.dtype_name) o.npy_dtype = dt;
    o.dir = pos.v[0];
    run r;
    memset(&r, 0, sizeof r);
    r.o = &o;
    sd_tally_init(&r.tally, o.pc.verbose ? -1 : 10);
    sd_strmap_init(&r.bases);
    sd_buf_init(&r.rec);
    sd_buf_init(&r.path);
    for (int i = 0; i < 4; i++) sd_buf_init(&r.conv[i]);
    sd_error err;
    sd_status st = SD_OK;
    if (o.meta_path) {
        st = sd_kohya_meta_load(&r.meta, o.meta_path, &err);
        r.have_meta = 1;
    }
    if (!st) st = walk_top(&r, &err);
    if (!st) st = pack_out_open(&r.out, o.output, PACK_OUT_RESUME, &err);
    r.out.batch_max = 64; /* small commits: a killed import loses little */
    int refused = 0;
    if (!st && (st = pack_import_target_check(r.out.s, o.output, names_family(&r), o.allow_mixed, &r.keep_meta, &err))) {
        refused = st == SD_EINVAL;
        pack_out_abort(&r.out, 1);
    }
    if (!st) {
        st = import_all(&r, &err);
        if (st) pack_out_abort(&r.out, 1);
        else st = pack_out_commit(&r.out, &err);
    }
    if (st) {
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        run_free(&r);
        sd_strlist_free(&pos);
        return refused ? SD_EXIT_USAGE : SD_EXIT_FATAL;
    }
    sd_log(SD_LOG_INFO, "imported %llu records (%llu new text embeddings), %llu already present, %llu skipped -> %s",
           (unsigned long long)r.imported, (unsigned long long)r.texts_new, (unsigned long long)r.present,
           (unsigned long long)r.tally.total, o.output);
    rc = pack_finish(&r.tally, &o.pc, "skipped");
    run_free(&r);
    sd_strlist_free(&pos);
    return rc;
}
