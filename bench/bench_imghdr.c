/* Header-only size reads per second on one core: every file named on the
 * command line (or one per stdin line) read round-robin until at least
 * --reads reads are done. Prints "reads N seconds S rate R". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "imghdr.h"
#include "progress.h"

int main(int argc, char **argv)
{
    long target = 10000;
    int first = 1;
    if (argc > 2 && strcmp(argv[1], "--reads") == 0) {
        target = atol(argv[2]);
        first = 3;
    }
    if (first >= argc) {
        fprintf(stderr, "usage: bench_imghdr [--reads N] FILE...\n");
        return 2;
    }
    int nfiles = argc - first;
    long done = 0, bad = 0;
    unsigned long long sum = 0;
    double t0 = sd_now();
    while (done < target) {
        for (int i = 0; i < nfiles; i++, done++) {
            sd_imginfo in;
            sd_error err;
            if (sd_imghdr_read_file(argv[first + i], &in, &err) != SD_OK) bad++;
            else sum += in.width + in.height;
        }
    }
    double dt = sd_now() - t0;
    printf("reads %ld seconds %.3f rate %.0f bad %ld checksum %llu\n", done, dt, (double)done / dt, bad, sum);
    return bad ? 1 : 0;
}
