/* GEMM shapes of the linear forward (run by hand): OpenBLAS sgemm through
 * sd_sgemm (y = x w^T as ops_linear did) against sd_gemm_rows on its best
 * kernel, and the AVX2 kernel against the AVX-512 one where the CPU has
 * it (interleaved in the same repetitions, so load hits both), one thread,
 * thread CPU time (the VM is shared), best of REPS, in GFLOP/s; also the
 * packing's share (sd_gemm_rows with m = 0 rows of work is not possible,
 * so the pack is timed as the difference to a call on 6 rows).
 * usage: bench_gemm_rows [REPS] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gemm.h"
#include "gemm_rows.h"

/* Seconds of CPU time of the calling thread. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Uniform values in [-1, 1) from a fixed LCG. */
static void fill(float *p, size_t n, unsigned *s)
{
    for (size_t i = 0; i < n; i++) {
        *s = *s * 1664525u + 1013904223u;
        p[i] = (float)(*s >> 8) / 8388608.0f - 1.0f;
    }
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    static const int shapes[][3] = {{77, 2304, 768},  {77, 768, 768},    {77, 3072, 768},  {77, 768, 3072},
                                    {616, 2304, 768}, {616, 768, 768},   {616, 3072, 768}, {616, 768, 3072},
                                    {1232, 3072, 768}, {4096, 320, 320}, {4096, 1280, 320}, {4096, 320, 1280},
                                    {4096, 512, 512}, {1024, 640, 640},  {1024, 5120, 640}, {1024, 640, 2560}};
    sd_gemm_rows_isa isa = sd_gemm_rows_best_isa();
    int wide = sd_gemm_rows_isa_usable(SD_GEMM_ROWS_AVX512) && sd_gemm_rows_isa_usable(SD_GEMM_ROWS_AVX2);
    printf("kernel: %s\n", sd_gemm_rows_isa_name(isa));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        unsigned seed = 1;
        float *x = malloc((size_t)m * k * sizeof(float)), *w = malloc((size_t)n * k * sizeof(float));
        float *b = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)m * n * sizeof(float));
        float *scr = sd_scratch_alloc(1, sd_gemm_rows_scratch_floats());
        if (!x || !w || !b || !y || !scr) return 1;
        fill(x, (size_t)m * k, &seed);
        fill(w, (size_t)n * k, &seed);
        fill(b, (size_t)n, &seed);
        double tb = 1e30, tr = 1e30, tp = 1e30, t2x = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = cpu_now();
            sd_sgemm(0, 1, m, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
            double t1 = cpu_now();
            sd_gemm_rows(isa, m, n, k, x, (size_t)k, w, (size_t)k, b, y, (size_t)n, scr);
            double t2 = cpu_now();
            sd_gemm_rows(isa, 6, n, k, x, (size_t)k, w, (size_t)k, b, y, (size_t)n, scr);
            double t3 = cpu_now();
            if (wide) sd_gemm_rows(SD_GEMM_ROWS_AVX2, m, n, k, x, (size_t)k, w, (size_t)k, b, y, (size_t)n, scr);
            double t4 = cpu_now();
            if (t1 - t0 < tb) tb = t1 - t0;
            if (t2 - t1 < tr) tr = t2 - t1;
            if (t3 - t2 < tp) tp = t3 - t2;
            if (t4 - t3 < t2x) t2x = t4 - t3;
        }
        double fl = 2.0 * m * n * k * 1e-9;
        printf("m %5d n %5d k %5d: openblas %6.1f GFLOP/s  gemm_rows %6.1f GFLOP/s (%.2fx)  pack+6 rows %.1f%% of it",
               m, n, k, fl / tb, fl / tr, tb / tr, 100.0 * tp / tr);
        if (wide) printf("  avx2 kernel %6.1f GFLOP/s (avx512 %.2fx)", fl / t2x, t2x / tr);
        printf("\n");
        free(x);
        free(w);
        free(b);
        free(y);
        free(scr);
    }
    return 0;
}
