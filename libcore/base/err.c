#include "err.h"

#include <stdarg.h>
#include <stdio.h>

/* One short word per code so logs and reports stay greppable. */
const char *sd_strerror(sd_status code)
{
    switch (code) {
    case SD_OK: return "ok";
    case SD_EINVAL: return "invalid argument";
    case SD_EIO: return "i/o error";
    case SD_ENOMEM: return "out of memory";
    case SD_EPARSE: return "parse error";
    case SD_EFORMAT: return "bad format";
    case SD_ENOTFOUND: return "not found";
    case SD_ERANGE: return "out of range";
    case SD_EUNSUPPORTED: return "unsupported";
    case SD_ETRUNC: return "truncated";
    }
    return "unknown error";
}

/* Record code and reason in one call and hand the code back, so callers can
 * write `return sd_err_set(e, SD_EIO, "...")`. A NULL e is allowed. */
sd_status sd_err_set(sd_error *e, sd_status code, const char *fmt, ...)
{
    if (!e) return code;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return code;
}

/* Reset an error record before reuse. */
void sd_err_clear(sd_error *e)
{
    if (!e) return;
    e->code = SD_OK;
    e->msg[0] = 0;
}
