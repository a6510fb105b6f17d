/* sd-bucket: what a run tells at its end: the summary in the log, the
 * JSON report (--report) and the SVG bar chart (--plot). */
#include <stdio.h>
#include <stdlib.h>

#include "bucket_tool.h"
#include "cli.h"
#include "log.h"
#include "outfile.h"
#include "svgplot.h"

/* Buckets in (w, h) order, for the summary, the report and the plot. */
static size_t *sorted_buckets(const bucket_table *t)
{
    size_t *o = malloc((t->n ? t->n : 1) * sizeof *o);
    if (!o) return NULL;
    for (size_t i = 0; i < t->n; i++) o[i] = i;
    for (size_t i = 1; i < t->n; i++) { /* insertion sort: bucket counts are small */
        size_t v = o[i], j = i;
        while (j > 0 && (t->w[o[j - 1]] > t->w[v] || (t->w[o[j - 1]] == t->w[v] && t->h[o[j - 1]] > t->h[v]))) {
            o[j] = o[j - 1];
            j--;
        }
        o[j] = v;
    }
    return o;
}

/* The JSON report: plan, counts, skips, buckets and parts. */
static void build_report(const bucket_run *r, const size_t *order, const uint64_t *part_counts, sd_buf *b)
{
    const bucket_opts *o = r->opt;
    const sd_plan *p = &r->plan;
    sd_buf_printf(b, "{\"tool\":\"sd-bucket\",\"version\":");
    sd_buf_json_cstr(b, sd_version());
    sd_buf_printf(b, ",\"plan\":{\"name\":\"%s\"", sd_plan_name(p));
    if (p->kind == SD_PLAN_KOHYA)
        sd_buf_printf(b, ",\"resolution\":[%d,%d],\"min_bucket\":%d,\"max_bucket\":%d,\"steps\":%d,\"no_upscale\":%s",
                      p->max_w, p->max_h, p->min_size, p->max_size, p->steps, p->no_upscale ? "true" : "false");
    else if (p->kind == SD_PLAN_MULTIRES)
        sd_buf_printf(b, ",\"min_res\":%d,\"max_res\":%d,\"steps\":%d,\"upscale\":%s", p->min_res, p->max_res, p->steps,
                      p->upscale ? "true" : "false");
    else
        sd_buf_printf(b, ",\"no_upscale\":%s", p->no_upscale ? "true" : "false");
    if (p->kind == SD_PLAN_LIST) { /* the list is the plan's one setting */
        sd_buf_puts(b, ",\"buckets\":[");
        for (size_t i = 0; i < p->n; i++) sd_buf_printf(b, "%s[%d,%d]", i ? "," : "", p->resos[i].w, p->resos[i].h);
        sd_buf_putc(b, ']');
    }
    sd_buf_printf(b, "},\"records_in\":%llu,\"records_out\":%llu,\"skipped\":%llu,\"skip_reasons\":",
                  (unsigned long long)r->in, (unsigned long long)r->out, (unsigned long long)r->tally.total);
    sd_tally_json(&r->tally, b);
    sd_buf_puts(b, ",\"mean_ar_error\":");
    if (r->out) sd_buf_json_num(b, r->sum_abs_err / (double)r->out);
    else sd_buf_puts(b, "null");
    sd_buf_puts(b, ",\"buckets\":[");
    for (size_t k = 0; k < r->bt.n; k++) {
        size_t i = order[k];
        sd_buf_printf(b, "%s{\"bucket\":[%d,%d],\"count\":%llu}", k ? "," : "", r->bt.w[i], r->bt.h[i],
                      (unsigned long long)r->bt.count[i]);
    }
    sd_buf_puts(b, "]");
    if (part_counts) {
        sd_buf_puts(b, ",\"parts\":[");
        for (long q = 0; q < o->split; q++) sd_buf_printf(b, "%s%llu", q ? "," : "", (unsigned long long)part_counts[q]);
        sd_buf_puts(b, "]");
    }
    sd_buf_puts(b, "}\n");
}

/* Print the summary, write --report and --plot. */
sd_status bucket_finish_outputs(const bucket_run *r, const uint64_t *part_counts, sd_error *err)
{
    const bucket_opts *o = r->opt;
    size_t *order = sorted_buckets(&r->bt);
    if (!order) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_log(SD_LOG_INFO, "%llu records: %llu bucketed into %zu buckets, %llu skipped", (unsigned long long)r->in,
           (unsigned long long)r->out, r->bt.n, (unsigned long long)r->tally.total);
    if (r->out) sd_log(SD_LOG_INFO, "mean ar error: %.6f", r->sum_abs_err / (double)r->out);
    for (size_t k = 0; k < r->bt.n; k++) {
        size_t i = order[k];
        sd_log(SD_LOG_INFO, "  bucket %5dx%-5d (ar %.3f): %llu", r->bt.w[i], r->bt.h[i], (double)r->bt.w[i] / r->bt.h[i],
               (unsigned long long)r->bt.count[i]);
    }
    if (part_counts)
        for (long q = 0; q < o->split; q++) sd_log(SD_LOG_INFO, "  part %ld: %llu records", q, (unsigned long long)part_counts[q]);
    sd_tally_log(&r->tally, "skipped");
    sd_status st = SD_OK;
    sd_buf b;
    sd_buf_init(&b);
    if (o->report) {
        build_report(r, order, part_counts, &b);
        st = b.oom ? sd_err_set(err, SD_ENOMEM, "out of memory") : sd_write_file_atomic(o->report, b.data, b.len, err);
    }
    if (!st && o->plot) {
        sd_buf_clear(&b);
        char **labels = calloc(r->bt.n ? r->bt.n : 1, sizeof *labels);
        uint64_t *counts = calloc(r->bt.n ? r->bt.n : 1, sizeof *counts);
        char *store = malloc((r->bt.n ? r->bt.n : 1) * 16);
        if (!labels || !counts || !store) st = sd_err_set(err, SD_ENOMEM, "out of memory");
        for (size_t k = 0; !st && k < r->bt.n; k++) {
            labels[k] = store + 16 * k;
            snprintf(labels[k], 16, "%dx%d", r->bt.w[order[k]], r->bt.h[order[k]]);
            counts[k] = r->bt.count[order[k]];
        }
        if (!st) {
            char title[128];
            snprintf(title, sizeof title, "sd-bucket: %llu records in %zu buckets (plan %s)", (unsigned long long)r->out,
                     r->bt.n, sd_plan_name(&r->plan));
            sd_svg_bars(&b, title, (const char *const *)labels, counts, r->bt.n);
            st = b.oom ? sd_err_set(err, SD_ENOMEM, "out of memory") : sd_write_file_atomic(o->plot, b.data, b.len, err);
        }
        free(labels);
        free(counts);
        free(store);
    }
    sd_buf_free(&b);
    free(order);
    return st;
}
