/* Model component lookup in diffusers folders (see model_dir.h). */
#include "model_dir.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "slurp.h"

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

/* One reading of a model component's config.json for every loader (the
 * VAE's, the UNet's and the text encoders'): parsed, an object, and of
 * the class the loader builds, so that a UNet folder given as --vae is
 * named as such instead of failing on some missing member. */
sd_status sd_model_config_read(const char *path, const char *class_name, sd_buf *text, sd_arena *a, sd_json **root,
                               sd_error *err)
{
    sd_status rc = sd_parse_json_file(path, text, a, root, err);
    if (rc) return rc;
    if ((*root)->type != SD_JSON_OBJECT) return sd_err_set(err, SD_EFORMAT, "%s: not a JSON object", path);
    const sd_json *cls = class_name ? sd_json_get(*root, "_class_name") : NULL;
    const char *s = cls ? sd_json_str(cls) : NULL;
    if (cls && (!s || strcmp(s, class_name) != 0))
        return sd_err_set(err, SD_EUNSUPPORTED, "%s: _class_name %s, expected %s", path, s ? s : "(not a string)",
                          class_name);
    return SD_OK;
}

/* The loaders' integer members, one rule and one message for all. */
sd_status sd_model_config_int(const sd_json *obj, const char *key, double max, int *out, const char *path,
                              sd_error *err)
{
    const sd_json *m = sd_json_get(obj, key);
    double d;
    if (!m || m->type == SD_JSON_NULL) return SD_OK;
    if (sd_json_whole(m, 0, max, &d))
        return sd_err_set(err, SD_EFORMAT, "%s: %s must be a non-negative integer", path, key);
    *out = (int)d;
    return SD_OK;
}

/* A v-prediction model (SD 2.x 768-v) trained with the epsilon target
 * learns the wrong thing without any error: the model folder says which
 * target its scheduler expects, as diffusers' training script reads it. */
sd_status sd_model_prediction(const char *path, char *out, size_t cap, char *from, size_t from_cap, sd_error *err)
{
    out[0] = 0;
    from[0] = 0;
    if (!sd_is_dir(path)) return SD_OK;
    static const char *const rel[] = {"/scheduler/scheduler_config.json", "/../scheduler/scheduler_config.json"};
    for (size_t i = 0; i < 2; i++) {
        if ((size_t)snprintf(from, from_cap, "%s%s", path, rel[i]) >= from_cap)
            return sd_err_set(err, SD_EINVAL, "path too long: %s", path);
        if (sd_is_file(from)) break;
        from[0] = 0;
    }
    if (!from[0]) return SD_OK;
    sd_buf text;
    sd_arena a;
    sd_json *root = NULL;
    sd_buf_init(&text);
    sd_arena_init(&a, 1 << 12);
    sd_status rc = sd_model_config_read(from, NULL, &text, &a, &root, err);
    const sd_json *p = rc ? NULL : sd_json_get(root, "prediction_type");
    if (p && (p->type != SD_JSON_STRING || p->len == 0 || p->len >= cap || memchr(p->str, 0, p->len)))
        rc = sd_err_set(err, SD_EFORMAT, "%s: prediction_type is not a short string", from);
    else if (p)
        memcpy(out, p->str, p->len + 1);
    sd_arena_free(&a);
    sd_buf_free(&text);
    return rc;
}
