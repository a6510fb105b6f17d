/* What the header reader finds past the size field (imghdr_walk.c): the
 * EXIF orientation of PNG and WebP files, read as libvips 8.14 reads it
 * (libpng, libexif 0.6.24), and the extent of a GIF's first frame. The
 * walks read through a byte source, so they run on the window already in
 * memory first and go on with pread only when it ran out. */
#ifndef SDTK_IMGHDR_INT_H
#define SDTK_IMGHDR_INT_H

#include <stddef.h>
#include <stdint.h>

/* The file's bytes: in memory (fd < 0: mem[0..n), the whole file when
 * `whole` is set, else only its start) or [off, off + size) of fd. */
typedef struct {
    const unsigned char *mem;
    size_t n;
    int fd;
    uint64_t off, size;
    int whole;
} sd_hdr_src;

/* Walk results: SD_WALK_MORE when a window in memory ran out before the
 * answer; for a GIF, SD_GIF_END when the file ends before the first frame
 * and SD_GIF_NONE when a trailer or a byte that starts no block comes
 * first (libvips then loads no image). */
enum { SD_WALK_MORE = -1, SD_GIF_END = 1, SD_GIF_NONE = 2 };

/* CRC-32 as PNG chunks carry it (the zlib polynomial). */
uint32_t sd_png_crc32(const unsigned char *p, size_t n);
/* The orientation libvips takes from an Exif TIFF block: IFD0's tag 0x0112
 * as libexif loads it and libvips turns its value into 1..8 (1 when absent,
 * dropped or out of range). */
int sd_exif_orientation(const unsigned char *t, size_t n);
/* The same for an EXIF block as a loader hands it to libvips: a JPEG APP1
 * payload ("Exif\0\0" and TIFF), a PNG eXIf or WebP EXIF chunk (TIFF, with
 * or without that prefix). */
int sd_exif_blob_orientation(const unsigned char *b, size_t n);
/* EXIF orientation of a PNG (the first eXIf before IDAT that libpng keeps)
 * or of an extended WebP (its EXIF chunk, wherever it lies): 1..8, or
 * SD_WALK_MORE. */
int sd_png_orientation(const sd_hdr_src *s);
int sd_webp_orientation(const sd_hdr_src *s);
/* The right and bottom edges of a GIF's first frame (its image descriptor's
 * left + width, top + height): 0 when found, else SD_WALK_MORE, SD_GIF_END
 * or SD_GIF_NONE. */
int sd_gif_first_frame(const sd_hdr_src *s, uint32_t *right, uint32_t *bottom);

#endif
