#include "meta_run.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

struct sd_meta_worker {
    SD_WORKER_ALIGN sd_arena arena; /* record strings, reset each batch */
    sd_buf out;     /* serialised records of this worker's slice */
    sd_buf scratch[3];
};

struct sd_meta_result {
    uint32_t off, len; /* in the worker's out buffer */
    int worker;
    sd_key128 key;
    const char *reason; /* NULL when the record is kept */
    const char *detail; /* worker-arena text, may be "" */
    const char *key_str;
    int val_left_out; /* a val record, kept out of kohya output */
    int unclosed;     /* its caption held a '{' without '}' (kept as a literal) */
    int wildcard;     /* K = 1: its caption holds a wildcard {a|b}, written as it is */
};

/* Set up a run writing to out. progress: show a progress display. */
sd_status sd_meta_run_init(sd_meta_run *m, const sd_rules *rules, const sd_build_opts *bopts, sd_pool *pool, FILE *out,
                           sd_out_format format, int show_limit, int progress, sd_error *err)
{
    memset(m, 0, sizeof *m);
    m->rules = rules;
    m->bopts = bopts;
    m->pool = pool;
    m->out = out;
    m->format = format;
    m->with_extra = 1;
    m->batch_cap = 8192;
    m->in = calloc(m->batch_cap, sizeof *m->in);
    m->res = calloc(m->batch_cap, sizeof *m->res);
    int nw = sd_pool_size(pool);
    m->workers = sd_worker_array((size_t)nw, sizeof *m->workers);
    if (!m->in || !m->res || !m->workers) return sd_err_set(err, SD_ENOMEM, "out of memory");
    for (int i = 0; i < nw; i++) {
        sd_arena_init(&m->workers[i].arena, 1 << 20);
        sd_buf_init(&m->workers[i].out);
        for (int k = 0; k < 3; k++) sd_buf_init(&m->workers[i].scratch[k]);
    }
    sd_arena_init(&m->arena, 1 << 20);
    sd_arena_init(&m->run_arena, 1 << 16);
    sd_keyset_init(&m->keys);
    sd_tally_init(&m->skips, show_limit);
    sd_tally_init(&m->ignored, show_limit < 0 ? -1 : 0); /* named with --verbose (all of them), else counted */
    m->ignored.verb = "ignored";
    sd_tally_init(&m->notes, show_limit);
    m->notes.verb = "note";
    sd_progress_init(&m->progress, "sd-meta", "records", 0, progress);
    if (format == SD_OUT_KOHYA) fputs("{", out);
    return SD_OK;
}

/* Copy a string into run-lifetime memory (file names that inputs point to). */
const char *sd_meta_keep(sd_meta_run *m, const char *s)
{
    return sd_arena_strndup(&m->run_arena, s, strlen(s));
}

/* How messages name an element of a JSON array or a kohya entry: "FILE:
 * entry N 'KEY'" (N from 1; no key part when key is NULL), in the batch's
 * memory like the input it names. */
const char *sd_meta_entry_origin(sd_meta_run *m, const char *file, long idx, const char *key, size_t klen)
{
    char where[400];
    int kl = (int)(klen < 200 ? klen : 200);
    if (key) snprintf(where, sizeof where, "%s: entry %ld '%.*s'", file, idx, kl, key);
    else snprintf(where, sizeof where, "%s: entry %ld", file, idx);
    return sd_arena_strndup(&m->arena, where, strlen(where));
}

/* A fresh input slot; the batch is processed first when full. */
sd_input *sd_meta_add(sd_meta_run *m, sd_input_kind kind, const char *origin, long line)
{
    if (m->n == m->batch_cap) sd_meta_flush(m);
    sd_input *in = &m->in[m->n++];
    sd_input_init(in, kind, origin, line);
    in->ordinal = m->next_ordinal++;
    m->read++;
    return in;
}

/* Count a skip and report it with control bytes and invalid UTF-8 in its
 * text escaped as \xHH (sd_name_escape): a file name holding a newline or
 * ESC must not split or recolour the message. */
static void skip_escaped(sd_tally *t, const char *reason, const char *msg)
{
    char esc[2048];
    sd_skip(t, reason, "%s", sd_name_escape(msg, esc, sizeof esc));
}

/* Count and report a candidate that a reader rejected before it became an
 * input (bad tar member, unreadable directory, ...). */
void sd_meta_skip_input(sd_meta_run *m, const char *reason, const char *fmt, ...)
{
    char where[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(where, sizeof where, fmt, ap);
    va_end(ap);
    m->read++;
    m->next_ordinal++;
    skip_escaped(&m->skips, reason, where);
}

/* Count and report a file that is left out without being an error (a
 * caption file with no usable image): counted in the summary, named with
 * --verbose. */
void sd_meta_note_ignored(sd_meta_run *m, const char *reason, const char *path)
{
    skip_escaped(&m->ignored, reason, path);
}

/* sd-scripts opens plain image files only, so a record whose image lies
 * inside a tar cannot go into kohya metadata: skipped with the reason. */
static int kohya_tar_member(const sd_record *rec, sd_meta_result *res)
{
    if (!rec->member) return 0;
    res->reason = "image inside a tar (sd-scripts reads image files only)";
    res->detail = rec->key;
    return 1;
}

/* Worker: build, filter and serialise inputs [b, e). */
static void process_range(void *ctx, int w, size_t b, size_t e)
{
    sd_meta_run *m = ctx;
    sd_meta_worker *wk = &m->workers[w];
    char detail[320];
    for (size_t i = b; i < e; i++) {
        sd_meta_result *res = &m->res[i];
        sd_record rec;
        const char *reason = NULL;
        res->worker = w;
        res->reason = NULL;
        res->detail = "";
        res->key_str = NULL;
        res->val_left_out = 0;
        res->unclosed = 0;
        res->wildcard = 0;
        if (sd_input_build(&m->in[i], m->bopts, &wk->arena, &rec, &reason, detail, sizeof detail) ||
            sd_rules_apply(m->rules, &rec, m->in[i].ordinal, &wk->arena, wk->scratch, &reason)) {
            res->reason = reason;
            if (detail[0]) res->detail = sd_arena_strndup(&wk->arena, detail, strlen(detail));
            continue;
        }
        if (!rec.out_caption || !rec.out_caption[0]) { /* nothing left to train on (every source, every rule) */
            res->reason = "empty caption";
            res->detail = rec.key ? rec.key : "";
            continue;
        }
        if (m->format == SD_OUT_KOHYA && kohya_tar_member(&rec, res)) continue;
        res->unclosed = rec.unclosed_brace;
        res->wildcard = rec.wildcard_literal;
        res->key_str = m->format == SD_OUT_KOHYA ? sd_record_kohya_key(&rec) : rec.key;
        res->key = sd_key128_of(res->key_str, strlen(res->key_str));
        /* kohya metadata has no split: a val record keeps its key (a later
         * copy stays a duplicate) but is not written */
        res->val_left_out = m->format == SD_OUT_KOHYA && rec.is_val;
        if (res->val_left_out) continue;
        size_t start = wk->out.len;
        if (m->format == SD_OUT_KOHYA) sd_record_write_kohya(&wk->out, &rec, res->key_str);
        else sd_record_write_json(&wk->out, &rec, m->with_extra);
        res->off = (uint32_t)start;
        res->len = (uint32_t)(wk->out.len - start);
    }
}

/* Where an input came from, for messages: "file:line" or "file". */
static void input_where(const sd_input *in, char *buf, size_t n)
{
    if (in->line > 0) snprintf(buf, n, "%s:%ld", in->origin, in->line);
    else if (in->member) snprintf(buf, n, "%s[%s]", in->origin, in->member);
    else snprintf(buf, n, "%s", in->origin ? in->origin : "?");
}

/* Process the batch in parallel, then emit kept records in input order. */
void sd_meta_flush(sd_meta_run *m)
{
    if (!m->n) return;
    int nw = sd_pool_size(m->pool);
    for (int i = 0; i < nw; i++) {
        sd_arena_reset(&m->workers[i].arena);
        sd_buf_clear(&m->workers[i].out);
    }
    sd_pool_for(m->pool, m->n, process_range, m);
    for (size_t i = 0; i < m->n; i++) {
        sd_meta_result *res = &m->res[i];
        char where[600], msg[1200];
        if (res->reason) {
            input_where(&m->in[i], where, sizeof where);
            if (res->detail[0]) snprintf(msg, sizeof msg, "%s (%s)", where, res->detail);
            else snprintf(msg, sizeof msg, "%s", where);
            skip_escaped(&m->skips, res->reason, msg);
            continue;
        }
        int fresh = sd_keyset_insert(&m->keys, res->key);
        if (fresh == 0) {
            input_where(&m->in[i], where, sizeof where);
            snprintf(msg, sizeof msg, "%s (key '%s' seen before; first kept)", where, res->key_str);
            skip_escaped(&m->skips, "duplicate key", msg);
            continue;
        }
        if (res->unclosed) {
            input_where(&m->in[i], where, sizeof where);
            snprintf(msg, sizeof msg, "%s (key '%s'; the record is kept, the brace is a literal)", where, res->key_str);
            skip_escaped(&m->notes, "unclosed { in a caption", msg);
        }
        if (res->wildcard) {
            input_where(&m->in[i], where, sizeof where);
            snprintf(msg, sizeof msg, "%s (key '%s'; trained as written: --caption-variants K > 1 draws the choices)",
                     where, res->key_str);
            skip_escaped(&m->notes, "wildcard {a|b} without --caption-variants", msg);
        }
        if (res->val_left_out) {
            m->val_left_out++;
            continue;
        }
        const char *data = m->workers[res->worker].out.data + res->off;
        if (m->format == SD_OUT_KOHYA) fputs(m->written ? ",\n  " : "\n  ", m->out);
        if (fwrite(data, 1, res->len, m->out) != res->len && !m->write_failed) {
            m->write_failed = 1;
            m->write_errno = errno;
        }
        m->written++;
    }
    if (!m->write_failed && (!m->out_file || !m->out_file->tmp)) { /* stdout or a device: known to be out */
        if (fflush(m->out) == 0) {
            m->written_out = m->written;
        } else {
            m->write_failed = 1;
            m->write_errno = errno;
        }
    }
    m->n = 0;
    sd_arena_reset(&m->arena);
    sd_progress_update(&m->progress, m->read, m->skips.total);
    if (m->out_file) sd_outfile_writeback(m->out_file);
}

/* Flush what is left and close the output format. */
sd_status sd_meta_finish(sd_meta_run *m, sd_error *err)
{
    sd_meta_flush(m);
    if (m->format == SD_OUT_KOHYA) fputs(m->written ? "\n}\n" : "}\n", m->out);
    sd_progress_update(&m->progress, m->read, m->skips.total);
    sd_progress_finish(&m->progress);
    if (fflush(m->out) != 0 && !m->write_failed) {
        m->write_failed = 1;
        m->write_errno = errno;
    }
    if (!m->write_failed && !ferror(m->out)) m->written_out = m->written;
    if (m->write_failed || ferror(m->out))
        return sd_err_set(err, SD_EIO, "%s: writing the output failed: %s",
                          m->out_file && m->out_file->path ? m->out_file->path : "standard output",
                          m->write_failed ? strerror(m->write_errno) : "write error");
    return SD_OK;
}

/* Free everything the run holds. */
void sd_meta_run_free(sd_meta_run *m)
{
    int nw = sd_pool_size(m->pool);
    for (int i = 0; m->workers && i < nw; i++) {
        sd_arena_free(&m->workers[i].arena);
        sd_buf_free(&m->workers[i].out);
        for (int k = 0; k < 3; k++) sd_buf_free(&m->workers[i].scratch[k]);
    }
    free(m->workers);
    free(m->in);
    free(m->res);
    sd_arena_free(&m->arena);
    sd_arena_free(&m->run_arena);
    sd_keyset_free(&m->keys);
}
