/* TensorBoard event files for sd-train's scalars (tensorboard --logdir
 * DIR reads them): DIR/events.out.tfevents.<seconds>.<host>, TFRecord
 * framing (length, masked CRC-32C of the length, an Event protobuf, masked
 * CRC-32C of it), the file_version event first, a SessionLog START at the
 * run's first step, then one Event per scalar (wall_time, step,
 * Summary{Value{tag, simple_value}}) or image (Summary{Value{tag,
 * Image{height, width, colorspace, PNG bytes}}}). Appended and
 * flushed as the run goes; a killed run leaves at most a cut last record,
 * which TensorBoard skips. */
#ifndef SDTK_TRAIN_TB_EVENTS_H
#define SDTK_TRAIN_TB_EVENTS_H

#include <stdint.h>
#include <stdio.h>

#include "err.h"

typedef struct {
    FILE *f;
    char path[4096];
} sd_tb;

/* A new event file in dir (created if missing), its session starting at
 * start_step: TensorBoard then drops the events of earlier files in dir at
 * that step or later (0 for a new run, the checkpoint's step + 1 for a
 * resumed one). */
sd_status sd_tb_open(sd_tb *tb, const char *dir, int64_t start_step, sd_error *err);
/* One scalar at a step, written and flushed. */
sd_status sd_tb_scalar(sd_tb *tb, const char *tag, int64_t step, double value, sd_error *err);
/* One image at a step: its PNG bytes, height and width in pixels and
 * colorspace (3: RGB), written and flushed (TensorBoard's IMAGES tab). */
sd_status sd_tb_image(sd_tb *tb, const char *tag, int64_t step, int height, int width, int colorspace,
                      const void *png, size_t png_len, sd_error *err);
void sd_tb_close(sd_tb *tb);
/* CRC-32C (Castagnoli) of n bytes, as TFRecord frames use it. */
uint32_t sd_crc32c(const void *data, size_t n);

#endif
