#include "progress.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

/* Monotonic wall time in seconds, for rates and timeouts. */
double sd_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Start a progress display; disabled ones cost one branch per update. */
void sd_progress_init(sd_progress *p, const char *label, const char *unit, uint64_t total, int enabled)
{
    p->label = label;
    p->unit = unit;
    p->total = total;
    p->done = 0;
    p->skipped = 0;
    p->work_total = p->work_done = 0;
    p->start = sd_now();
    p->last_print = p->start;
    p->is_tty = isatty(STDERR_FILENO);
    p->enabled = enabled;
    p->printed_live = 0;
}

/* Digits after the point for a rate: a slow stage (a CPU VAE at 0.1
 * images/s) must not read "0/s", a fast one needs no fraction. */
static int rate_digits(double rate)
{
    return rate < 1.0 ? 2 : rate < 10.0 ? 1 : 0;
}

/* Write the current state: count, rate, percentage and ETA when the total is known. */
static void progress_print(sd_progress *p, double now, int final)
{
    double dt = now - p->start;
    double rate = dt > 0 ? (double)p->done / dt : 0.0;
    /* fraction done: by count when the total is known, else by the second measure */
    double frac = p->total ? (double)p->done / (double)p->total
                           : p->work_total ? (double)p->work_done / (double)p->work_total : -1.0;
    char eta[48] = "";
    if (frac > 0 && frac < 1 && !final) {
        double left = dt * (1.0 - frac) / frac;
        snprintf(eta, sizeof eta, " ETA %dm%02ds", (int)(left / 60), (int)left % 60);
    }
    char pct[16] = "";
    if (frac >= 0) snprintf(pct, sizeof pct, " (%.1f%%)", 100.0 * frac);
    char tot[32] = "";
    if (p->total) snprintf(tot, sizeof tot, "/%llu", (unsigned long long)p->total);
    fprintf(stderr, "%s%s: %llu%s %s%s, %llu skipped, %.*f %s/s, %.1fs%s%s",
            p->is_tty ? "\r\033[K" : "", p->label, (unsigned long long)p->done, tot, p->unit, pct,
            (unsigned long long)p->skipped, rate_digits(rate), rate, p->unit, dt, eta,
            (p->is_tty && !final) ? "" : "\n");
    fflush(stderr);
    p->printed_live = p->is_tty && !final;
}

/* Record progress; prints at most 10 times a second on a TTY, every 10 s otherwise. */
void sd_progress_update(sd_progress *p, uint64_t done, uint64_t skipped)
{
    p->done = done;
    p->skipped = skipped;
    if (!p->enabled) return;
    double now = sd_now();
    double every = p->is_tty ? 0.1 : 10.0;
    if (now - p->last_print < every) return;
    p->last_print = now;
    progress_print(p, now, 0);
}

/* Print the final summary line (always, when enabled). */
void sd_progress_finish(sd_progress *p)
{
    if (!p->enabled) return;
    progress_print(p, sd_now(), 1);
}
