/* sd-pack merge and compact: copy records (and the text embeddings they
 * reference) from input shards into a new one, checking every record on
 * the way so corruption is not carried along. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "log.h"
#include "pack.h"

typedef struct {
    sd_tally tally;
    sd_progress prog;
    uint64_t in, out, texts;
    uint64_t variants_dropped; /* caption variants left out: their embedding missing or corrupt */
    int has_empty;      /* the output holds an empty caption's embedding and names it */
    int encoder_known;  /* an input with text embeddings or a text_encoder was met */
} copy_run;

/* Does the input's names index point the record's name at another record
 * that is sound and carries that name (a corrupt indexed copy, or an entry
 * leading to a record of another name, leaves this one to be kept)? */
static int indexed_elsewhere(sd_shard_txn *t, const sd_shard_rec *rec, const void *k, size_t kl)
{
    const void *ik = NULL, *iv = NULL;
    size_t ikl = 0, ivl = 0;
    sd_error e = {0};
    sd_shard_rec other;
    if (sd_shard_get_name(t, rec->name, rec->name_len, &ik, &ikl, &e) != SD_OK) return 0;
    if (ikl == kl && memcmp(ik, k, kl) == 0) return 0;
    if (sd_shard_get(t, ik, ikl, &iv, &ivl, &e) != SD_OK) return 0;
    if (pack_rec_check(iv, ivl, SD_REC_LATENT, "a text-embedding record among the latents", &other, &e)) return 0;
    return other.name_len == rec->name_len && memcmp(other.name, rec->name, rec->name_len) == 0;
}

/* Carry an input's text identity into the output: the embedding its
 * empty_text names (stored unreferenced, so the record copy would miss it),
 * the output's empty_text naming the first one the output holds, and the
 * text_encoder of the first input with text embeddings or that meta (a
 * first input without either would leave the output unlabelled). A missing
 * or corrupt embedding is a skip. */
static sd_status copy_text_identity(sd_shard *s, sd_shard_txn *t, const char *path, pack_out *o, copy_run *r,
                                    sd_error *err)
{
    uint8_t key[16];
    int found = 0;
    const char *skip;
    sd_error why;
    sd_err_clear(&why);
    sd_status st = pack_find_empty_text(s, t, key, &found, &skip, &why, err);
    if (!st && skip) sd_skip(&r->tally, skip, "%s: %s", path, why.msg);
    if (!st && found && !r->has_empty) {
        st = pack_put_empty_text(t, o, key, err);
        r->has_empty = !st;
    } else if (!st && found) {
        st = pack_copy_text(t, o, key, &skip, &why, err);
    }
    if (st || r->encoder_known) return st;
    char *enc = NULL;
    sd_error e;
    uint64_t texts = 0;
    if (sd_shard_meta_get(s, SD_SHARD_META_TEXT_ENCODER, &enc, &e) == SD_OK) {
        st = sd_shard_meta_set(o->s, SD_SHARD_META_TEXT_ENCODER, enc, err);
        r->encoder_known = 1;
    } else if (sd_shard_count(t, SD_SHARD_DB_TEXT, &texts, &e) == SD_OK && texts) {
        r->encoder_known = 1;
    }
    free(enc);
    return st;
}

/* Why one latent record of an input is not copied (NULL: copy it), with
 * the detail in *why: its key or its name is already in the output (the
 * first one is kept, so the names index keeps pointing at it), its input's
 * names index points at another sound copy of its name, it is corrupt, or
 * so is its text embedding. Copies the text embedding. */
static sd_status check_one(sd_shard_txn *t, pack_out *o, const void *k, size_t kl, const void *v, size_t vl,
                           const char **skip, sd_error *why, sd_error *err)
{
    int found = 0;
    *skip = NULL;
    sd_status st = sd_shard_exists(o->s, k, kl, &found, err);
    if (st || found) {
        if (found) *skip = "duplicate record key (first kept)";
        return st;
    }
    sd_shard_rec rec;
    if (pack_rec_check(v, vl, SD_REC_LATENT, "a text-embedding record among the latents", &rec, why)) {
        *skip = "corrupt record";
        return SD_OK;
    }
    if (rec.name_len) {
        /* two records of one name in this input: the one its names index
         * points at is the current one (as sd-verify --repair keeps it) */
        if (indexed_elsewhere(t, &rec, k, kl)) {
            *skip = "duplicate name (the indexed copy kept)";
            int n = (int)(rec.name_len < 200 ? rec.name_len : 200);
            sd_err_set(why, SD_EINVAL, "name '%.*s': the input's names index points at another record", n, rec.name);
            return SD_OK;
        }
        st = sd_shard_name_exists(o->s, rec.name, rec.name_len, &found, err);
        if (st || found) {
            if (found) *skip = "duplicate name (first kept)";
            int n = (int)(rec.name_len < 200 ? rec.name_len : 200);
            sd_err_set(why, SD_EINVAL, "name '%.*s' is already in the output", n, rec.name);
            return st;
        }
    }
    return pack_has_text_ref(rec.text_ref) ? pack_copy_text(t, o, rec.text_ref, skip, why, err) : SD_OK;
}

/* Copy every latent record of one input; all_text also copies text
 * embeddings no record references. Record problems are skips, the rest is fatal. */
static sd_status copy_shard(const char *path, pack_out *o, int all_text, const char *producer, copy_run *r,
                            sd_error *err)
{
    sd_shard *s;
    sd_shard_txn *t;
    sd_status st = pack_open_ro(&s, &t, path, err);
    if (st) return st;
    if (producer) st = pack_copy_meta(t, o, producer, err);
    if (!st) st = copy_text_identity(s, t, path, o, r, err);
    sd_shard_cursor *c = NULL;
    if (!st) st = sd_shard_cursor_open(t, SD_SHARD_DB_LATENTS, &c, err);
    const void *k, *v;
    size_t kl, vl;
    char hex[80], label[512];
    while (!st && (st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        r->in++;
        sd_progress_update(&r->prog, r->in, r->tally.total);
        const char *skip;
        sd_error why;
        sd_err_clear(&why);
        st = check_one(t, o, k, kl, v, vl, &skip, &why, err);
        if (st) break;
        if (skip) {
            pack_rec_label(k, kl, v, vl, label, sizeof label);
            sd_skip(&r->tally, skip, "%s: record %s%s%s", path, label, why.msg[0] ? ": " : "", why.msg);
            continue;
        }
        st = pack_out_put(o, k, kl, v, vl, err);
        sd_shard_rec rec;
        if (!st && sd_shard_rec_parse(v, vl, &rec, &why) == SD_OK && pack_has_text_ref(rec.text_ref))
            st = pack_copy_variants(t, o, k, kl, rec.text_ref, &r->variants_dropped, err);
        if (!st) r->out++;
    }
    if (st == SD_ENOTFOUND) st = SD_OK;
    sd_shard_cursor_close(c);
    c = NULL;
    if (!st && all_text) st = sd_shard_cursor_open(t, SD_SHARD_DB_TEXT, &c, err);
    while (!st && all_text && (st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        int found = 0;
        if (kl != SD_SHARD_TEXT_KEY) continue;
        st = sd_shard_text_exists(o->s, k, &found, err);
        if (st || found) continue;
        sd_shard_rec rec;
        sd_error e;
        if (pack_rec_check(v, vl, SD_REC_TEXT, "a latent record among the text embeddings", &rec, &e)) {
            pack_hex(k, kl, hex, sizeof hex);
            sd_skip(&r->tally, "corrupt text embedding", "%s: text %s (%s)", path, hex, e.msg);
            continue;
        }
        st = pack_out_put_text(o, k, v, vl, err);
    }
    if (st == SD_ENOTFOUND) st = SD_OK;
    sd_shard_cursor_close(c);
    pack_close_ro(s, t);
    return st;
}

/* A meta value of a shard as a malloc'ed string ("" when absent). */
static char *meta_or_empty(sd_shard *s, const char *key)
{
    char *v = NULL;
    sd_error e;
    if (sd_shard_meta_get(s, key, &v, &e) != SD_OK) return strdup("");
    return v;
}

/* A shard's text encoder setup for the merge check: its text_encoder meta,
 * "" when absent (embeddings of an unknown setup), or NULL when it has
 * neither that meta nor text embeddings (latents alone fit any setup). */
static char *text_identity(sd_shard *s)
{
    char *v = NULL;
    sd_error e;
    if (sd_shard_meta_get(s, SD_SHARD_META_TEXT_ENCODER, &v, &e) == SD_OK) return v;
    sd_shard_txn *t;
    uint64_t texts = 0;
    if (sd_shard_read_begin(s, &t, &e) == SD_OK) {
        if (sd_shard_count(t, SD_SHARD_DB_TEXT, &texts, &e) != SD_OK) texts = 1; /* unknown: not a wildcard */
        sd_shard_read_end(t);
    }
    return texts ? strdup("") : NULL;
}

/* Refuse input i when its text encoder setup differs from the first input
 * that has one (sd-train refuses such shards; merged, they would pass under
 * one label). *first and *first_i keep that input's setup and index. */
static sd_status check_same_text(sd_shard *s, const sd_strlist *in, int i, char **first, int *first_i, sd_error *err)
{
    char *te = text_identity(s);
    sd_status st = SD_OK;
    if (!te) return SD_OK;
    if (!*first) {
        *first = te;
        *first_i = i;
        return SD_OK;
    }
    if (strcmp(te, *first) != 0)
        st = sd_err_set(err, SD_EINVAL, "%s has text_encoder '%s' but %s has '%s': text embeddings of different "
                        "text encoder setups; --allow-mixed merges them anyway", in->v[i], te[0] ? te : "(none)",
                        in->v[*first_i], (*first)[0] ? *first : "(none)");
    free(te);
    return st;
}

/* Latents from different VAEs (or scaling factors), or text embeddings of
 * different encoder setups, must not be mixed in one cache by accident:
 * compare every input's model identity with the first's, and its text
 * encoder setup with the first input's that has one. */
static sd_status check_same_model(const sd_strlist *in, sd_error *err)
{
    static const char *const keys[] = {SD_SHARD_META_MODEL, SD_SHARD_META_SCALING};
    char *first[2] = {NULL, NULL}, *first_te = NULL;
    int first_te_i = 0;
    sd_status st = SD_OK;
    for (int i = 0; !st && i < in->n; i++) {
        sd_shard *s;
        sd_shard_opts ro = {SD_SHARD_RDONLY, 0, 0};
        if ((st = sd_shard_open(&s, in->v[i], &ro, err))) break;
        for (int k = 0; k < 2 && !st; k++) {
            char *v = meta_or_empty(s, keys[k]);
            if (i == 0) {
                first[k] = v;
                continue;
            }
            if (v && first[k] && strcmp(v, first[k]) != 0)
                st = sd_err_set(err, SD_EINVAL, "%s has %s '%s' but %s has '%s': caches of different models; "
                                "--allow-mixed merges them anyway", in->v[i], keys[k], v, in->v[0], first[k]);
            free(v);
        }
        if (!st) st = check_same_text(s, in, i, &first_te, &first_te_i, err);
        sd_error ce;
        sd_shard_close(s, &ce);
    }
    free(first[0]);
    free(first[1]);
    free(first_te);
    return st;
}

/* Copy inputs into a new shard at output (built under a temporary name;
 * mode PACK_OUT_REPLACE: it may replace an existing output). */
static int run_copy(const char *prog, const sd_strlist *in, const char *output, int all_text, unsigned mode,
                    const pack_common *pc)
{
    copy_run r;
    memset(&r, 0, sizeof r);
    sd_tally_init(&r.tally, pc->verbose ? -1 : 10);
    sd_progress_init(&r.prog, prog, "records", 0, !pc->quiet);
    pack_out o;
    sd_error err;
    if (pack_out_open(&o, output, mode, &err)) {
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        return SD_EXIT_FATAL;
    }
    sd_status st = SD_OK;
    char producer[128];
    snprintf(producer, sizeof producer, "%s %s", prog, sd_version());
    for (int i = 0; !st && i < in->n; i++) {
        st = copy_shard(in->v[i], &o, all_text, i == 0 ? producer : NULL, &r, &err);
        if (st) sd_log(SD_LOG_ERROR, "%s", err.msg);
    }
    pack_progress_finish(&r.prog, &r.tally);
    if (st) {
        pack_out_abort(&o, 0);
        return SD_EXIT_FATAL;
    }
    if (pack_out_commit(&o, &err)) {
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        return SD_EXIT_FATAL;
    }
    sd_log(SD_LOG_INFO, "%llu records read, %llu written to %s, %llu skipped", (unsigned long long)r.in,
           (unsigned long long)r.out, output, (unsigned long long)r.tally.total);
    if (r.variants_dropped)
        sd_log(SD_LOG_WARN, "%llu caption variants left out: their text embedding is missing or corrupt in the input "
               "(sd-verify names them there)", (unsigned long long)r.variants_dropped);
    return pack_finish(&r.tally, pc, "skipped");
}

/* Shared command-line handling of merge and compact. */
static int copy_main(int argc, char **argv, int compact)
{
    const char *output = NULL;
    pack_common pc = {0};
    int allow_mixed = 0, force = 0;
    sd_opt opts[] = {
        {"output", 'o', SD_OPT_STR, &output, "SHARD",
         "the new shard (written as SHARD.partial-XXXXXX, renamed at the end)"},
        {"force", 0, SD_OPT_FLAG, &force, NULL,
         "replace an existing SHARD; never one being written"},
        {"strict", 0, SD_OPT_FLAG, &pc.strict, NULL, "exit 1 if any record was skipped"},
        {"quiet", 'q', SD_OPT_FLAG, &pc.quiet, NULL, "only warnings and errors"},
        {"verbose", 'v', SD_OPT_FLAG, &pc.verbose, NULL, "show every skipped record"},
        {"allow-mixed", 0, SD_OPT_FLAG, &allow_mixed, NULL,
         "accept inputs whose model_hash, scaling_factor or text_encoder differ"},
        {NULL, 0, 0, NULL, NULL, NULL},
    };
    if (compact) opts[5] = opts[6]; /* one input: nothing to mix */
    const sd_cli merge_cli = {
        "sd-pack merge", "-o OUT SHARD...",
        "Merge shards into one. Records are copied in input order; a record whose key or whose name\n"
        "(the sd-meta key: the same image cached under another key) is already in the output is\n"
        "skipped (the first one is kept) and counted. Text embeddings are keyed by content hash, so\n"
        "each is stored once. Every record's and text embedding's header and checksum are checked;\n"
        "corrupt ones (and records whose text embedding is missing or corrupt) are skipped. The\n"
        "empty caption's embedding each input's empty_text names (for conditioning dropout) is\n"
        "copied too; OUT's empty_text names the first one copied.\n"
        "Meta entries come from the first shard; inputs made with another model (model_hash or\n"
        "scaling_factor) or another text encoder setup (text_encoder; a shard without text\n"
        "embeddings fits any) are refused unless --allow-mixed. OUT is built under a fresh temporary\n"
        "name beside it (OUT.partial-XXXXXX) and renamed into place at the end; no input may be OUT.\n"
        "An existing OUT is refused unless --force, which replaces it; even with --force, not while\n"
        "another process (sd-latents, import-kohya) is writing it.",
        opts, "Example:\n  sd-pack merge -o all.lmdb part-0.lmdb part-1.lmdb", NULL};
    const sd_cli compact_cli = {
        "sd-pack compact", "SHARD -o OUT",
        "Copy a shard without its free pages (a shard that had records deleted or replaced shrinks).\n"
        "Every record and text embedding is rewritten through the shard API and checked on the way\n"
        "(header and checksum); corrupt ones, records whose text embedding is missing or corrupt and\n"
        "a second record of one name are skipped and counted. OUT is built under a fresh temporary\n"
        "name beside it and renamed into place at the end; it may not be SHARD itself. An existing\n"
        "OUT is refused unless --force, which replaces it; even with --force, not while another\n"
        "process (sd-latents, import-kohya) is writing it.",
        opts, "Example:\n  sd-pack compact cache.lmdb -o cache.compact.lmdb && mv cache.compact.lmdb cache.lmdb", NULL};
    const sd_cli *cli = compact ? &compact_cli : &merge_cli;
    sd_strlist pos = {0};
    int rc = sd_cli_parse(cli, argc, argv, &pos);
    if (rc >= 0) {
        sd_strlist_free(&pos);
        return rc;
    }
    sd_log_setup(cli->prog, pc.quiet ? SD_LOG_WARN : pc.verbose ? SD_LOG_DEBUG : SD_LOG_INFO);
    rc = -1;
    if (!output) rc = (sd_cli_usage_error(cli, "-o OUT is required"), SD_EXIT_USAGE);
    else if (pos.n == 0 || (compact && pos.n != 1))
        rc = (sd_cli_usage_error(cli, compact ? "give exactly one SHARD" : "no SHARD given"), SD_EXIT_USAGE);
    for (int i = 0; rc < 0 && i < pos.n; i++)
        if (pack_same_file(pos.v[i], output))
            rc = (sd_cli_usage_error(cli, "output %s is also an input", output), SD_EXIT_USAGE);
    if (rc < 0 && !force && pack_path_taken(output))
        rc = (sd_cli_usage_error(cli, "output %s exists: --force replaces it", output), SD_EXIT_USAGE);
    sd_error re = {0};
    if (rc < 0 && force && pack_path_taken(output) && sd_shard_replaceable(output, &re) == SD_EFORMAT)
        rc = (sd_cli_usage_error(cli, "%s", re.msg), SD_EXIT_USAGE);
    if (rc < 0 && pack_path_busy(output)) {
        sd_log(SD_LOG_ERROR, "output %s is being written by another process (it holds the shard's writer lock): "
               "not replaced, even with --force", output);
        rc = SD_EXIT_FATAL;
    }
    sd_error err;
    if (rc < 0 && !compact && !allow_mixed && check_same_model(&pos, &err)) {
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        rc = err.code == SD_EINVAL ? SD_EXIT_USAGE : SD_EXIT_FATAL;
    }
    if (rc < 0) rc = run_copy(cli->prog, &pos, output, compact, force ? PACK_OUT_REPLACE : 0, &pc);
    sd_strlist_free(&pos);
    return rc;
}

/* sd-pack merge -o OUT SHARD... */
int pack_merge(int argc, char **argv)
{
    return copy_main(argc, argv, 0);
}

/* sd-pack compact SHARD -o OUT */
int pack_compact(int argc, char **argv)
{
    return copy_main(argc, argv, 1);
}
