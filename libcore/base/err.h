/* Error codes shared by every sdtk library function, and an error record that
 * carries a human-readable reason up to the caller that reports it. */
#ifndef SDTK_ERR_H
#define SDTK_ERR_H

#include <stddef.h>

typedef enum {
    SD_OK = 0,
    SD_EINVAL,       /* bad argument or option */
    SD_EIO,          /* read/write/open failed */
    SD_ENOMEM,       /* allocation failed */
    SD_EPARSE,       /* malformed input text (JSON, rules, ...) */
    SD_EFORMAT,      /* well-formed but not what we expect (bad header, wrong type) */
    SD_ENOTFOUND,    /* missing file, key or field */
    SD_ERANGE,       /* value out of allowed range */
    SD_EUNSUPPORTED, /* valid input we do not handle */
    SD_ETRUNC        /* input ends early */
} sd_status;

/* Process exit codes, the same for every tool. */
enum {
    SD_EXIT_OK = 0,
    SD_EXIT_SKIPPED = 1, /* some records were skipped and --strict was given */
    SD_EXIT_USAGE = 2,
    SD_EXIT_FATAL = 3
};

/* msg holds a whole message with its hint (a plan, two encoder setups): 1 KiB */
typedef struct {
    sd_status code;
    char msg[1024];
} sd_error;

const char *sd_strerror(sd_status code);
sd_status sd_err_set(sd_error *e, sd_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void sd_err_clear(sd_error *e);

#endif
