/* What the header reader finds past the size field (imghdr_walk.c): the
 * EXIF orientation of PNG and WebP files and the extent of a GIF's first
 * frame. The walks read through a byte source, so they run on the window
 * already in memory first and go on with pread only when it ran out. */
#ifndef SDTK_IMGHDR_INT_H
#define SDTK_IMGHDR_INT_H

#include <stddef.h>
#include <stdint.h>

/* The file's bytes: in memory (fd < 0: mem[0..n)) or [off, off + size) of fd. */
typedef struct {
    const unsigned char *mem;
    size_t n;
    int fd;
    uint64_t off, size;
} sd_hdr_src;

/* Walk results: SD_WALK_MORE when the bytes ran out before the answer. */
enum { SD_WALK_MORE = -1 };

/* Orientation (tag 0x0112) of an Exif TIFF block; 1 when absent or damaged. */
int sd_exif_orientation(const unsigned char *t, size_t n);
/* EXIF orientation of a PNG (an eXIf chunk before the first IDAT) or of an
 * extended WebP (its EXIF chunk, wherever it lies): 1..8, or SD_WALK_MORE. */
int sd_png_orientation(const sd_hdr_src *s);
int sd_webp_orientation(const sd_hdr_src *s);
/* The right and bottom edges of a GIF's first frame (its image descriptor's
 * left + width, top + height): 0 when found, SD_WALK_MORE, or 1 when the
 * file ends or breaks before it (the decoder then reports the file). */
int sd_gif_first_frame(const sd_hdr_src *s, uint32_t *right, uint32_t *bottom);

#endif
