/* Logging to stderr with a tool-name prefix and a verbosity level. The level
 * and prefix are process-wide settings made once in main(). */
#ifndef SDTK_LOG_H
#define SDTK_LOG_H

typedef enum { SD_LOG_ERROR = 0, SD_LOG_WARN, SD_LOG_INFO, SD_LOG_DEBUG } sd_log_level;

void sd_log_setup(const char *prog, sd_log_level level);
sd_log_level sd_log_get_level(void);
void sd_log(sd_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
