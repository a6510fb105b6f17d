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
    int corrupt;   /* the jump was a warning about damaged image data (sd_jpeg_warning_is_corrupt) */
    int only_damage; /* set after init: harmless warnings go on instead of jumping (the scan check) */
    char msg[JMSG_LENGTH_MAX]; /* libjpeg's text of the error or warning that jumped */
} sd_jpeg_fail;

/* Whether a libjpeg warning code says the image data is damaged (bad
 * Huffman code, lost restart marker, premature end) rather than something
 * harmless such as extra bytes before a marker. */
int sd_jpeg_warning_is_corrupt(int msg_code);

/* c->err set to f's manager, whose fatal errors and warnings longjmp to
 * f->jump (trace messages are ignored); the caller setjmps f->jump. */
void sd_jpeg_fail_init(struct jpeg_decompress_struct *c, sd_jpeg_fail *f);

/* Bytes of row buffer sd_jpeg_drain needs after jpeg_start_decompress. */
size_t sd_jpeg_drain_bytes(const struct jpeg_decompress_struct *c);
/* Decode every scanline left into rows, which are discarded: what a
 * check or a timing wants from the decoder, the entropy decoding whole. */
void sd_jpeg_drain(struct jpeg_decompress_struct *c, unsigned char *rows);

#endif
