/* A plain SVG bar chart (no scripts, no external resources) for reports that
 * open in any browser: one bar per label with its count above it. */
#ifndef SDTK_SVGPLOT_H
#define SDTK_SVGPLOT_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

void sd_svg_bars(sd_buf *b, const char *title, const char *const *labels, const uint64_t *counts, size_t n);

#endif
