/* sd-verify: problems into the tally (the messages, the first few of each
 * kind kept as JSON examples) and the JSON report of every shard. */
#include <stdio.h>

#include "verify.h"

/* Where a problem is, for its message: "text key K name N", only the parts
 * it has (empty for a bucket count, say). */
static void problem_where(const problem *p, const char *k, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s", p->db == SD_SHARD_DB_TEXT ? "text" : p->db == SD_SHARD_DB_META ? "meta" : "");
    if (p->key && n >= 0 && (size_t)n < cap) n += snprintf(out + n, cap - (size_t)n, "%skey %s", n ? " " : "", k);
    if (p->name && p->name[0] && n >= 0 && (size_t)n < cap)
        snprintf(out + n, cap - (size_t)n, "%sname %s", n ? " " : "", p->name);
}

/* Count problems into the tally, printing the first few of each kind. */
void verify_tally_problems(shard_result *res)
{
    for (size_t i = 0; i < res->probs.n; i++) {
        problem *p = &res->probs.v[i];
        char k[80], where[400];
        verify_key_str(p->key, p->klen, k, sizeof k);
        problem_where(p, k, where, sizeof where);
        sd_skip(&res->tally, p->reason, "%s: %s%s%s", res->path, where, where[0] ? ": " : "", p->detail);
        if (res->tally.show_limit >= 0 && sd_tally_count(&res->tally, p->reason) > (uint64_t)res->tally.show_limit)
            continue;
        sd_buf *b = &res->examples;
        int first = 1;
        sd_buf_puts(b, b->len ? ",{" : "{");
        sd_buf_json_key(b, &first, "kind");
        sd_buf_json_cstr(b, p->reason);
        sd_buf_json_key(b, &first, "db");
        sd_buf_json_cstr(b, p->db == SD_SHARD_DB_TEXT      ? "text"
                            : p->db == SD_SHARD_DB_LATENTS ? "latents"
                            : p->db == SD_SHARD_DB_META    ? "meta"
                            : p->db == SD_SHARD_DB_VARIANTS ? "variants"
                            : p->db == VERIFY_DB_PAGES     ? "pages"
                                                           : "index");
        if (p->key) {
            sd_buf_json_key(b, &first, "key");
            sd_buf_json_cstr(b, k);
        }
        if (p->name && p->name[0]) {
            sd_buf_json_key(b, &first, "name");
            sd_buf_json_cstr(b, p->name);
        }
        sd_buf_json_key(b, &first, "detail");
        sd_buf_json_cstr(b, p->detail);
        sd_buf_puts(b, "}");
    }
}

/* The JSON report: per shard counts, problems by kind, examples. */
void verify_build_report(const shard_result *rs, int n, const verify_opts *o, sd_buf *b)
{
    sd_buf_puts(b, "{\"shards\":[");
    for (int i = 0; i < n; i++) {
        const shard_result *r = &rs[i];
        int first = 1;
        sd_buf_puts(b, i ? ",{" : "{");
        sd_buf_json_key(b, &first, "path");
        sd_buf_json_cstr(b, r->path);
        sd_buf_json_key(b, &first, "opened");
        sd_buf_puts(b, r->opened ? "true" : "false");
        if (r->open_error[0]) {
            sd_buf_json_key(b, &first, "error");
            sd_buf_json_cstr(b, r->open_error);
        }
        sd_buf_json_key(b, &first, "records");
        sd_buf_json_int(b, (int64_t)r->latents);
        sd_buf_json_key(b, &first, "text_records");
        sd_buf_json_int(b, (int64_t)r->texts);
        sd_buf_json_key(b, &first, "bytes");
        sd_buf_json_int(b, (int64_t)r->bytes);
        sd_buf_json_key(b, &first, "seconds");
        sd_buf_json_num(b, r->seconds);
        sd_buf_json_key(b, &first, "problems");
        sd_buf_json_int(b, (int64_t)r->tally.total);
        sd_buf_json_key(b, &first, "by_kind");
        sd_tally_json(&r->tally, b);
        sd_buf_json_key(b, &first, "examples");
        sd_buf_puts(b, "[");
        if (r->examples.len) sd_buf_put(b, r->examples.data, r->examples.len);
        sd_buf_puts(b, "]");
        if (o->repair) {
            sd_buf_json_key(b, &first, "repaired_records");
            sd_buf_json_int(b, (int64_t)r->repaired_latents);
            sd_buf_json_key(b, &first, "repaired_text_records");
            sd_buf_json_int(b, (int64_t)r->repaired_texts);
            sd_buf_json_key(b, &first, "repaired_variants");
            sd_buf_json_int(b, (int64_t)r->repaired_variants);
            sd_buf_json_key(b, &first, "problems_after_repair");
            sd_buf_json_int(b, (int64_t)r->after_repair);
            if (r->salvaged) {
                int f2 = 1;
                sd_buf_json_key(b, &first, "salvaged");
                sd_buf_puts(b, "{");
                sd_buf_json_key(b, &f2, "records");
                sd_buf_json_int(b, (int64_t)r->salvage.latents);
                sd_buf_json_key(b, &f2, "text_records");
                sd_buf_json_int(b, (int64_t)r->salvage.texts);
                sd_buf_json_key(b, &f2, "meta");
                sd_buf_json_int(b, (int64_t)r->salvage.meta);
                sd_buf_json_key(b, &f2, "dropped");
                sd_buf_json_int(b, (int64_t)r->salvage.dropped);
                sd_buf_json_key(b, &f2, "header_records");
                sd_buf_json_int(b, (int64_t)(r->salvage.older_only ? r->salvage.older_found.records
                                                                    : r->salvage.found.records));
                sd_buf_json_key(b, &f2, "older_snapshot");
                sd_buf_puts(b, r->salvage.older ? "true" : "false");
                sd_buf_json_key(b, &f2, "from_older_snapshot");
                sd_buf_json_int(b, (int64_t)r->salvage.from_older);
                sd_buf_json_key(b, &f2, "kept");
                sd_buf_json_cstr(b, r->salvage.kept);
                sd_buf_puts(b, "}");
            }
        }
        sd_buf_puts(b, "}");
    }
    sd_buf_puts(b, "]}\n");
}
