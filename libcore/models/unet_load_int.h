/* Inside the UNet loader: the weights file and the names it uses, shared by
 * the loader (unet_load.c) and the config inference it falls back on when
 * there is no config.json (unet_infer.c). */
#ifndef SDTK_UNET_LOAD_INT_H
#define SDTK_UNET_LOAD_INT_H

#include "safetensors.h"
#include "unet.h"
#include "weights.h"

/* Which names a file uses. */
typedef struct {
    const sd_safetensors *st;
    sd_weight_layout lay;
} sd_unet_probe;

/* Infer the whole config from shapes; norm groups (32), eps and the SDXL
 * size-embedding width (256) are not in the weights. */
sd_status sd_unet_infer_config(const sd_unet_probe *p, sd_unet_config *c, int groups, sd_error *err, const char *path);

#endif
