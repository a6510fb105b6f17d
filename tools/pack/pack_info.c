/* sd-pack info: what a shard holds (meta, counts by kind, buckets, dtypes,
 * bytes), as text or JSON. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "buf.h"
#include "cli.h"
#include "log.h"
#include "pack.h"

typedef struct {
    uint64_t n, bytes, payload, flipped, meanstd, masks, corrupt;
    uint64_t varied, variants; /* latent records with caption variants, and those variants */
    uint64_t dtype[4]; /* by sd_dtype of tensor 0 */
} kind_stats;

/* Walk one database of records and add up its statistics. */
static sd_status scan(sd_shard_txn *t, sd_shard_db db, kind_stats *ks, sd_error *err)
{
    sd_shard_cursor *c;
    sd_status st = sd_shard_cursor_open(t, db, &c, err);
    if (st) return st;
    const void *k, *v;
    size_t kl, vl;
    while ((st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        sd_shard_rec r;
        sd_error e;
        ks->n++;
        ks->bytes += vl;
        if (sd_shard_rec_parse(v, vl, &r, &e)) {
            ks->corrupt++;
            continue;
        }
        ks->payload += r.payload_len;
        if (r.flags & SD_REC_F_FLIPPED) ks->flipped++;
        if (r.flags & SD_REC_F_MASK) ks->masks++;
        const uint8_t *refs;
        size_t nv;
        if (r.kind == SD_REC_LATENT && sd_shard_get_variants(t, k, kl, &refs, &nv, NULL) == SD_OK && nv) {
            ks->varied++;
            ks->variants += nv;
        }
        if (r.flags & SD_REC_F_MEANSTD) ks->meanstd++;
        if (r.t[0].dtype < 4) ks->dtype[r.t[0].dtype]++;
    }
    sd_shard_cursor_close(c);
    return st == SD_ENOTFOUND ? SD_OK : st;
}

/* Append the meta entries as a JSON object. */
static sd_status meta_json(sd_shard_txn *t, sd_buf *b, sd_error *err)
{
    sd_shard_cursor *c;
    sd_status st = sd_shard_cursor_open(t, SD_SHARD_DB_META, &c, err);
    if (st) return st;
    const void *k, *v;
    size_t kl, vl;
    int first = 1;
    sd_buf_putc(b, '{');
    while ((st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        if (!first) sd_buf_puts(b, ", ");
        first = 0;
        sd_buf_json_str(b, k, kl);
        sd_buf_puts(b, ": ");
        sd_buf_json_str(b, v, vl);
    }
    sd_buf_putc(b, '}');
    sd_shard_cursor_close(c);
    return st == SD_ENOTFOUND ? SD_OK : st;
}

/* Append one kind's statistics as a JSON object. */
static void kind_json(sd_buf *b, const kind_stats *k)
{
    sd_buf_printf(b, "{\"records\": %llu, \"bytes\": %llu, \"payload_bytes\": %llu, \"corrupt\": %llu",
                  (unsigned long long)k->n, (unsigned long long)k->bytes, (unsigned long long)k->payload,
                  (unsigned long long)k->corrupt);
    sd_buf_printf(b, ", \"flipped\": %llu, \"mean_std\": %llu, \"masks\": %llu, \"with_variants\": %llu, "
                  "\"variants\": %llu, \"dtypes\": {", (unsigned long long)k->flipped, (unsigned long long)k->meanstd,
                  (unsigned long long)k->masks, (unsigned long long)k->varied, (unsigned long long)k->variants);
    int first = 1;
    for (int d = 1; d < 4; d++)
        if (k->dtype[d]) {
            sd_buf_printf(b, "%s\"%s\": %llu", first ? "" : ", ", sd_dtype_name(d), (unsigned long long)k->dtype[d]);
            first = 0;
        }
    sd_buf_puts(b, "}}");
}

/* Print one kind's statistics as text. */
static void kind_text(const char *what, const kind_stats *k)
{
    printf("%-15s %llu records, %llu bytes (payload %llu)", what, (unsigned long long)k->n,
           (unsigned long long)k->bytes, (unsigned long long)k->payload);
    for (int d = 1; d < 4; d++)
        if (k->dtype[d]) printf(", %s %llu", sd_dtype_name(d), (unsigned long long)k->dtype[d]);
    if (k->flipped) printf(", flipped %llu", (unsigned long long)k->flipped);
    if (k->meanstd) printf(", mean+std %llu", (unsigned long long)k->meanstd);
    if (k->masks) printf(", loss masks %llu", (unsigned long long)k->masks);
    if (k->varied)
        printf(", caption variants on %llu (%llu variants)", (unsigned long long)k->varied,
               (unsigned long long)k->variants);
    if (k->corrupt) printf(", CORRUPT %llu (run sd-verify)", (unsigned long long)k->corrupt);
    printf("\n");
}

/* Describe one shard on stdout; the JSON form is one object per line. */
static sd_status info_one(const char *path, int json, sd_error *err)
{
    sd_shard *s;
    sd_shard_txn *t;
    sd_status st = pack_open_ro(&s, &t, path, err);
    if (st) return st;
    kind_stats lat = {0}, txt = {0};
    uint64_t names = 0;
    sd_shard_bucket *bk = NULL;
    size_t nb = 0;
    sd_buf meta;
    sd_buf_init(&meta);
    st = scan(t, SD_SHARD_DB_LATENTS, &lat, err);
    if (!st) st = scan(t, SD_SHARD_DB_TEXT, &txt, err);
    if (!st) st = sd_shard_count(t, SD_SHARD_DB_NAMES, &names, err);
    if (!st) st = sd_shard_buckets(t, &bk, &nb, err);
    if (!st) st = meta_json(t, &meta, err);
    struct stat sb;
    unsigned long long fsize = stat(path, &sb) == 0 ? (unsigned long long)sb.st_size : 0;
    if (!st && json) {
        sd_buf b;
        sd_buf_init(&b);
        sd_buf_puts(&b, "{\"shard\": ");
        sd_buf_json_cstr(&b, path);
        sd_buf_printf(&b, ", \"file_bytes\": %llu, \"meta\": ", fsize);
        sd_buf_put(&b, meta.data, meta.len);
        sd_buf_puts(&b, ", \"latents\": ");
        kind_json(&b, &lat);
        sd_buf_puts(&b, ", \"text\": ");
        kind_json(&b, &txt);
        sd_buf_printf(&b, ", \"names\": %llu, \"buckets\": [", (unsigned long long)names);
        for (size_t i = 0; i < nb; i++)
            sd_buf_printf(&b, "%s{\"w\": %u, \"h\": %u, \"count\": %llu}", i ? ", " : "", bk[i].w, bk[i].h,
                          (unsigned long long)bk[i].count);
        sd_buf_puts(&b, "]}\n");
        fwrite(b.data, 1, b.len, stdout);
        sd_buf_free(&b);
    } else if (!st) {
        printf("shard           %s (%llu bytes on disk)\n", path, fsize);
        printf("meta            %.*s\n", (int)meta.len, meta.data);
        kind_text("latents", &lat);
        kind_text("text", &txt);
        printf("names           %llu\n", (unsigned long long)names);
        printf("buckets         %zu\n", nb);
        for (size_t i = 0; i < nb; i++)
            printf("  %5ux%-5u     %llu\n", bk[i].w, bk[i].h, (unsigned long long)bk[i].count);
    }
    free(bk);
    sd_buf_free(&meta);
    pack_close_ro(s, t);
    return st;
}

/* sd-pack info SHARD... */
int pack_info(int argc, char **argv)
{
    int json = 0;
    pack_common c = {0};
    const sd_opt opts[] = {
        {"json", 0, SD_OPT_FLAG, &json, NULL, "one JSON object per shard instead of text"},
        {"quiet", 'q', SD_OPT_FLAG, &c.quiet, NULL, "only warnings and errors"},
        {NULL, 0, 0, NULL, NULL, NULL},
    };
    const sd_cli cli = {"sd-pack info", "[OPTIONS] SHARD...",
                        "Show a shard's metadata, record counts by kind (latents, text embeddings), records per\n"
                        "bucket, dtypes, flags and bytes. Every record header is parsed; corrupt ones are counted\n"
                        "(sd-verify says which and why).",
                        opts, "Example:\n  sd-pack info --json cache.lmdb",
        "0 ok, 2 usage error, 3 a shard cannot be read."};
    sd_strlist pos = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &pos);
    if (rc >= 0) {
        sd_strlist_free(&pos);
        return rc;
    }
    sd_log_setup("sd-pack info", c.quiet ? SD_LOG_WARN : SD_LOG_INFO);
    if (pos.n == 0) {
        sd_cli_usage_error(&cli, "no SHARD given");
        sd_strlist_free(&pos);
        return SD_EXIT_USAGE;
    }
    rc = SD_EXIT_OK;
    for (int i = 0; i < pos.n; i++) {
        sd_error err;
        if (info_one(pos.v[i], json, &err)) {
            sd_log(SD_LOG_ERROR, "%s", err.msg);
            rc = SD_EXIT_FATAL;
        }
    }
    sd_strlist_free(&pos);
    if (fflush(stdout) != 0 || ferror(stdout)) { /* > /dev/full, a full disk: not a silent truncation */
        sd_log(SD_LOG_ERROR, "standard output: write failed: %s", strerror(errno));
        rc = SD_EXIT_FATAL;
    }
    return rc;
}
