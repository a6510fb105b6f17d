/* sd-sample's contact sheet: every image of the run in one grid. */
#include <stdlib.h>
#include <string.h>

#include "sample.h"

/* A grid of the images (see sample.h). */
sd_status sample_contact_sheet(int n, uint8_t *const *rgb, const int *w, const int *h, uint8_t **sheet, int *sw,
                               int *sh, sd_error *err)
{
    int cols = 1, cw = 8, ch = 8;
    while (cols * cols < n) cols++;
    int rows = n > 0 ? (n + cols - 1) / cols : 1;
    for (int i = 0; i < n; i++) {
        if (w[i] > cw) cw = w[i];
        if (h[i] > ch) ch = h[i];
    }
    if ((double)cw * cols * ch * rows * 3 > 1.5e9)
        return sd_err_set(err, SD_ERANGE, "contact sheet of %d images of up to %dx%d is too large", n, cw, ch);
    *sw = cw * cols;
    *sh = ch * rows;
    size_t stride = (size_t)*sw * 3;
    *sheet = malloc(stride * (size_t)*sh);
    if (!*sheet) return sd_err_set(err, SD_ENOMEM, "out of memory for the contact sheet");
    memset(*sheet, 32, stride * (size_t)*sh);
    for (int i = 0; i < n; i++) {
        if (!rgb[i]) continue; /* a failed image stays dark */
        int x0 = (i % cols) * cw, y0 = (i / cols) * ch;
        for (int y = 0; y < h[i]; y++)
            memcpy(*sheet + (size_t)(y0 + y) * stride + (size_t)x0 * 3, rgb[i] + (size_t)y * (size_t)w[i] * 3,
                   (size_t)w[i] * 3);
    }
    return SD_OK;
}
