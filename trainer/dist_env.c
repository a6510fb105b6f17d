/* What the launcher's environment says about the processes it started,
 * for both worlds (dist_mpi.c, dist_single.c). */
#include "dist.h"

#include <stdlib.h>
#include <string.h>

/* A launcher's count of processes and the rank variable it sets beside it
 * in every process it starts. Not SLURM_NTASKS: a batch script (one
 * process, which may run sd-train itself) has it for the whole job. */
static const char *const size_vars[][2] = {
    {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
    {"PMI_SIZE", "PMI_RANK"},
    {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID"},
};

/* A variable's value as a count of processes; 0 when unset or not one. */
static int env_count(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    long n = strtol(v, &end, 10);
    return *end || n < 1 || n > 1 << 24 ? 0 : (int)n;
}

/* The largest count a launcher set together with its rank variable; 1
 * under SD_DIST=single, which says each process is a run of its own (a
 * sweep, each with its own -o) and asks for no world. */
int sd_dist_launcher_size(const char **var)
{
    int best = 1;
    *var = NULL;
    const char *force = getenv("SD_DIST");
    if (force && strcmp(force, "single") == 0) return 1;
    for (size_t i = 0; i < sizeof size_vars / sizeof size_vars[0]; i++) {
        const char *rank = getenv(size_vars[i][1]);
        int n = env_count(size_vars[i][0]);
        if (rank && *rank && n > best) {
            best = n;
            *var = size_vars[i][0];
        }
    }
    return best;
}

/* Several processes from a launcher that form no world would each train
 * the whole run into the same output: one message for both builds. */
sd_status sd_dist_refuse_copies(const char *why, sd_error *err)
{
    const char *var = NULL;
    int n = sd_dist_launcher_size(&var);
    if (n <= 1) return SD_OK;
    return sd_err_set(err, SD_EUNSUPPORTED,
                      "started as one of %d processes (%s=%d) %s: each may train the same run into the same output; "
                      "start them as one MPI world, or set SD_DIST=single to run each as a run of its own (sweeps, "
                      "one -o each)",
                      n, var, n, why);
}
