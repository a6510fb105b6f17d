/* The VAE decoder's layer table, its weight names in both layouts (ldm
 * numbers its up blocks by resolution level, diffusers in running order)
 * and its loading from the files the encoder reads. */
#include <stdio.h>
#include <string.h>

#include "vae_decode.h"
#include "vae_int.h"

/* Register every decoder parameter (post_quant_conv, conv_in, the mid
 * block, the up blocks, norm_out, conv_out) in diffusers' order; nothing
 * allocated for their values yet. */
static sd_status register_all(sd_vae_decoder *d, const sd_vae_config *cfg, sd_error *err)
{
    sd_status rc = sd_vae_check_config(cfg, err);
    if (rc) return rc;
    if (cfg->out_channels < 1) return sd_err_set(err, SD_EINVAL, "VAE config: bad image channel count");
    memset(d, 0, sizeof(*d));
    d->cfg = *cfg;
    sd_weights_init(&d->w);
    sd_vae_reg r = {&d->w, err};
    const int *bo = cfg->block_out;
    int nb = cfg->nblocks, top = bo[nb - 1], lat = cfg->latent_channels;
    if (cfg->use_post_quant_conv)
        rc = sd_vae_add_conv(&r, &d->post_quant, "post_quant_conv", "post_quant_conv", lat, lat, 1);
    if (!rc) rc = sd_vae_add_conv(&r, &d->conv_in, "decoder.conv_in", "decoder.conv_in", lat, top, 3);
    if (!rc) rc = sd_vae_add_resnet(&r, &d->mid[0], "decoder.mid_block.resnets.0", "decoder.mid.block_1", top, top);
    if (!rc && cfg->mid_attention)
        rc = sd_vae_add_attn(&r, &d->attn, "decoder.mid_block.attentions.0", "decoder.mid.attn_1", top);
    if (!rc) rc = sd_vae_add_resnet(&r, &d->mid[1], "decoder.mid_block.resnets.1", "decoder.mid.block_2", top, top);
    char dn[SD_WEIGHT_NAME_MAX], ln[SD_WEIGHT_NAME_MAX];
    int cin = top;
    for (int i = 0; i < nb && !rc; i++) {
        int level = nb - 1 - i, cout = bo[level];
        for (int j = 0; j < cfg->layers_per_block + 1 && !rc; j++) {
            snprintf(dn, sizeof dn, "decoder.up_blocks.%d.resnets.%d", i, j);
            snprintf(ln, sizeof ln, "decoder.up.%d.block.%d", level, j);
            rc = sd_vae_add_resnet(&r, &d->res[i][j], dn, ln, cin, cout);
            cin = cout;
        }
        if (!rc && i < nb - 1) {
            snprintf(dn, sizeof dn, "decoder.up_blocks.%d.upsamplers.0.conv", i);
            snprintf(ln, sizeof ln, "decoder.up.%d.upsample.conv", level);
            rc = sd_vae_add_conv(&r, &d->up[i], dn, ln, cout, cout, 3);
        }
    }
    if (!rc) rc = sd_vae_add_norm(&r, &d->norm_out, "decoder.conv_norm_out", "decoder.norm_out", bo[0]);
    if (!rc) rc = sd_vae_add_conv(&r, &d->conv_out, "decoder.conv_out", "decoder.conv_out", bo[0], cfg->out_channels, 3);
    if (rc) sd_weights_free(&d->w);
    return rc;
}

/* The layer table and the flat parameter buffer for cfg (see vae_decode.h). */
sd_status sd_vae_decoder_build(sd_vae_decoder *d, const sd_vae_config *cfg, sd_error *err)
{
    sd_status rc = register_all(d, cfg, err);
    if (!rc) rc = sd_weights_alloc(&d->w, err);
    if (rc) sd_weights_free(&d->w);
    return rc;
}

/* The config and layer table of path's decoder, no parameter read or
 * allocated (see vae_decode.h). */
sd_status sd_vae_decoder_layout(sd_vae_decoder *d, const char *path, const sd_vae_opts *opts, sd_error *err)
{
    sd_vae_source src;
    sd_status rc = sd_vae_source_open(&src, path, opts, "decoder", err);
    if (rc) return rc;
    rc = register_all(d, &src.cfg, err);
    if (!rc) snprintf(d->layout, sizeof d->layout, "%s", src.desc);
    sd_vae_source_close(&src);
    return rc;
}

/* Release the parameters. */
void sd_vae_decoder_free(sd_vae_decoder *d)
{
    sd_weights_free(&d->w);
}

/* Load the decoder from a folder or a file (config.json or inferred from
 * the decoder's shapes). A shift_factor (SD3 / Flux VAEs) is refused: the
 * pipelines of those models add it, the SD ones do not have it. */
sd_status sd_vae_decoder_load(sd_vae_decoder *d, const char *path, const sd_vae_opts *opts, sd_error *err)
{
    sd_vae_source src;
    sd_status rc = sd_vae_source_open(&src, path, opts, "decoder", err);
    if (rc) return rc;
    if (src.cfg.shift_factor != 0)
        rc = sd_err_set(err, SD_EUNSUPPORTED, "%s: a VAE with shift_factor %g (SD3 / Flux) is not supported",
                        src.weights, src.cfg.shift_factor);
    if (!rc) rc = sd_vae_decoder_build(d, &src.cfg, err);
    if (rc) {
        sd_vae_source_close(&src);
        return rc;
    }
    if (!src.lay.use_alt) sd_vae_use_deprecated_attn_names(&d->w, &src, "decoder");
    rc = sd_weights_load(&d->w, src.st, &src.lay, src.weights, err);
    if (rc) sd_vae_decoder_free(d);
    else snprintf(d->layout, sizeof d->layout, "%s", src.desc);
    sd_vae_source_close(&src);
    return rc;
}
