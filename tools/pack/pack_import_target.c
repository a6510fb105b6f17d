/* sd-pack import-kohya: whether an existing output shard may take this
 * import. A shard made otherwise (sd-latents: a VAE's model_hash) or a
 * kohya import of the other model family would silently mix foreign latents
 * with the imported ones, which merge refuses too unless --allow-mixed. */
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "pack.h"

/* A meta value of the output, NULL when absent (or unreadable: the import's
 * own writes report a shard that cannot be read). */
static char *meta_value(sd_shard *s, const char *key)
{
    char *v = NULL;
    sd_error e;
    return sd_shard_meta_get(s, key, &v, &e) == SD_OK ? v : NULL;
}

/* 1 when two kohya layouts name different model families (_sd and _sdxl);
 * legacy names say none, so they fit either. */
static int families_differ(const char *shard_layout, sd_kohya_kind import)
{
    sd_kohya_kind had;
    if (!shard_layout || sd_kohya_kind_parse(shard_layout, &had)) return 0;
    return (had == SD_KOHYA_SD && import == SD_KOHYA_SDXL) || (had == SD_KOHYA_SDXL && import == SD_KOHYA_SD);
}

/* Check the output shard s (at path) before an import of files whose names
 * say family (SD_KOHYA_SD, SD_KOHYA_SDXL, or SD_KOHYA_LEGACY: unknown). A
 * new shard (no producer yet) takes anything; an existing one only when it
 * is a kohya import (a kohya_layout, which merge and split keep, and no
 * model_hash) of the same family, else SD_EINVAL naming its producer and
 * model_hash, unless allow_mixed, which warns instead. *keep_meta is set to
 * 1 for an existing shard: its producer, kohya_layout and options describe
 * how it was made and stay as they are. */
sd_status pack_import_target_check(sd_shard *s, const char *path, sd_kohya_kind family, int allow_mixed,
                                   int *keep_meta, sd_error *err)
{
    char *producer = meta_value(s, SD_SHARD_META_PRODUCER), *model = meta_value(s, SD_SHARD_META_MODEL),
         *layout = meta_value(s, "kohya_layout");
    *keep_meta = producer != NULL;
    sd_status st = SD_OK;
    const char *why = NULL;
    if (producer && (model || !layout)) why = "it is not a kohya import";
    else if (producer && families_differ(layout, family)) why = "it is a kohya import of the other model family";
    if (why && !allow_mixed) { /* said in full here: an sd_error holds 256 bytes, a long path would cut the advice */
        sd_log(SD_LOG_ERROR, "%s: made by '%s' (model_hash %s, kohya_layout %s) and the cache has %s names: %s, and "
               "importing would mix foreign latents into it; import into a new shard, or pass --allow-mixed to import "
               "anyway (the shard's meta is kept)", path, producer, model ? model : "none", layout ? layout : "none",
               sd_kohya_kind_name(family), why);
        st = sd_err_set(err, SD_EINVAL, "%s: nothing imported (a shard made otherwise; see above)", path);
    }
    else if (why)
        sd_log(SD_LOG_WARN, "%s: made by '%s' (model_hash %s): %s; importing anyway (--allow-mixed), its meta kept", path,
               producer, model ? model : "none", why);
    free(producer);
    free(model);
    free(layout);
    return st;
}
