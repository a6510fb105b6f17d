#include "svgplot.h"

#include <string.h>

/* Append text with the XML special characters escaped. */
static void xml_text(sd_buf *b, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': sd_buf_puts(b, "&lt;"); break;
        case '>': sd_buf_puts(b, "&gt;"); break;
        case '&': sd_buf_puts(b, "&amp;"); break;
        case '"': sd_buf_puts(b, "&quot;"); break;
        default: sd_buf_putc(b, *s);
        }
    }
}

/* Draw n bars scaled to the largest count, labels rotated under the axis. */
void sd_svg_bars(sd_buf *b, const char *title, const char *const *labels, const uint64_t *counts, size_t n)
{
    const int bar = 22, gap = 6, left = 60, top = 50, plot_h = 300, label_h = 90;
    int width = left + (int)n * (bar + gap) + 40;
    int title_w = left + (int)strlen(title) * 9 + 20; /* ~9 px a character at 15 px bold */
    if (width < title_w) width = title_w;
    if (width < 400) width = 400;
    int height = top + plot_h + label_h;
    uint64_t max = 1;
    for (size_t i = 0; i < n; i++)
        if (counts[i] > max) max = counts[i];
    sd_buf_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                     "font-family=\"sans-serif\" font-size=\"11\">\n", width, height, width, height);
    sd_buf_printf(b, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", width, height);
    sd_buf_printf(b, "<text x=\"%d\" y=\"24\" font-size=\"15\" font-weight=\"bold\">", left);
    xml_text(b, title);
    sd_buf_puts(b, "</text>\n");
    int base = top + plot_h;
    sd_buf_printf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", left - 4, base, width - 20, base);
    sd_buf_printf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", left - 4, top, left - 4, base);
    sd_buf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%llu</text>\n", left - 8, top + 4, (unsigned long long)max);
    sd_buf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">0</text>\n", left - 8, base + 4);
    for (size_t i = 0; i < n; i++) {
        int x = left + (int)i * (bar + gap);
        int h = (int)((double)counts[i] / (double)max * plot_h + 0.5);
        if (counts[i] && h < 1) h = 1;
        sd_buf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#4a7ab5\"><title>", x, base - h, bar, h);
        xml_text(b, labels[i]);
        sd_buf_printf(b, ": %llu</title></rect>\n", (unsigned long long)counts[i]);
        sd_buf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"9\">%llu</text>\n", x + bar / 2,
                      base - h - 3, (unsigned long long)counts[i]);
        sd_buf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" transform=\"rotate(-60 %d %d)\">", x + bar / 2,
                      base + 12, x + bar / 2, base + 12);
        xml_text(b, labels[i]);
        sd_buf_puts(b, "</text>\n");
    }
    sd_buf_puts(b, "</svg>\n");
}
