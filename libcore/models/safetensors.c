#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"
#include "buf.h"
#include "f16.h"
#include "json.h"
#include "outfile.h"
#include "slurp.h"
#include "strmap.h"

struct sd_safetensors {
    const unsigned char *base; /* whole file (mapped) or caller memory */
    size_t len;
    int mapped;
    char *header; /* mutable copy of the JSON header (strings point into it) */
    sd_arena arena;
    sd_st_tensor *t;
    size_t n;
    sd_st_meta *meta;
    size_t nmeta;
    sd_strmap by_name;
    sd_buf index;            /* a sharded checkpoint: the index.json text (strings point into it) */
    sd_safetensors **parts;  /* and its shards, whose mappings the tensors point into */
    size_t nparts;
};

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"I16", 2},     {"I32", 4},      {"I64", 8},
              {"F16", 2},  {"BF16", 2}, {"F32", 4}, {"F64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};

/* The safetensors name of a dtype ("F16"). */
const char *sd_st_dtype_name(sd_st_dtype d)
{
    return (size_t)d < sizeof dtypes / sizeof *dtypes ? dtypes[d].name : "?";
}

/* Bytes per element. */
size_t sd_st_dtype_size(sd_st_dtype d)
{
    return (size_t)d < sizeof dtypes / sizeof *dtypes ? dtypes[d].size : 0;
}

/* dtype by name; -1 if unknown. */
static int dtype_parse(const char *s)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (strcmp(dtypes[i].name, s) == 0) return (int)i;
    return -1;
}

/* A JSON number that is a whole number in [0, 2^53]. */
static int json_u64(const sd_json *v, uint64_t *out)
{
    if (!v || v->type != SD_JSON_NUMBER || !(v->num >= 0) || v->num > 9007199254740992.0 || v->num != (double)(uint64_t)v->num)
        return -1;
    *out = (uint64_t)v->num;
    return 0;
}

/* Order tensors by data range (begin, then end), for the coverage check:
 * an empty tensor at a's begin comes before a, as the reference reader
 * sorts them, so the order of the header does not matter. */
static int by_offset(const void *a, const void *b)
{
    const sd_st_tensor *x = *(const sd_st_tensor *const *)a, *y = *(const sd_st_tensor *const *)b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    if (px != py) return px < py ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Refuse an object whose members repeat a key or whose keys hold a NUL
 * (\u0000): the JSON parser keeps duplicates, which would count twice
 * (two __metadata__ objects overflowed the metadata table), and a name
 * with a NUL could never be looked up by its C string. `what` says
 * which object, for the message. */
static sd_status check_keys(const sd_json *obj, const char *name, const char *what, sd_error *err)
{
    sd_strmap seen;
    sd_strmap_init(&seen);
    sd_status s = SD_OK;
    for (const sd_json *m = obj->child; m && !s; m = m->next) {
        if (memchr(m->key, 0, m->key_len)) {
            s = sd_err_set(err, SD_EFORMAT, "%s: %s key '%s\\u0000...' holds a NUL character", name, what, m->key);
            break;
        }
        sd_strmap_slot *slot = sd_strmap_put(&seen, m->key, m->key_len);
        if (!slot) s = sd_err_set(err, SD_ENOMEM, "out of memory");
        else if (slot->nval) s = sd_err_set(err, SD_EFORMAT, "%s: %s key '%s' appears twice", name, what, m->key);
        else slot->nval = 1;
    }
    sd_strmap_free(&seen);
    return s;
}

/* Validate and index the header of a file held in st->base/len. */
static sd_status parse(sd_safetensors *st, const char *name, sd_error *err)
{
    if (st->len < 8) return sd_err_set(err, SD_ETRUNC, "%s: shorter than the 8-byte header length", name);
    if (st->len > 8 && st->base[8] != '{') /* the format's header must begin with '{' */
        return sd_err_set(err, SD_EFORMAT,
                          "%s: not a safetensors file (no JSON header after the 8-byte length; .ckpt, .bin and .pt "
                          "pickles are not read: convert them to .safetensors)",
                          name);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | st->base[i];
    if (hlen > SD_ST_MAX_HEADER) return sd_err_set(err, SD_EFORMAT, "%s: header length %llu over the 100 MB limit", name, (unsigned long long)hlen);
    if (hlen > st->len - 8) return sd_err_set(err, SD_ETRUNC, "%s: header of %llu bytes runs past the end of the file", name, (unsigned long long)hlen);
    st->header = malloc(hlen + 1);
    if (!st->header) return sd_err_set(err, SD_ENOMEM, "out of memory");
    memcpy(st->header, st->base + 8, hlen);
    st->header[hlen] = 0;
    sd_json *root;
    sd_error jerr;
    if (sd_json_parse(&st->arena, st->header, hlen, &root, &jerr))
        return sd_err_set(err, SD_EPARSE, "%s: header: %s", name, jerr.msg);
    if (root->type != SD_JSON_OBJECT) return sd_err_set(err, SD_EFORMAT, "%s: header is not a JSON object", name);
    sd_status rc = check_keys(root, name, "header", err);
    if (rc) return rc;
    const unsigned char *data = st->base + 8 + hlen;
    uint64_t data_len = st->len - 8 - hlen;
    st->t = sd_arena_alloc(&st->arena, (root->len ? root->len : 1) * sizeof *st->t);
    if (!st->t) return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (const sd_json *e = root->child; e; e = e->next) {
        if (strcmp(e->key, "__metadata__") == 0) {
            if (e->type != SD_JSON_OBJECT) return sd_err_set(err, SD_EFORMAT, "%s: __metadata__ is not an object", name);
            rc = check_keys(e, name, "__metadata__", err);
            if (rc) return rc;
            st->meta = sd_arena_alloc(&st->arena, (e->len ? e->len : 1) * sizeof *st->meta);
            if (!st->meta) return sd_err_set(err, SD_ENOMEM, "out of memory");
            for (const sd_json *m = e->child; m; m = m->next) {
                if (m->type != SD_JSON_STRING) return sd_err_set(err, SD_EFORMAT, "%s: __metadata__ value of '%s' is not a string", name, m->key);
                st->meta[st->nmeta].key = m->key;
                st->meta[st->nmeta].value = m->str;
                st->nmeta++;
            }
            continue;
        }
        if (e->type != SD_JSON_OBJECT) return sd_err_set(err, SD_EFORMAT, "%s: tensor '%s' is not an object", name, e->key);
        const sd_json *dt = sd_json_get(e, "dtype"), *sh = sd_json_get(e, "shape"), *off = sd_json_get(e, "data_offsets");
        if (!dt || !sh || !off)
            return sd_err_set(err, SD_EFORMAT, "%s: tensor '%s' needs dtype, shape and data_offsets", name, e->key);
        int d = dt->type == SD_JSON_STRING ? dtype_parse(dt->str) : -1;
        if (d < 0) return sd_err_set(err, SD_EUNSUPPORTED, "%s: tensor '%s': unknown dtype", name, e->key);
        if (sh->type != SD_JSON_ARRAY || sh->len > SD_ST_MAX_DIMS)
            return sd_err_set(err, SD_EFORMAT, "%s: tensor '%s': shape must be an array of at most %d sizes", name, e->key, SD_ST_MAX_DIMS);
        sd_st_tensor *t = &st->t[st->n];
        memset(t, 0, sizeof *t);
        t->name = e->key;
        t->dtype = (sd_st_dtype)d;
        uint64_t count = 1;
        for (const sd_json *s = sh->child; s; s = s->next) {
            uint64_t v;
            if (json_u64(s, &v)) return sd_err_set(err, SD_EFORMAT, "%s: tensor '%s': bad shape entry", name, e->key);
            if (v && count > UINT64_MAX / v) return sd_err_set(err, SD_ERANGE, "%s: tensor '%s': shape overflows", name, e->key);
            count *= v;
            t->shape[t->ndim++] = v;
        }
        uint64_t b, en;
        if (off->type != SD_JSON_ARRAY || off->len != 2 || json_u64(off->child, &b) || json_u64(off->child->next, &en) || en < b)
            return sd_err_set(err, SD_EFORMAT, "%s: tensor '%s': data_offsets must be [begin, end]", name, e->key);
        if (en > data_len) return sd_err_set(err, SD_ETRUNC, "%s: tensor '%s' ends past the end of the file", name, e->key);
        if (count > UINT64_MAX / dtypes[d].size || count * dtypes[d].size != en - b)
            return sd_err_set(err, SD_EFORMAT, "%s: tensor '%s': %llu bytes for shape and dtype %s, offsets give %llu", name,
                              e->key, (unsigned long long)(count * dtypes[d].size), dtypes[d].name, (unsigned long long)(en - b));
        t->nbytes = en - b;
        t->data = data + b;
        sd_strmap_slot *slot = sd_strmap_put(&st->by_name, e->key, e->key_len); /* unique: check_keys */
        if (!slot) return sd_err_set(err, SD_ENOMEM, "out of memory");
        slot->nval = (double)(st->n + 1);
        st->n++;
    }
    /* the buffer must be covered exactly: contiguous from 0, no overlaps, no holes */
    const sd_st_tensor **ord = malloc((st->n ? st->n : 1) * sizeof *ord);
    if (!ord) return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (size_t i = 0; i < st->n; i++) ord[i] = &st->t[i];
    qsort(ord, st->n, sizeof *ord, by_offset);
    const unsigned char *at = data;
    for (size_t i = 0; i < st->n && !rc; i++) {
        if ((const unsigned char *)ord[i]->data != at)
            rc = sd_err_set(err, SD_EFORMAT, "%s: tensor '%s' %s", name, ord[i]->name,
                            (const unsigned char *)ord[i]->data < at ? "overlaps another" : "leaves a hole before it");
        at += ord[i]->nbytes;
    }
    if (!rc && at != data + data_len)
        rc = sd_err_set(err, SD_EFORMAT, "%s: %llu bytes after the last tensor", name, (unsigned long long)(data + data_len - at));
    free(ord);
    return rc;
}

/* Fresh, empty reader state. */
static sd_safetensors *new_reader(void)
{
    sd_safetensors *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    sd_arena_init(&st->arena, 1 << 16);
    sd_strmap_init(&st->by_name);
    sd_buf_init(&st->index);
    return st;
}

static sd_status open_index(sd_safetensors *st, const char *path, sd_error *err);

/* Whether a path names a sharded checkpoint's index (FILE.index.json). */
static int is_index(const char *path)
{
    size_t n = strlen(path), k = strlen(".index.json");
    return n > k && strcmp(path + n - k, ".index.json") == 0;
}

static sd_status open_file(sd_safetensors **out, const char *path, sd_error *err);

/* Open and validate a file; tensors are read in place from the mapping.
 * A path ending in .index.json opens a sharded checkpoint as one file. */
sd_status sd_st_open(sd_safetensors **out, const char *path, sd_error *err)
{
    *out = NULL;
    if (!is_index(path)) return open_file(out, path, err);
    sd_safetensors *st = new_reader();
    if (!st) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_status s = open_index(st, path, err);
    if (s) sd_st_close(st);
    else *out = st;
    return s;
}

/* One safetensors file, mapped and validated. */
static sd_status open_file(sd_safetensors **out, const char *path, sd_error *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sd_err_set(err, errno == ENOENT ? SD_ENOTFOUND : SD_EIO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return sd_err_set(err, SD_EIO, "%s: not a regular file", path);
    }
    sd_safetensors *st = new_reader();
    if (!st) {
        close(fd);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    st->len = (size_t)sb.st_size;
    if (st->len) {
        void *p = mmap(NULL, st->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            sd_st_close(st);
            return sd_err_set(err, SD_EIO, "%s: mmap: %s", path, strerror(errno));
        }
        st->base = p;
        st->mapped = 1;
    }
    close(fd);
    sd_status s = parse(st, path, err);
    if (s) {
        sd_st_close(st);
        return s;
    }
    *out = st;
    return SD_OK;
}

/* Validate a file already in memory (the caller keeps it alive). */
sd_status sd_st_open_memory(sd_safetensors **out, const void *data, size_t len, const char *name, sd_error *err)
{
    *out = NULL;
    sd_safetensors *st = new_reader();
    if (!st) return sd_err_set(err, SD_ENOMEM, "out of memory");
    st->base = data;
    st->len = len;
    sd_status s = parse(st, name, err);
    if (s) {
        sd_st_close(st);
        return s;
    }
    *out = st;
    return SD_OK;
}

/* Unmap and free. */
void sd_st_close(sd_safetensors *st)
{
    if (!st) return;
    if (st->mapped) munmap((void *)st->base, st->len);
    for (size_t i = 0; i < st->nparts; i++) sd_st_close(st->parts[i]);
    free(st->parts);
    sd_buf_free(&st->index);
    free(st->header);
    sd_arena_free(&st->arena);
    sd_strmap_free(&st->by_name);
    free(st);
}

/* Number of tensors. */
size_t sd_st_count(const sd_safetensors *st)
{
    return st->n;
}

/* Tensor i in header order. */
const sd_st_tensor *sd_st_tensor_at(const sd_safetensors *st, size_t i)
{
    return i < st->n ? &st->t[i] : NULL;
}

/* Tensor by name; NULL when absent. */
const sd_st_tensor *sd_st_find(const sd_safetensors *st, const char *name)
{
    const sd_strmap_slot *s = sd_strmap_get(&st->by_name, name, strlen(name));
    return s ? &st->t[(size_t)s->nval - 1] : NULL;
}

/* A tensor's pages of the file mapping given back once it has been read
 * (madvise MADV_DONTNEED: a private read-only mapping refaults the same
 * bytes from the page cache if read again): loading a model a tensor at a
 * time then never holds the whole file in the resident set beside the
 * converted copy. Only the whole pages inside the tensor go (its
 * neighbours' bytes stay); nothing for memory that is not a mapping. */
void sd_st_drop_pages(const sd_safetensors *st, const sd_st_tensor *t)
{
    const sd_safetensors *own = NULL;
    uintptr_t p = (uintptr_t)t->data, e = p + (uintptr_t)t->nbytes;
    for (size_t i = 0; i < st->nparts + 1 && !own; i++) {
        const sd_safetensors *s = i < st->nparts ? st->parts[i] : st;
        uintptr_t b = (uintptr_t)s->base;
        if (s->mapped && p >= b && e <= b + s->len) own = s;
    }
    long page = sysconf(_SC_PAGESIZE);
    if (!own || page <= 0) return;
    uintptr_t lo = (p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1), hi = e & ~((uintptr_t)page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice only: a failure changes nothing read */
}

/* Number of __metadata__ entries. */
size_t sd_st_meta_count(const sd_safetensors *st)
{
    return st->nmeta;
}

/* Metadata entry i. */
const sd_st_meta *sd_st_meta_at(const sd_safetensors *st, size_t i)
{
    return i < st->nmeta ? &st->meta[i] : NULL;
}

/* A shard's file name as an index gives it: a plain NAME.safetensors,
 * read from the index's own folder (an index must not reach files
 * elsewhere, nor name another index: shards are plain files). */
static int plain_name(const char *s)
{
    size_t n = strlen(s), k = strlen(".safetensors");
    return n > k && !strchr(s, '/') && strcmp(s + n - k, ".safetensors") == 0;
}

/* The shard of index entry `name` in st->parts (opened on first use);
 * -1 with err set when it cannot be. */
static long shard_of(sd_safetensors *st, const char *path, const char *name, const char ***names, sd_error *err)
{
    for (size_t i = 0; i < st->nparts; i++)
        if (strcmp((*names)[i], name) == 0) return (long)i;
    if (!plain_name(name)) {
        sd_err_set(err, SD_EFORMAT, "%s: shard '%s' is not a plain NAME.safetensors in the index's folder", path,
                   name);
        return -1;
    }
    const char *slash = strrchr(path, '/');
    int dir = slash ? (int)(slash - path) : 1;
    char file[4096];
    if ((size_t)snprintf(file, sizeof file, "%.*s/%s", dir, slash ? path : ".", name) >= sizeof file) {
        sd_err_set(err, SD_EINVAL, "%s: path too long", path);
        return -1;
    }
    sd_safetensors **np = realloc(st->parts, (st->nparts + 1) * sizeof *np);
    const char **nn = np ? realloc(*names, (st->nparts + 1) * sizeof *nn) : NULL;
    if (np) st->parts = np;
    if (!nn) {
        sd_err_set(err, SD_ENOMEM, "out of memory");
        return -1;
    }
    *names = nn;
    sd_safetensors *part = NULL;
    if (open_file(&part, file, err)) return -1; /* its message names the shard */
    st->parts[st->nparts] = part;
    nn[st->nparts] = name;
    return (long)st->nparts++;
}

/* A sharded checkpoint (diffusers and transformers write one above a size
 * limit: FILE.index.json with a weight_map from tensor name to shard file):
 * every shard is opened and validated as a file of its own, and their
 * tensors are seen as one file's, the first shard's metadata as its. The
 * index and the shards must agree exactly: each listed tensor is in the
 * shard the index names, each shard tensor is listed there, no name is
 * listed twice. */
static sd_status open_index(sd_safetensors *st, const char *path, sd_error *err)
{
    sd_json *root;
    sd_status s = sd_parse_json_file(path, &st->index, &st->arena, &root, err);
    if (s) return s;
    const sd_json *map = root->type == SD_JSON_OBJECT ? sd_json_get(root, "weight_map") : NULL;
    if (!map || map->type != SD_JSON_OBJECT || !map->len)
        return sd_err_set(err, SD_EFORMAT, "%s: no weight_map object (not a safetensors index)", path);
    const char **names = NULL;
    sd_strmap listed;
    sd_strmap_init(&listed);
    for (const sd_json *e = map->child; e && !s; e = e->next) {
        if (e->type != SD_JSON_STRING) {
            s = sd_err_set(err, SD_EFORMAT, "%s: weight_map entry '%s' is not a file name", path, e->key);
            break;
        }
        if (memchr(e->key, 0, e->key_len)) { /* no shard can hold it: shards refuse such names */
            s = sd_err_set(err, SD_EFORMAT, "%s: weight_map key '%s\\u0000...' holds a NUL character", path, e->key);
            break;
        }
        long k = shard_of(st, path, e->str, &names, err);
        sd_strmap_slot *slot = k < 0 ? NULL : sd_strmap_put(&listed, e->key, e->key_len);
        if (k < 0) s = err->code ? err->code : SD_EFORMAT;
        else if (!slot) s = sd_err_set(err, SD_ENOMEM, "out of memory");
        else if (slot->nval) s = sd_err_set(err, SD_EFORMAT, "%s: weight_map lists '%s' twice", path, e->key);
        else slot->nval = (double)(k + 1);
    }
    size_t total = 0;
    for (size_t p = 0; p < st->nparts && !s; p++) total += st->parts[p]->n;
    if (!s && total != map->len) { /* some listed tensor is not where the index says, or a shard has extras */
        for (const sd_json *e = map->child; e && !s; e = e->next) {
            const sd_strmap_slot *slot = sd_strmap_get(&listed, e->key, e->key_len);
            const sd_safetensors *part = st->parts[(size_t)slot->nval - 1];
            if (!sd_st_find(part, e->key))
                s = sd_err_set(err, SD_EFORMAT, "%s: the index puts '%s' in %s, which does not hold it", path, e->key,
                               e->str);
        }
    }
    st->t = s ? NULL : sd_arena_alloc(&st->arena, (total ? total : 1) * sizeof *st->t);
    if (!s && !st->t) s = sd_err_set(err, SD_ENOMEM, "out of memory");
    for (size_t p = 0; p < st->nparts && !s; p++) {
        const sd_safetensors *part = st->parts[p];
        for (size_t i = 0; i < part->n && !s; i++) {
            const sd_st_tensor *t = &part->t[i];
            const sd_strmap_slot *ls = sd_strmap_get(&listed, t->name, strlen(t->name));
            sd_strmap_slot *slot = ls ? sd_strmap_put(&st->by_name, t->name, strlen(t->name)) : NULL;
            if (!ls)
                s = sd_err_set(err, SD_EFORMAT, "%s: tensor '%s' of %s is not in the index", path, t->name, names[p]);
            else if ((size_t)ls->nval - 1 != p)
                s = sd_err_set(err, SD_EFORMAT, "%s: tensor '%s' is in %s, the index puts it in %s", path, t->name,
                               names[p], names[(size_t)ls->nval - 1]);
            else if (!slot) s = sd_err_set(err, SD_ENOMEM, "out of memory");
            else { /* unique: the index names one shard per tensor, and a shard holds a name once */
                st->t[st->n] = *t;
                slot->nval = (double)++st->n;
            }
        }
    }
    if (!s && st->nparts) {
        st->meta = st->parts[0]->meta;
        st->nmeta = st->parts[0]->nmeta;
    }
    sd_strmap_free(&listed);
    free(names);
    return s;
}

/* Value i of a tensor given as floats (t->f32) or bf16 bits (t->bf16). */
static float source_value(const sd_st_tensor *t, size_t i)
{
    return t->f32 ? t->f32[i] : sd_bf16_to_f32(t->bf16[i]);
}

/* One tensor given as floats (t->f32) or bf16 bits (t->bf16), converted to
 * its dtype through a small buffer: a checkpoint is written without a
 * second copy of the model in memory. Nonzero when a write failed. */
static int write_converted(FILE *f, const sd_st_tensor *t)
{
    enum { CHUNK = 16384 };
    unsigned char buf[CHUNK * 4];
    size_t es = sd_st_dtype_size(t->dtype), count = (size_t)(t->nbytes / es);
    if (t->f32 && t->dtype == SD_ST_F32) return count && fwrite(t->f32, 4, count, f) != count;
    for (size_t at = 0; at < count; at += CHUNK) {
        size_t m = count - at < CHUNK ? count - at : CHUNK;
        for (size_t j = 0; j < m; j++) {
            float x = source_value(t, at + j);
            uint32_t v;
            if (t->dtype == SD_ST_F32) memcpy(&v, &x, 4);
            else v = t->dtype == SD_ST_F16 ? sd_f32_to_f16(x) : sd_f32_to_bf16(x);
            for (size_t b = 0; b < es; b++) buf[es * j + b] = (unsigned char)(v >> (8 * b)); /* little-endian */
        }
        if (fwrite(buf, es, m, f) != m) return 1;
    }
    return 0;
}

/* Write tensors (in the given order, back to back) and metadata as a
 * safetensors file, atomically. The header is space-padded to a multiple of
 * 8 as the reference writer does, so data stays 8-byte aligned. */
sd_status sd_st_write(const char *path, const sd_st_tensor *t, size_t n, const sd_st_meta *meta, size_t nmeta,
                      sd_error *err)
{
    sd_buf h;
    sd_buf_init(&h);
    sd_buf_putc(&h, '{');
    int first = 1;
    if (nmeta) {
        sd_buf_json_key(&h, &first, "__metadata__");
        sd_buf_putc(&h, '{');
        for (size_t i = 0; i < nmeta; i++) {
            if (i) sd_buf_putc(&h, ',');
            sd_buf_json_cstr(&h, meta[i].key);
            sd_buf_putc(&h, ':');
            sd_buf_json_cstr(&h, meta[i].value);
        }
        sd_buf_putc(&h, '}');
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t count = 1;
        for (int k = 0; k < t[i].ndim; k++) count *= t[i].shape[k];
        uint64_t bytes = count * sd_st_dtype_size(t[i].dtype);
        if ((t[i].f32 || t[i].bf16) && t[i].dtype != SD_ST_F32 && t[i].dtype != SD_ST_F16 && t[i].dtype != SD_ST_BF16) {
            sd_buf_free(&h);
            return sd_err_set(err, SD_EINVAL, "%s: tensor '%s': floats can be written as F32, F16 or BF16 only", path,
                              t[i].name);
        }
        if (bytes != t[i].nbytes) {
            sd_buf_free(&h);
            return sd_err_set(err, SD_EINVAL, "%s: tensor '%s': nbytes does not match shape and dtype", path, t[i].name);
        }
        sd_buf_json_key(&h, &first, t[i].name);
        sd_buf_printf(&h, "{\"dtype\":\"%s\",\"shape\":[", sd_st_dtype_name(t[i].dtype));
        for (int k = 0; k < t[i].ndim; k++) sd_buf_printf(&h, "%s%llu", k ? "," : "", (unsigned long long)t[i].shape[k]);
        sd_buf_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    sd_buf_putc(&h, '}');
    while (h.len % 8) sd_buf_putc(&h, ' ');
    if (h.oom) {
        sd_buf_free(&h);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    sd_outfile o;
    sd_status s = sd_outfile_open(&o, path, err);
    if (s) {
        sd_buf_free(&h);
        return s;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    int bad = fwrite(len8, 1, 8, o.f) != 8 || fwrite(h.data, 1, h.len, o.f) != h.len;
    for (size_t i = 0; i < n && !bad; i++)
        bad = t[i].f32 || t[i].bf16 ? write_converted(o.f, &t[i]) : t[i].nbytes && fwrite(t[i].data, 1, t[i].nbytes, o.f) != t[i].nbytes;
    sd_buf_free(&h);
    if (bad) {
        sd_outfile_abort(&o);
        return sd_err_set(err, SD_EIO, "%s: write failed: %s", path, strerror(errno));
    }
    return sd_outfile_commit(&o, err);
}
