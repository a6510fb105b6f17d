#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

/* The logger is configured once per process by main(); the mutex keeps lines
 * from different worker threads from interleaving. */
static struct {
    const char *prog;
    sd_log_level level;
    pthread_mutex_t mu;
} g_log = {"sdtk", SD_LOG_INFO, PTHREAD_MUTEX_INITIALIZER};

/* Set the program name printed before each line and the most verbose level shown. */
void sd_log_setup(const char *prog, sd_log_level level)
{
    g_log.prog = prog;
    g_log.level = level;
}

/* Let callers skip building expensive messages that would not be shown. */
sd_log_level sd_log_get_level(void)
{
    return g_log.level;
}

/* Print one line "prog: [level: ]message" to stderr if the level is enabled. */
void sd_log(sd_log_level level, const char *fmt, ...)
{
    static const char *names[] = {"error: ", "warning: ", "", "debug: "};
    if (level > g_log.level) return;
    pthread_mutex_lock(&g_log.mu);
    fprintf(stderr, "%s: %s", g_log.prog, names[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&g_log.mu);
}
