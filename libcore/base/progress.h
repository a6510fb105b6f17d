/* Progress display for long work: a live line on a terminal, a plain line
 * every few seconds otherwise (logs, CI), always a final summary. */
#ifndef SDTK_PROGRESS_H
#define SDTK_PROGRESS_H

#include <stdint.h>

typedef struct {
    const char *label;
    const char *unit;
    uint64_t total;   /* 0 when unknown */
    uint64_t done;
    uint64_t skipped;
    uint64_t work_total; /* optional second measure of progress (bytes of input) */
    uint64_t work_done;  /* for the percentage and ETA when total is unknown */
    double start;     /* monotonic seconds */
    double last_print;
    int is_tty;
    int enabled;
    int printed_live; /* a live line is on screen and needs clearing */
} sd_progress;

double sd_now(void);
void sd_progress_init(sd_progress *p, const char *label, const char *unit, uint64_t total, int enabled);
void sd_progress_update(sd_progress *p, uint64_t done, uint64_t skipped);
void sd_progress_finish(sd_progress *p);

#endif
