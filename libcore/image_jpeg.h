/* libjpeg error handling shared by the direct JPEG decoder (image_dec.c)
 * and the decoder-floor benchmark: errors and warnings jump back to the
 * setjmp of the caller, which then declines the file. Needs <stdio.h>
 * before <jpeglib.h>, as libjpeg requires. */
#ifndef SDTK_IMAGE_JPEG_H
#define SDTK_IMAGE_JPEG_H

#include <setjmp.h>
#include <stdio.h>

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
} sd_jpeg_fail;

/* c->err set to f's manager, whose fatal errors and warnings longjmp to
 * f->jump (trace messages are ignored); the caller setjmps f->jump. */
void sd_jpeg_fail_init(struct jpeg_decompress_struct *c, sd_jpeg_fail *f);

#endif
