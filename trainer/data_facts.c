/* What the training shards hold beyond latents and captions, told at the
 * start of a run: caption variants and loss masks (counted per shard by
 * data_index.c while indexing), and --masked-loss checked against the
 * masks, so that a masked run on shards without masks is not silently a
 * plain one. */
#include <stdio.h>
#include <string.h>

#include "clip_text.h"
#include "data.h"
#include "log.h"

/* How many shard names a message lists before "and N more". */
enum { NAMES_MAX = 4 };

/* The shards with records whose facts pass `pick` (masks: none, or some),
 * as a list of names ("a.shard, b.shard and 3 more") in out. */
static void shard_names(const sd_data *d, const char *const *paths, int (*pick)(const sd_data_facts *), char *out,
                        size_t cap)
{
    size_t len = 0;
    int listed = 0, more = 0;
    out[0] = 0;
    for (int i = 0; i < d->nshards; i++) {
        if (!d->facts[i].records || !pick(&d->facts[i])) continue;
        if (listed == NAMES_MAX) {
            more++;
            continue;
        }
        int n = snprintf(out + len, cap - len, "%s%s", listed ? ", " : "", paths[i]);
        if (n < 0 || (size_t)n >= cap - len) break;
        len += (size_t)n;
        listed++;
    }
    if (more && len < cap) snprintf(out + len, cap - len, " and %d more", more);
}

/* A shard none of whose records has a mask. */
static int no_masks(const sd_data_facts *f)
{
    return f->masks == 0;
}

/* A shard where some records have a mask and others not. */
static int some_masks(const sd_data_facts *f)
{
    return f->masks > 0 && f->masks < f->records;
}

/* See data.h. */
sd_status sd_data_facts_report(const sd_data *d, const char *const *paths, int masked, int log, sd_error *err)
{
    sd_data_facts all = {0};
    for (int i = 0; i < d->nshards; i++) {
        all.records += d->facts[i].records;
        all.masks += d->facts[i].masks;
        all.varied += d->facts[i].varied;
        all.variants += d->facts[i].variants;
    }
    char none[600], part[300];
    if (masked && all.masks == 0) {
        shard_names(d, paths, no_masks, none, sizeof none);
        return sd_err_set(err, SD_EINVAL, "--masked-loss: no record of %s has a loss mask, so every record would "
                          "train on the plain loss: make the shards with sd-latents --masks alpha|files (or import "
                          "kohya caches with alpha_mask), or drop --masked-loss", none);
    }
    unsigned long long recs = (unsigned long long)all.records;
    if (log && all.varied)
        sd_log(SD_LOG_INFO, "caption variants: %llu of %llu records have them, %llu variants in all (each such "
               "record trains on one of its variants per epoch)", (unsigned long long)all.varied, recs,
               (unsigned long long)all.variants);
    else if (log)
        sd_log(SD_LOG_INFO, "caption variants: none (each record trains on its caption)");
    if (log && all.masks)
        sd_log(SD_LOG_INFO, "loss masks: %llu of %llu records have one%s", (unsigned long long)all.masks, recs,
               masked ? " (--masked-loss)" : "; not used without --masked-loss");
    else if (log)
        sd_log(SD_LOG_INFO, "loss masks: none");
    if (log && masked && all.masks < all.records) {
        /* sd-scripts fills a batch's missing masks with ones: those records get the unmasked loss */
        shard_names(d, paths, no_masks, none, sizeof none);
        shard_names(d, paths, some_masks, part, sizeof part);
        sd_log(SD_LOG_WARN, "--masked-loss: %llu of %llu records have no loss mask (%s%s%s%s%s): they train on the "
               "plain, unmasked loss (every latent pixel weighs 1, as sd-scripts fills missing masks with ones)",
               (unsigned long long)(all.records - all.masks), recs, none[0] ? "none in " : "", none,
               none[0] && part[0] ? "; " : "", part[0] ? "some in " : "", part);
    }
    return SD_OK;
}

/* See data.h. */
int sd_data_caption_tokens(const sd_data *d, const sd_load_opts *lo)
{
    int n = sd_data_max_tokens(d), rows = 0;
    if (n) return n;
    sd_error e = {0};
    if (d->nbuckets && sd_data_bucket_tokens(d, 0, lo, &rows, &e) == SD_OK && sd_clip_kohya_rows(rows - 2))
        return rows - 2;
    return 75;
}
