/* Finding a model component's files in a diffusers folder: the weights and
 * config.json of vae/, unet/, text_encoder/ ... given either the model
 * folder or the component's own folder. Shared by every model loader. */
#ifndef SDTK_MODEL_DIR_H
#define SDTK_MODEL_DIR_H

#include <stddef.h>

#include "arena.h"
#include "buf.h"
#include "err.h"
#include "json.h"

int sd_is_dir(const char *path);
int sd_is_file(const char *path);
/* The first of files[] found in DIR/SUB/ or else in DIR/ itself goes to
 * weights, that folder's config.json to config ("" when it has none).
 * A sharded checkpoint (FILE.index.json beside its shards, as
 * save_pretrained writes above its size limit) goes to weights as the
 * index's path: sd_st_open reads the shards through it. */
sd_status sd_model_component(const char *dir, const char *sub, const char *const *files, size_t nfiles,
                             char *weights, char *config, size_t cap, sd_error *err);

/* What every loader does with its PATH argument: a folder goes through
 * sd_model_component, a file is the weights itself (no config); a given
 * config_override (a --*-config option) replaces the config found. */
sd_status sd_model_files(const char *path, const char *sub, const char *const *files, size_t nfiles,
                         const char *config_override, char *weights, char *config, size_t cap, sd_error *err);

/* The prediction_type ("epsilon", "v_prediction", ...) of the diffusers
 * scheduler beside a UNet: scheduler/scheduler_config.json in the model
 * folder PATH, or beside PATH when it is the unet/ folder itself. out is ""
 * when there is none (a single file, a lone unet/ folder); from is the file
 * read. An unreadable or malformed scheduler config is an error naming it. */
sd_status sd_model_prediction(const char *path, char *out, size_t cap, char *from, size_t from_cap, sd_error *err);

/* A component's config.json parsed into *root (text and a hold its bytes
 * and nodes; the caller frees them, also on failure): it must be a JSON
 * object, and its "_class_name", when there, must be class_name (NULL: any
 * or none, as transformers' configs name no class). */
sd_status sd_model_config_read(const char *path, const char *class_name, sd_buf *text, sd_arena *a, sd_json **root,
                               sd_error *err);
/* A config member that counts something (channels, layers, a vocabulary):
 * absent or null keeps *out, else a whole number in [0, max]. */
sd_status sd_model_config_int(const sd_json *obj, const char *key, double max, int *out, const char *path,
                              sd_error *err);

#endif
