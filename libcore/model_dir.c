/* Model component lookup in diffusers folders (see model_dir.h). */
#include "model_dir.h"

#include <stdio.h>
#include <sys/stat.h>

/* Whether path is a directory (following links). */
int sd_is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Whether path is a regular file (following links). */
int sd_is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* DIR/SUB/ first (a model folder), then DIR/ (the component's folder). */
sd_status sd_model_component(const char *dir, const char *sub, const char *const *files, size_t nfiles,
                             char *weights, char *config, size_t cap, sd_error *err)
{
    char where[2][512];
    snprintf(where[0], sizeof where[0], "/%s/", sub);
    snprintf(where[1], sizeof where[1], "/");
    /* the weight files themselves first, then a sharded one's FILE.index.json
     * (sd_st_open reads it and its shards as one file) */
    static const char *const suffix[] = {"", ".index.json"};
    for (size_t s = 0; s < 2; s++) {
        for (size_t x = 0; x < 2; x++) {
            for (size_t f = 0; f < nfiles; f++) {
                if ((size_t)snprintf(weights, cap, "%s%s%s%s", dir, where[s], files[f], suffix[x]) >= cap)
                    return sd_err_set(err, SD_EINVAL, "path too long: %s", dir);
                if (!sd_is_file(weights)) continue;
                snprintf(config, cap, "%s%sconfig.json", dir, where[s]);
                if (!sd_is_file(config)) config[0] = 0;
                return SD_OK;
            }
        }
    }
    return sd_err_set(err, SD_ENOTFOUND,
                      "%s: no %s/%s or %s in it, nor a sharded %s.index.json (a diffusers model folder, its %s/ "
                      "folder, or a .safetensors file is expected)",
                      dir, sub, files[0], files[0], files[0], sub);
}

/* Weights and config for a loader's PATH (see model_dir.h). */
sd_status sd_model_files(const char *path, const char *sub, const char *const *files, size_t nfiles,
                         const char *config_override, char *weights, char *config, size_t cap, sd_error *err)
{
    config[0] = 0;
    if (sd_is_dir(path)) {
        sd_status rc = sd_model_component(path, sub, files, nfiles, weights, config, cap, err);
        if (rc) return rc;
    } else if ((size_t)snprintf(weights, cap, "%s", path) >= cap) {
        return sd_err_set(err, SD_EINVAL, "path too long: %s", path);
    }
    if (config_override && (size_t)snprintf(config, cap, "%s", config_override) >= cap)
        return sd_err_set(err, SD_EINVAL, "path too long: %s", config_override);
    return SD_OK;
}
