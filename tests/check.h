/* Minimal test harness: checks count failures and print where they happened;
 * each test program exits non-zero if any check failed. */
#ifndef SDTK_TESTS_CHECK_H
#define SDTK_TESTS_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_failures;
static int check_count;

/* Record one check; returns ok so callers can bail out of dependent checks. */
static inline int check_at(int ok, const char *expr, const char *file, int line)
{
    check_count++;
    if (!ok) {
        check_failures++;
        fprintf(stderr, "%s:%d: check failed: %s\n", file, line, expr);
    }
    return ok;
}

/* Compare two strings, printing both on mismatch. */
static inline int check_str_at(const char *got, const char *want, const char *file, int line)
{
    int ok = got && want && strcmp(got, want) == 0;
    check_count++;
    if (!ok) {
        check_failures++;
        fprintf(stderr, "%s:%d: got  '%s'\n%*s want '%s'\n", file, line, got ? got : "(null)", (int)strlen(file) + 8, "",
                want ? want : "(null)");
    }
    return ok;
}

/* The summary line and exit status of a test program. */
static inline int check_done(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, check_count, check_failures);
    return check_failures ? 1 : 0;
}

/* The file and line of the failing check are what make these worth a macro. */
#define CHECK(e) check_at(!!(e), #e, __FILE__, __LINE__)
#define CHECK_STR(g, w) check_str_at((g), (w), __FILE__, __LINE__)

#endif
