/* sd-verify: one shard from open to close: its pages, a verification pass,
 * and with --repair the deletions and index rebuild (re-verifying until
 * clean or MAX_ROUNDS) or the salvage of a file with damaged pages. */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "verify.h"

enum { MAX_ROUNDS = 3 };

/* One full verification pass over an open shard. */
static sd_status verify_pass(sd_shard *s, const verify_opts *o, sd_pool *pool, int show, shard_result *res,
                             sd_error *err)
{
    double t0 = sd_now();
    verify_free_problems(&res->probs);
    sd_shard_txn *t;
    uint64_t nl = 0, nt = 0;
    sd_status st = sd_shard_read_begin(s, &t, err);
    if (st) return st;
    sd_shard_count(t, SD_SHARD_DB_LATENTS, &nl, err);
    sd_shard_count(t, SD_SHARD_DB_TEXT, &nt, err);
    sd_shard_read_end(t);
    sd_progress prog;
    sd_progress_init(&prog, "sd-verify", "records", nl + nt, show && !o->quiet);
    uint64_t b1 = 0, b2 = 0;
    st = verify_scan_db(s, SD_SHARD_DB_LATENTS, pool, &prog, 0, &res->probs, &res->latents, &b1, err);
    if (!st) st = verify_scan_db(s, SD_SHARD_DB_TEXT, pool, &prog, res->latents, &res->probs, &res->texts, &b2, err);
    res->bytes = b1 + b2;
    if (!st) st = verify_check_indexes(s, &res->probs, err);
    if (!st) st = verify_check_empty_text(s, &res->probs, err);
    if (!st) st = verify_check_variants(s, &res->probs, err);
    if (!st && o->manifest) st = verify_check_manifest(s, o->manifest, &res->probs, err);
    sd_progress_update(&prog, res->latents + res->texts, 0);
    sd_progress_finish(&prog);
    res->seconds = sd_now() - t0;
    return st;
}

/* Problems --repair leaves as they are: a record of a newer format version
 * (sound for the sdtk that wrote it: deleting it would lose its data) and an
 * empty_text naming a missing embedding (nothing to delete or rebuild). */
static int report_only(const problem *p)
{
    return strcmp(p->reason, "newer_version") == 0 || strcmp(p->reason, "empty_text_missing") == 0;
}

/* 1 when --repair can do something about one of the problems. */
static int any_repairable(const problem_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        if (!report_only(&l->v[i])) return 1;
    return 0;
}

/* Delete the bad records, rebuild the index; 0 problems means nothing to do. */
static sd_status repair(sd_shard *s, shard_result *res, sd_error *err)
{
    sd_status st = sd_shard_begin(s, err);
    if (st) return st;
    for (size_t i = 0; !st && i < res->probs.n; i++) {
        problem *p = &res->probs.v[i];
        if (report_only(p)) continue;
        if (p->db == SD_SHARD_DB_LATENTS && p->key) {
            st = sd_shard_del(s, p->key, p->klen, err);
            if (!st) res->repaired_latents++;
        } else if (p->db == SD_SHARD_DB_TEXT && p->key && p->klen == SD_SHARD_TEXT_KEY) {
            st = sd_shard_del_text(s, p->key, err);
            if (!st) res->repaired_texts++;
        }
        if (st == SD_ENOTFOUND) st = SD_OK;
    }
    if (!st) st = sd_shard_reindex(s, err);
    if (!st) st = sd_shard_commit(s, err);
    else sd_shard_abort(s);
    res->reindexed = !st;
    uint64_t fixed = 0; /* after the deletions: a variant whose embedding they took goes too */
    if (!st) st = verify_fix_variants(s, &fixed, err);
    res->repaired_variants += fixed;
    return st;
}

/* The pages under the records (sd_shard_check_pages, deep): damage is one
 * problem naming the first damaged place; with --repair the file is
 * replaced by the entries of its intact pages (sd_shard_salvage), since
 * LMDB can neither read nor safely write it. */
static sd_status check_pages(sd_shard **s, const verify_opts *o, shard_result *res, problem *found, sd_error *err)
{
    sd_shard_pages pages;
    sd_status st = sd_shard_check_pages(*s, 1, NULL, NULL, &pages, err);
    if (st || !pages.damage) return st;
    memset(found, 0, sizeof *found);
    found->reason = "damaged_page";
    found->db = VERIFY_DB_PAGES;
    const char *plural = pages.damage == 1 ? "" : "s";
    snprintf(found->detail, sizeof found->detail, "%llu damaged place%s; first: %.140s",
             (unsigned long long)pages.damage, plural, pages.first);
    sd_log(o->repair ? SD_LOG_WARN : SD_LOG_ERROR, "%s: damaged pages: %s (%llu damaged place%s)%s%s", res->path,
           pages.first, (unsigned long long)pages.damage, plural,
           sd_shard_damaged(*s) ? ", so its records cannot be read" : "",
           o->repair ? "" : "; sd-verify --repair copies the records of its intact pages into a new file");
    if (!o->repair) return SD_OK;
    st = sd_shard_salvage(s, &res->salvage, err);
    if (st && *s) { /* refused, nothing changed: the problem stays, nothing else is repaired */
        sd_log(SD_LOG_ERROR, "%s", err->msg);
        return SD_OK;
    }
    if (st) return st;
    res->salvaged = 1;
    const sd_shard_salvage_counts *c = &res->salvage;
    char older[160] = "";
    if (c->older)
        snprintf(older, sizeof older, "; %llu of these entries %s", (unsigned long long)c->from_older,
                 c->older_only ? "from the snapshot before the newest alone (the newest one's directory is damaged)"
                               : "only in the snapshot before the newest");
    sd_log(SD_LOG_WARN, "%s: replaced by a new file holding the %llu latent records (of %llu its header counted), "
           "%llu text records and %llu meta entries of its intact pages (%llu entries dropped%s); the damaged file "
           "is kept as %s (remove it when done); rerun sd-latents to compute the missing records again", res->path,
           (unsigned long long)c->latents, (unsigned long long)(c->older_only ? c->older_found.records : pages.records),
           (unsigned long long)c->texts, (unsigned long long)c->meta, (unsigned long long)c->dropped, older, c->kept);
    return SD_OK;
}

/* Add the damaged-page problem to the shard's list (after a verify pass,
 * which starts the list afresh). */
static void add_found(shard_result *res, const problem *found)
{
    if (!found->reason) return;
    verify_add_problem(&res->probs, found->reason, found->db, NULL, 0, NULL, 0, "%s", found->detail);
}

/* Open, verify, optionally repair (re-verifying until clean or MAX_ROUNDS). */
void verify_shard(const char *path, const verify_opts *o, sd_pool *pool, shard_result *res)
{
    sd_error err;
    sd_shard *s;
    sd_shard_opts so = {(o->repair ? 0 : SD_SHARD_RDONLY) | SD_SHARD_KEEP_DAMAGED, 0, 0};
    res->path = path;
    sd_buf_init(&res->examples);
    sd_tally_init(&res->tally, o->verbose ? -1 : (int)o->examples);
    res->tally.verb = "problem";
    sd_status st = sd_shard_open(&s, path, &so, &err);
    if (st) {
        snprintf(res->open_error, sizeof res->open_error, "%s", err.msg);
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        return;
    }
    res->opened = 1;
    problem found = {0};
    st = check_pages(&s, o, res, &found, &err);
    if (!st && !sd_shard_damaged(s)) st = verify_pass(s, o, pool, 1, res, &err);
    if (!st) add_found(res, &found);
    if (!st) verify_tally_problems(res);
    if (!st && res->salvaged) res->probs.n--; /* repaired by the salvage: not for the rounds below */
    int writable = !found.reason || res->salvaged; /* never write into a file with damaged pages */
    for (int round = 0; !st && writable && o->repair && any_repairable(&res->probs) && round < MAX_ROUNDS; round++) {
        st = repair(s, res, &err);
        shard_result again;
        memset(&again, 0, sizeof again);
        if (!st) st = verify_pass(s, o, pool, 0, &again, &err);
        verify_free_problems(&res->probs);
        res->probs = again.probs;
    }
    if (!st && o->repair) res->after_repair = res->probs.n;
    if (st) {
        snprintf(res->open_error, sizeof res->open_error, "%s", err.msg);
        sd_log(SD_LOG_ERROR, "%s", err.msg);
        res->opened = 0;
    }
    sd_shard_close(s, &err);
}
