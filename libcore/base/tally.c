#include "tally.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

/* Empty tally; show_limit messages per reason are printed by sd_skip. */
void sd_tally_init(sd_tally *t, int show_limit)
{
    t->n = 0;
    t->total = 0;
    t->show_limit = show_limit;
    t->verb = "skip";
}

/* The entry for reason, created on first use (the last slot absorbs overflow). */
static sd_tally_entry *entry(sd_tally *t, const char *reason)
{
    for (int i = 0; i < t->n; i++)
        if (t->e[i].reason == reason || strcmp(t->e[i].reason, reason) == 0) return &t->e[i];
    if (t->n == SD_TALLY_MAX) return &t->e[SD_TALLY_MAX - 1];
    t->e[t->n].reason = reason;
    t->e[t->n].n = 0;
    return &t->e[t->n++];
}

/* Count n records under reason without printing anything. */
void sd_tally_add(sd_tally *t, const char *reason, uint64_t n)
{
    entry(t, reason)->n += n;
    t->total += n;
}

/* Count one skipped record and, for the first few of its reason, say where
 * and why: "skip FILE:LINE: reason: detail". */
void sd_skip(sd_tally *t, const char *reason, const char *fmt, ...)
{
    sd_tally_entry *e = entry(t, reason);
    e->n++;
    t->total++;
    if (t->show_limit >= 0 && e->n > (uint64_t)t->show_limit) return;
    char where[8192]; /* room for a full path and its detail (a record name alone may be 511 bytes) */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(where, sizeof where, fmt, ap);
    va_end(ap);
    sd_log(SD_LOG_WARN, "%s %s: %s%s", t->verb, where, reason,
           t->show_limit >= 0 && e->n == (uint64_t)t->show_limit ? " (further ones of this kind not shown; --verbose shows all)" : "");
}

/* Add another tally's counts (workers' tallies into the run's). */
void sd_tally_merge(sd_tally *into, const sd_tally *from)
{
    for (int i = 0; i < from->n; i++) sd_tally_add(into, from->e[i].reason, from->e[i].n);
}

/* How many were counted under reason. */
uint64_t sd_tally_count(const sd_tally *t, const char *reason)
{
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->e[i].reason, reason) == 0) return t->e[i].n;
    return 0;
}

/* One summary line per reason, largest first. */
void sd_tally_log(const sd_tally *t, const char *what)
{
    if (t->total == 0) {
        sd_log(SD_LOG_INFO, "%s: none", what);
        return;
    }
    sd_log(SD_LOG_INFO, "%s: %llu", what, (unsigned long long)t->total);
    int done[SD_TALLY_MAX] = {0};
    for (int k = 0; k < t->n; k++) {
        int best = -1;
        for (int i = 0; i < t->n; i++)
            if (!done[i] && (best < 0 || t->e[i].n > t->e[best].n)) best = i;
        done[best] = 1;
        sd_log(SD_LOG_INFO, "  %10llu  %s", (unsigned long long)t->e[best].n, t->e[best].reason);
    }
}

/* The counts as a JSON object {"reason": n, ...}. */
void sd_tally_json(const sd_tally *t, sd_buf *b)
{
    int first = 1;
    sd_buf_putc(b, '{');
    for (int i = 0; i < t->n; i++) {
        sd_buf_json_key(b, &first, t->e[i].reason);
        sd_buf_json_int(b, (int64_t)t->e[i].n);
    }
    sd_buf_putc(b, '}');
}
