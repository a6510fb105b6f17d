/* Source readers for sd-meta. Each walks one kind of dataset in the calling
 * thread and adds one input per candidate image to the run; the heavy work
 * (parsing, caption files) happens later in the workers. Problems that stop
 * a candidate are reported with the file/line/member and counted; only an
 * unusable source as a whole (cannot open) returns an error. */
#ifndef SDTK_SOURCES_H
#define SDTK_SOURCES_H

#include "meta_run.h"
#include "utf8.h" /* sd_bom_len, sd_name_is_utf8, sd_name_escape */

typedef enum {
    SD_SRC_AUTO,
    SD_SRC_FOLDER,   /* image + .txt/.caption, recursive */
    SD_SRC_TREE,     /* images/ + captions/ */
    SD_SRC_METATREE, /* *.json files {tags, score, path} */
    SD_SRC_BOORU,    /* JSONL or JSON array of posts */
    SD_SRC_KOHYA,    /* meta_cap(_dd).json */
    SD_SRC_WDS       /* WebDataset tar shards */
} sd_source_kind;

sd_source_kind sd_source_parse(const char *name);
const char *sd_source_name(sd_source_kind k);
sd_source_kind sd_source_detect(const char *path);
sd_status sd_read_folder(sd_meta_run *m, const char *root, int tree, sd_error *err);
sd_status sd_read_metatree(sd_meta_run *m, const char *root, sd_error *err);
sd_status sd_read_booru(sd_meta_run *m, const char *path, sd_error *err);
sd_status sd_read_kohya(sd_meta_run *m, const char *path, const char *image_root, sd_error *err);
sd_status sd_read_wds(sd_meta_run *m, const char *path, sd_error *err);
int sd_expand_braces(const char *pattern, char ***out, int *n);

#endif
